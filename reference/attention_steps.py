"""The attention steps every architecture's attention half shares in the reference
(reference/archs/<name>.py keeps only what differs: biases, q/k norms, sinks, windows).

    q, k, v = h . W_q, h . W_k, h . W_v         `qkv_products`: one q8_1 quantization of h per
                                                layout (float weights: float32 products of h);
                                                `split_heads`
    q, k = NEOX RoPE at absolute positions      `rope_qk`
    KV cache <- int8 k, v; o = attention         `attend_and_project`: then o . W_o (+ its bias),
    x = x + out                                 the residual, and the op records
"""
from __future__ import annotations

import numpy as np

from strata_prefill.contract import attention, numerics

from strata_prefill.reference.moe_half import dense_product, quantize


def qkv_products(model, layer: int, h: np.ndarray):
    """`product(name, w)`: block `layer`'s product of h with matrix w, its activations quantized
    once per q8_1 layout across the calls."""
    acts: dict = {}  # one quantization of h per q8_1 layout

    def product(name, w):
        if w.is_float:
            return model.float_product((layer, name), w, h)
        if w.qtype not in acts:
            acts[w.qtype] = quantize(h, w.qtype)
        return model.product((layer, name), w, acts[w.qtype])

    return product


def split_heads(cfg, q: np.ndarray, k: np.ndarray, v: np.ndarray):
    """The products [T, n] as heads: q [T, n_head, head_dim], k and v [T, n_head_kv, head_dim]."""
    n_tok = q.shape[0]
    return (q.reshape(n_tok, cfg.n_head, cfg.head_dim), k.reshape(n_tok, cfg.n_head_kv, cfg.head_dim),
            v.reshape(n_tok, cfg.n_head_kv, cfg.head_dim))


def rope_qk(model, q: np.ndarray, k: np.ndarray, positions: np.ndarray):
    """q and k rotated by NEOX RoPE at the tokens' absolute positions (the model's table)."""
    cos, sin = model.rope(int(positions.max()) + 1)
    return numerics.rope_neox(q, positions, cos, sin), numerics.rope_neox(k, positions, cos, sin)


def attend_and_project(model, layer: int, x, h, q, k, v, positions, dump=None, *, out_bias=None,
                       **attend_kw) -> np.ndarray:
    """The half's tail: k, v into the KV cache, causal attention of q over it (attend_kw:
    contract.attention.attend's sinks and window), o . W_o plus out_bias (float32, where the
    architecture has one), the residual x + out; the op records to `dump`. Returns the new x."""
    cfg = model.config
    L = model.pack.layer(layer)
    for name, a in (("q", q), ("k", k), ("v", v)):  # what the KV cache's quantize would hide
        model.watch.see(layer, name, a)
    model.kv.write(layer, positions, k, v)
    o = attention.attend(model.kv, layer, q, positions, **attend_kw).reshape(x.shape[0], cfg.n_q)
    model.watch.see(layer, "attn_out", o)  # what the o-projection's quantize would hide
    out = dense_product(model, (layer, "attn_output"), L.attn_output, o)
    if out_bias is not None:
        out = out + out_bias
    x = x + out
    if dump is not None:  # the op records, in the order computed (formats/records.py)
        for name, a in (("attn_norm", h), ("q", q), ("k", k), ("v", v), ("attn_out", o),
                        ("attn_proj", out), ("attn_resid", x)):
            dump.op(layer, name, a)
    return x
