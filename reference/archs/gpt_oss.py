"""gpt-oss's attention half of a layer, as the reference computes it (formats/archs/gpt_oss.py:
ATTENTION), each step named as llama.cpp's graph (src/models/openai-moe.cpp) names it.

    h = RMSNorm(x)                              attn_norm
    q, k, v = h . W_q, h . W_k, h . W_v         MMQ products on q8_1 rows (float weights:
                                                float32 products of h, strata_prefill.contract.dense)
    q, k, v += attn_q.bias, attn_k.bias, ...    one float32 addition each, after the product
    q, k = NEOX RoPE at absolute positions      Qcur, Kcur: the shared float64-built table,
                                                YaRN where the pack's rope.scaling says
    KV cache <- int8 k, v                        (contract/attention.py)
    o = causal attention over the cache         each head's sink logit in its softmax
                                                (attn_sinks); the even blocks see only the
                                                last sliding_window keys
    x = x + (o . W_o + attn_output.bias)        attn_out, ffn_inp

No q/k norm. The MoE half that follows (reference/moe_half.py) starts from
`post_attention_norm` (the Layer's ffn_norm).
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
    matmul = qkv_products(model, layer, h)

    def product(name, w, bias):
        return matmul(name, w) + bias  # float32 [T, n] + [n]: one rounding per value

    q, k, v = split_heads(cfg, product("attn_q", L.attn_q, L.attn_q_b), product("attn_k", L.attn_k, L.attn_k_b),
                          product("attn_v", L.attn_v, L.attn_v_b))
    q, k = rope_qk(model, q, k, positions)
    return attend_and_project(model, layer, x, h, q, k, v, positions, dump, out_bias=L.attn_output_b,
                              sinks=L.attn_sinks, window=cfg.spec.ATTENTION.window(cfg, layer))
