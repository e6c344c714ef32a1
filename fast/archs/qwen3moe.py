"""qwen3moe's attention half on the device: reference/archs/qwen3moe.py's steps as backend calls
(fast/backend_base.py), the same bytes.

    h = RMSNorm(x); q, k, v = h . W_q, W_k, W_v (one q8_1 quantize of h per layout)
    q, k = RMSNorm per head, NEOX RoPE; KV cache <- int8 k, v; o = causal attention
    x = x + o . W_o
"""
from __future__ import annotations

import numpy as np

from strata_prefill.contract import dense, q8_1


def attention_half(engine, layer: int, x, positions: np.ndarray, dump=None):
    """x [T, n_embd] residual in, residual out; positions: the tokens' absolute positions."""
    be, cfg = engine.be, engine.config
    W = engine.layer_weights(layer)
    n_tok = len(positions)
    h = be.rmsnorm(x, W.attn_norm, cfg.rms_eps)
    engine._rec(dump, layer, "attn_norm", h)
    acts = {}

    def product(w):
        if dense.is_float(w.qtype):
            return be.float_dense(w, h)
        layout = q8_1.layout_for(w.qtype)
        if layout not in acts:
            acts[layout] = be.quantize_rows(h, layout)
        return be.mmq_dense(w, acts[layout])

    q, k, v = product(W.attn_q), product(W.attn_k), product(W.attn_v)
    q = be.rmsnorm(be.view(q, (n_tok * cfg.n_head, cfg.head_dim)), W.attn_q_norm, cfg.rms_eps)
    k = be.rmsnorm(be.view(k, (n_tok * cfg.n_head_kv, cfg.head_dim)), W.attn_k_norm, cfg.rms_eps)
    q = be.rope(be.view(q, (n_tok, cfg.n_head, cfg.head_dim)), positions)
    k = be.rope(be.view(k, (n_tok, cfg.n_head_kv, cfg.head_dim)), positions)
    v = be.view(v, (n_tok, cfg.n_head_kv, cfg.head_dim))
    for name, a in (("q", q), ("k", k), ("v", v)):
        engine.watch.see(layer, name, a)  # what the KV cache's quantize would hide
        engine._rec(dump, layer, name, a)
    be.kv_write(layer, positions, k, v)
    o = be.view(be.attend(layer, q, positions), (n_tok, cfg.n_q))
    engine.watch.see(layer, "attn_out", o)  # what the o-projection's quantize would hide
    engine._rec(dump, layer, "attn_out", o)
    out = engine._dense(W.attn_output, o)
    engine._rec(dump, layer, "attn_proj", out)
    x = be.add(x, out)
    engine._rec(dump, layer, "attn_resid", x)
    return x
