"""Float dense products on the GPU: fast/cuda/kernels/float_dense.cu, whose definition is
strata.dense.float_matmul (F32, F16 or BF16 weights times float32 rows, no quantize).

Every launch is counted in :data:`counters` ("launches" and "float_dense").
"""
from __future__ import annotations

import collections
import os

import numpy as np
from gguf import GGMLQuantizationType as QT

from strata.errors import InputError

from fast.cuda import runtime

__all__ = ["counters", "float_dense"]

_KERNEL = {QT.F32: "float_dense_f32", QT.F16: "float_dense_f16", QT.BF16: "float_dense_bf16"}
_WARPS = 8  # FD_WARPS in the kernel
_TOK = 4  # FD_TOK in the kernel
# runtime.load_module takes a kernel's name relative to runtime.KERNEL_DIR: name this file's
# folder relative to it, so the kernel is found wherever KERNEL_DIR points
_SOURCE = os.path.relpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels",
                                       "float_dense"), runtime.KERNEL_DIR)

counters: collections.Counter = collections.Counter()
_funcs: dict = {}


def _func(qtype: QT):
    f = _funcs.get(qtype)
    if f is None:
        f = runtime.load_module(_SOURCE).get_function(_KERNEL[qtype])
        f.prepare("PPqPqiii")
        _funcs[qtype] = f
    return f


def _ptr(buf) -> int:
    gpudata = getattr(buf, "gpudata", None)
    return int(gpudata if gpudata is not None else buf)


def float_dense(qtype, w, N: int, K: int, x, T: int, out, *, ldx: int | None = None,
                ldo: int | None = None, stream=None) -> None:
    """out float32 [T, ldo] <- x [T, ldx] float32 times weight rows w [N, K] of `qtype`
    (F32, F16 or BF16, contiguous rows) = strata.dense.float_matmul; ldx, ldo default K, N."""
    try:
        qtype = QT(qtype)
        _KERNEL[qtype]
    except (ValueError, KeyError):
        raise InputError(f"float_dense: not a float type: {getattr(qtype, 'name', qtype)}") from None
    N, K, T = int(N), int(K), int(T)
    if N <= 0 or T <= 0:
        return
    warps = N * -(-T // _TOK)
    grid = (-(-warps // _WARPS), 1, 1)
    _func(qtype).prepared_async_call(grid, (32 * _WARPS, 1, 1), stream, _ptr(w), _ptr(x),
                                     np.int64(K if ldx is None else ldx), _ptr(out),
                                     np.int64(N if ldo is None else ldo), N, K, T)
    counters["launches"] += 1
    counters["float_dense"] += 1
