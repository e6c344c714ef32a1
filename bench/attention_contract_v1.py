"""The attention contract before "attention contract v2" (docs/numerics.md section 5): kept
only so that bench/contract_cost.py (and tests/test_attention_options.py) can measure what the
change did, on the same data. Nothing else computes it.

v1: Q and K as int8 blocks of 32 values with one float32 scale each (the KV cache stored
K codes int8 [n_kv, cap, hd] and k_scale float32 [n_kv, cap, hd/32]); scores
s = sum_b (dq_b * dk_b) * sumi_b, then times float32(1/sqrt(head_dim)); the online softmax in
natural units with the degree-7 `exp` (strata_prefill.contract.numerics.exp); P codes by roundf;
O = O * alpha + dw * pv as two roundings. V, the key blocks of 64, sinks (M = sink) and windows
as in v2. The code is the retired strata_prefill.contract.attention of that contract; the steps
both contracts share (the cache's growth, the pieces, the masks, the running maximum, the
merge's order and liveness) are v2's own, called from here.
"""
from __future__ import annotations

import math

import numpy as np

from strata_prefill.contract import attention, numerics
from strata_prefill.contract.attention import check_options, quantize_int8
from strata_prefill.contract.constants import KEY_BLOCK

QK_BLOCK = 32  # values per int8 Q/K scale (v1)
F32 = np.float32


def kq_scale(head_dim: int) -> np.float32:
    """1/sqrt(head_dim), computed in float64 and rounded once to float32."""
    return F32(1.0 / math.sqrt(head_dim))


class KVCache(attention.KVCache):
    """int8 K (one scale per 32 values) and int8 V (one scale per token and head)."""

    def _layout(self) -> tuple:
        hd = self.head_dim
        return (("k_codes", np.int8, (hd,)), ("k_scale", F32, (hd // QK_BLOCK,)), ("v_codes", np.int8, (hd,)),
                ("v_scale", F32, ()))

    def write(self, layer: int, positions: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
        """Store k, v [T, n_head_kv, head_dim] (float32) at the given absolute positions."""
        self._reserve(positions)
        kq, kd = quantize_int8(k, QK_BLOCK)
        vq, vd = quantize_int8(v, self.head_dim)
        self.k_codes[layer][:, positions] = kq.transpose(1, 0, 2)
        self.k_scale[layer][:, positions] = kd.transpose(1, 0, 2)
        self.v_codes[layer][:, positions] = vq.transpose(1, 0, 2)
        self.v_scale[layer][:, positions] = vd[..., 0].T


def attend(cache: KVCache, layer: int, q: np.ndarray, positions: np.ndarray, sinks: np.ndarray | None = None,
           window: int | None = None) -> np.ndarray:
    """strata_prefill.contract.attention.attend (its arguments, result and pieces) under the
    first attention contract: int8 Q and K blocks of 32, scores in natural units with `exp`."""
    n_head, hd = q.shape[1], q.shape[2]
    sinks, window = check_options(n_head, sinks, window)
    n_k = -(-(int(positions.max()) + 1) // KEY_BLOCK) * KEY_BLOCK

    # Q's int8 blocks (32 values each, so per head and query), for all pieces at once; each
    # KV head's keys and values widened to float32 once, for all of its tiles.
    qc, qd = quantize_int8(q, QK_BLOCK)  # [T, H, hd], [T, H, hd/32]
    kv = [(cache.k_codes[layer][kvh, :n_k].astype(F32), np.ascontiguousarray(cache.k_scale[layer][kvh, :n_k].T),
           cache.v_codes[layer][kvh, :n_k].astype(F32), cache.v_scale[layer][kvh, :n_k])
          for kvh in range(cache.n_head_kv)]

    def tile(rows, heads, kvh, pos, n_blk, b0):
        return _attend_tile(kv[kvh], qc[rows, heads], qd[rows, heads], pos, n_blk, b0=b0, window=window,
                            sink=None if sinks is None else sinks[heads])

    return attention.by_pieces(q.shape, cache.n_head_kv, positions, window, tile)


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

    k0, masked = attention.mask_invalid(s, pos, key0, window)
    s = s.reshape(n_head, n_tok, n_blk, KEY_BLOCK)
    m_prev, m_run = attention.running_max(s, sink)
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

    # Merge the blocks: L = L * alpha + lsum, O = O * alpha + ob (two roundings). A sink starts
    # L at exp(sink - sink) = 1.
    return attention.merge_blocks(alpha, lsum, pos, b0, window, sink is not None, hd, lambda o, c: o + ob[:, c])
