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

from strata_prefill.contract import attention, numerics

from strata_prefill.reference.moe_half import dense_product, quantize

F32 = np.float32


def attention_half(model, layer: int, x: np.ndarray, positions: np.ndarray, dump=None) -> np.ndarray:
    """x [T, n_embd] residual in, residual out; positions: the tokens' absolute positions."""
    cfg = model.config
    L = model.pack.layer(layer)
    n_tok = x.shape[0]

    h = numerics.rmsnorm(x, L.attn_norm, cfg.rms_eps)
    acts: dict = {}  # one quantization of h per q8_1 layout

    def product(name, w):
        if w.is_float:
            return model.float_product((layer, name), w, h)
        if w.qtype not in acts:
            acts[w.qtype] = quantize(h, w.qtype)
        return model.product((layer, name), w, acts[w.qtype])

    q = product("attn_q", L.attn_q).reshape(n_tok, cfg.n_head, cfg.head_dim)
    k = product("attn_k", L.attn_k).reshape(n_tok, cfg.n_head_kv, cfg.head_dim)
    v = product("attn_v", L.attn_v).reshape(n_tok, cfg.n_head_kv, cfg.head_dim)

    q = numerics.rmsnorm(q, L.attn_q_norm, cfg.rms_eps)
    k = numerics.rmsnorm(k, L.attn_k_norm, cfg.rms_eps)
    cos, sin = model.rope(int(positions.max()) + 1)
    q = numerics.rope_neox(q, positions, cos, sin)
    k = numerics.rope_neox(k, positions, cos, sin)

    for name, a in (("q", q), ("k", k), ("v", v)):  # what the KV cache's quantize would hide
        model.watch.see(layer, name, a)
    model.kv.write(layer, positions, k, v)
    o = attention.attend(model.kv, layer, q, positions).reshape(n_tok, cfg.n_q)
    model.watch.see(layer, "attn_out", o)  # what the o-projection's quantize would hide
    out = dense_product(model, (layer, "attn_output"), L.attn_output, o)
    x = x + out
    if dump is not None:  # the op records, in the order computed (formats/records.py)
        for name, a in (("attn_norm", h), ("q", q), ("k", k), ("v", v), ("attn_out", o),
                        ("attn_proj", out), ("attn_resid", x)):
            dump.op(layer, name, a)
    return x
