"""Results documents made from training runs, not timed: learning tables, curves, comparisons.

Each module reads run directories (and the archive of runs it has seen before, docs/data/,
kept by `run_archive`) and writes one document under docs/. Benchmarks that time things are in
bench/; like them, nothing in the project imports these.
"""
