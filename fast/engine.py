"""The fast engine: the prompt path as a sequence of backend steps (fast/backend.py).

The same code drives two backends: `cuda` (PyCUDA kernels, fast/cuda/backend.py) and `sim`
(NumPy definitions of the same kernels over simulated streams, fast/sim.py), so the walk, the
switches, the rings and the buffers are exercised on machines with no GPU. The engine plugs
into `strata_prefill.session.Session` like the reference does. The expert walk itself is
fast/walk.py; which experts are copied into the ring, when and why, fast/schedule.py (one
CopySchedule a chunk or window); where experts live and how rings are filled, fast/experts.py.

The switches (each a keyword argument, a `run` flag and mostly an environment variable) are
declared once, in fast/options.py; the engine resolves them once (strata_prefill.fast.options.resolve) into
`self.options`, which it hands to the backend too.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from strata_prefill.contract import dense, q8_1
from strata_prefill.formats import nonfinite
from strata_prefill.contract.constants import MMQ_GROUP
from strata_prefill.fast.tuning import (
    PINNED_SHARE,
    PREDICT_ROWS,
    RING_SLOTS,
    RING_SLOTS_PINNED,
    STAGING_SLOTS,
)
from strata_prefill.contract.errors import InputError

from strata_prefill.fast import archs, options, walk
from strata_prefill.fast.experts import Passes, Place, Ring, place_experts
from strata_prefill.fast.moe_steps import MoeSteps
from strata_prefill.fast.schedule import CopyParts, PromptSchedules
from strata_prefill.fast.weights import LayerWeights

F32 = np.float32


def window_bytes_per_token(config) -> int:
    """Device bytes a layer-major window holds per token, for `--window auto`: what the MoE half
    of a layer allocates over all of the window's tokens. Per token: the residual in, its norm,
    the combined output and the shared expert's output (float32 rows), the norm's q8_1 row, the
    router logits, the top-K ids and weights and the routing tables' slot and src, the shared
    expert's gate, up and H; per each of its K expert-sorted rows: the MoE input (q8_1, or
    float32 for float experts), gate and up (float32), down's input (q8_1, or float32 H) and y
    (float32); with expert biases, each row's expert (int32). Attention's buffers are a chunk's,
    as without windows."""
    c, k, f32 = config, config.n_expert_used, 4
    per_row = (max(q8_1.buffer_nbytes(1, c.n_embd), f32 * c.n_embd) + 2 * f32 * c.n_ff_exp
               + max(q8_1.buffer_nbytes(1, c.n_ff_exp), f32 * c.n_ff_exp) + f32 * c.n_embd)
    per_token = (4 * f32 * c.n_embd + q8_1.buffer_nbytes(1, c.n_embd) + f32 * c.n_expert + 4 * 4 * k
                 + 3 * f32 * c.n_ff_shexp)
    if c.spec.MOE.expert_bias:
        per_row += 4
    return k * per_row + per_token


class DeviceWatch(nonfinite.Watch):
    """The run's NaN/Inf watch (formats/nonfinite.py) kept by the backend: each `see` queues a
    mark behind the op that wrote the array (a kernel on the cuda backend, no host wait); gate,
    up and shexp have no `see`: the SwiGLU steps that read them mark them (`code`s passed as the
    steps' mark). `first` reads the one value, when the run has its logits."""

    def __init__(self, backend, n_layer: int):
        super().__init__(n_layer)
        self.be = backend

    def reset(self) -> None:
        super().reset()
        self.be.nonfinite_reset()

    def see(self, layer: int, op: str, array) -> None:
        self.be.nonfinite_mark(array, self.code(layer, op))

    def _read(self) -> int:
        return self.be.nonfinite_first()


class FastEngine:
    name = "fast"

    def __init__(self, pack, backend, group_size: int = MMQ_GROUP, **switches):
        """`switches`: fast/options.py's keywords (None: not given, its variable or default)."""
        self.pack = pack
        cfg = self.config = pack.config
        self.be = backend
        self._arch = archs.module(cfg.arch)  # its attention half (fast/archs)
        self._moe = MoeSteps.of(cfg.spec.MOE)  # its MoE values as the steps' keywords
        self._layer_weights: dict = {}  # layer -> LayerWeights
        o = options.resolve(switches)
        if not 1 <= group_size <= MMQ_GROUP:
            raise InputError(f"group size must be 1..{MMQ_GROUP}, got {group_size}")
        self.group_size = group_size
        ring_slots = o.ring
        if ring_slots is None:  # Strata's rule: a deep ring only where the host side is pinned
            pinned = backend.streamed_bytes_pinned() >= PINNED_SHARE
            ring_slots = RING_SLOTS_PINNED if pinned else RING_SLOTS
        self.options = o = dataclasses.replace(o, ring=ring_slots)
        backend.use_options(o)
        # the staged walk's ring: the streamed walk's own (stage_in_ring), or 8 slots of its own
        staging_slots = 0 if o.stage_in_ring else STAGING_SLOTS
        if o.expert_cache == options.AUTO:
            n_cache = backend.expert_cache_capacity(pack, reserve_mib=o.vram_reserve_mib, ring_slots=ring_slots,
                                                    staging_slots=staging_slots)
        else:
            n_cache = o.expert_cache
        self.placement = place_experts(cfg.n_layer, cfg.n_expert, n_cache)
        # a switch set that does nothing with these experts where they lie is refused (the one rule
        # of fast/options.py), before any weight is loaded; the command line checked what it knew
        options.refuse_idle(switches, self._facts(backend.name, o.expert_cache, n_cache))
        self.ring = Ring(Place.RING, ring_slots)
        self.staging = self.ring if o.stage_in_ring else Ring(Place.STAGE, STAGING_SLOTS)
        self.passes = Passes(backend, o.copy_coalesce)
        #: the copy schedule of each chunk (or window) of the current prompt (fast/schedule.py)
        self.schedules = PromptSchedules(CopyParts(
            backend, cfg, o, self.placement, self.ring, self.staging, self.passes,
            blob_bytes=tuple(pack.expert_blob_size(l) for l in range(cfg.n_layer)),  # one expert's, per layer
            n_streamed=tuple(len(self.placement.streamed(l)) for l in range(cfg.n_layer))))
        self.window_reason: str | None = None  # why window_tokens took its window (run prints it)
        with self.be.oom_guard(f"the pack's weights ({pack.file_size >> 20} MiB on disk) with "
                               f"{self.placement.n_resident} resident experts and {ring_slots} ring slots"):
            self.be.load(pack, placement=self.placement, ring_slots=ring_slots, staging_slots=staging_slots)
        self.name = f"fast/{backend.name}"
        self.watch = DeviceWatch(backend, cfg.n_layer)  # where a run first computed a NaN or an Inf

    def _facts(self, backend: str, setting, n_cache: int) -> options.Facts:
        """What refuse_idle knows here: the experts' places, and who sized the cache."""
        cfg = self.config
        if setting == options.AUTO and backend == "sim":
            return options.facts_of("fast", backend, setting, cfg)
        by = (f"--expert-cache auto ({n_cache} slots in free memory)" if setting == options.AUTO
              else f"--expert-cache {n_cache}")
        return options.placed_facts("fast", backend, n_cache, cfg.n_layer * cfg.n_expert, by, cfg.n_layer,
                                    cfg.n_expert)

    def __getattr__(self, name):
        """A switch by its keyword (engine.group_gather): its resolved value."""
        o = self.__dict__.get("options")
        if o is None or name not in options.BY_KEYWORD:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(o, name)

    @property
    def counters(self):
        return self.be.counters

    @property
    def schedule(self):
        """The copy schedule of the chunk (or window) running now (strata_prefill.fast.schedule.CopySchedule)."""
        return self.schedules.now

    @property
    def walk_choices(self) -> list:
        """The walk each chunk (or window) of the current prompt took, layer by layer, and why
        (strata_prefill.fast.schedule.WalkChoice), in order; a prompt that starts at position 0 starts the list
        again (run --timing prints it)."""
        return self.schedules.records()

    # ---- the engine protocol of strata_prefill.session ----------------------------------------
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

    def window_tokens(self, chunk: int, n_tok: int) -> int:
        """The tokens of the layer-major windows (the window switch) a prompt of n_tok tokens cut
        into chunks of `chunk` runs in: whole chunks; `chunk` itself (today's walk, one chunk a
        window) under off. auto (the default): where experts stream, the most whole chunks whose
        window buffers (window_bytes_per_token) fit in the backend's budget, at least one, at most
        the prompt's; one chunk where every expert is resident (a window saves copies, nothing else:
        docs/results/2026-12-02-ring-in-place-8layer.md). window_reason: why, in a few words."""
        w = self.options.window
        if w == options.AUTO:
            if not self.placement.n_streamed:
                self.window_reason = "--window auto: every expert resident, a window would save no copy"
                return chunk
            budget, per_chunk = self.be.window_budget_bytes(), window_bytes_per_token(self.config) * chunk
            need = -(-int(n_tok) // chunk)
            fit = budget // per_chunk
            self.window_reason = (f"--window auto: experts stream; the buffers of {int(fit):,} chunk(s) "
                                  f"({per_chunk / 2**20:,.0f} MiB a chunk) fit in {budget / 2**30:,.1f} GiB, "
                                  f"the prompt has {need}")
            return chunk * max(1, min(int(fit), need))
        tokens, self.window_reason = options.window_taken(w, chunk, n_tok)
        return tokens

    def window_layer(self, layer: int, x, spans: list, dump=None):
        """One layer of a layer-major window: x [W, n_embd], the window's residual; spans: the
        positions of each of its chunks, in order. The attention half per chunk, in chunk order
        (each chunk's queries see the KV cache its earlier chunks wrote at this layer), then the
        MoE half once over all W tokens: the window's ring pass brings each streamed expert of
        the layer once (docs/numerics.md section 9: no bit depends on the grouping)."""
        n_tok = sum(len(s) for s in spans)
        if layer == 0:
            self.schedules.begin(n_tok, int(spans[0][0]))
        with self.be.oom_guard(f"the buffers of layer {layer} for a window of {n_tok} tokens in {len(spans)} "
                               f"chunks (a smaller --window needs less)"):
            parts, r0 = [], 0
            for positions in spans:
                with self.be.phase("attention", layer=layer):
                    part = self.be.rows(x, r0, r0 + len(positions))
                    parts.append(self.attention_half(layer, part, positions, dump))
                self.schedule.after_attention(layer)
                r0 += len(positions)
            x = self.be.join_rows(x, parts)
            return self.moe_half(layer, x, dump)

    def layer(self, layer: int, x, positions: np.ndarray, dump=None):
        if layer == 0:
            self.schedules.begin(len(positions), int(positions[0]) if len(positions) else 0)
        with self.be.oom_guard(f"the buffers of layer {layer} for a chunk of {len(positions)} tokens "
                               f"(a smaller --prefill chunk needs less)"):
            with self.be.phase("attention", layer=layer):
                x = self.attention_half(layer, x, positions, dump)
            self.schedule.after_attention(layer)
            return self.moe_half(layer, x, dump)

    def _predict_next(self, layer: int, x) -> None:
        """head_predict: where the next layer's walk waits for this layer's routing and could stage
        with a head, its routing predicted from this layer's residual x (its ffn norm, router and
        top-k on x's first PREDICT_ROWS rows, the residual after this layer's attention: the next
        router sees it after this layer's MoE half and the next attention), queued behind this
        layer's routing tables; the host reads the counts (backend expert_counts) when it chooses
        the next layer's walk. A layer that then streams after all wasted one short chunk's router."""
        cfg, be, nxt = self.config, self.be, layer + 1
        if not self.schedule.wants_prediction(nxt):
            return
        with be.phase("predict", layer=layer):
            W = self.layer_weights(nxt)
            n = be.shape(x)[0]
            h = be.rmsnorm(x if n <= PREDICT_ROWS else be.rows(x, 0, PREDICT_ROWS), W.ffn_norm, cfg.rms_eps)
            ids, _weights = be.top_k(self._dense(W.ffn_gate_inp, h), cfg.n_expert_used, **self._moe.router(W))
            self.schedule.predicted(nxt, be.expert_counts(ids, cfg.n_expert))

    # ---- op records (--dump-level ops): nothing is downloaded unless they are asked for ----
    def _rec(self, dump, layer: int, op: str, array, slot=None, on_host: bool = False) -> None:
        """Record op's output (formats/records.py): a device array, downloaded (the sim's arrays
        are NumPy too, filled only once their step has run), or a host one (on_host); slot: the
        host copy of the routing slots, when the rows are expert-sorted."""
        if dump is not None and dump.ops:
            host = array if array is None or on_host else self.be.download(array)
            dump.op(layer, op, host, slot)

    # ---- pieces -----------------------------------------------------------------------
    def _quantize(self, x, w):
        """x's rows as a q8_1 buffer in the layout the weight w multiplies."""
        return self.be.quantize_rows(x, q8_1.layout_for(w.qtype))

    def _dense(self, w, x):
        """w . x: float32 products of x itself for a float w (no q8_1 quantize), else MMQ."""
        if dense.is_float(w.qtype):
            return self.be.float_dense(w, x)
        return self.be.mmq_dense(w, self._quantize(x, w))

    def layer_weights(self, layer: int) -> LayerWeights:
        """Layer `layer`'s weights by field (fast/weights.py: the architecture's table)."""
        got = self._layer_weights.get(layer)
        if got is None:
            got = self._layer_weights[layer] = LayerWeights(self.be, self.pack, layer)
        return got

    def attention_half(self, layer: int, x, positions: np.ndarray, dump=None):
        """The architecture's attention half (fast/archs/<name>.py), x [T, n_embd] in and out."""
        return self._arch.attention_half(self, layer, x, positions, dump)

    def moe_half(self, layer: int, x, dump=None):
        """x [T, n_embd] residual in, residual out: reference/moe_half.py's steps on the device."""
        be, cfg, o = self.be, self.config, self.options
        W = self.layer_weights(layer)
        n_tok, k_used = be.shape(x)[0], cfg.n_expert_used
        n_rows = n_tok * k_used

        # 1. Norm and router. 2. Routing tables (device); their counts reach the host when the
        # walk first reads them, or never where the walk is planned on the device (device_plan).
        on_device = walk.plans_on_device(be, o, self.placement, layer)
        with be.phase("router", layer=layer):
            h = be.rmsnorm(x, W.ffn_norm, cfg.rms_eps)
            logits = self._dense(W.ffn_gate_inp, h)
            self.watch.see(layer, "router_logits", logits)  # a -Inf logit is only an expert not picked
            self._rec(dump, layer, "ffn_norm", h)
            self._rec(dump, layer, "router_logits", logits)
            ids, weights = be.top_k(logits, k_used, **self._moe.router(W))
            tab = be.routing_tables(ids, cfg.n_expert, to_host=not on_device)
            # the expert of each expert-sorted row, where the SwiGLU steps add expert biases
            rexp = be.row_experts(ids, tab.slot) if self._moe.expert_bias else None
            if not o.overlap_plan and not on_device:
                tab.order  # noqa: B018 - reading the counts makes the host wait for them here
        self._predict_next(layer, x)  # head_predict: queued behind the routing, read when the next layer is chosen

        # 3. The MoE input, quantized once per token (scatter) or once per row (gather); float
        # gate/up experts take the rows themselves, copied per token or per row the same way.
        gu_t, down_t = be.expert_types(layer)
        if dense.is_float(gu_t):
            with be.phase("gather rows", layer=layer):
                if o.quant_gather:
                    moe_in = be.gather_rows(x=h, src=tab.src, n_rows=n_rows)
                else:
                    moe_in = be.scatter_rows(x=h, slot=tab.slot, n_tok=n_tok, k_used=k_used)
        else:
            in_layout = q8_1.layout_for(gu_t)
            moe_in = be.alloc_q8(n_rows, cfg.n_embd)
            with be.phase("quantize", layer=layer):
                if o.quant_gather:
                    be.quantize_gather(x=h, src=tab.src, n_rows=n_rows, layout=in_layout, out=moe_in, row0=0,
                                       n_rows_total=n_rows)
                else:
                    be.quantize_scatter(x=h, slot=tab.slot, n_tok=n_tok, k_used=k_used, layout=in_layout,
                                        out=moe_in)

        # 5 before 4 with overlap_plan: the shared expert needs no routing, so it is queued first and
        # the device runs it while the host waits for the routing counts and plans the walk (no
        # idle gap before the first gather)
        shared = self._shared_phase(layer, W, h) if o.overlap_plan else None

        # 4. The per-expert walk (fast/walk.py), through the ring pass the unit's copy schedule gives it.
        # The watch's gate and up (H's quantize would hide what they hold) are marked by the SwiGLU
        # steps that read them (glu's mark): every form of the walk takes every row through one,
        # after its product; where a step read rows not yet written, the walk made no mark there.
        ring_pass, ahead = self.schedule.layer_pass(layer, tab)
        marks = (self.watch.code(layer, "gate"), self.watch.code(layer, "up"))
        glu = dict(self._moe.glu(be, W, rexp, cfg), mark=marks)
        rows = walk.run_experts(be, config=cfg, layer=layer, tab=tab, n_rows=n_rows, moe_in=moe_in,
                                down_layout=None if dense.is_float(down_t) else q8_1.layout_for(down_t),
                                placement=self.placement, ring_pass=ring_pass, ahead=ahead, options=o,
                                group_size=self.group_size, on_device=on_device, keep_h=dump is not None and dump.ops,
                                glu=glu)
        if not rows.marked:
            self.watch.see(layer, "gate", rows.gate)
            self.watch.see(layer, "up", rows.up)

        # 5. The shared expert, where it was not queued before the walk.
        if not o.overlap_plan:
            shared = self._shared_phase(layer, W, h)

        # 6. Combine in rank order, then the shared expert, then the residual.
        with be.phase("combine", layer=layer):
            out = be.combine(x, weights, tab.slot, rows.y, shared, **self._moe.combine(be, W, ids, cfg))
        self.watch.see(layer, "moe_out", out)  # the residual: what every op before it reaches

        if dump is not None:  # in the order computed (formats/records.py)
            slot = be.download(tab.slot)
            dump.layer(layer, "topk_ids", be.download(ids))
            dump.layer(layer, "topk_w", be.download(weights))
            dump.layer(layer, "slot", slot)
            if not dense.is_float(gu_t):  # float experts have no q8_1 buffers to record
                dump.layer(layer, "moe_in_q8_1", q8_1.unpack_rows(be.download(moe_in), n_rows)[slot])
            self._rec(dump, layer, "gate", rows.gate, slot)
            self._rec(dump, layer, "up", rows.up, slot)
            self._rec(dump, layer, "swiglu_h", rows.h, slot, on_host=True)
            if not dense.is_float(down_t):
                dump.layer(layer, "down_in_q8_1", q8_1.unpack_rows(be.download(rows.down_in), n_rows)[slot])
            self._rec(dump, layer, "y", rows.y, slot)
            if shared is not None:
                self._rec(dump, layer, "shexp_g", shared[0])
                self._rec(dump, layer, "shexp", shared[1])
            self._rec(dump, layer, "moe_out", out)
        return out

    def _shared_phase(self, layer: int, W: LayerWeights, h):
        with self.be.phase("shared expert", layer=layer):
            return self.shared_expert(W, h) if self.config.has_shexp else None

    def shared_expert(self, W: LayerWeights, h):
        be = self.be
        g = be.sigmoid(self._dense(W.ffn_gate_inp_shexp, h))
        wg, wu, wd = W.ffn_gate_shexp, W.ffn_up_shexp, W.ffn_down_shexp
        if dense.is_float(wg.qtype):
            gate, up = be.float_dense(wg, h), be.float_dense(wu, h)
        else:
            act = self._quantize(h, wg)
            gate, up = be.mmq_dense(wg, act), be.mmq_dense(wu, act)
        n_tok = be.shape(h)[0]
        code = self.watch.code(W.index, "shexp")  # gate and up, which H's quantize would hide, under one op
        hh = be.swiglu_rows(gate, up, 0, n_tok, mark=(code, code))
        return g, self._dense(wd, hh)
