"""Developer tools run as modules from the repository root (`python3 -m dev.compare_cubins ...`,
`python3 -m dev.host_profile ...`); docs/benchmarks.md lists them."""
