"""qwen3moe's attention half of a layer, as the reference computes it (formats/archs/qwen3moe.py:
ATTENTION).

    h = RMSNorm(x)                              attn_norm
    q, k, v = h . W_q, h . W_k, h . W_v         MMQ products on q8_1 rows (float weights:
                                                float32 products of h, strata_prefill.contract.dense)
    q, k = RMSNorm per head                     attn_q_norm, attn_k_norm
    q, k = NEOX RoPE at absolute positions      the shared float64-built table
    KV cache <- int8 k, v                        (contract/attention.py)
    o = causal attention over the cache
    x = x + o . W_o
"""
from __future__ import annotations

import numpy as np

from strata_prefill.contract import numerics

from strata_prefill.reference.attention_steps import attend_and_project, qkv_products, rope_qk, split_heads


def attention_half(model, layer: int, x: np.ndarray, positions: np.ndarray, dump=None) -> np.ndarray:
    """x [T, n_embd] residual in, residual out; positions: the tokens' absolute positions."""
    cfg = model.config
    L = model.pack.layer(layer)
    h = numerics.rmsnorm(x, L.attn_norm, cfg.rms_eps)
    product = qkv_products(model, layer, h)
    q, k, v = split_heads(cfg, product("attn_q", L.attn_q), product("attn_k", L.attn_k), product("attn_v", L.attn_v))
    q = numerics.rmsnorm(q, L.attn_q_norm, cfg.rms_eps)
    k = numerics.rmsnorm(k, L.attn_k_norm, cfg.rms_eps)
    q, k = rope_qk(model, q, k, positions)
    return attend_and_project(model, layer, x, h, q, k, v, positions, dump)
