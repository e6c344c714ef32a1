"""Inputs that the kernel rows' checks (verify/) and their benchmarks (bench/) build alike, host
side and NumPy only: normal values drawn fast at the 32K shapes, and a random top-k routing of
the `strata` shape.

normal(rng, shape): a 32K-token activation is 84M values, and drawing them one by one costs a
second of the gate's time per test; the kernels do not care whether two rows share values, only
that every value is random and none is zero by construction. So an array larger than POOL
values takes its rows (the first axis) as windows of consecutive values of one drawn pool, each
at its own random offset: a copy, not a draw, per value. Smaller arrays are drawn value by value.

Routing: every token picks TOP_K distinct experts uniformly at random; rows are ordered by
expert (stable), as the walk orders them, so expert e owns rows off[e]..off[e+1].
"""
from __future__ import annotations

import numpy as np

from strata_prefill.formats.config import PRESETS
from strata_prefill.contract.constants import MMQ_GROUP

STRATA = PRESETS["strata"]
POOL = 1 << 22  # values drawn for a large array's rows to be windows of


def normal(rng: np.random.Generator, shape) -> np.ndarray:
    """float32 standard normal values of `shape` (see the module's docstring)."""
    shape = tuple(int(d) for d in shape)
    rows, n = shape[0], int(np.prod(shape[1:], dtype=np.int64))
    if rows * n <= POOL or n > POOL:
        return rng.standard_normal(shape, dtype=np.float32)
    pool = rng.standard_normal(POOL + n, dtype=np.float32)
    starts = rng.integers(0, POOL + 1, rows)
    return np.lib.stride_tricks.sliding_window_view(pool, n)[starts].reshape(shape)
N_EXPERT, TOP_K = STRATA.n_expert, STRATA.n_expert_used
N_GROUPS = N_EXPERT // MMQ_GROUP


class Routing:
    """tokens x TOP_K routed rows: ids [T, TOP_K], per-expert counts, row offsets, the scatter
    table slot[t*TOP_K + k] (row of token t's k-th pick), the gather table src[row] (its token),
    and per group of MMQ_GROUP experts the (row_begin, row_end) bounds and total rows."""

    def __init__(self, tokens: int, seed: int = 0):
        rng = np.random.default_rng(seed)
        keys = rng.random((tokens, N_EXPERT), dtype=np.float32)
        self.tokens, self.rows = tokens, tokens * TOP_K
        self.ids = np.argpartition(keys, TOP_K, axis=1)[:, :TOP_K].astype(np.int32)
        flat = self.ids.reshape(-1)
        self.counts = np.bincount(flat, minlength=N_EXPERT)
        self.offsets = np.concatenate([[0], np.cumsum(self.counts)]).astype(np.int64)
        order = np.argsort(flat, kind="stable")
        self.slot = np.empty(flat.size, np.int32)
        self.slot[order] = np.arange(flat.size, dtype=np.int32)
        self.src = (order // TOP_K).astype(np.int32)
        starts = self.offsets[:-1].reshape(N_GROUPS, MMQ_GROUP)
        ends = self.offsets[1:].reshape(N_GROUPS, MMQ_GROUP)
        self.bounds = np.stack([starts, ends], axis=-1).astype(np.int32)  # [N_GROUPS, MMQ_GROUP, 2]
        self.group_rows = (ends[:, -1] - starts[:, 0]).astype(np.int64)

    def expert_rows(self, e: int) -> tuple[int, int]:
        return int(self.offsets[e]), int(self.offsets[e + 1])


def around_clamp(rng: np.random.Generator, shape, limit: float = 7.0) -> np.ndarray:
    """float32 values for the clamped SwiGLU (strata_prefill.contract.moe.swiglu_oai) and its kernels, never zero:
    a quarter a few ulp either side of +-limit, a quarter beyond it (magnitudes up to 1e4), a
    quarter far below zero (-60 .. -40: exp(-alpha g) overflows there), a quarter normal (sd 4)."""
    lim = np.float32(limit)
    near = np.array([np.nextafter(lim, np.float32(0)), lim, np.nextafter(lim, np.float32(np.inf))], np.float32)
    near = np.concatenate([near, -near, near + np.float32(2 ** -20), -near - np.float32(2 ** -20)])
    kind = rng.integers(0, 4, shape)
    out = np.where(kind == 0, rng.choice(near, shape),
                   np.where(kind == 1, np.sign(rng.standard_normal(shape)) * np.exp(rng.uniform(2.0, 9.2, shape)),
                            np.where(kind == 2, rng.uniform(-60.0, -40.0, shape), rng.standard_normal(shape) * 4)))
    return np.where(out == 0, 1.0, out).astype(np.float32)
