"""Parallax benchmarks: one script per measurement, run together by run_all.py (see docs/BENCHMARKS.md)."""
