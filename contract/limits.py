"""The limits a pack's shape must meet for this project to run it, with where each comes from.

`ModelConfig.problems()` (formats/config.py) checks a pack's metadata against the first group
when the pack is opened, before any work; `ModelConfig.cuda_problems()` checks the second,
which only the CUDA kernels have (the reference and the sim run any shape of the first group).
`fast/` cannot be imported from `contract/`, so the CUDA numbers are written here and
tests/test_load_checks.py holds them equal to the kernels' wrappers.
"""
from __future__ import annotations

# ---- every path (the reference, the sim, the CUDA kernels) ------------------------------------
#: the head size is a multiple of 32: the head sizes the contract is stated and tested for (Q and
#: K are quantized per head row, contract/attention.py, one warp's lanes over a row in the
#: kernels); it is then even too, as NEOX RoPE's pairs need (contract/numerics.py:rope_table)
HEAD_DIM_MULTIPLE = 32

# ---- the CUDA kernels only -------------------------------------------------------------------
#: head sizes the attention kernels are instantiated for (fast/cuda/attention.py:ATTEND_HEAD_DIMS)
CUDA_HEAD_DIMS = (64, 128)
#: router.cu's top-K keeps the chosen experts of a token in one warp's lanes
#: (fast/cuda/elementwise.py:top_k)
CUDA_TOP_K_MAX = 32
#: router.cu holds 4 warps' rows of E float32 logits in 48 KiB of shared memory
#: (fast/cuda/elementwise.py:top_k): E * 16 bytes at most 48 KiB
CUDA_ROUTER_MAX_EXPERTS = 48 * 1024 // (4 * 4)
