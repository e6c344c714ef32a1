"""The row tiles of the tile-list MMQ launch (kernels/mmq.cu, tiles != NULL), in NumPy: how a
batch's expert-sorted rows are cut into the CTA tiles the launch walks. How rows are cut
changes which CTA computes an output element, never its arithmetic.

Two cuts of the same rows:
- :func:`row_tiles`: the host's, from the batch's (row_begin, row_end) bounds, which the host
  has after reading the routing counts back (fast/cuda/backend.py uploads it).
- :func:`routed_row_lists`: the device's, from the routing tables' counts and offsets where
  they lie (device_plan, fast/walk.py): every expert of the layer with a weight offset and rows,
  in id order, then empty entries up to a worst-case count (:func:`max_row_tiles`) that the host
  knows without the counts. The host cannot see the mean rows per expert that picks a tile
  configuration (products.AUTO_CONFIGS), so it hands over one list per configuration the mean
  could call for (a :class:`ListPlan` each) and the device cuts the one the counts choose
  (:func:`routed_choice`); the others stay empty, with a live count of 0. The definition of
  kernels/routing_tables.cu `routed_row_tiles`; the sim runs it as the device step.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from strata_prefill.contract.errors import InputError

#: default cap on activation rows per CTA tile (row_tiles cuts whole tiles of this many rows)
DEFAULT_TILE_ROWS = 128


def checked_tile_rows(tile_rows, who: str) -> int:
    """tile_rows as an int, or an InputError naming `who`: a cut's tiles hold whole n8 tiles of
    activation rows, all but an expert's last, so tile_rows is a positive multiple of 8."""
    tile_rows = int(tile_rows)
    if tile_rows <= 0 or tile_rows % 8:
        raise InputError(f"{who}: tile_rows must be a positive multiple of 8, got {tile_rows}")
    return tile_rows


def row_tiles(bounds, woff, tile_rows: int) -> np.ndarray:
    """The tile list of a tile-list launch (mmq.cu): int32 [n, 4] rows (row_begin, row_end,
    low and high 32 bits of the expert's byte offset), one per row tile. Expert i's rows
    bounds[i] = (begin, end) are cut into ceil(rows / tile_rows) tiles of tile_rows rows (a
    multiple of 8), the last one what remains; experts with no rows give none. Whole tiles
    rather than equal ones: a warp's n8-tile count picks the unrolled body it runs (mmq.cu
    mmq2_dispatch), and whole tiles keep most warps of an SM in the one body of a whole tile
    where equal cuts spread them over several (docs/performance.md, "The row cut of a tile list").
    woff: int64 byte offsets of each expert's matrix (even)."""
    b = np.asarray(bounds, np.int64).reshape(-1, 2)
    woff = np.asarray(woff, np.int64).reshape(-1)
    if len(woff) != len(b):
        raise InputError(f"row_tiles: {len(b)} bounds but {len(woff)} offsets")
    if np.any(woff < 0) or np.any(woff % 2):
        raise InputError("row_tiles: weight offsets must be even and non-negative")
    tile_rows = checked_tile_rows(tile_rows, "row_tiles")
    rows = np.maximum(b[:, 1] - b[:, 0], 0)
    nrt = -(-rows // tile_rows)
    which = np.repeat(np.arange(len(b)), nrt)
    first = np.cumsum(nrt) - nrt
    k = np.arange(len(which)) - first[which]  # the tile's index within its expert
    begin = b[which, 0] + k * tile_rows
    end = np.minimum(begin + tile_rows, b[which, 1])
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


class ListPlan(NamedTuple):
    """One list of a device cut: its tile configuration's row-tile cap (BN), the mean rows per
    routed expert below which the configuration is chosen (0: no bound), and the list's length
    (at least max_row_tiles of the rows at tile_rows)."""
    tile_rows: int
    bound: int
    n_max: int


def list_starts(plans) -> list[int]:
    """Each list's first entry in a device cut's tiles (:func:`routed_row_lists`: the plans'
    lists one after another, each n_max entries long)."""
    return [int(v) for v in np.cumsum([0] + [int(p[2]) for p in plans[:-1]])]


def routed_choice(cnt, woff, bounds) -> int:
    """The list the device cuts: the first whose bound exceeds the mean rows per routed expert
    (rows / experts with a weight offset and rows, compared as rows < bound * experts, exact in
    integers), else the last; the last too where no expert has rows. bounds: each list's (0:
    none). The host's plan picks the same way from the experts it routes (products.auto_config
    of rows / experts)."""
    cnt, woff = np.asarray(cnt, np.int64).reshape(-1), np.asarray(woff, np.int64).reshape(-1)
    mine = (woff >= 0) & (cnt > 0)
    n_exp, rows = int(mine.sum()), int(cnt[mine].sum())
    for i, bound in enumerate(bounds):
        if bound > 0 and rows < int(bound) * n_exp:
            return i
    return len(bounds) - 1


def routed_row_lists(cnt, off, woff, plans) -> tuple[np.ndarray, np.ndarray]:
    """The device's cut (kernels/routing_tables.cu `routed_row_tiles`): (tiles int32 [sum of the
    plans' n_max, 4], the lists one after another; live int32 [len(plans)]). The chosen list
    (routed_choice) holds row_tiles of every expert e with woff[e] >= 0 and cnt[e] > 0, in id
    order, over its rows (off[e], off[e] + cnt[e]) of the routing tables
    (strata_prefill.contract.routing.RoutingTables) at its tile_rows, then empty entries (0, 0, 0,
    0); every other list is empty entries. live: the chosen list's tiles cut, 0 for the others:
    the launch over a list reads it and no CTA past it loads anything (mmq.cu's MMQ_EMPTY_EXIT).
    woff: int64 [E] byte offsets of each expert's matrix, -1 where the expert has none here (it
    streams). A list shorter than its cut is an InputError."""
    cnt, off = np.asarray(cnt, np.int64).reshape(-1), np.asarray(off, np.int64).reshape(-1)
    woff = np.asarray(woff, np.int64).reshape(-1)
    if not len(cnt) == len(off) == len(woff):
        raise InputError(f"routed_row_lists: {len(cnt)} counts, {len(off)} offsets, {len(woff)} weight offsets")
    plans = [ListPlan(*map(int, p)) for p in plans]
    if not plans:
        raise InputError("routed_row_lists: no list to cut")
    chosen = routed_choice(cnt, woff, [p.bound for p in plans])
    mine = np.flatnonzero((woff >= 0) & (cnt > 0))
    cut = row_tiles(np.stack([off[mine], off[mine] + cnt[mine]], axis=1), woff[mine], plans[chosen].tile_rows)
    if len(cut) > plans[chosen].n_max:
        raise InputError(f"routed_row_lists: {len(cut)} tiles do not fit in {plans[chosen].n_max}")
    tiles = np.zeros((sum(p.n_max for p in plans), 4), np.int32)
    first = list_starts(plans)[chosen]
    tiles[first:first + len(cut)] = cut
    live = np.zeros(len(plans), np.int32)
    live[chosen] = len(cut)
    return tiles, live
