"""Benchmarks run by `make bench` (`python -m bench.run_all`, see bench/run_all.py).

`timing` runs and times subprocesses and holds the options and `main` every section shares,
`harness` is the two-budget method of the end-to-end sections, `inprocess` times calls inside a
measuring child. Results documents made from training runs, not timed, are in reports/.
"""
