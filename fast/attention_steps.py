"""The attention steps every architecture's attention half shares in the fast engine, as backend
calls (fast/backend_base.py); fast/archs/<name>.py keeps only what differs (biases, q/k norms,
sinks, windows). reference/attention_steps.py computes the same bytes.

    h = RMSNorm(x)                    `normed_input`
    q, k, v = h . W_q, W_k, W_v       `qkv_products`: one q8_1 quantize of h per layout
    q, k = RoPE                       `rope_heads`
    KV cache <- int8 k, v; o = attention; x = x + o . W_o (+ its bias)
                                      `attend_and_project`, with the op records
"""
from __future__ import annotations

import numpy as np

from strata_prefill.contract import dense, q8_1


def normed_input(engine, layer: int, x, dump=None):
    """h = RMSNorm(x) by the block's attn_norm, recorded as attn_norm."""
    h = engine.be.rmsnorm(x, engine.layer_weights(layer).attn_norm, engine.config.rms_eps)
    engine._rec(dump, layer, "attn_norm", h)
    return h


def qkv_products(be, h):
    """`product(w)`: the product of h with matrix w on backend `be`, h quantized once per q8_1
    layout across the calls (float weights: the float product of h)."""
    acts = {}

    def product(w):
        if dense.is_float(w.qtype):
            return be.float_dense(w, h)
        layout = q8_1.layout_for(w.qtype)
        if layout not in acts:
            acts[layout] = be.quantize_rows(h, layout)
        return be.mmq_dense(w, acts[layout])

    return product


def rope_heads(engine, q, k, v, positions: np.ndarray):
    """The products as heads, q and k rotated by RoPE at the tokens' absolute positions: q [T,
    n_head, head_dim], k and v [T, n_head_kv, head_dim]."""
    be, cfg = engine.be, engine.config
    n_tok = len(positions)
    q = be.rope(be.view(q, (n_tok, cfg.n_head, cfg.head_dim)), positions)
    k = be.rope(be.view(k, (n_tok, cfg.n_head_kv, cfg.head_dim)), positions)
    return q, k, be.view(v, (n_tok, cfg.n_head_kv, cfg.head_dim))


def attend_and_project(engine, layer: int, x, q, k, v, positions: np.ndarray, dump=None, *,
                       out_bias=None, **attend_kw):
    """The half's tail: q, k, v watched and recorded, k, v into the KV cache, causal attention of
    q over it (attend_kw: the backend's sinks and window), o . W_o plus out_bias (where the
    architecture has one), the residual x + out. Returns the new x."""
    be, cfg = engine.be, engine.config
    W = engine.layer_weights(layer)
    for name, a in (("q", q), ("k", k), ("v", v)):
        engine.watch.see(layer, name, a)  # what the KV cache's quantize would hide
        engine._rec(dump, layer, name, a)
    be.kv_write(layer, positions, k, v)
    o = be.view(be.attend(layer, q, positions, **attend_kw), (len(positions), cfg.n_q))
    engine.watch.see(layer, "attn_out", o)  # what the o-projection's quantize would hide
    engine._rec(dump, layer, "attn_out", o)
    out = engine._dense(W.attn_output, o)
    if out_bias is not None:
        out = be.add_row_bias(out, out_bias)
    engine._rec(dump, layer, "attn_proj", out)
    x = be.add(x, out)
    engine._rec(dump, layer, "attn_resid", x)
    return x
