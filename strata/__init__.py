"""Shared pieces of strata-prefill: pack loading, quant formats, q8_1 buffers,
numerics primitives, the NumPy definitions of every op, dumps and the CLI."""
