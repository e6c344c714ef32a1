"""Float dense products on the GPU: fast/cuda/kernels/float_dense.cu, whose definition is
strata.dense.float_matmul (F32, F16 or BF16 weights times float32 rows, no quantize).
Launches go through the backend's runtime.Device (counted as "float_dense")."""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as QT

from strata.errors import InputError

from fast.cuda import runtime
from fast.cuda.runtime import ptr

__all__ = ["float_dense"]

_KERNEL = {QT.F32: "float_dense_f32", QT.F16: "float_dense_f16", QT.BF16: "float_dense_bf16"}
_WARPS = 8  # FD_WARPS in the kernel
_TOK = 4  # FD_TOK in the kernel


def float_dense(dev, qtype, w, N: int, K: int, x, T: int, out, *, ldx: int | None = None,
                ldo: int | None = None) -> None:
    """out float32 [T, ldo] <- x [T, ldx] float32 times weight rows w [N, K] of `qtype`
    (F32, F16 or BF16, contiguous rows) = strata.dense.float_matmul; ldx, ldo default K, N."""
    try:
        qtype = QT(qtype)
        name = _KERNEL[qtype]
    except (ValueError, KeyError):
        raise InputError(f"float_dense: not a float type: {getattr(qtype, 'name', qtype)}") from None
    N, K, T = int(N), int(K), int(T)
    if N <= 0 or T <= 0:
        return
    warps = N * -(-T // _TOK)
    grid = (-(-warps // _WARPS), 1, 1)
    f = runtime.function("float_dense", name, "PPqPqiii")
    dev.launch(f, "float_dense", grid, (32 * _WARPS, 1, 1), ptr(w), ptr(x), np.int64(K if ldx is None else ldx),
               ptr(out), np.int64(N if ldo is None else ldo), N, K, T)
