"""Benchmarks run by `make bench` (see bench/run_all.py)."""
