"""gpt-oss's attention half on the device: reference/archs/gpt_oss.py's steps as backend calls
(fast/backend_base.py), the same bytes (docs/numerics.md section 5: Sinks, Sliding window,
Biases).

    h = RMSNorm(x); q, k, v = h . W_q + b_q, h . W_k + b_k, h . W_v + b_v
        (one q8_1 quantize of h per layout; each bias one float32 addition per element)
    q, k = NEOX RoPE (the pack's scaling: YaRN in the released models); no q/k norm
    KV cache <- int8 k, v; o = causal attention with a sink logit per head, through the
        sliding window on the layers the architecture marks as sliding
    x = x + (o . W_o + b_o)

The biases and sinks are the layer's weights (fast/weights.py): uploaded once, on first use.
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

    def product(w, b):
        if dense.is_float(w.qtype):
            y = be.float_dense(w, h)
        else:
            layout = q8_1.layout_for(w.qtype)
            if layout not in acts:
                acts[layout] = be.quantize_rows(h, layout)
            y = be.mmq_dense(w, acts[layout])
        return be.add_row_bias(y, b)

    q = product(W.attn_q, W.attn_q_b)
    k = product(W.attn_k, W.attn_k_b)
    v = product(W.attn_v, W.attn_v_b)
    q = be.rope(be.view(q, (n_tok, cfg.n_head, cfg.head_dim)), positions)
    k = be.rope(be.view(k, (n_tok, cfg.n_head_kv, cfg.head_dim)), positions)
    v = be.view(v, (n_tok, cfg.n_head_kv, cfg.head_dim))
    for name, a in (("q", q), ("k", k), ("v", v)):
        engine.watch.see(layer, name, a)  # what the KV cache's quantize would hide
        engine._rec(dump, layer, name, a)
    be.kv_write(layer, positions, k, v)
    window = cfg.spec.ATTENTION.window(cfg, layer)  # None on a block that sees every key
    o = be.view(be.attend(layer, q, positions, sinks=W.attn_sinks, window=window), (n_tok, cfg.n_q))
    engine.watch.see(layer, "attn_out", o)  # what the o-projection's quantize would hide
    engine._rec(dump, layer, "attn_out", o)
    out = be.add_row_bias(engine._dense(W.attn_output, o), W.attn_output_b)
    engine._rec(dump, layer, "attn_proj", out)
    x = be.add(x, out)
    engine._rec(dump, layer, "attn_resid", x)
    return x
