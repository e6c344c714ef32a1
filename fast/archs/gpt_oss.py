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

from strata_prefill.fast.attention_steps import attend_and_project, normed_input, qkv_products, rope_heads


def attention_half(engine, layer: int, x, positions: np.ndarray, dump=None):
    """x [T, n_embd] residual in, residual out; positions: the tokens' absolute positions."""
    be, cfg = engine.be, engine.config
    W = engine.layer_weights(layer)
    matmul = qkv_products(be, normed_input(engine, layer, x, dump))

    def product(w, b):
        return be.add_row_bias(matmul(w), b)

    q, k, v = rope_heads(engine, product(W.attn_q, W.attn_q_b), product(W.attn_k, W.attn_k_b),
                         product(W.attn_v, W.attn_v_b), positions)
    window = cfg.spec.ATTENTION.window(cfg, layer)  # None on a block that sees every key
    return attend_and_project(engine, layer, x, q, k, v, positions, dump, out_bias=W.attn_output_b,
                              sinks=W.attn_sinks, window=window)
