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

from strata_prefill.contract import attention, numerics

from strata_prefill.reference.moe_half import dense_product, quantize

F32 = np.float32


def attention_half(model, layer: int, x: np.ndarray, positions: np.ndarray, dump=None) -> np.ndarray:
    """x [T, n_embd] residual in, residual out; positions: the tokens' absolute positions."""
    cfg = model.config
    spec = cfg.spec
    L = model.pack.layer(layer)
    n_tok = x.shape[0]

    h = numerics.rmsnorm(x, L.attn_norm, cfg.rms_eps)
    acts: dict = {}  # one quantization of h per q8_1 layout

    def product(name, w, bias):
        if w.is_float:
            out = model.float_product((layer, name), w, h)
        else:
            if w.qtype not in acts:
                acts[w.qtype] = quantize(h, w.qtype)
            out = model.product((layer, name), w, acts[w.qtype])
        return out + bias  # float32 [T, n] + [n]: one rounding per value

    q = product("attn_q", L.attn_q, L.attn_q_b).reshape(n_tok, cfg.n_head, cfg.head_dim)
    k = product("attn_k", L.attn_k, L.attn_k_b).reshape(n_tok, cfg.n_head_kv, cfg.head_dim)
    v = product("attn_v", L.attn_v, L.attn_v_b).reshape(n_tok, cfg.n_head_kv, cfg.head_dim)

    cos, sin = model.rope(int(positions.max()) + 1)
    q = numerics.rope_neox(q, positions, cos, sin)
    k = numerics.rope_neox(k, positions, cos, sin)

    for name, a in (("q", q), ("k", k), ("v", v)):  # what the KV cache's quantize would hide
        model.watch.see(layer, name, a)
    model.kv.write(layer, positions, k, v)
    o = attention.attend(model.kv, layer, q, positions, sinks=L.attn_sinks,
                         window=spec.ATTENTION.window(cfg, layer)).reshape(n_tok, cfg.n_q)
    model.watch.see(layer, "attn_out", o)  # what the o-projection's quantize would hide
    out = dense_product(model, (layer, "attn_output"), L.attn_output, o) + L.attn_output_b
    x = x + out
    if dump is not None:  # the op records, in the order computed (formats/records.py)
        for name, a in (("attn_norm", h), ("q", q), ("k", k), ("v", v), ("attn_out", o),
                        ("attn_proj", out), ("attn_resid", x)):
            dump.op(layer, name, a)
    return x
