"""The fast engine: the prompt path as a sequence of backend steps (fast/backend.py).

The same code drives two backends: `cuda` (PyCUDA kernels, fast/cuda/backend.py) and `sim`
(NumPy definitions of the same kernels over simulated streams, fast/sim.py), so the walk, the
switches, the rings and the buffers are exercised on machines with no GPU. The engine plugs
into `strata.session.Session` like the reference does. The expert walk itself is
fast/walk.py; where experts live and how rings are filled, fast/experts.py.

The switches (each a keyword argument, a `run` flag and mostly an environment variable) are
declared once, in fast/options.py; the engine resolves them once (fast.options.resolve) into
`self.options`, which it hands to the backend too.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from strata import dense, q8_1
from strata.constants import MMQ_GROUP, PINNED_SHARE, RING_SLOTS, RING_SLOTS_PINNED, STAGING_SLOTS
from strata.errors import InputError

from fast import options
from fast.experts import Ring, RingStream, place_experts
from fast.walk import LayerWalk, plan_groups, split_resident

F32 = np.float32


class FastEngine:
    name = "fast"

    def __init__(self, pack, backend, group_size: int = MMQ_GROUP, **switches):
        """`switches`: fast/options.py's keywords (None: not given, its variable or default)."""
        self.pack = pack
        cfg = self.config = pack.config
        self.be = backend
        o = options.resolve(switches)
        if not 1 <= group_size <= MMQ_GROUP:
            raise InputError(f"group size must be 1..{MMQ_GROUP}, got {group_size}")
        self.group_size = group_size
        ring_slots = o.ring
        if ring_slots is None:  # Strata's rule: a deep ring only where the host side is pinned
            pinned = backend.streamed_bytes_pinned() >= PINNED_SHARE
            ring_slots = RING_SLOTS_PINNED if pinned else RING_SLOTS
        self.options = o = dataclasses.replace(o, ring=ring_slots)
        backend.use_options(o)  # before the cache is sized: widen_float adds to the weights' bytes
        if o.expert_cache == options.AUTO:
            n_cache = backend.expert_cache_capacity(pack, reserve_mib=o.vram_reserve_mib, ring_slots=ring_slots,
                                                    staging_slots=STAGING_SLOTS)
        else:
            n_cache = o.expert_cache
        self.placement = place_experts(cfg.n_layer, cfg.n_expert, n_cache)
        self.ring = Ring("ring", ring_slots)
        self.staging = Ring("stage", STAGING_SLOTS)
        self._stream = None  # the chunk's streamed-walk pass, when the chunk streams
        self._passes = 0
        self._held = {}  # op records of buffers that live one group at a time (_rec_rows)
        with self.be.oom_guard(f"the pack's weights ({pack.file_size >> 20} MiB on disk) with "
                               f"{self.placement.n_resident} resident experts and {ring_slots} ring slots"):
            self.be.load(pack, placement=self.placement, ring_slots=ring_slots, staging_slots=STAGING_SLOTS)
        self.name = f"fast/{backend.name}"

    def __getattr__(self, name):
        """A switch by its keyword (engine.group_gather): its resolved value."""
        o = self.__dict__.get("options")
        if o is None or name not in options.BY_KEYWORD:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(o, name)

    @property
    def counters(self):
        return self.be.counters

    # ---- the engine protocol of strata.session ----------------------------------------
    def chunk_begin(self) -> None:
        """A chunk starts (before its embedding): phase tables and traces are kept per chunk."""
        self.be.chunk_begin()

    def chunk_end(self) -> None:
        """The chunk's last layer is enqueued."""
        self.be.chunk_end()

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
        logits = self._dense(be.w("output"), h)
        return be.download(logits)

    def layer(self, layer: int, x, positions: np.ndarray, dump=None):
        if layer == 0:
            self._begin_chunk(len(positions))
        with self.be.oom_guard(f"the buffers of layer {layer} for a chunk of {len(positions)} tokens "
                               f"(a smaller --prefill chunk needs less)"):
            with self.be.phase("attention", layer=layer):
                x = self.attention_half(layer, x, positions, dump)
            return self.moe_half(layer, x, dump)

    def _begin_chunk(self, n_tok: int) -> None:
        """A chunk from stream_min tokens streams every streamed expert of every layer in
        (layer, id) order through the ring; its first copies start now, before layer 0's
        attention. Smaller chunks stage each layer's routed streamed experts after routing."""
        self._stream = None
        if n_tok >= self.options.stream_min and self.placement.n_streamed:
            p = self.placement
            entries = [(l, int(e)) for l in range(self.config.n_layer) for e in p.streamed(l)]
            self._stream = self._new_pass(self.ring, entries)

    def _new_pass(self, ring: Ring, entries) -> RingStream:
        self._passes += 1
        stream = RingStream(self.be, ring, entries, self._passes, self.options.copy_coalesce)
        with self.be.host_phase("host planning"):  # enqueueing the first copies is host work
            stream.copy_ahead()
        return stream

    # ---- op records (--dump-level ops): nothing is downloaded unless they are asked for ----
    def _rec(self, dump, layer: int, op: str, array, slot=None, on_host: bool = False) -> None:
        """Record op's output (strata/records.py): a device array, downloaded (the sim's arrays
        are NumPy too, filled only once their step has run), or a host one (on_host); slot: the
        host copy of the routing slots, when the rows are expert-sorted."""
        if dump is not None and dump.ops:
            host = array if array is None or on_host else self.be.download(array)
            dump.op(layer, op, host, slot)

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

    def _dense(self, w, x):
        """w . x: float32 products of x itself for a float w (no q8_1 quantize), else MMQ."""
        if dense.is_float(w.qtype):
            return self.be.float_dense(w, x)
        return self.be.mmq_dense(w, self._quantize(x, w))

    def attention_half(self, layer: int, x, positions: np.ndarray, dump=None):
        be, cfg = self.be, self.config
        n_tok = len(positions)
        p = f"blk.{layer}."
        h = be.rmsnorm(x, be.w(p + "attn_norm"), cfg.rms_eps)
        self._rec(dump, layer, "attn_norm", h)
        acts = {}

        def product(name):
            w = be.w(p + name)
            if dense.is_float(w.qtype):
                return be.float_dense(w, h)
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
        out = self._dense(wo, o)
        self._rec(dump, layer, "attn_proj", out)
        x = be.add(x, out)
        self._rec(dump, layer, "attn_resid", x)
        return x

    def moe_half(self, layer: int, x, dump=None):
        be, cfg = self.be, self.config
        p = f"blk.{layer}."
        n_tok, k_used = be.shape(x)[0], cfg.n_expert_used

        # 1. norm, router, top-K; 2. routing tables (device), their counts on the host when the walk
        # first reads them
        with be.phase("router", layer=layer):
            h = be.rmsnorm(x, be.w(p + "ffn_norm"), cfg.rms_eps)
            logits = self._dense(be.w(p + "ffn_gate_inp"), h)
            self._rec(dump, layer, "ffn_norm", h)
            self._rec(dump, layer, "router_logits", logits)
            ids, weights = be.top_k(logits, k_used)
            tab = be.routing_tables(ids, cfg.n_expert)
            if not self.options.overlap_plan:
                tab.order  # noqa: B018 - reading the counts makes the host wait for them here
        n_rows = n_tok * k_used

        # 3. the MoE input, quantized once per token (scatter) or once per row (gather)
        gu_t, down_t = be.expert_types(layer)
        in_layout = q8_1.layout_for(gu_t)
        moe_in = be.alloc_q8(n_rows, cfg.n_embd)
        with be.phase("quantize", layer=layer):
            if self.options.quant_gather:
                be.quantize_gather(x=h, src=tab.src, n_rows=n_rows, layout=in_layout, out=moe_in, row0=0,
                                   n_rows_total=n_rows)
            else:
                be.quantize_scatter(x=h, slot=tab.slot, n_tok=n_tok, k_used=k_used, layout=in_layout,
                                    out=moe_in)

        # 4. the shared expert needs no routing: queued here, the device runs it while the host
        # waits for the routing counts and plans the walk (no idle gap before the first gather)
        shared = self._shared_phase(layer, p, h) if self.options.overlap_plan else None

        # 5. the walk: groups of group_size consecutive routed experts, in id order
        down_layout = q8_1.layout_for(down_t)
        gate = be.alloc_f32((n_rows, cfg.n_ff_exp))
        up = be.alloc_f32((n_rows, cfg.n_ff_exp))
        down_in = be.alloc_q8(n_rows, cfg.n_ff_exp)
        y = be.alloc_f32((n_rows, cfg.n_embd))
        resident = self.placement.resident[layer]
        with be.host_phase("host planning"):
            if self.options.in_place:  # the routed resident experts are one batch; groups hold streamed ones
                batch, walked = split_resident(tab.order, tab.cnt, tab.off, resident)
            else:
                batch, walked = None, tab.order
            groups = plan_groups(walked, tab.cnt, tab.off, self.group_size)
            bounds = be.group_bounds([g.bounds for g in groups])  # one upload per layer

        def swiglu_h(r0: int, r1: int, args: dict) -> None:
            with be.phase("swiglu+quantize H", **args):
                if not self.options.fuse_group or (dump is not None and dump.ops):  # op records keep H: two launches
                    hh = be.swiglu_rows(gate, up, r0, r1)
                    self._rec_rows(dump, "swiglu_h", hh, r0, n_rows)
                    be.quantize_gather(x=hh, src=None, n_rows=r1 - r0, layout=down_layout, out=down_in,
                                       row0=r0, n_rows_total=n_rows)
                else:  # one launch, H never written
                    be.swiglu_quantize(gate=gate, up=up, r0=r0, r1=r1, layout=down_layout, out=down_in, row0=r0,
                                       n_rows_total=n_rows)

        def products(grp, gb):
            args = dict(layer=layer, experts=len(grp.experts), rows=grp.n_rows)
            with be.phase("gate/up", **args):
                be.mmq_group_gate_up(layer=layer, group=grp, bounds=gb, act=moe_in, n_rows=n_rows, gate=gate,
                                     up=up, one_launch=self.options.fuse_group)
            swiglu_h(grp.row_begin, grp.row_end, args)
            with be.phase("down", **args):
                be.mmq_group_down(layer=layer, group=grp, bounds=gb, act=down_in, n_rows=n_rows, y=y)

        walked = [int(e) for e in walked]
        if self._stream is not None:  # streamed walk: this layer's entries, routed or not
            stream = self._stream
            with be.host_phase("host planning"):
                visit = sorted(set(walked) | set(int(e) for e in self.placement.streamed(layer)))
        else:  # staged: the routed streamed experts, through the staging ring
            stream = self._new_pass(self.staging, [(layer, e) for e in walked if not resident[e]])
            visit = walked
        # the resident batch's gate/up first: the device multiplies while the copies land
        in_batch = batch is not None and len(batch.experts) > 0
        if in_batch:
            bargs = dict(layer=layer, experts=len(batch.experts), rows=batch.n_rows, resident=True)
            with be.phase("gate/up", **bargs):
                be.mmq_batch_gate_up(layer=layer, batch=batch, act=moe_in, n_rows=n_rows, gate=gate, up=up,
                                     one_launch=self.options.fuse_group)
        LayerWalk(be, layer, self.placement, stream, self.options.group_gather, products).run(groups, bounds, visit)
        if in_batch:
            # SwiGLU over the rows from the batch's first to its last: when streamed experts'
            # rows lie between, they are computed again from the same gate and up, the same bytes
            swiglu_h(int(batch.bounds[:, 0].min()), int(batch.bounds[:, 1].max()), bargs)
            with be.phase("down", **bargs):
                be.mmq_batch_down(layer=layer, batch=batch, act=down_in, n_rows=n_rows, y=y)

        # 6. combine (the shared expert here when it was not queued early)
        if not self.options.overlap_plan:
            shared = self._shared_phase(layer, p, h)
        with be.phase("combine", layer=layer):
            out = be.combine(x, weights, tab.slot, y, shared)

        if dump is not None:
            slot = be.download(tab.slot)
            dump.layer(layer, "topk_ids", be.download(ids))
            dump.layer(layer, "topk_w", be.download(weights))
            dump.layer(layer, "slot", slot)
            dump.layer(layer, "moe_in_q8_1", q8_1.unpack_rows(be.download(moe_in), n_rows)[slot])
            self._rec(dump, layer, "gate", gate, slot)
            self._rec(dump, layer, "up", up, slot)
            self._rec(dump, layer, "swiglu_h", self._held.pop("swiglu_h", None), slot, on_host=True)
            dump.layer(layer, "down_in_q8_1", q8_1.unpack_rows(be.download(down_in), n_rows)[slot])
            self._rec(dump, layer, "y", y, slot)
            if shared is not None:
                self._rec(dump, layer, "shexp_g", shared[0])
                self._rec(dump, layer, "shexp", shared[1])
            self._rec(dump, layer, "moe_out", out)
        return out

    def _shared_phase(self, layer: int, p: str, h):
        with self.be.phase("shared expert", layer=layer):
            return self.shared_expert(p, h) if self.config.has_shexp else None

    def shared_expert(self, p: str, h):
        be = self.be
        g = be.sigmoid(self._dense(be.w(p + "ffn_gate_inp_shexp"), h))
        wg, wu, wd = be.w(p + "ffn_gate_shexp"), be.w(p + "ffn_up_shexp"), be.w(p + "ffn_down_shexp")
        if dense.is_float(wg.qtype):
            gate, up = be.float_dense(wg, h), be.float_dense(wu, h)
        else:
            act = self._quantize(h, wg)
            gate, up = be.mmq_dense(wg, act), be.mmq_dense(wu, act)
        n_tok = be.shape(h)[0]
        hh = be.swiglu_rows(gate, up, 0, n_tok)
        return g, self._dense(wd, hh)
