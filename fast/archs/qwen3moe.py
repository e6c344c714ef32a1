"""qwen3moe's attention half on the device: reference/archs/qwen3moe.py's steps as backend calls
(fast/backend_base.py), the same bytes.

    h = RMSNorm(x); q, k, v = h . W_q, W_k, W_v (one q8_1 quantize of h per layout)
    q, k = RMSNorm per head, NEOX RoPE; KV cache <- int8 k, v; o = causal attention
    x = x + o . W_o
"""
from __future__ import annotations

import numpy as np

from strata_prefill.fast.attention_steps import attend_and_project, normed_input, qkv_products, rope_heads


def attention_half(engine, layer: int, x, positions: np.ndarray, dump=None):
    """x [T, n_embd] residual in, residual out; positions: the tokens' absolute positions."""
    be, cfg = engine.be, engine.config
    W = engine.layer_weights(layer)
    n_tok = len(positions)
    product = qkv_products(be, normed_input(engine, layer, x, dump))
    q, k, v = product(W.attn_q), product(W.attn_k), product(W.attn_v)
    q = be.rmsnorm(be.view(q, (n_tok * cfg.n_head, cfg.head_dim)), W.attn_q_norm, cfg.rms_eps)
    k = be.rmsnorm(be.view(k, (n_tok * cfg.n_head_kv, cfg.head_dim)), W.attn_k_norm, cfg.rms_eps)
    q, k, v = rope_heads(engine, q, k, v, positions)
    return attend_and_project(engine, layer, x, q, k, v, positions, dump)
