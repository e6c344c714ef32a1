"""The MoE half of a layer, as the reference computes it: read this file top to bottom.

    h = RMSNorm(x)                                   ffn_norm
    router: logits = h . ffn_gate_inp (+ ffn_gate_inp_b where MOE.router_bias);
            MOE.scoring: softmax, top-K, renormalize; or top-K on the logits, softmax over those K
            (a float router: float32 products of h itself, strata_prefill.contract.dense; never quantized)
    routing tables: cnt, off, slot, src, order       (contract/routing.py)
    per-row GATHER quantize: row r of the MoE input buffer is q8_1(h[src[r]])
        (float gate/up experts: row r is h[src[r]] itself, never quantized)
    per-expert walk (each expert alone; the experts run side by side on threads):
        gate = W_gate[e] . rows,  up = W_up[e] . rows   (+ each expert's gate and up bias
               where MOE.expert_bias: float32, before the activation)
        H    = silu(gate) * up (MOE.activation swiglu; swiglu_oai: the clamped form), quantized
               to q8_1 (the layout of the down type; a float down type: H itself)
        Y[rows] = W_down[e] . H
        (a float matrix: float32 products, strata_prefill.contract.dense.float_matmul; else MMQ)
    shared expert (where the pack has one), gated by sigmoid(ffn_gate_inp_shexp . h)
    combine per token in rank order (each output plus its expert's down bias where
        MOE.expert_bias, times its weight), plus the shared expert, plus the residual

The fast path computes the same bytes with grouped launches and a per-token scatter; this
file keeps the plain way, because it is the definition.
"""
from __future__ import annotations

import numpy as np

from strata_prefill.contract import numerics, parallel, q8_1
from strata_prefill.contract.constants import Q8_1_BLOCK_BYTES
from strata_prefill.contract.mmq import row_slice
from strata_prefill.contract.moe import add_expert_bias, combine, gather_rows, glu, swiglu
from strata_prefill.contract.routing import routing_tables, row_experts, top_k

F32 = np.float32


def quantize(x: np.ndarray, qtype) -> q8_1.Q8Rows:
    """q8_1 rows of x [R, K] in the layout that the weight type `qtype` multiplies."""
    layout = q8_1.layout_for(qtype)
    return q8_1.decode_rows(q8_1.quantize_rows(x, layout), x.shape[0], layout)


def dense_product(model, key, w, x: np.ndarray) -> np.ndarray:
    """w . x for a dense matrix w: float32 products of x itself for a float w
    (strata_prefill.contract.dense.float_matmul), else MMQ on x quantized to q8_1."""
    if w.is_float:
        return model.float_product(key, w, x)
    return model.product(key, w, quantize(x, w.qtype))


def expert_product(model, key, w, act) -> np.ndarray:
    """An expert matrix w times its rows: float32 rows for a float w (act: float32 [rows, K]),
    else MMQ (act: decoded q8_1 rows)."""
    if w.is_float:
        return model.float_product(key, w, act)
    return model.product(key, w, act)


def moe_half(model, layer: int, x: np.ndarray, dump=None) -> np.ndarray:
    """x [T, n_embd] residual in, residual out."""
    cfg = model.config
    L = model.pack.layer(layer)
    n_tok, k_used = x.shape[0], cfg.n_expert_used
    m = cfg.spec.MOE  # the architecture's MoE parameters (formats/archs)

    # 1. Norm and router.
    h = numerics.rmsnorm(x, L.ffn_norm, cfg.rms_eps)
    logits = dense_product(model, (layer, "ffn_gate_inp"), L.ffn_gate_inp, h)
    model.watch.see(layer, "router_logits", logits)  # a -Inf logit is only an expert not picked
    ids, weights = top_k(logits, k_used, bias=L.ffn_gate_inp_b if m.router_bias else None, gating=m.scoring)

    # 2. Routing tables (and each expert-sorted row's expert, for the experts' biases).
    tab = routing_tables(ids, cfg.n_expert)
    rexp = row_experts(ids, tab.slot) if m.expert_bias else None

    # 3. Per-row gather quantize of the MoE input into T*K expert-sorted rows (float gate/up
    # experts: the rows gathered as they are).
    gate_exps, up_exps, down_exps = L.ffn_gate_exps, L.ffn_up_exps, L.ffn_down_exps
    moe_in = None
    if gate_exps.is_float:
        moe_in_rows = gather_rows(h, tab.src)
    else:
        in_layout = q8_1.layout_for(gate_exps.qtype)
        moe_in = q8_1.alloc_buffer(tab.n_rows, cfg.n_embd)
        q8_1.gather_quantize(h, tab.src, in_layout, moe_in)
        moe_in_rows = q8_1.decode_rows(moe_in, tab.n_rows, in_layout)

    # 4. The per-expert walk.
    down_layout = None if down_exps.is_float else q8_1.layout_for(down_exps.qtype)
    down_in = None if down_layout is None else \
        np.zeros((tab.n_rows, q8_1.blocks_per_row(cfg.n_ff_exp), Q8_1_BLOCK_BYTES), np.uint8)
    y = np.zeros((tab.n_rows, cfg.n_embd), dtype=F32)
    gate_all, up_all, h_all = (np.zeros((tab.n_rows, cfg.n_ff_exp), F32) for _ in range(3))  # op records

    def expert(e):  # writes only the expert's own rows
        rows = tab.rows_of(e)
        act = moe_in_rows[rows] if gate_exps.is_float else row_slice(moe_in_rows, rows.start, rows.stop)
        gate = expert_product(model, (layer, "gate", e), gate_exps.expert(e), act)
        up = expert_product(model, (layer, "up", e), up_exps.expert(e), act)
        gate_all[rows], up_all[rows] = gate, up  # the records: the products before their biases (numerics.md 6)
        if rexp is not None:
            gate = add_expert_bias(gate, L.ffn_gate_exps_b, rexp[rows])
            up = add_expert_bias(up, L.ffn_up_exps_b, rexp[rows])
        h_all[rows] = glu(gate, up, m.act)
        if down_layout is None:
            act_h = h_all[rows]
        else:
            down_in[rows] = q8_1.quantize_rows(h_all[rows], down_layout)
            act_h = q8_1.decode_rows(down_in[rows], rows.stop - rows.start, down_layout)
        y[rows] = expert_product(model, (layer, "down", e), down_exps.expert(e), act_h)

    # Experts share nothing but their inputs, so they run on the pool's threads; the
    # largest first, so that the last to finish is a small one.
    parallel.map_ordered(expert, sorted(tab.order, key=lambda e: -int(tab.cnt[e])))
    model.watch.see(layer, "gate", gate_all)  # H's quantize would hide what they hold
    model.watch.see(layer, "up", up_all)

    # 5. The shared expert.
    shared = None
    if L.has_shexp:
        shared = shared_expert(model, layer, L, h)

    # 6. Combine in rank order, then the shared expert, then the residual.
    out = combine(x, weights, tab.slot, y, shared,
                  down_bias=(L.ffn_down_exps_b, ids) if m.expert_bias else None)
    model.watch.see(layer, "moe_out", out)  # the residual: what every op before it reaches

    if dump is not None:  # in the order computed (formats/records.py)
        dump.op(layer, "ffn_norm", h)
        dump.op(layer, "router_logits", logits)
        dump.layer(layer, "topk_ids", ids)
        dump.layer(layer, "topk_w", weights)
        dump.layer(layer, "slot", tab.slot)
        if moe_in is not None:  # float experts have no q8_1 buffers to record
            dump.layer(layer, "moe_in_q8_1", q8_1.unpack_rows(moe_in, tab.n_rows)[tab.slot])
        dump.op(layer, "gate", gate_all, slot=tab.slot)
        dump.op(layer, "up", up_all, slot=tab.slot)
        dump.op(layer, "swiglu_h", h_all, slot=tab.slot)
        if down_in is not None:
            dump.layer(layer, "down_in_q8_1", down_in[tab.slot])
        dump.op(layer, "y", y, slot=tab.slot)
        if shared is not None:
            dump.op(layer, "shexp_g", shared[0])
            dump.op(layer, "shexp", shared[1])
        dump.op(layer, "moe_out", out)
    return out


def shared_expert(model, layer: int, L, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(gate g [T], output [T, n_embd]) of the shared expert on the normed input h."""
    g = numerics.sigmoid(dense_product(model, (layer, "shexp_gate_inp"), L.ffn_gate_inp_shexp, h)[:, 0])
    gate = dense_product(model, (layer, "shexp_gate"), L.ffn_gate_shexp, h)
    up = dense_product(model, (layer, "shexp_up"), L.ffn_up_shexp, h)
    model.watch.see(layer, "shexp", gate)  # H's quantize would hide what they hold
    model.watch.see(layer, "shexp", up)
    return g, dense_product(model, (layer, "shexp_down"), L.ffn_down_shexp, swiglu(gate, up))
