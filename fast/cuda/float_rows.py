"""The MoE input of float gate/up experts on the GPU: fast/cuda/kernels/float_rows.cu, whose
definitions are strata_prefill.contract.moe.gather_rows and strata_prefill.contract.moe.scatter_rows (the normed rows copied into
the expert-sorted order, never quantized). Launches go through the backend's runtime.Device
(counted as "gather_rows" and "scatter_rows")."""
from __future__ import annotations

import numpy as np

from strata_prefill.fast.cuda import runtime
from strata_prefill.fast.cuda.runtime import check, ptr

__all__ = ["gather_rows", "scatter_rows"]

_THREADS = 256
_MAX_GRID = 1 << 20


def _grid(total: int) -> tuple[int, int, int]:
    return (max(1, min(-(-int(total) // _THREADS), _MAX_GRID)), 1, 1)


def gather_rows(dev, x, src, n_rows: int, out=None):
    """out float32 [n_rows, K] <- x[src[r]] for each row r (strata_prefill.contract.moe.gather_rows); x float32
    [T, K], src int32 [n_rows] on the device."""
    check(x, "gather_rows x", np.float32, ndim=2)
    T, K = (int(s) for s in x.shape)
    n_rows = int(n_rows)
    out = dev.output(out, "gather_rows out", (n_rows, K), np.float32)
    if n_rows * K == 0:
        return out
    f = runtime.function("float_rows", "gather_rows_f32", "PqPPii")
    dev.launch(f, "gather_rows", _grid(n_rows * K), (_THREADS, 1, 1), ptr(x), K, ptr(src), ptr(out), n_rows, K)
    return out


def scatter_rows(dev, x, slot, k_used: int, out=None):
    """out float32 [T * k_used, K]: row slot[t * k_used + k] <- x[t] (strata_prefill.contract.moe.scatter_rows);
    x float32 [T, K], slot int32 [T * k_used] on the device."""
    check(x, "scatter_rows x", np.float32, ndim=2)
    T, K = (int(s) for s in x.shape)
    k_used = int(k_used)
    out = dev.output(out, "scatter_rows out", (T * k_used, K), np.float32)
    if T * k_used * K == 0:
        return out
    f = runtime.function("float_rows", "scatter_rows_f32", "PqPPiii")
    dev.launch(f, "scatter_rows", _grid(T * k_used * K), (_THREADS, 1, 1), ptr(x), K, ptr(slot), ptr(out), T,
               k_used, K)
    return out
