"""The fast engine: the prompt path as a sequence of backend steps.

The same code drives two backends: `cuda` (PyCUDA kernels, fast/cuda/backend.py) and `sim`
(NumPy definitions of the same kernels, fast/sim.py), so the walk, the switches and the
buffers are exercised on machines with no GPU. The engine plugs into
`strata.session.Session` like the reference does.

Switches (each a Python argument, a CLI flag and an environment variable):
  group_gather  STRATA_PREFILL_GROUP_GATHER  1: one gather launch per MMQ group (default)
                                             0: one gather launch per expert
  quant_gather  STRATA_QUANT_GATHER          1: per-row gather quantize of the MoE input
                                             0: per-token scatter (default)
"""
from __future__ import annotations

import os

import numpy as np

from strata import q8_1
from strata.errors import InputError
from strata.moe import MMQ_GROUP

from fast.walk import plan_groups

F32 = np.float32


def switch(value, env: str, default: bool) -> bool:
    """A switch from its argument, else its environment variable, else its default."""
    if value is None:
        raw = os.environ.get(env)
        if raw is None or raw == "":
            return default
        if raw not in ("0", "1"):
            raise InputError(f"{env} must be 0 or 1, got {raw!r}")
        return raw == "1"
    return bool(int(value))


class FastEngine:
    name = "fast"

    def __init__(self, pack, backend, group_gather=None, quant_gather=None, group_size: int = MMQ_GROUP):
        self.pack = pack
        self.config = pack.config
        self.be = backend
        self.group_gather = switch(group_gather, "STRATA_PREFILL_GROUP_GATHER", True)
        self.quant_gather = switch(quant_gather, "STRATA_QUANT_GATHER", False)
        if not 1 <= group_size <= MMQ_GROUP:
            raise InputError(f"group size must be 1..{MMQ_GROUP}, got {group_size}")
        self.group_size = group_size
        self._held = {}  # op records of buffers that live one group at a time (_rec_rows)
        with self.be.oom_guard(f"the pack's weights ({pack.file_size >> 20} MiB on disk)"):
            self.be.load(pack)
        self.name = f"fast/{backend.name}"

    @property
    def counters(self):
        return self.be.counters

    # ---- the engine protocol of strata.session ----------------------------------------
    def embed(self, ids: np.ndarray):
        return self.be.embed(ids)

    def to_host(self, x) -> np.ndarray:
        return self.be.download(x)

    def last_logits(self, x) -> np.ndarray:
        """Logits of the chunk's last position, on the host."""
        return self.head(self.be.last_row(x))[0]

    def head(self, x_last):
        be = self.be
        h = be.rmsnorm(x_last, be.w("output_norm"), self.config.rms_eps)
        out = be.w("output")
        logits = be.mmq_dense(out, self._quantize(h, out))
        return be.download(logits)

    def layer(self, layer: int, x, positions: np.ndarray, dump=None):
        with self.be.oom_guard(f"the buffers of layer {layer} for a chunk of {len(positions)} tokens "
                               f"(a smaller --prefill chunk needs less)"):
            with self.be.phase("attention"):
                x = self.attention_half(layer, x, positions, dump)
            return self.moe_half(layer, x, dump)

    # ---- op records (--dump-level ops): nothing is downloaded unless they are asked for ----
    def _rec(self, dump, layer: int, op: str, array, slot=None) -> None:
        """Record op's output (strata/records.py); slot: the rows are expert-sorted."""
        if dump is not None and dump.ops:
            host = [a if a is None or isinstance(a, np.ndarray) else self.be.download(a) for a in (array, slot)]
            dump.op(layer, op, *host)

    def _rec_rows(self, dump, op: str, array, row0: int, n_rows: int) -> None:
        """Keep rows row0.. of an expert-sorted buffer that lives one group at a time (H);
        `self._held.pop(op)` is then recorded whole."""
        if dump is not None and dump.ops:
            part = self.be.download(array)
            held = self._held.setdefault(op, np.full((n_rows, *part.shape[1:]), np.nan, part.dtype))
            held[row0:row0 + part.shape[0]] = part

    # ---- pieces -----------------------------------------------------------------------
    def _quantize(self, x, w):
        """x's rows as a q8_1 buffer in the layout the weight w multiplies."""
        return self.be.quantize_rows(x, q8_1.layout_for(w.qtype))

    def attention_half(self, layer: int, x, positions: np.ndarray, dump=None):
        be, cfg = self.be, self.config
        n_tok = len(positions)
        p = f"blk.{layer}."
        h = be.rmsnorm(x, be.w(p + "attn_norm"), cfg.rms_eps)
        self._rec(dump, layer, "attn_norm", h)
        acts = {}

        def product(name):
            w = be.w(p + name)
            layout = q8_1.layout_for(w.qtype)
            if layout not in acts:
                acts[layout] = be.quantize_rows(h, layout)
            return be.mmq_dense(w, acts[layout])

        q, k, v = product("attn_q"), product("attn_k"), product("attn_v")
        q = be.rmsnorm(be.view(q, (n_tok * cfg.n_head, cfg.head_dim)), be.w(p + "attn_q_norm"), cfg.rms_eps)
        k = be.rmsnorm(be.view(k, (n_tok * cfg.n_head_kv, cfg.head_dim)), be.w(p + "attn_k_norm"), cfg.rms_eps)
        q = be.rope(be.view(q, (n_tok, cfg.n_head, cfg.head_dim)), positions)
        k = be.rope(be.view(k, (n_tok, cfg.n_head_kv, cfg.head_dim)), positions)
        v = be.view(v, (n_tok, cfg.n_head_kv, cfg.head_dim))
        for name, a in (("q", q), ("k", k), ("v", v)):
            self._rec(dump, layer, name, a)
        be.kv_write(layer, positions, k, v)
        o = be.view(be.attend(layer, q, positions), (n_tok, cfg.n_q))
        self._rec(dump, layer, "attn_out", o)
        wo = be.w(p + "attn_output")
        out = be.mmq_dense(wo, self._quantize(o, wo))
        self._rec(dump, layer, "attn_proj", out)
        x = be.add(x, out)
        self._rec(dump, layer, "attn_resid", x)
        return x

    def moe_half(self, layer: int, x, dump=None):
        be, cfg = self.be, self.config
        p = f"blk.{layer}."
        n_tok, k_used = be.shape(x)[0], cfg.n_expert_used

        # 1. norm, router, top-K; 2. routing tables (device), their counts on the host
        with be.phase("router"):
            h = be.rmsnorm(x, be.w(p + "ffn_norm"), cfg.rms_eps)
            router = be.w(p + "ffn_gate_inp")
            logits = be.mmq_dense(router, self._quantize(h, router))
            self._rec(dump, layer, "ffn_norm", h)
            self._rec(dump, layer, "router_logits", logits)
            ids, weights = be.top_k(logits, k_used)
            tab = be.routing_tables(ids, cfg.n_expert)
        n_rows = n_tok * k_used

        # 3. the MoE input, quantized once per token (scatter) or once per row (gather)
        gu_t, down_t = be.expert_types(layer)
        in_layout = q8_1.layout_for(gu_t)
        moe_in = be.alloc_q8(n_rows, cfg.n_embd)
        with be.phase("quantize"):
            if self.quant_gather:
                be.quantize_gather(h, tab.src, n_rows, in_layout, moe_in, row0=0, n_rows_total=n_rows)
            else:
                be.quantize_scatter(h, tab.slot, n_tok, k_used, in_layout, moe_in)

        # 4. the walk: groups of MMQ_GROUP consecutive routed experts, in id order
        down_layout = q8_1.layout_for(down_t)
        gate = be.alloc_f32((n_rows, cfg.n_ff_exp))
        up = be.alloc_f32((n_rows, cfg.n_ff_exp))
        down_in = be.alloc_q8(n_rows, cfg.n_ff_exp)
        y = be.alloc_f32((n_rows, cfg.n_embd))
        groups = plan_groups(tab.order, tab.cnt, tab.off, self.group_size)
        bounds = be.group_bounds([g.bounds for g in groups])  # one upload per layer
        for grp, gb in zip(groups, bounds):
            with be.phase("gather"):
                if self.group_gather:
                    bufs = be.gather_group(layer, grp.experts)
                else:
                    bufs = be.gather_each(layer, grp.experts)
            with be.phase("products"):
                be.mmq_group_gate_up(layer, bufs, grp, gb, moe_in, n_rows, gate, up)
            with be.phase("swiglu+quantize H"):
                hh = be.swiglu_rows(gate, up, grp.row_begin, grp.row_end)
                self._rec_rows(dump, "swiglu_h", hh, grp.row_begin, n_rows)
                be.quantize_gather(hh, None, grp.n_rows, down_layout, down_in, row0=grp.row_begin,
                                   n_rows_total=n_rows)
            with be.phase("products"):
                be.mmq_group_down(layer, bufs, grp, gb, down_in, n_rows, y)
            be.release(bufs)

        # 5. the shared expert, 6. combine
        with be.phase("shared expert"):
            shared = self.shared_expert(p, h) if self.config.has_shexp else None
        with be.phase("combine"):
            out = be.combine(x, weights, tab.slot, y, shared)

        if dump is not None:
            slot = be.download(tab.slot)
            dump.layer(layer, "topk_ids", be.download(ids))
            dump.layer(layer, "topk_w", be.download(weights))
            dump.layer(layer, "slot", slot)
            dump.layer(layer, "moe_in_q8_1", q8_1.unpack_rows(be.download(moe_in), n_rows)[slot])
            self._rec(dump, layer, "gate", gate, slot)
            self._rec(dump, layer, "up", up, slot)
            self._rec(dump, layer, "swiglu_h", self._held.pop("swiglu_h", None), slot)
            dump.layer(layer, "down_in_q8_1", q8_1.unpack_rows(be.download(down_in), n_rows)[slot])
            self._rec(dump, layer, "y", y, slot)
            if shared is not None:
                self._rec(dump, layer, "shexp_g", shared[0])
                self._rec(dump, layer, "shexp", shared[1])
            self._rec(dump, layer, "moe_out", out)
        return out

    def shared_expert(self, p: str, h):
        be = self.be
        gate_in = be.w(p + "ffn_gate_inp_shexp")
        g = be.sigmoid(be.mmq_dense(gate_in, self._quantize(h, gate_in)))
        wg, wu, wd = be.w(p + "ffn_gate_shexp"), be.w(p + "ffn_up_shexp"), be.w(p + "ffn_down_shexp")
        act = self._quantize(h, wg)
        gate, up = be.mmq_dense(wg, act), be.mmq_dense(wu, act)
        n_tok = be.shape(h)[0]
        hh = be.swiglu_rows(gate, up, 0, n_tok)
        return g, be.mmq_dense(wd, self._quantize(hh, wd))
