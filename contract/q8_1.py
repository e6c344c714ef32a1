"""q8_1 activation buffers: llama.cpp's ``block_q8_1_mmq`` (docs/numerics.md, section 2).

A buffer holds R rows of K float32 values, each row padded with zeros to ``Kp`` (a multiple
of 512) and cut into 128-value blocks of 144 bytes: a 16-byte header (layout-dependent) and
128 int8 codes. Blocks are stored column-block-major: block ``(kb, r)`` is at index
``kb * R + r``.

Header by layout (which one a weight type reads: its strata_prefill.contract.qformats class's q8_1_layout):

- ``D4``:   ``float d[4]``, one float32 scale per 32 values (the types without a min)
- ``DS4``:  ``half2 ds[4]``: d0 s0 d1 s1 d2 s2 d3 s3, scale and float sum per 32 values (Q4_1, Q5_1)
- ``D2S6``: ``half[8]``: d0 d1 (one scale per 64 values), s0..s5 (sums of the 16-value groups
  of values 0..95) (Q2_K)

A scale group is quantized by :func:`strata_prefill.contract.blockquant.quantize_blocks` (rule INVERSE).
CUDA kernels that write these buffers name :func:`quantize_rows` (and :func:`gather_quantize`
or :func:`scatter_quantize`) as their definition.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as QT

from strata_prefill.contract import parallel
from strata_prefill.contract.blockquant import quantize_blocks

# The buffer's sizes (contract/constants.py) under the short names that fast/ and verify/ use.
from strata_prefill.contract.constants import QK8_1 as QK
from strata_prefill.contract.constants import Q8_1_BLOCK_BYTES as BLOCK_BYTES
from strata_prefill.contract.constants import Q8_1_BLOCK_VALUES as BLOCK_VALUES
from strata_prefill.contract.constants import Q8_1_HEADER_BYTES as HEADER_BYTES
from strata_prefill.contract.constants import Q8_1_ROW_ALIGN as ROW_ALIGN
from strata_prefill.contract.errors import PackError
from strata_prefill.contract.numerics import f32, to_half, tree_sum

__all__ = [
    "Layout",
    "LAYOUT_D4",
    "LAYOUT_DS4",
    "LAYOUT_D2S6",
    "layout_for",
    "QK",
    "BLOCK_VALUES",
    "BLOCK_BYTES",
    "HEADER_BYTES",
    "ROW_ALIGN",
    "padded_len",
    "blocks_per_row",
    "buffer_nbytes",
    "quantize_rows",
    "alloc_buffer",
    "pack_rows",
    "unpack_rows",
    "gather_quantize",
    "scatter_quantize",
    "Q8Rows",
    "decode_rows",
    "describe_block",
]


class Layout(enum.IntEnum):
    """Header layouts; values follow llama.cpp's ``mmq_q8_1_ds_layout`` enum."""

    D4 = 0
    DS4 = 1
    D2S6 = 2


LAYOUT_D4 = Layout.D4
LAYOUT_DS4 = Layout.DS4
LAYOUT_D2S6 = Layout.D2S6


def layout_for(qtype) -> Layout:
    """The q8_1 layout a weight type's MMQ kernel reads (its strata_prefill.contract.qformats class's
    q8_1_layout); PackError for unsupported types."""
    # strata_prefill.contract.qformats names this module's Layout, so it is imported here, not above
    from strata_prefill.contract import qformats

    try:
        qt = QT(int(qtype))
    except (ValueError, TypeError):
        raise PackError(f"unknown GGML quantization type {qtype!r}") from None
    fmt = qformats.lookup(qt)
    if fmt is None:
        supported = ", ".join(f.qtype.name for f in qformats.formats())
        raise PackError(
            f"weight type {qt.name} has no MMQ path here (supported: {supported})"
        )
    return fmt.q8_1_layout


def _layout(layout) -> Layout:
    try:
        return Layout(int(layout))
    except (ValueError, TypeError):
        raise ValueError(f"not a q8_1 layout: {layout!r}") from None


def padded_len(K: int) -> int:
    """K rounded up to a multiple of 512 (``Kp``)."""
    K = int(K)
    if K < 1:
        raise ValueError(f"row length must be positive, got {K}")
    return -(-K // ROW_ALIGN) * ROW_ALIGN


def blocks_per_row(K: int) -> int:
    """Number of 144-byte blocks per row: ``Kp / 128``."""
    return padded_len(K) // BLOCK_VALUES


def buffer_nbytes(n_rows: int, K: int) -> int:
    """Bytes of a buffer of ``n_rows`` rows of K values."""
    if n_rows < 0:
        raise ValueError(f"n_rows must be >= 0, got {n_rows}")
    return int(n_rows) * blocks_per_row(K) * BLOCK_BYTES


def alloc_buffer(n_rows: int, K: int) -> np.ndarray:
    """A zeroed flat uint8 buffer of :func:`buffer_nbytes` bytes."""
    return np.zeros(buffer_nbytes(n_rows, K), dtype=np.uint8)


# --------------------------------------------------------------------------- quantize

# Rows below which a quantization is not split across threads.
_MIN_ROWS_PER_THREAD = 256


def _sums(g: np.ndarray) -> np.ndarray:
    """Group sums in the written order: runs of 4 left to right, then a halving tree.

    g: float32 [..., G] -> [...]
    """
    q = g.reshape(g.shape[:-1] + (g.shape[-1] // 4, 4))
    s4 = ((q[..., 0] + q[..., 1]) + q[..., 2]) + q[..., 3]
    return tree_sum(s4, axis=-1)


def quantize_rows(x, layout) -> np.ndarray:
    """Quantize float32 rows [R, K] into their blocks: uint8 [R, Kp/128, 144].

    Vectorized over rows and blocks. Rows are padded with zeros to Kp; padding blocks get
    d = 0, codes 0 and sums 0.
    """
    layout = _layout(layout)
    x = f32(x)
    if x.ndim != 2:
        raise ValueError(f"quantize_rows expects [rows, K], got shape {x.shape}")
    R, K = x.shape
    pieces = parallel.slabs(R, parallel.workers(), _MIN_ROWS_PER_THREAD)
    if len(pieces) > 1:  # rows are independent: slabs of them on the pool's threads
        out = np.empty((R, padded_len(K) // BLOCK_VALUES, BLOCK_BYTES), dtype=np.uint8)

        def run(piece):
            out[piece[0]:piece[1]] = _quantize_rows(x[piece[0]:piece[1]], layout)

        parallel.map_ordered(run, pieces)
        return out
    return _quantize_rows(x, layout)


def _quantize_rows(x: np.ndarray, layout: Layout) -> np.ndarray:
    R, K = x.shape
    Kp = padded_len(K)
    nb = Kp // BLOCK_VALUES
    if Kp != K:
        xp = np.zeros((R, Kp), dtype=np.float32)
        xp[:, :K] = x
    else:
        xp = np.ascontiguousarray(x)
    out = np.empty((R, nb, BLOCK_BYTES), dtype=np.uint8)

    if layout == Layout.D2S6:
        q, d = quantize_blocks(xp.reshape(R, nb, BLOCK_VALUES), 2 * QK)  # d [R, nb, 2]
        s = _sums(xp.reshape(R, nb, BLOCK_VALUES)[..., :96].reshape(R, nb, 6, 16))
        header = np.concatenate([to_half(d), to_half(s)], axis=-1)  # [R, nb, 8] half
        header = header.astype("<f2", copy=False)
    else:
        q, d = quantize_blocks(xp.reshape(R, nb, BLOCK_VALUES), QK)  # d [R, nb, 4]
        if layout == Layout.D4:
            header = d.astype("<f4", copy=False)
        else:
            s = _sums(xp.reshape(R, nb, 4, QK))  # [R, nb, 4]
            header = np.stack([to_half(d), to_half(s)], axis=-1).reshape(R, nb, 8)
            header = header.astype("<f2", copy=False)
    out[..., :HEADER_BYTES] = np.ascontiguousarray(header).view(np.uint8).reshape(
        R, nb, HEADER_BYTES
    )
    out[..., HEADER_BYTES:] = q.reshape(R, nb, BLOCK_VALUES).view(np.uint8)
    return out


# --------------------------------------------------------------------------- buffers


def _col_view(out: np.ndarray, n_rows: int, K: int) -> np.ndarray:
    """The flat buffer ``out`` as [Kp/128, R, 144] (a view, column-block-major)."""
    need = buffer_nbytes(n_rows, K)
    if not isinstance(out, np.ndarray) or out.dtype != np.uint8 or out.ndim != 1:
        raise TypeError("out must be a flat uint8 numpy array")
    if out.size != need:
        raise ValueError(
            f"q8_1 buffer has {out.size} bytes, {n_rows} rows of K={K} need {need}"
        )
    if not out.flags.c_contiguous:
        raise ValueError("out must be contiguous")
    return out.reshape(blocks_per_row(K), n_rows, BLOCK_BYTES)


def pack_rows(rows_blocks: np.ndarray) -> np.ndarray:
    """[R, nb, 144] row blocks -> a new flat column-block-major buffer."""
    rb = np.asarray(rows_blocks)
    if rb.dtype != np.uint8 or rb.ndim != 3 or rb.shape[2] != BLOCK_BYTES:
        raise ValueError(f"pack_rows expects uint8 [R, nb, {BLOCK_BYTES}], got {rb.dtype} {rb.shape}")
    return np.ascontiguousarray(rb.transpose(1, 0, 2)).reshape(-1)


def unpack_rows(buffer: np.ndarray, n_rows: int) -> np.ndarray:
    """A flat buffer -> [R, nb, 144] (a strided view onto ``buffer``, no copy)."""
    buf = np.asarray(buffer)
    if buf.dtype != np.uint8 or buf.ndim != 1:
        raise TypeError("unpack_rows expects a flat uint8 buffer")
    if n_rows <= 0:
        if buf.size:
            raise ValueError(f"{buf.size} bytes for 0 rows")
        return buf.reshape(0, 0, BLOCK_BYTES)
    per_row = n_rows * BLOCK_BYTES
    if buf.size % per_row:
        raise ValueError(f"q8_1 buffer of {buf.size} bytes does not hold {n_rows} whole rows")
    nb = buf.size // per_row
    return buf.reshape(nb, n_rows, BLOCK_BYTES).transpose(1, 0, 2)


def gather_quantize(x, src, layout, out: np.ndarray) -> np.ndarray:
    """Row r of the buffer = quantize(x[src[r]]). ``out`` is the flat buffer; returned."""
    x = f32(x)
    src = np.asarray(src)
    if src.ndim != 1 or src.dtype.kind not in "iu":
        raise ValueError("src must be a 1-D integer array")
    view = _col_view(out, src.size, x.shape[1])
    if src.size:
        view[...] = quantize_rows(x[src], layout).transpose(1, 0, 2)
    return out


def scatter_quantize(x, slot, K_used: int, layout, out: np.ndarray) -> np.ndarray:
    """Quantize each token t of x [T, K] once, write its blocks to rows slot[t*K_used + k].

    ``out`` is the flat buffer of ``T * K_used`` rows; returned.
    """
    x = f32(x)
    slot = np.asarray(slot)
    T = x.shape[0]
    if slot.ndim != 1 or slot.dtype.kind not in "iu" or slot.size != T * K_used:
        raise ValueError(f"slot must be 1-D integer of T*K_used = {T * K_used} entries")
    view = _col_view(out, slot.size, x.shape[1])
    if T:
        qt = quantize_rows(x, layout).transpose(1, 0, 2)  # [nb, T, 144]
        s = slot.reshape(T, K_used)
        for k in range(K_used):
            view[:, s[:, k], :] = qt
    return out


# --------------------------------------------------------------------------- decode


@dataclass
class Q8Rows:
    """Decoded q8_1 rows, as the MMQ products consume them.

    codes  int8    [R, Kp/32, 32]
    d      float32 [R, Kp/32]   the scale of each 32-block (D4: its float; DS4: its half;
                                D2S6: its 64-group's half), as float32
    s      float32 [R, Kp/32]   DS4 block sums (half -> float), else None
    s16    float32 [R, 6*Kp/128] D2S6 16-value sums s0..s5 of each 128-block, else None
    layout the buffer's Layout
    """

    codes: np.ndarray
    d: np.ndarray
    s: np.ndarray | None
    s16: np.ndarray | None
    layout: Layout


def decode_rows(buffer_or_rows, n_rows: int, layout) -> Q8Rows:
    """Decode a flat buffer (with ``n_rows`` rows) or row blocks [R, nb, 144]."""
    layout = _layout(layout)
    arr = np.asarray(buffer_or_rows)
    rows = arr if arr.ndim == 3 else unpack_rows(arr, n_rows)
    if rows.dtype != np.uint8 or rows.shape[-1] != BLOCK_BYTES:
        raise ValueError(f"not q8_1 blocks: {rows.dtype} {rows.shape}")
    R, nb = rows.shape[:2]
    if arr.ndim == 3 and n_rows is not None and R != n_rows:
        raise ValueError(f"{R} rows given, n_rows says {n_rows}")
    codes = np.ascontiguousarray(rows[..., HEADER_BYTES:]).view(np.int8).reshape(R, nb * 4, QK)
    hdr = np.ascontiguousarray(rows[..., :HEADER_BYTES])
    s = s16 = None
    if layout == Layout.D4:
        d = hdr.view("<f4").reshape(R, nb * 4).astype(np.float32)
    else:
        h = hdr.view("<f2").reshape(R, nb, 8).astype(np.float32)
        if layout == Layout.DS4:
            d = h[..., 0::2].reshape(R, nb * 4)
            s = np.ascontiguousarray(h[..., 1::2]).reshape(R, nb * 4)
        else:
            d = np.repeat(h[..., 0:2], 2, axis=-1).reshape(R, nb * 4)
            s16 = np.ascontiguousarray(h[..., 2:8]).reshape(R, nb * 6)
        d = np.ascontiguousarray(d)
    return Q8Rows(codes=codes, d=d, s=s, s16=s16, layout=layout)


def describe_block(block_bytes, layout) -> str:
    """One 144-byte block, human-readable: header values (with half/float bits) and codes."""
    layout = _layout(layout)
    b = np.asarray(block_bytes, dtype=np.uint8).reshape(-1)
    if b.size != BLOCK_BYTES:
        raise ValueError(f"a q8_1 block is {BLOCK_BYTES} bytes, got {b.size}")
    hdr = b[:HEADER_BYTES]
    lines = [f"q8_1 block ({layout.name}), header {hdr.tobytes().hex(' ')}"]
    if layout == Layout.D4:
        vals = hdr.view("<f4")
        bits = hdr.view("<u4")
        lines.append(
            "  d = " + ", ".join(f"{v!r}(0x{int(u):08x})" for v, u in zip(vals.tolist(), bits))
        )
    else:
        vals = hdr.view("<f2").astype(np.float32).tolist()
        bits = hdr.view("<u2")
        fmt = [f"{v!r}(0x{int(u):04x})" for v, u in zip(vals, bits)]
        if layout == Layout.DS4:
            for j in range(4):
                lines.append(f"  d{j} = {fmt[2 * j]}, s{j} = {fmt[2 * j + 1]}")
        else:
            lines.append(f"  d0 = {fmt[0]}, d1 = {fmt[1]}")
            lines.append("  " + ", ".join(f"s{j} = {fmt[2 + j]}" for j in range(6)))
    codes = b[HEADER_BYTES:].view(np.int8)
    for j in range(4):
        c = codes[j * QK:(j + 1) * QK]
        lines.append(f"  codes[{j * QK:3d}:{(j + 1) * QK:3d}] " + " ".join(f"{int(v):4d}" for v in c))
    return "\n".join(lines)
