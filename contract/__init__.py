"""The contract: the math every side computes identically (numerics, quant formats, q8_1, MMQ,
attention, routing, the MoE combine), defined in NumPy and written down in docs/numerics.md."""
