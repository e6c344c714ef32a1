"""The attention contract before "attention contract v2" (docs/numerics.md section 5): kept
only so that bench/contract_cost.py (and tests/test_attention_options.py) can measure what the
change did, on the same data. Nothing else computes it.

v1: Q and K as int8 blocks of 32 values with one float32 scale each (the KV cache stored
K codes int8 [n_kv, cap, hd] and k_scale float32 [n_kv, cap, hd/32]); scores
s = sum_b (dq_b * dk_b) * sumi_b, then times float32(1/sqrt(head_dim)); the online softmax in
natural units with the degree-7 `exp` (strata_prefill.contract.numerics.exp); P codes by roundf;
O = O * alpha + dw * pv as two roundings. V, the key blocks of 64, sinks (M = sink) and windows
as in v2. The code is the retired strata_prefill.contract.attention of that contract, unchanged
but for this docstring and its imports.
"""
from __future__ import annotations

import math

import numpy as np

from strata_prefill.contract import numerics, parallel
from strata_prefill.contract.attention import check_options, window_start
from strata_prefill.contract.blockquant import quantize_blocks
from strata_prefill.contract.constants import KEY_BLOCK

QK_BLOCK = 32  # values per int8 Q/K scale (v1)
F32 = np.float32


def quantize_int8(x: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """The int8 blocks of K, V, Q and the folded P: (codes int8 [..., n], scales float32
    [..., n/block]) by the shared loop, rule INVERSE (docs/numerics.md sections 2 and 5);
    a block whose 127/amax is not finite stores scale 0 and codes 0. The KV-cache and
    attention kernels name this function."""
    return quantize_blocks(np.asarray(x, dtype=F32), block)


def kq_scale(head_dim: int) -> np.float32:
    """1/sqrt(head_dim), computed in float64 and rounded once to float32."""
    return F32(1.0 / math.sqrt(head_dim))


class KVCache:
    """int8 K (one scale per 32 values) and int8 V (one scale per token and head)."""

    def __init__(self, n_layer: int, n_head_kv: int, head_dim: int, capacity: int = 4 * KEY_BLOCK):
        self.n_layer, self.n_head_kv, self.head_dim = n_layer, n_head_kv, head_dim
        self.capacity = 0
        self.k_codes: list[np.ndarray] = []
        self.k_scale: list[np.ndarray] = []
        self.v_codes: list[np.ndarray] = []
        self.v_scale: list[np.ndarray] = []
        self._grow(capacity)

    def _grow(self, capacity: int) -> None:
        hkv, hd = self.n_head_kv, self.head_dim

        def grown(old, shape, dtype):
            new = np.zeros(shape, dtype=dtype)
            if old is not None:
                new[:, : old.shape[1]] = old
            return new

        n = self.n_layer
        olds = (self.k_codes, self.k_scale, self.v_codes, self.v_scale) if self.capacity else ([None] * n,) * 4
        self.k_codes = [grown(o, (hkv, capacity, hd), np.int8) for o in olds[0]]
        self.k_scale = [grown(o, (hkv, capacity, hd // QK_BLOCK), F32) for o in olds[1]]
        self.v_codes = [grown(o, (hkv, capacity, hd), np.int8) for o in olds[2]]
        self.v_scale = [grown(o, (hkv, capacity), F32) for o in olds[3]]
        self.capacity = capacity

    def write(self, layer: int, positions: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
        """Store k, v [T, n_head_kv, head_dim] (float32) at the given absolute positions."""
        # Capacity in whole key blocks, so attention can read every block it visits.
        need = -(-(int(positions.max()) + 1) // KEY_BLOCK) * KEY_BLOCK
        if need > self.capacity:
            self._grow(max(need, 2 * self.capacity))
        kq, kd = quantize_int8(k, QK_BLOCK)
        vq, vd = quantize_int8(v, self.head_dim)
        self.k_codes[layer][:, positions] = kq.transpose(1, 0, 2)
        self.k_scale[layer][:, positions] = kd.transpose(1, 0, 2)
        self.v_codes[layer][:, positions] = vq.transpose(1, 0, 2)
        self.v_scale[layer][:, positions] = vd[..., 0].T


# Bound on one piece's [heads, queries, keys] float32 scratch (a piece runs on one thread).
_TILE_BYTES = 64 << 20
# Queries of a tile at most: a tile visits every key block up to its last query, so tiles
# of one key block's length compute the fewest masked scores.
_TILE_QUERIES = KEY_BLOCK


def attend(cache: KVCache, layer: int, q: np.ndarray, positions: np.ndarray, sinks: np.ndarray | None = None,
           window: int | None = None) -> np.ndarray:
    """Causal attention of q [T, n_head, hd] (float32, after norm and RoPE) at absolute
    `positions` over the cache's keys 0..position. Returns [T, n_head, hd] float32.

    sinks: float32 [n_head], each head's sink logit (None: no sink). window: each query sees
    the keys position - window + 1 .. position only (None: every key up to its position).

    Queries and heads are independent: a (query tile, KV head) piece computes its queries of
    the query heads that KV head serves, each by the same operations whatever the tile, and
    the pieces run on the threads of strata_prefill.contract.parallel."""
    n_tok, n_head, hd = q.shape
    sinks, window = check_options(n_head, sinks, window)
    out = np.empty_like(q, dtype=F32)
    n_keys = int(positions.max()) + 1
    n_blk = -(-n_keys // KEY_BLOCK)
    n_k = n_blk * KEY_BLOCK
    group = n_head // cache.n_head_kv
    per_query = 4 * group * n_k * 4
    tile = max(1, min(_TILE_QUERIES, _TILE_BYTES // per_query))
    pieces = [(t0, kvh) for t0 in range(0, n_tok, tile) for kvh in range(cache.n_head_kv)]

    # Q's int8 blocks (32 values each, so per head and query), for all pieces at once; each
    # KV head's keys and values widened to float32 once, for all of its tiles.
    qc, qd = quantize_int8(q, QK_BLOCK)  # [T, H, hd], [T, H, hd/32]
    kv = [(cache.k_codes[layer][kvh, :n_k].astype(F32), np.ascontiguousarray(cache.k_scale[layer][kvh, :n_k].T),
           cache.v_codes[layer][kvh, :n_k].astype(F32), cache.v_scale[layer][kvh, :n_k])
          for kvh in range(cache.n_head_kv)]

    def run(piece):
        t0, kvh = piece
        rows, heads = slice(t0, t0 + tile), slice(kvh * group, (kvh + 1) * group)
        pos = positions[rows]
        # a tile visits only the key blocks up to its last query's position, and with a window
        # from the block of its earliest query's first key
        b0 = int(window_start(pos, window).min()) // KEY_BLOCK
        out[rows, heads] = _attend_tile(kv[kvh], qc[rows, heads], qd[rows, heads], pos,
                                        int(pos.max()) // KEY_BLOCK + 1, b0=b0, window=window,
                                        sink=None if sinks is None else sinks[heads])

    parallel.map_ordered(run, pieces)
    return out


def _attend_tile(kv, qc: np.ndarray, qd: np.ndarray, pos: np.ndarray, n_blk: int, b0: int = 0,
                 window: int | None = None, sink: np.ndarray | None = None) -> np.ndarray:
    """The query heads that one KV head serves (GQA), as int8 blocks qc [T, group, hd] with
    scales qd [T, group, hd/32], over key blocks b0..n_blk-1. kv: that head's keys and values,
    shared by its query heads (broadcast over them): K codes as float32 [keys, hd], K scales
    [hd/32, keys], V codes as float32 [keys, hd], V scales [keys]. window, sink: as attend's
    (sink: the group's sink logits [group])."""
    n_tok, n_head, hd = qc.shape
    key0 = b0 * KEY_BLOCK  # the first key visited
    n_blk -= b0
    n_k = n_blk * KEY_BLOCK
    kc, kd = kv[0][key0:key0 + n_k], kv[1][:, key0:key0 + n_k]
    vc, vd = kv[2][key0:key0 + n_k], kv[3][key0:key0 + n_k]

    # Scores: per 32-value block an exact integer dot, then the float epilogue in block order:
    # s = s + (qd * kd) * sumi per element.
    qc = np.ascontiguousarray(qc.astype(F32).transpose(1, 0, 2)).reshape(n_head * n_tok, hd)
    qd = np.ascontiguousarray(qd.transpose(2, 1, 0))  # [nb, H, T]
    s = np.zeros((n_head, n_tok, n_k), dtype=F32)
    t = np.empty_like(s)
    for b in range(hd // QK_BLOCK):
        cols = slice(b * QK_BLOCK, (b + 1) * QK_BLOCK)
        sumi = np.matmul(qc[:, cols], kc[:, cols].T).reshape(n_head, n_tok, n_k)  # exact ints
        np.multiply(qd[b, :, :, None], kd[b, None, None, :], out=t)
        np.multiply(t, sumi, out=t)
        np.add(s, t, out=s)
    np.multiply(s, kq_scale(hd), out=s)

    # Mask keys after each query's position. Keys up to the tile's first position are valid
    # for every query, so only the keys after it are looked at. With a window, keys before
    # each query's first key (window_start) too, over the whole span.
    keys = np.arange(key0, key0 + n_k)
    if window is None:
        k0 = min(n_k, int(pos.min()) + 1 - key0)
        masked = (keys[None, k0:] > pos[:, None])[None]  # [1, T, n_k - k0]
    else:
        k0 = 0
        masked = ((keys[None, :] > pos[:, None]) | (keys[None, :] < window_start(pos, window)[:, None]))[None]
    np.copyto(s[:, :, k0:], F32(-np.inf), where=masked)
    s = s.reshape(n_head, n_tok, n_blk, KEY_BLOCK)

    # Running maximum after each block (max is exact in any order); a sink is the maximum
    # before the first block. A block wholly outside a query's window has m_blk = -inf and
    # leaves the running maximum as it is; its alpha and p (NaN where the maximum is still
    # -inf) are never merged.
    m_blk = s.max(axis=-1)  # [H, T, n_blk]
    if sink is None:
        m_run = np.maximum.accumulate(m_blk, axis=-1)
        m_prev = np.concatenate([np.full_like(m_run[..., :1], -np.inf), m_run[..., :-1]], axis=-1)
    else:
        start = np.broadcast_to(sink[:, None, None], (n_head, n_tok, 1))
        m_all = np.maximum.accumulate(np.concatenate([start, m_blk], axis=-1), axis=-1)
        m_prev, m_run = m_all[..., :-1], m_all[..., 1:]
    with np.errstate(invalid="ignore"):  # -inf - -inf in the blocks outside a window
        alpha = numerics.exp(m_prev - m_run)  # exp(-inf) = 0 for the first block
        np.subtract(s, m_run[..., None], out=s)
        p = numerics.exp(s)
    np.copyto(p.reshape(n_head, n_tok, n_k)[:, :, k0:], F32(0.0), where=masked)
    lsum = numerics.tree_sum(p, axis=-1)  # [H, T, n_blk]

    # P folded with V's per-token scale, quantized to int8 per (query, key block). A key block
    # far below the running maximum can have amax under 127/FLT_MAX: scale 0, codes 0.
    np.multiply(p, vd.reshape(1, 1, n_blk, KEY_BLOCK), out=p)
    wq, wd = quantize_int8(p, KEY_BLOCK)  # [H, T, n_blk, 64], [H, T, n_blk, 1]
    vc_blk = vc.reshape(n_blk, KEY_BLOCK, hd)
    pv = np.matmul(wq.astype(F32).transpose(0, 2, 1, 3), vc_blk)  # [H, n_blk, T, hd], exact ints
    ob = wd.transpose(0, 2, 1, 3) * pv  # [H, n_blk, T, hd]

    # Merge the blocks in ascending order; a query starts at the block holding its first key
    # and stops at the block holding its position. A sink starts L at exp(sink - sink) = 1.
    last_blk = pos // KEY_BLOCK - b0  # [T]
    first_blk = window_start(pos, window) // KEY_BLOCK - b0
    acc_l = (np.zeros if sink is None else np.ones)((n_head, n_tok), dtype=F32)
    acc_o = np.zeros((n_head, n_tok, hd), dtype=F32)
    all_from, all_live = int(first_blk.max()), int(last_blk.min())  # blocks live for every query
    for c in range(n_blk):
        a = alpha[:, :, c]
        if all_from <= c <= all_live:  # acc = acc * a + block, in place
            np.multiply(acc_l, a, out=acc_l)
            np.add(acc_l, lsum[:, :, c], out=acc_l)
            np.multiply(acc_o, a[..., None], out=acc_o)
            np.add(acc_o, ob[:, c], out=acc_o)
            continue
        live = ((first_blk <= c) & (c <= last_blk))[None, :]  # [1, T]
        with np.errstate(invalid="ignore"):
            acc_l = np.where(live, acc_l * a + lsum[:, :, c], acc_l)
            acc_o = np.where(live[..., None], acc_o * a[..., None] + ob[:, c], acc_o)
    return (acc_o / acc_l[..., None]).transpose(1, 0, 2)
