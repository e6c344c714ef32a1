"""Causal attention over a quantized KV cache: the NumPy definition, attention contract v2
(docs/numerics.md, section 5).

Q and K are quantized per head row (Q to 9-bit codes, |q| <= 255; K to 10-bit codes,
|k| <= 511; one float32 scale per row each), so a score is one exact integer dot product and
two float32 products, in base-2 units: s = (sumf * dk) * (dq * log2(e) / sqrt(head_dim)).
Keys are visited in blocks of 64 at absolute positions with an online softmax in base 2
(`exp2c`, strata_prefill.contract.numerics), merged in ascending order. P is folded with V's
per-token scale and quantized to int8 per (query, key block), half to even, so P.V is an exact
integer too, and O takes it with one fused multiply-add. The attention kernels name `attend`
here, the KV-cache kernels `KVCache.write`.

Two options, both off by default (then not one operation differs): a learned sink logit per
query head, which joins each row's softmax as a key whose value is zero (the online softmax
starts from it: M = sink * log2(e), L = 1), and a sliding window of `window` keys (a key is
masked when position - key >= window), whose key blocks wholly outside a query's window are
not visited (section 5, "Sinks" and "Sliding window").
"""
from __future__ import annotations

import math

import numpy as np

from strata_prefill.contract import numerics, parallel
from strata_prefill.contract.blockquant import quantize_blocks
from strata_prefill.contract.constants import KEY_BLOCK, K_QMAX, Q_QMAX

F32 = np.float32


def quantize_int8(x: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """V's int8 rows (codes int8 [..., n], scales float32 [..., n/block]) by the shared loop,
    rule INVERSE (docs/numerics.md sections 2 and 5); a block whose 127/amax is not finite
    stores scale 0 and codes 0. The KV-cache kernel names this function."""
    return quantize_blocks(np.asarray(x, dtype=F32), block)


def quantize_rows(x: np.ndarray, qmax: int) -> tuple[np.ndarray, np.ndarray]:
    """Q's (qmax 255) or K's (qmax 511) codes per head row: (codes int16 [..., hd], scales
    float32 [...]) by the shared loop, rule INVERSE with code bound qmax over the whole row
    (docs/numerics.md section 5); a row whose qmax/amax is not finite stores scale 0 and codes
    0. The KV-cache and attention kernels name this function."""
    x = np.asarray(x, dtype=F32)
    codes, d = quantize_blocks(x, x.shape[-1], qmax=qmax)
    return codes, d[..., 0]


def quantize_p(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The folded P's int8 codes per block of 64 keys along the last axis, rule INVERSE, codes
    by rint (half to even): (codes int8 [..., 64], dw float32 [..., 1])."""
    return quantize_blocks(w, KEY_BLOCK, half_to_even=True)


def kq2(head_dim: int) -> np.float32:
    """log2(e) / sqrt(head_dim), computed in float64 and rounded once to float32: a score's
    factor into base-2 units (docs/numerics.md section 5, KQ2)."""
    return F32(1.0 / (math.log(2.0) * math.sqrt(head_dim)))


def cache_layout(head_dim: int) -> tuple:
    """(name, dtype, trailing shape after [n_kv, capacity]) of each per-layer array of the KV
    cache: the layout KVCache and the device's cache (fast/cuda/attention.py) both keep."""
    return (("k_codes", np.float16, (head_dim,)), ("k_scale", F32, ()), ("v_codes", np.int8, (head_dim,)),
            ("v_scale", F32, ()))


class KVCache:
    """K as 10-bit codes held in float16 (exact: integers up to 2048), one float32 scale per
    token and KV head, and int8 V, one float32 scale per token and KV head. Per layer:
    k_codes float16 [n_kv, cap, hd], k_scale float32 [n_kv, cap], v_codes int8 [n_kv, cap, hd],
    v_scale float32 [n_kv, cap]."""

    def __init__(self, n_layer: int, n_head_kv: int, head_dim: int, capacity: int = 4 * KEY_BLOCK):
        self.n_layer, self.n_head_kv, self.head_dim = n_layer, n_head_kv, head_dim
        self.capacity = 0
        self.k_codes: list[np.ndarray] = []
        self.k_scale: list[np.ndarray] = []
        self.v_codes: list[np.ndarray] = []
        self.v_scale: list[np.ndarray] = []
        self._grow(capacity)

    def _layout(self) -> tuple:
        return cache_layout(self.head_dim)

    def _grow(self, capacity: int) -> None:
        for name, dtype, tail in self._layout():
            olds = getattr(self, name) if self.capacity else [None] * self.n_layer
            news = []
            for old in olds:
                new = np.zeros((self.n_head_kv, capacity, *tail), dtype=dtype)
                if old is not None:
                    new[:, : old.shape[1]] = old
                news.append(new)
            setattr(self, name, news)
        self.capacity = capacity

    def _reserve(self, positions: np.ndarray) -> None:
        """Capacity in whole key blocks for keys 0 .. max(positions), so attention can read
        every block it visits (doubling)."""
        need = -(-(int(positions.max()) + 1) // KEY_BLOCK) * KEY_BLOCK
        if need > self.capacity:
            self._grow(max(need, 2 * self.capacity))

    def write(self, layer: int, positions: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
        """Store k, v [T, n_head_kv, head_dim] (float32) at the given absolute positions."""
        self._reserve(positions)
        kq, kd = quantize_rows(k, K_QMAX)
        vq, vd = quantize_int8(v, self.head_dim)
        self.k_codes[layer][:, positions] = kq.astype(np.float16).transpose(1, 0, 2)
        self.k_scale[layer][:, positions] = kd.T
        self.v_codes[layer][:, positions] = vq.transpose(1, 0, 2)
        self.v_scale[layer][:, positions] = vd[..., 0].T


# Bound on one piece's [heads, queries, keys] float32 scratch (a piece runs on one thread).
_TILE_BYTES = 64 << 20
# Queries of a tile at most: a tile visits every key block up to its last query, so tiles
# of one key block's length compute the fewest masked scores.
_TILE_QUERIES = KEY_BLOCK


def window_start(positions, window: int | None):
    """The first key each query at `positions` sees: position - window + 1, at least 0 (0
    without a window). A key j is valid for the query iff window_start <= j <= position."""
    positions = np.asarray(positions)
    if window is None:
        return np.zeros_like(positions)
    return np.maximum(positions - (int(window) - 1), 0)


def check_options(n_head: int, sinks, window):
    """(sinks as float32 [n_head] or None, window as an int or None), refused with a one-line
    ValueError where they are malformed."""
    if window is not None:
        if isinstance(window, bool) or int(window) != window or int(window) < 1:
            raise ValueError(f"attention window must be a whole number of keys >= 1, got {window!r}")
        window = int(window)
    if sinks is not None:
        sinks = np.asarray(sinks)
        if sinks.dtype != F32 or sinks.shape != (n_head,):
            raise ValueError(f"attention sinks must be float32 [{n_head}], got {sinks.dtype} {sinks.shape}")
    return sinks, window


def attend(cache: KVCache, layer: int, q: np.ndarray, positions: np.ndarray, sinks: np.ndarray | None = None,
           window: int | None = None) -> np.ndarray:
    """Causal attention of q [T, n_head, hd] (float32, after norm and RoPE) at absolute
    `positions` over the cache's keys 0..position. Returns [T, n_head, hd] float32.

    sinks: float32 [n_head], each head's sink logit (None: no sink). window: each query sees
    the keys position - window + 1 .. position only (None: every key up to its position).

    Queries and heads are independent: a (query tile, KV head) piece computes its queries of
    the query heads that KV head serves, each by the same operations whatever the tile, and
    the pieces run on the threads of strata_prefill.contract.parallel."""
    n_head, hd = q.shape[1], q.shape[2]
    sinks, window = check_options(n_head, sinks, window)
    n_k = -(-(int(positions.max()) + 1) // KEY_BLOCK) * KEY_BLOCK

    # Q's codes and its scale in base-2 units, dqs = dq * KQ2, for all pieces at once; each
    # KV head's keys and values widened to float32 once, for all of its tiles.
    qc, qd = quantize_rows(q, Q_QMAX)  # int16 [T, H, hd], float32 [T, H]
    dqs = qd * kq2(hd)
    kv = [(cache.k_codes[layer][kvh, :n_k].astype(F32), cache.k_scale[layer][kvh, :n_k],
           cache.v_codes[layer][kvh, :n_k].astype(F32), cache.v_scale[layer][kvh, :n_k])
          for kvh in range(cache.n_head_kv)]
    sinks2 = None if sinks is None else sinks * numerics.LOG2E  # the sink logits in base 2

    def tile(rows, heads, kvh, pos, n_blk, b0):
        return _attend_tile(kv[kvh], qc[rows, heads], dqs[rows, heads], pos, n_blk, b0=b0, window=window,
                            sink2=None if sinks2 is None else sinks2[heads])

    return by_pieces(q.shape, cache.n_head_kv, positions, window, tile)


def by_pieces(q_shape, n_head_kv: int, positions: np.ndarray, window: int | None, tile) -> np.ndarray:
    """Causal attention's output [T, n_head, hd] float32, computed a (query tile, KV head)
    piece at a time on the threads of strata_prefill.contract.parallel: ``tile(rows, heads,
    kvh, pos, n_blk, b0)`` returns the piece's [tile queries, group, hd], for its queries
    (slice ``rows``, positions ``pos``) of the query heads KV head ``kvh`` serves (slice
    ``heads``) over key blocks ``b0 .. n_blk - 1``: up to its last query's position, and with
    a window from the block of its earliest query's first key. Tiles are as long as
    _TILE_BYTES of scores allows, at most a key block."""
    n_tok, n_head, hd = q_shape
    out = np.empty(q_shape, dtype=F32)
    n_k = -(-(int(positions.max()) + 1) // KEY_BLOCK) * KEY_BLOCK
    group = n_head // n_head_kv
    per_query = 4 * group * n_k * 4
    size = max(1, min(_TILE_QUERIES, _TILE_BYTES // per_query))
    pieces = [(t0, kvh) for t0 in range(0, n_tok, size) for kvh in range(n_head_kv)]

    def run(piece):
        t0, kvh = piece
        rows, heads = slice(t0, t0 + size), slice(kvh * group, (kvh + 1) * group)
        pos = positions[rows]
        b0 = int(window_start(pos, window).min()) // KEY_BLOCK
        out[rows, heads] = tile(rows, heads, kvh, pos, int(pos.max()) // KEY_BLOCK + 1, b0)

    parallel.map_ordered(run, pieces)
    return out


def _attend_tile(kv, qc: np.ndarray, dqs: np.ndarray, pos: np.ndarray, n_blk: int, b0: int = 0,
                 window: int | None = None, sink2: np.ndarray | None = None) -> np.ndarray:
    """The query heads that one KV head serves (GQA), as codes qc [T, group, hd] with their
    scales in base-2 units dqs [T, group], over key blocks b0..n_blk-1. kv: that head's keys
    and values, shared by its query heads (broadcast over them): K codes as float32 [keys, hd],
    K scales [keys], V codes as float32 [keys, hd], V scales [keys]. window: as attend's;
    sink2: the group's sink logits in base 2 [group]."""
    n_tok, n_head, hd = qc.shape
    key0 = b0 * KEY_BLOCK  # the first key visited
    n_blk -= b0
    n_k = n_blk * KEY_BLOCK
    kc, kd = kv[0][key0:key0 + n_k], kv[1][key0:key0 + n_k]
    vc, vd = kv[2][key0:key0 + n_k], kv[3][key0:key0 + n_k]

    # Scores in base 2: the exact integer dot, then s = (sumf * dk) * dqs. |sumf| <= hd * 255 *
    # 511 is below 2^24 up to head_dim 128, so a float32 product is exact in any order; above,
    # the exact integer (float64 holds it) is rounded to float32 once.
    qc = np.ascontiguousarray(qc.astype(F32).transpose(1, 0, 2)).reshape(n_head * n_tok, hd)
    if hd * Q_QMAX * K_QMAX < 2**24:
        s = np.matmul(qc, kc.T)
    else:
        s = np.matmul(qc.astype(np.float64), kc.T.astype(np.float64)).astype(F32)
    s = s.reshape(n_head, n_tok, n_k)
    np.multiply(s, kd[None, None, :], out=s)
    np.multiply(s, np.ascontiguousarray(dqs.T)[:, :, None], out=s)

    k0, masked = mask_invalid(s, pos, key0, window)
    s = s.reshape(n_head, n_tok, n_blk, KEY_BLOCK)

    # (exp2c's clamp of a NaN where the maximum is still -inf: never merged)
    m_prev, m_run = running_max(s, sink2)
    with np.errstate(invalid="ignore"):  # -inf - -inf in the blocks outside a window
        # exp2c(-inf) = 2^-125 for the first block: it multiplies L = 0 and O = 0
        alpha = numerics.exp2c(m_prev - m_run)
        np.subtract(s, m_run[..., None], out=s)
        p = numerics.exp2c(s)
    np.copyto(p.reshape(n_head, n_tok, n_k)[:, :, k0:], F32(0.0), where=masked)
    lsum = numerics.tree_sum(p, axis=-1)  # [H, T, n_blk]

    # P folded with V's per-token scale, quantized to int8 per (query, key block), half to
    # even. A key block far below the running maximum can have amax under 127/FLT_MAX: scale
    # 0, codes 0.
    np.multiply(p, vd.reshape(1, 1, n_blk, KEY_BLOCK), out=p)
    wq, wd = quantize_p(p)  # [H, T, n_blk, 64], [H, T, n_blk, 1]
    vc_blk = vc.reshape(n_blk, KEY_BLOCK, hd)
    pv = np.matmul(wq.astype(F32).transpose(0, 2, 1, 3), vc_blk)  # [H, n_blk, T, hd], exact ints

    # Merge the blocks: L = L * alpha + lsum, O = fma(dw, pv, O * alpha). A sink starts L at
    # exp2c(sink2 - sink2) = 1.
    return merge_blocks(alpha, lsum, pos, b0, window, sink2 is not None, hd,
                        lambda o, c: numerics.fma(wd[:, :, c], pv[:, c], o))


def mask_invalid(s: np.ndarray, pos: np.ndarray, key0: int, window: int | None):
    """Set the scores s [H, T, n_k] of keys key0 .. key0 + n_k - 1 to -inf where invalid for
    their query: after its position, and with a window before its first key (window_start).
    Keys up to the tile's first position are valid for every query, so without a window only
    the keys after it are looked at. Returns (k0, masked): s[:, :, k0:] was masked where
    ``masked`` [1, T, n_k - k0] holds (p is zeroed by the same)."""
    n_k = s.shape[-1]
    keys = np.arange(key0, key0 + n_k)
    if window is None:
        k0 = min(n_k, int(pos.min()) + 1 - key0)
        masked = (keys[None, k0:] > pos[:, None])[None]
    else:
        k0 = 0
        masked = ((keys[None, :] > pos[:, None]) | (keys[None, :] < window_start(pos, window)[:, None]))[None]
    np.copyto(s[:, :, k0:], F32(-np.inf), where=masked)
    return k0, masked


def running_max(s: np.ndarray, start: np.ndarray | None):
    """(m_prev, m_run) [H, T, n_blk] of the scores s [H, T, n_blk, 64]: the running maximum
    before and after each block (max is exact in any order). ``start`` [H] (a sink's score):
    the maximum before the first block, else -inf. A block wholly outside a query's window
    has m_blk = -inf and leaves the running maximum as it is; its alpha and p are never
    merged."""
    n_head, n_tok = s.shape[:2]
    m_blk = s.max(axis=-1)
    if start is None:
        m_run = np.maximum.accumulate(m_blk, axis=-1)
        m_prev = np.concatenate([np.full_like(m_run[..., :1], -np.inf), m_run[..., :-1]], axis=-1)
    else:
        first = np.broadcast_to(start[:, None, None], (n_head, n_tok, 1))
        m_all = np.maximum.accumulate(np.concatenate([first, m_blk], axis=-1), axis=-1)
        m_prev, m_run = m_all[..., :-1], m_all[..., 1:]
    return m_prev, m_run


def merge_blocks(alpha, lsum, pos, b0: int, window: int | None, sink: bool, hd: int, add_block) -> np.ndarray:
    """The online softmax's merge of key blocks b0 .. b0 + n_blk - 1 in ascending order, and
    out = O / L, as [T, H, hd]: per block c, L = L * alpha + lsum and O = add_block(O * alpha,
    c) (each contract's way of adding the block's P.V). A query starts at the block holding
    its first key and stops at the block holding its position; L starts at 1 with a sink
    (its own exp(0)), else 0. alpha, lsum: [H, T, n_blk]."""
    n_head, n_tok, n_blk = alpha.shape
    last_blk = pos // KEY_BLOCK - b0  # [T]
    first_blk = window_start(pos, window) // KEY_BLOCK - b0
    acc_l = (np.ones if sink else np.zeros)((n_head, n_tok), dtype=F32)
    acc_o = np.zeros((n_head, n_tok, hd), dtype=F32)
    all_from, all_live = int(first_blk.max()), int(last_blk.min())  # blocks live for every query
    for c in range(n_blk):
        a = alpha[:, :, c]
        if all_from <= c <= all_live:  # in place
            np.multiply(acc_l, a, out=acc_l)
            np.add(acc_l, lsum[:, :, c], out=acc_l)
            np.multiply(acc_o, a[..., None], out=acc_o)
            acc_o = add_block(acc_o, c)
            continue
        live = ((first_blk <= c) & (c <= last_blk))[None, :]  # [1, T]
        with np.errstate(invalid="ignore"):
            acc_l = np.where(live, acc_l * a + lsum[:, :, c], acc_l)
            acc_o = np.where(live[..., None], add_block(acc_o * a[..., None], c), acc_o)
    return (acc_o / acc_l[..., None]).transpose(1, 0, 2)
