"""Benchmarks: pytest-benchmark suites (`python3 -m pytest bench/`) and scripts run as modules
from the repository root (`python3 -m bench.bench_whole_model ...`); docs/benchmarks.md lists them."""
