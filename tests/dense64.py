"""A float64 dense forward of a pack: the function the quantized model claims to compute.

Weights are dequantized with gguf's own `gguf.quants.dequantize` (an independent oracle), then
every product, norm, softmax and attention is plain float64 with no quantization of
activations or of the KV cache. Used by tests to check that the integer machinery of the
reference computes this function within a tolerance.
"""
from __future__ import annotations

import numpy as np
from gguf.quants import dequantize


def _w(pack, name):
    t = pack._tensor(name.removesuffix(".weight"))
    arr = dequantize(np.asarray(t.data), t.tensor_type)
    return np.asarray(arr, dtype=np.float64)


def _rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _silu(x):
    return x / (1.0 + np.exp(-x))


def _rope(x, pos, base):
    hd = x.shape[-1]
    half = hd // 2
    theta = pos[:, None] * base ** (-2.0 * np.arange(half) / hd)  # [T, half]
    c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    x0, x1 = x[..., :half], x[..., half:]
    return np.concatenate([x0 * c - x1 * s, x0 * s + x1 * c], axis=-1)


def dense_forward(pack, ids) -> np.ndarray:
    """Logits at every position of the prompt, float64 [T, vocab]."""
    cfg = pack.config
    eps = float(cfg.rms_eps)
    T = len(ids)
    x = _w(pack, "token_embd.weight")[ids]
    pos = np.arange(T, dtype=np.float64)
    mask = np.tril(np.ones((T, T), dtype=bool))
    group = cfg.n_head // cfg.n_head_kv
    for l in range(cfg.n_layer):
        p = f"blk.{l}."
        h = _rms(x, _w(pack, p + "attn_norm.weight"), eps)
        q = (h @ _w(pack, p + "attn_q.weight").T).reshape(T, cfg.n_head, cfg.head_dim)
        k = (h @ _w(pack, p + "attn_k.weight").T).reshape(T, cfg.n_head_kv, cfg.head_dim)
        v = (h @ _w(pack, p + "attn_v.weight").T).reshape(T, cfg.n_head_kv, cfg.head_dim)
        q = _rope(_rms(q, _w(pack, p + "attn_q_norm.weight"), eps), pos, cfg.rope_base)
        k = _rope(_rms(k, _w(pack, p + "attn_k_norm.weight"), eps), pos, cfg.rope_base)
        k = np.repeat(k, group, axis=1)
        v = np.repeat(v, group, axis=1)
        s = np.einsum("thd,uhd->htu", q, k) / np.sqrt(cfg.head_dim)
        s = np.where(mask[None], s, -np.inf)
        pr = np.exp(s - s.max(-1, keepdims=True))
        pr /= pr.sum(-1, keepdims=True)
        o = np.einsum("htu,uhd->thd", pr, v).reshape(T, -1)
        x = x + o @ _w(pack, p + "attn_output.weight").T

        h = _rms(x, _w(pack, p + "ffn_norm.weight"), eps)
        logits = h @ _w(pack, p + "ffn_gate_inp.weight").T
        pr = np.exp(logits - logits.max(-1, keepdims=True))
        pr /= pr.sum(-1, keepdims=True)
        top = np.argsort(-pr, axis=-1, kind="stable")[:, : cfg.n_expert_used]
        w = np.take_along_axis(pr, top, -1)
        w /= np.maximum(w.sum(-1, keepdims=True), 6.1035e-5)
        gate, up, down = (_w(pack, p + n) for n in ("ffn_gate_exps.weight", "ffn_up_exps.weight",
                                                      "ffn_down_exps.weight"))
        y = np.zeros_like(x)
        for t in range(T):
            for r, e in enumerate(top[t]):
                hh = _silu(gate[e] @ h[t]) * (up[e] @ h[t])
                y[t] += w[t, r] * (down[e] @ hh)
        if cfg.n_ff_shexp:
            g = 1.0 / (1.0 + np.exp(-(h @ _w(pack, p + "ffn_gate_inp_shexp.weight").reshape(-1))))
            hh = _silu(h @ _w(pack, p + "ffn_gate_shexp.weight").T) * (h @ _w(pack, p + "ffn_up_shexp.weight").T)
            y += g[:, None] * (hh @ _w(pack, p + "ffn_down_shexp.weight").T)
        x = x + y
    h = _rms(x, _w(pack, "output_norm.weight"), eps)
    out_name = "output.weight" if "output" in pack.tensor_names() else "token_embd.weight"
    return h @ _w(pack, out_name).T
