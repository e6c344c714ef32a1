"""The `strata-prefill` command: the layer above `strata/`, `reference/` and `fast/`, the one
place that picks an implementation."""
