"""MMQ-style products: the NumPy definition of every matrix product (docs/numerics.md, section 3).

A product multiplies activation rows, already quantized into a q8_1 buffer, by weight rows
decoded from their GGUF blocks. Per 32-value block the integer dot product is exact (float32
matmul of small integers: every partial sum stays below 2^24), and the float epilogue adds
the blocks in ascending order, one written formula per weight type.

CUDA kernels that compute a product name `mmq` (or `mmq_rows`) here as their definition.
"""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as QT

from strata import q8_1, quants

F32 = np.float32


def _int_dots(a_codes: np.ndarray, w_folded: np.ndarray) -> np.ndarray:
    """Exact per-block integer dot products.

    a_codes  [R, nb, 32] activation codes (any real dtype holding small ints)
    w_folded [N, nb, 32] weight codes times their integer sub-scales
    returns  [nb, R, N] float32 holding exact integers.
    """
    a = np.ascontiguousarray(a_codes.transpose(1, 0, 2), dtype=F32)  # [nb, R, 32]
    w = np.ascontiguousarray(w_folded.transpose(1, 2, 0), dtype=F32)  # [nb, 32, N]
    return np.matmul(a, w)


# Bound on the [nb, rows, N] float32 scratch of one pass; rows are independent, so the
# product is computed in slabs of rows without changing a bit.
_SCRATCH_BYTES = 64 << 20


def _row_slice(act: q8_1.Q8Rows, r0: int, r1: int) -> q8_1.Q8Rows:
    """The same decoded rows, r0..r1 only."""
    fields = {k: (v[r0:r1] if isinstance(v, np.ndarray) else v) for k, v in vars(act).items()}
    return type(act)(**fields)


def mmq_rows(qtype, dec: quants.Decoded, act: q8_1.Q8Rows) -> np.ndarray:
    """out[r, n] = sum over blocks b (ascending) of the type's epilogue.

    dec: weight rows decoded, arrays shaped [N, nb, ...] (nb = K/32).
    act: activation rows decoded from a q8_1 buffer of the layout the type selects;
         only its first nb blocks are read (the rest is row padding).
    """
    qtype = QT(qtype)
    nb = dec.codes.shape[-2]
    n_rows = act.codes.shape[0]
    n_out = dec.codes.shape[0]
    out = np.zeros((n_rows, n_out), dtype=F32)
    if n_rows == 0 or n_out == 0:
        return out
    slab = max(1, _SCRATCH_BYTES // (4 * nb * n_out))
    if n_rows > slab:
        for r0 in range(0, n_rows, slab):
            out[r0:r0 + slab] = mmq_rows(qtype, dec, _row_slice(act, r0, r0 + slab))
        return out
    sumi = _int_dots(act.codes[:, :nb], quants.folded_codes(dec))  # [nb, R, N]
    da = act.d[:, :nb]  # [R, nb]
    dw = dec.dw  # [N, nb]
    if qtype == QT.Q4_1:
        sa = act.s[:, :nb]
        mw = dec.mw
        for b in range(nb):
            term = (dw[None, :, b] * da[:, b, None]) * sumi[b] + mw[None, :, b] * sa[:, b, None]
            out = out + term
    elif qtype == QT.Q2_K:
        mi = _int_dots(act.codes[:, :nb], quants.folded_mins(dec))
        mw = dec.mw
        for b in range(nb):
            dab = da[:, b, None]
            term = (dw[None, :, b] * dab) * sumi[b] - (mw[None, :, b] * dab) * mi[b]
            out = out + term
    else:
        for b in range(nb):
            out = out + (dw[None, :, b] * da[:, b, None]) * sumi[b]
    return out


def mmq(qtype, weight_raw: np.ndarray, act_rows: q8_1.Q8Rows) -> np.ndarray:
    """Product of raw weight rows [N, row_bytes] with decoded activation rows: [R, N] float32."""
    return mmq_rows(qtype, quants.decode(qtype, weight_raw), act_rows)


def quantize_and_mmq(qtype, weight_raw: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Quantize float rows x [R, K] to q8_1 (the layout the weight type selects), then `mmq`."""
    layout = q8_1.layout_for(qtype)
    rows = q8_1.quantize_rows(np.ascontiguousarray(x, dtype=F32), layout)
    return mmq(qtype, weight_raw, q8_1.decode_rows(rows, x.shape[0], layout))
