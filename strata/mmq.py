"""MMQ-style products: the NumPy definition of every matrix product (docs/numerics.md, section 3).

A product multiplies activation rows, already quantized into a q8_1 buffer, by weight rows
decoded from their GGUF blocks. Per 32-value block the integer dot product is exact (float32
matmul of small integers: every partial sum stays below 2^24), and the float epilogue adds
the blocks in ascending order, one written formula per weight type.

CUDA kernels that compute a product name `mmq_prepared` here as their definition.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as QT

from strata import parallel, q8_1, quants

F32 = np.float32

# Bound on the [nb, rows, N] float32 scratch of the passes running at once; rows are
# independent, so the product is computed in slabs of rows without changing a bit.
_SCRATCH_BYTES = 64 << 20
# Rows below which a product is not split across threads (a thread's share would cost
# less than handing it over).
_MIN_ROWS_PER_THREAD = 64


@dataclass
class PreparedWeights:
    """Weight rows in the form the products consume, decoded once.

    w   float32 [nb, 32, N]  codes times their integer sub-scales (exact integers)
    dw  float32 [N, nb]      per-block float scale
    mw  float32 [N, nb]      Q4_1 min / Q2_K dmin, else None
    wm  float32 [nb, 32, N]  Q2_K min sub-scales per value, else None
    """

    qtype: QT
    w: np.ndarray
    dw: np.ndarray
    mw: np.ndarray | None
    wm: np.ndarray | None

    @property
    def n_out(self) -> int:
        return self.w.shape[2]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.w, self.dw, self.mw, self.wm) if a is not None)


# A matrix of more rows than this is decoded in row slabs across the pool (the output head,
# 151,936 rows, is the longest single step of a reference run otherwise).
_PREPARE_SLAB_ROWS = 4096


def prepare(qtype, raw: np.ndarray) -> PreparedWeights:
    """Decode raw weight rows [N, row_bytes] once. Rows decode independently, so a tall matrix
    is decoded in row slabs on the pool, each written into its columns of the result."""
    qtype = QT(qtype)
    n = raw.shape[0]
    pieces = parallel.slabs(n, parallel.workers(), _PREPARE_SLAB_ROWS)
    if len(pieces) <= 1:
        return _prepare_rows(qtype, raw)
    probe = _prepare_rows(qtype, raw[:1])

    def tall(a):  # a's layout with n rows: [nb, 32, N] keeps its rows last, [N, nb] first
        if a is None:
            return None
        return np.empty(a.shape[:-1] + (n,) if a.ndim == 3 else (n,) + a.shape[1:], a.dtype)

    out = PreparedWeights(qtype, tall(probe.w), tall(probe.dw), tall(probe.mw), tall(probe.wm))

    def fill(piece):
        r0, r1 = piece
        part = _prepare_rows(qtype, raw[r0:r1])
        out.w[..., r0:r1] = part.w
        out.dw[r0:r1] = part.dw
        if out.mw is not None:
            out.mw[r0:r1] = part.mw
        if out.wm is not None:
            out.wm[..., r0:r1] = part.wm

    parallel.map_ordered(fill, pieces)
    return out


def _prepare_rows(qtype: QT, raw: np.ndarray) -> PreparedWeights:
    dec = quants.decode(qtype, raw)
    # quants.folded_codes and folded_mins, built directly in the [nb, 32, N] layout: the
    # int8 codes are moved, not their float32 products; code times sub-scale is an exact
    # small integer either way.
    w = np.multiply(dec.codes.transpose(1, 2, 0), _halves(dec.sub), dtype=F32, order="C")
    wm = _halves(dec.msub) if qtype == QT.Q2_K else None
    return PreparedWeights(qtype, w, dec.dw, dec.mw, wm)


def _halves(sub: np.ndarray) -> np.ndarray:
    """float32 [nb, 32, N]: the sub-scale of each value's half (v0 x16, v1 x16) from
    sub [N, nb, 2]."""
    return np.repeat(sub.transpose(1, 2, 0).astype(F32), 16, axis=1)


def row_slice(act: q8_1.Q8Rows, r0: int, r1: int) -> q8_1.Q8Rows:
    """The same decoded rows, r0..r1 only."""
    fields = {k: (v[r0:r1] if isinstance(v, np.ndarray) else v) for k, v in vars(act).items()}
    return type(act)(**fields)


def mmq_prepared(pw: PreparedWeights, act: q8_1.Q8Rows) -> np.ndarray:
    """out[r, n] = sum over weight blocks b (ascending) of the type's epilogue.

    act: activation rows decoded from a q8_1 buffer of the layout the type selects; only
    its first nb blocks are read (the rest is row padding). Rows are independent: they are
    computed in slabs, on the threads of strata.parallel, each row by the same operations.
    """
    nb = pw.w.shape[0]
    n_rows, n_out = act.codes.shape[0], pw.n_out
    out = np.zeros((n_rows, n_out), dtype=F32)
    if n_rows == 0 or n_out == 0:
        return out
    pieces = parallel.slabs(n_rows, parallel.workers(), _MIN_ROWS_PER_THREAD)
    slab = max(1, _SCRATCH_BYTES // (4 * nb * n_out * len(pieces)))
    ranges = [(r0, min(r1, r0 + slab)) for p0, r1 in pieces for r0 in range(p0, r1, slab)]

    def run(r):
        _rows_product(pw, row_slice(act, r[0], r[1]), out[r[0]:r[1]])

    parallel.map_ordered(run, ranges)
    return out


def _rows_product(pw: PreparedWeights, act: q8_1.Q8Rows, out: np.ndarray) -> None:
    """The product of a slab of rows into `out` (zeros, [R, N]). Per output element, block
    by block ascending: ``out = out + epilogue_b``, each epilogue the written sequence of
    float32 operations in its written operand order, computed in place (no temporaries
    allocated per block)."""
    nb = pw.w.shape[0]
    a = np.ascontiguousarray(act.codes[:, :nb].transpose(1, 0, 2), dtype=F32)  # [nb, R, 32]
    sumi = np.matmul(a, pw.w)  # [nb, R, N] exact integers
    da = np.ascontiguousarray(act.d[:, :nb].T)  # [nb, R]
    dw = np.ascontiguousarray(pw.dw.T)  # [nb, N]
    t = np.empty_like(out)
    if pw.qtype == QT.Q4_1:
        # out + ((dw * da) * sumi + mw * sa)
        sa, mw = np.ascontiguousarray(act.s[:, :nb].T), np.ascontiguousarray(pw.mw.T)
        u = np.empty_like(out)
        for b in range(nb):
            np.multiply(dw[b, None, :], da[b, :, None], out=t)
            np.multiply(t, sumi[b], out=t)
            np.multiply(mw[b, None, :], sa[b, :, None], out=u)
            np.add(t, u, out=t)
            np.add(out, t, out=out)
    elif pw.qtype == QT.Q2_K:
        # out + ((dw * da) * sumi - (mw * da) * mi)
        mi = np.matmul(a, pw.wm)
        mw = np.ascontiguousarray(pw.mw.T)
        u = np.empty_like(out)
        for b in range(nb):
            dab = da[b, :, None]
            np.multiply(dw[b, None, :], dab, out=t)
            np.multiply(t, sumi[b], out=t)
            np.multiply(mw[b, None, :], dab, out=u)
            np.multiply(u, mi[b], out=u)
            np.subtract(t, u, out=t)
            np.add(out, t, out=out)
    else:
        # out + (dw * da) * sumi
        for b in range(nb):
            np.multiply(dw[b, None, :], da[b, :, None], out=t)
            np.multiply(t, sumi[b], out=t)
            np.add(out, t, out=out)


def mmq(qtype, weight_raw: np.ndarray, act_rows: q8_1.Q8Rows) -> np.ndarray:
    """Product of raw weight rows [N, row_bytes] with decoded activation rows: [R, N] float32."""
    return mmq_prepared(prepare(qtype, weight_raw), act_rows)


class PreparedCache:
    """Prepared weights by key, up to a byte budget. Decoding a matrix costs more than
    multiplying a short chunk by it, so keeping them pays. A prefill asks for the matrices
    in the same order every chunk, so once the budget is spent the entries kept stay and a
    new one is not kept (dropping the least recently used instead would drop each matrix
    just before its next use, and nothing would hit). Safe to share between threads: two
    threads asking for one missing key may both decode it (the same bytes), and the
    bookkeeping is under a lock."""

    def __init__(self, max_bytes: int = 1 << 30):
        self.max_bytes = max_bytes
        self._items: dict = {}
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key, qtype, raw: np.ndarray) -> PreparedWeights:
        with self._lock:
            pw = self._items.get(key)
        if pw is not None:
            return pw
        pw = prepare(qtype, raw)  # outside the lock: decodes run in parallel
        with self._lock:
            if key not in self._items and self._bytes + pw.nbytes <= self.max_bytes:
                self._items[key] = pw
                self._bytes += pw.nbytes
        return pw
