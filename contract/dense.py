"""Float matrices (F32, F16, BF16) in their own precision (docs/numerics.md, section 3a).

A float weight is never converted to a quantized type and its input is never quantized: the
product is float32 with one fixed reduction order, the one a GPU warp computes
(:func:`float_matmul`; fast/cuda/kernels/float_dense.cu names it as its definition).
"""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as QT

from strata_prefill.contract import parallel
from strata_prefill.contract.numerics import LANES, f32, tree_sum

FLOAT_TYPES: tuple[QT, ...] = (QT.F32, QT.F16, QT.BF16)
_ELEMENT_BYTES = {QT.F32: 4, QT.F16: 2, QT.BF16: 2}

# Bound on the [rows, 32, T] float32 accumulators of the passes running at once; weight
# rows are independent, so the product is computed in slabs of rows without changing a bit.
_SCRATCH_BYTES = 16 << 20
# Weight rows below which a product is not split across threads.
_MIN_ROWS_PER_THREAD = 16


def is_float(qtype) -> bool:
    """True for F32, F16 and BF16."""
    try:
        return QT(qtype) in FLOAT_TYPES
    except ValueError:
        return False


def row_bytes(qtype, n_cols: int) -> int:
    """Bytes of a row of n_cols values of a float type."""
    return _ELEMENT_BYTES[QT(qtype)] * int(n_cols)


def decode_float(qtype, raw: np.ndarray) -> np.ndarray:
    """float32 [..., n_cols] of raw little-endian rows uint8 [..., row_bytes], exactly:
    F16 and BF16 widen to float32 without rounding (BF16 is float32's upper 16 bits)."""
    qtype = QT(qtype)
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    if qtype == QT.F32:
        return raw.view("<f4").astype(np.float32, copy=False)
    if qtype == QT.F16:
        return raw.view("<f2").astype(np.float32)
    if qtype == QT.BF16:
        return (raw.view("<u2").astype(np.uint32) << np.uint32(16)).view(np.float32)
    raise ValueError(f"not a float type: {qtype.name}")


def encode_float(x: np.ndarray, qtype) -> np.ndarray:
    """Little-endian bytes uint8 [..., row_bytes] of float32 x in a float type, the inverse
    of :func:`decode_float` where x is representable: F16 by NumPy's round to nearest even,
    BF16 by rounding float32 to its upper 16 bits, to nearest even."""
    qtype = QT(qtype)
    if qtype == QT.F32:
        return np.ascontiguousarray(x, dtype="<f4").view(np.uint8)
    if qtype == QT.F16:
        return x.astype("<f2").view(np.uint8)
    if qtype == QT.BF16:
        u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
        r = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
        return r.astype("<u2").view(np.uint8)
    raise ValueError(f"not a float type: {qtype.name}")


def float_matmul(w, x) -> np.ndarray:
    """y[t, n] = sum_k w[n, k] * x[t, k]: float32 [T, N] from w [N, K] and x [T, K] (float32).

    The order, per output element: lane j (0..31) accumulates ``acc = acc + w[n,k] * x[t,k]``
    for k = j, j+32, j+64, ... ascending, from ``acc = 0.0f`` (each product rounded to
    float32, then added: no fused multiply-add); then the 32 lane partials are summed by the
    halving tree ``v = v[:16] + v[16:]``, ..., ``v[:1] + v[1:]`` (`strata_prefill.contract.numerics.tree_sum`).
    K is padded with zeros to a multiple of 32: a padded product is +0.0, and adding +0.0
    leaves every partial's bits unchanged (a partial that starts at +0.0 is never -0.0).
    """
    w, x = f32(w), f32(x)
    if w.ndim != 2 or x.ndim != 2 or w.shape[1] != x.shape[1]:
        raise ValueError(f"float_matmul: w {w.shape} and x {x.shape} are not [N, K] and [T, K]")
    (N, K), T = w.shape, x.shape[0]
    steps = -(-K // LANES)
    pad = steps * LANES - K
    if pad:
        w = np.concatenate([w, np.zeros((N, pad), np.float32)], axis=1)
        x = np.concatenate([x, np.zeros((T, pad), np.float32)], axis=1)
    # w as [N, steps, 32]; x as [steps, 32, T] so the long axis (tokens) is the innermost
    ws = w.reshape(N, steps, LANES)
    xs = np.ascontiguousarray(x.reshape(T, steps, LANES).transpose(1, 2, 0))
    out = np.empty((T, N), np.float32)
    if T == 0 or N == 0:
        out[...] = 0.0
        return out
    # Weight rows are independent: slabs of them run on the threads of strata_prefill.contract.parallel.
    pieces = parallel.slabs(N, parallel.workers(), _MIN_ROWS_PER_THREAD)
    slab = max(1, _SCRATCH_BYTES // (4 * LANES * T * len(pieces)))

    def run(piece):
        for n0 in range(piece[0], piece[1], slab):
            n1 = min(piece[1], n0 + slab)
            wn = ws[n0:n1]  # [n, steps, 32]
            acc = np.zeros((wn.shape[0], LANES, T), np.float32)
            prod = np.empty_like(acc)
            for s in range(steps):
                np.multiply(wn[:, s, :, None], xs[s][None], out=prod)
                np.add(acc, prod, out=acc)
            out[:, n0:n1] = tree_sum(acc, axis=1).T

    parallel.map_ordered(run, pieces)
    return out


def add_row_bias(y, b) -> np.ndarray:
    """y + b on every row: ``y[t, i] = y[t, i] + b[i]``, one float32 addition per element
    (docs/numerics.md section 5, Biases: a dense product's bias, added right after it).
    y float32 [..., n], b float32 [n]; a new array."""
    y, b = f32(y), f32(b)
    if b.ndim != 1 or y.shape[-1:] != b.shape:
        raise ValueError(f"add_row_bias: a bias of {b.shape} for rows of {y.shape[-1:]} values")
    return y + b
