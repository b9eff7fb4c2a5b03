"""Benchmarks of the workbench: capture overhead, store writes, analyses, memory, remote.

Run `make bench` (tiny + real-size) or `make bench-quick` (tiny only); see benchmarks/README.md.
Every number is a ratio against a baseline timed in the same run.
"""
