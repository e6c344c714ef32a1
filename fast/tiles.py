"""The row tiles of the tile-list MMQ launch (kernels/mmq.cu, tiles != NULL), in NumPy: how a
batch's expert-sorted rows are cut into the CTA tiles the launch walks. How rows are cut
changes which CTA computes an output element, never its arithmetic.

Two cuts of the same rows:
- :func:`row_tiles`: the host's, from the batch's (row_begin, row_end) bounds, which the host
  has after reading the routing counts back (fast/cuda/backend.py uploads it).
- :func:`routed_row_tiles`: the device's, from the routing tables' counts and offsets where they
  lie (device_plan, fast/walk.py): every expert of the layer with a weight offset and rows, in
  id order, then empty entries up to a worst-case count (:func:`max_row_tiles`) that the host
  knows without the counts. The definition of kernels/routing_tables.cu `routed_row_tiles`; the
  sim runs it as the device step.
"""
from __future__ import annotations

import numpy as np

from strata_prefill.contract.errors import InputError

#: default cap on activation rows per CTA tile (an expert's rows are cut into equal tiles)
DEFAULT_TILE_ROWS = 128


def row_tiles(bounds, woff, tile_rows: int) -> np.ndarray:
    """The tile list of a tile-list launch (mmq.cu): int32 [n, 4] rows (row_begin, row_end,
    low and high 32 bits of the expert's byte offset), one per row tile. Expert i's rows
    bounds[i] = (begin, end) are cut as the kernel's bounds path cuts them: ceil(rows /
    tile_rows) tiles of the same multiple of 8 rows, the last one shorter; experts with no rows
    give none. woff: int64 byte offsets of each expert's matrix (even)."""
    b = np.asarray(bounds, np.int64).reshape(-1, 2)
    woff = np.asarray(woff, np.int64).reshape(-1)
    if len(woff) != len(b):
        raise InputError(f"row_tiles: {len(b)} bounds but {len(woff)} offsets")
    if np.any(woff < 0) or np.any(woff % 2):
        raise InputError("row_tiles: weight offsets must be even and non-negative")
    rows = np.maximum(b[:, 1] - b[:, 0], 0)
    nrt = -(-rows // int(tile_rows))
    rpt = np.where(nrt > 0, ((-(-rows // np.maximum(nrt, 1))) + 7) // 8 * 8, 0)
    which = np.repeat(np.arange(len(b)), nrt)
    first = np.cumsum(nrt) - nrt
    k = np.arange(len(which)) - first[which]  # the tile's index within its expert
    begin = b[which, 0] + k * rpt[which]
    end = np.minimum(begin + rpt[which], b[which, 1])
    off = woff[which]
    out = np.stack([begin, end, off & 0xFFFFFFFF, off >> 32], axis=1)
    return out.astype(np.uint32).view(np.int32) if len(out) else np.zeros((0, 4), np.int32)


def max_row_tiles(n_rows: int, n_experts: int, tile_rows: int) -> int:
    """The most row tiles n_rows expert-sorted rows over at most n_experts experts can cut into
    (each expert's ceil(rows / tile_rows) summed): ceil(n_rows / tile_rows) plus one for each
    expert that can hold rows (min(n_experts, n_rows)). The device cut's length."""
    n_rows, n_experts, tile_rows = int(n_rows), int(n_experts), int(tile_rows)
    if n_rows <= 0 or n_experts <= 0:
        return 0
    return -(-n_rows // tile_rows) + min(n_experts, n_rows)


def routed_row_tiles(cnt, off, woff, tile_rows: int, n_max: int) -> np.ndarray:
    """The device's cut (kernels/routing_tables.cu `routed_row_tiles`): int32 [n_max, 4]. First
    row_tiles of every expert e with woff[e] >= 0 and cnt[e] > 0, in id order, over its rows
    (off[e], off[e] + cnt[e]) of the routing tables (strata_prefill.contract.routing.RoutingTables); then
    empty entries (0, 0, 0, 0), which the launch skips (mmq.cu's MMQ_EMPTY_EXIT). woff: int64
    [E] byte offsets of each expert's matrix, -1 where the expert has none here (it streams).
    n_max: at least the tiles cut (max_row_tiles), else an InputError."""
    cnt, off = np.asarray(cnt, np.int64).reshape(-1), np.asarray(off, np.int64).reshape(-1)
    woff = np.asarray(woff, np.int64).reshape(-1)
    if not len(cnt) == len(off) == len(woff):
        raise InputError(f"routed_row_tiles: {len(cnt)} counts, {len(off)} offsets, {len(woff)} weight offsets")
    mine = np.flatnonzero((woff >= 0) & (cnt > 0))
    cut = row_tiles(np.stack([off[mine], off[mine] + cnt[mine]], axis=1), woff[mine], tile_rows)
    if len(cut) > int(n_max):
        raise InputError(f"routed_row_tiles: {len(cut)} tiles do not fit in {int(n_max)}")
    out = np.zeros((int(n_max), 4), np.int32)
    out[:len(cut)] = cut
    return out
