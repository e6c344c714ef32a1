"""The attention half of a layer, as the reference computes it.

    h = RMSNorm(x)                              attn_norm
    q, k, v = h . W_q, h . W_k, h . W_v         MMQ products on q8_1 rows
    q, k = RMSNorm per head                     attn_q_norm, attn_k_norm
    q, k = NEOX RoPE at absolute positions      the shared float64-built table
    KV cache <- int8 k, v                        (strata/attention.py)
    o = causal attention over the cache
    x = x + o . W_o
"""
from __future__ import annotations

import numpy as np

from strata import attention, mmq, numerics

from reference.moe_half import quantize

F32 = np.float32


def attention_half(model, layer: int, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
    cfg = model.config
    L = model.pack.layer(layer)
    n_tok = x.shape[0]

    h = numerics.rmsnorm(x, L.attn_norm, cfg.rms_eps)
    acts: dict = {}  # one quantization of h per q8_1 layout

    def product(w):
        layout_key = w.qtype
        if layout_key not in acts:
            acts[layout_key] = quantize(h, w.qtype)
        return mmq.mmq(w.qtype, w.data, acts[layout_key])

    q = product(L.attn_q).reshape(n_tok, cfg.n_head, cfg.head_dim)
    k = product(L.attn_k).reshape(n_tok, cfg.n_head_kv, cfg.head_dim)
    v = product(L.attn_v).reshape(n_tok, cfg.n_head_kv, cfg.head_dim)

    q = numerics.rmsnorm(q, L.attn_q_norm, cfg.rms_eps)
    k = numerics.rmsnorm(k, L.attn_k_norm, cfg.rms_eps)
    cos, sin = model.rope(int(positions.max()) + 1)
    q = numerics.rope_neox(q, positions, cos, sin)
    k = numerics.rope_neox(k, positions, cos, sin)

    model.kv.write(layer, positions, k, v)
    o = attention.attend(model.kv, layer, q, positions).reshape(n_tok, cfg.n_q)
    out = mmq.mmq(L.attn_output.qtype, L.attn_output.data, quantize(o, L.attn_output.qtype))
    return x + out
