"""Kernel versions, probes and candidate forms beside production's, run as modules from the
repository root (`python3 -m dev.kernels.mmq_core ...`); README.md here says what each one shows."""
