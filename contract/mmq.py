"""MMQ-style products: the NumPy definition of every matrix product (docs/numerics.md, section 3).

A product multiplies activation rows, already quantized into a q8_1 buffer, by weight rows
decoded from their GGUF blocks. Per 32-value block the integer dot product is exact (float32
matmul of small integers: every partial sum stays below 2^24), and the float epilogue adds
the blocks in ascending order, one written formula per weight type.

CUDA kernels that compute a product name `mmq_prepared` here as their definition.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as QT

from strata_prefill.contract import parallel, q8_1, qformats, quants
from strata_prefill.contract.qformats import Epilogue

F32 = np.float32

# Rows below which a product is not split across threads (a thread's share would cost
# less than handing it over).
_MIN_ROWS_PER_THREAD = 64


@dataclass
class PreparedWeights:
    """Weight rows in the form the products consume, decoded once.

    w   int8 or int16 [nb, N, 32]  codes times their integer sub-scales (exact integers; int8
                                   where every sub-scale is 1); a product widens one block of
                                   it at a time to float32, so a matrix is kept in a quarter
                                   or half of its float32 size
    dw  float32 [N, nb]      per-block float scale ([N, nb, 2] for the HALVES epilogue: dw0,
                             dw1 of the two 16-value halves)
    mw  float32 [N, nb]      the min (Q4_1, Q5_1) or dmin (Q2_K, Q4_K, Q5_K), else None
    wm  int8 [nb, N, 32]     the integer min sub-scales per value (Q2_K, Q4_K, Q5_K), else None
    """

    qtype: QT
    w: np.ndarray
    dw: np.ndarray
    mw: np.ndarray | None
    wm: np.ndarray | None

    @property
    def n_out(self) -> int:
        return self.w.shape[1]

    @property
    def n_blocks(self) -> int:
        return self.w.shape[0]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.w, self.dw, self.mw, self.wm) if a is not None)


# A matrix of more rows than this is decoded in row slabs across the pool (the output head,
# 151,936 rows, is the longest single step of a reference run otherwise).
_PREPARE_SLAB_ROWS = 4096


def prepare(qtype, raw: np.ndarray) -> PreparedWeights:
    """Decode raw weight rows [N, row_bytes] once. Rows decode independently, so a tall matrix
    is decoded in row slabs on the pool, each written into its rows of the result."""
    qtype = QT(qtype)
    n = raw.shape[0]
    pieces = parallel.slabs(n, parallel.workers(), _PREPARE_SLAB_ROWS)
    if len(pieces) <= 1:
        return _prepare_rows(qtype, raw)
    probe = _prepare_rows(qtype, raw[:1])

    def tall(a, axis):  # a's layout with n rows on `axis`: [nb, N, 32] keeps them second, [N, nb] first
        if a is None:
            return None
        return np.empty(a.shape[:axis] + (n,) + a.shape[axis + 1:], a.dtype)

    out = PreparedWeights(qtype, tall(probe.w, 1), tall(probe.dw, 0), tall(probe.mw, 0), tall(probe.wm, 1))

    def fill(piece):
        r0, r1 = piece
        part = _prepare_rows(qtype, raw[r0:r1])
        if part.w.dtype != out.w.dtype:  # this slab needs sub-scales where the probe had none
            raise AssertionError("prepare: slabs of one matrix decoded to different widths")
        out.w[:, r0:r1] = part.w
        out.dw[r0:r1] = part.dw
        if out.mw is not None:
            out.mw[r0:r1] = part.mw
        if out.wm is not None:
            out.wm[:, r0:r1] = part.wm

    parallel.map_ordered(fill, pieces)
    return out


def _prepare_rows(qtype: QT, raw: np.ndarray) -> PreparedWeights:
    dec = quants.decode(qtype, raw)
    # quants.folded_codes and folded_mins, in the [nb, N, 32] layout: code times sub-scale is
    # an exact small integer (at most 127 for a type without sub-scales, 2,000 with them).
    codes = dec.codes.transpose(1, 0, 2)
    fmt = qformats.lookup(qtype)
    if fmt.unit_sub:  # sub-scales all 1: the codes are the products' integers
        w = np.ascontiguousarray(codes)
    else:
        w = np.multiply(codes, _halves(dec.sub), dtype=np.int16)
    wm = _halves(dec.msub).astype(np.int8) if fmt.epilogue is Epilogue.DMIN else None
    return PreparedWeights(qtype, w, dec.dw, dec.mw, wm)


def _halves(sub: np.ndarray) -> np.ndarray:
    """int16 [nb, N, 32]: the sub-scale of each value's half (v0 x16, v1 x16) from
    sub [N, nb, 2]."""
    return np.repeat(sub.transpose(1, 0, 2), 16, axis=2)


def row_slice(act: q8_1.Q8Rows, r0: int, r1: int) -> q8_1.Q8Rows:
    """The same decoded rows, r0..r1 only."""
    fields = {k: (v[r0:r1] if isinstance(v, np.ndarray) else v) for k, v in vars(act).items()}
    return type(act)(**fields)


def mmq_prepared(pw: PreparedWeights, act: q8_1.Q8Rows) -> np.ndarray:
    """out[r, n] = sum over weight blocks b (ascending) of the type's epilogue.

    act: activation rows decoded from a q8_1 buffer of the layout the type selects; only
    its first nb blocks are read (the rest is row padding). Rows and output columns are
    independent: they are computed in slabs, on the threads of strata_prefill.contract.parallel, each element
    by the same operations.
    """
    n_rows, n_out = act.codes.shape[0], pw.n_out
    out = np.zeros((n_rows, n_out), dtype=F32)
    if n_rows == 0 or n_out == 0:
        return out
    pieces = parallel.slabs(n_rows, parallel.workers(), _MIN_ROWS_PER_THREAD)
    # Few rows (the output head's one): the threads split the columns instead.
    if len(pieces) == 1 and parallel.workers() > 1 and n_out >= 2 * _MIN_COLS_PER_THREAD:
        cols = parallel.slabs(n_out, parallel.workers(), _MIN_COLS_PER_THREAD)
        parallel.map_ordered(lambda c: _rows_product(pw, act, out, c[0], c[1]), cols)
        return out
    parallel.map_ordered(lambda p: _rows_product(pw, row_slice(act, p[0], p[1]), out[p[0]:p[1]], 0, n_out),
                         pieces)
    return out


# A slab's passes run over [nb, rows, cols] float32 arrays of about this many elements (and
# widen [nb, cols, 32] weights): each NumPy call does enough work that the threads spend their
# time in it, not waiting for the interpreter lock between calls.
_SLAB_ELEMENTS = 1 << 21
_MIN_COLS_PER_THREAD = 2048


def _rows_product(pw: PreparedWeights, act: q8_1.Q8Rows, out: np.ndarray, c0: int, c1: int) -> None:
    """The product of a slab of rows into columns c0..c1 of `out` ([R, N]), slab by slab.
    Per output element, block by block ascending: ``out = out + epilogue_b`` from out = 0,
    each epilogue the written sequence of float32 operations in its written operand order."""
    nb = pw.n_blocks
    n_rows = act.codes.shape[0]
    a = np.ascontiguousarray(act.codes[:, :nb].transpose(1, 0, 2), dtype=F32)  # [nb, R, 32]
    da = np.ascontiguousarray(act.d[:, :nb].T)  # [nb, R]
    epilogue = qformats.lookup(pw.qtype).epilogue
    sa = np.ascontiguousarray(act.s[:, :nb].T) if epilogue is Epilogue.MIN else None
    cols = max(1, min(c1 - c0, _SLAB_ELEMENTS // (32 * nb)))
    rows = max(1, min(n_rows, _SLAB_ELEMENTS // (nb * cols)))
    for j0 in range(c0, c1, cols):
        j1 = min(c1, j0 + cols)
        w = pw.w[:, j0:j1].astype(F32).transpose(0, 2, 1)  # [nb, 32, n], exact integers
        wm = pw.wm[:, j0:j1].astype(F32).transpose(0, 2, 1) if pw.wm is not None else None
        dw = np.ascontiguousarray(np.moveaxis(pw.dw[j0:j1], 0, -1))  # [nb, n] ([nb, 2, n]: HALVES)
        mw = np.ascontiguousarray(pw.mw[j0:j1].T) if pw.mw is not None else None
        for r0 in range(0, n_rows, rows):
            r1 = min(n_rows, r0 + rows)
            out[r0:r1, j0:j1] = _slab(epilogue, a[:, r0:r1], da[:, r0:r1, None],
                                      None if sa is None else sa[:, r0:r1, None], w, wm, dw[..., None, :],
                                      None if mw is None else mw[:, None, :])


def _slab(epilogue: Epilogue, a, da, sa, w, wm, dw, mw) -> np.ndarray:
    """[r, n]: every block's epilogue of one slab at once, then their sum in block order."""
    if epilogue is Epilogue.HALVES:  # (dw0 * da) * S0 + (dw1 * da) * S1 (dw [nb, 2, 1, n])
        t = np.multiply(dw[:, 0], da)
        np.multiply(t, np.matmul(a[..., :16], w[:, :16]), out=t)
        u = np.multiply(dw[:, 1], da)
        np.multiply(u, np.matmul(a[..., 16:], w[:, 16:]), out=u)
        np.add(t, u, out=t)
        return block_sum(t)
    sumi = np.matmul(a, w)  # [nb, r, n] exact integers (every partial sum below 2^24)
    t = np.multiply(dw, da)
    np.multiply(t, sumi, out=t)  # (dw * da) * sumi
    if epilogue is Epilogue.MIN:  # + mw * sa
        np.add(t, np.multiply(mw, sa), out=t)
    elif epilogue is Epilogue.DMIN:  # - (mw * da) * mi
        u = np.multiply(mw, da)
        np.multiply(u, np.matmul(a, wm), out=u)
        np.subtract(t, u, out=t)
    return block_sum(t)


def block_sum(t: np.ndarray) -> np.ndarray:
    """((0 + t[0]) + t[1]) + ... over the first axis of t [nb, ...] float32, strictly in block
    order: the first addition (which turns -0 into +0), then NumPy's reduction over the outer
    axis, which adds each block's slice into the running result in turn. A reduction over a
    single element's run (one output element) would be NumPy's pairwise sum instead, so that
    case adds in a loop."""
    np.add(t[0], F32(0.0), out=t[0])
    if t[0].size < 2:
        acc = t[0].copy()
        for b in range(1, t.shape[0]):
            np.add(acc, t[b], out=acc)
        return acc
    return np.add.reduce(t, axis=0)


def mmq(qtype, weight_raw: np.ndarray, act_rows: q8_1.Q8Rows) -> np.ndarray:
    """Product of raw weight rows [N, row_bytes] with decoded activation rows: [R, N] float32."""
    return mmq_prepared(prepare(qtype, weight_raw), act_rows)
