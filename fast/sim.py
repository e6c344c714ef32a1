"""The `sim` backend: every kernel of the fast path as its NumPy definition from contract/, on
host arrays standing in for device buffers, over simulated streams (fast/sim_streams.py).

Nothing runs when the engine or the walk calls a step: the step is enqueued on the compute
stream (copies on the copy stream) and a seeded scheduler runs the two streams in any order
their events allow. Outputs are allocated at enqueue time and filled when their step runs, so
a step that reads a buffer before the step writing it has run sees the poison (NaN, 0xA5).
Ring slots carry versions; a gather (or, with ring_in_place, a product) of a slot refilled too
early or already released, a release before the slot's last read, a copy over a slot whose
release nobody waited for, or a wait on an event nothing records raises ScheduleHazard.

The expert cache and the host tier are the pack's own bytes (a memory map); the ring slots are
host arrays. Launch counters count what the CUDA backend would launch. Phase timing is host
time (fast/phases.py); a trace (fast/trace.py) is the streams' modelled time
(fast/sim_streams.ModelClock), each operation named by the phase that enqueued it.
"""
from __future__ import annotations

import collections
import contextlib
import weakref
from dataclasses import dataclass

import numpy as np

from strata_prefill.contract import attention, dense, mmq, numerics, q8_1, quants
from strata_prefill.formats import nonfinite
from strata_prefill.contract.constants import GROUP_TAIL_BYTES, MMQ_GROUP
from strata_prefill.contract.moe import add_expert_bias, combine, gather_rows, glu, scatter_rows
from strata_prefill.formats.nonfinite import NOTHING
from strata_prefill.contract.routing import routing_tables, row_experts, top_k

from strata_prefill.fast.backend_base import BackendBase
from strata_prefill.fast.experts import Place, adjacent_runs
from strata_prefill.fast.phases import HostClock, PhaseRecorder, timing_enabled
from strata_prefill.fast.sim_streams import ModelClock, SimEvent, SimStreams
from strata_prefill.fast.tiles import DEFAULT_TILE_ROWS, ListPlan, max_row_tiles, routed_row_lists
from strata_prefill.fast.walk import DeviceBatch

F32 = np.float32
#: the device bytes `--window auto` may give a window's buffers on the sim (docs/how-it-works.md)
SIM_WINDOW_BUDGET = 1 << 30


@dataclass
class Weight:
    """A weight matrix as the backend holds it."""

    qtype: object
    n_rows: int
    n_cols: int
    data: np.ndarray  # uint8 [n_rows, row_bytes]


@dataclass
class Q8Buf:
    """A q8_1 buffer: n_rows rows of K values (column-block-major bytes)."""

    data: np.ndarray
    n_rows: int
    K: int


@dataclass
class Tables:
    """Routing tables: device copies (slot, src, and dev_cnt, dev_off: the counts and offsets
    where they lie) and host copies for the walk (cnt, off, order)."""

    slot: np.ndarray
    src: np.ndarray
    cnt: np.ndarray
    off: np.ndarray
    order: np.ndarray

    @property
    def dev_cnt(self) -> np.ndarray:
        return self.cnt

    @property
    def dev_off(self) -> np.ndarray:
        return self.off


class DeviceTables:
    """Routing tables that stay on the device (routing_tables to_host False, device_plan): slot,
    src, dev_cnt, dev_off are filled when the compute stream runs the launch; cnt, off and order
    read the counts back on first use (a host read, counted: op records may ask for them)."""

    def __init__(self, slot, src, dev_cnt, dev_off, be):
        self.slot, self.src, self.dev_cnt, self.dev_off = slot, src, dev_cnt, dev_off
        # weakly: the backend keeps the tables (its DeviceBatch tiles), a strong reference would be a cycle
        self._be, self._host = weakref.proxy(be), None

    def _read(self):
        if self._host is None:
            be = self._be
            with be.host_phase("router sync"):
                be.streams.synchronize("compute")
            be.counters["host_reads"] += 1
            cnt, off = self.dev_cnt.copy(), self.dev_off.copy()
            self._host = (cnt, off, np.nonzero(cnt)[0].astype(np.int32))
        return self._host

    @property
    def cnt(self) -> np.ndarray:
        return self._read()[0]

    @property
    def off(self) -> np.ndarray:
        return self._read()[1]

    @property
    def order(self) -> np.ndarray:
        return self._read()[2]


class _Counts:
    """expert_counts' result: the counts, once the compute stream has run their launch (the
    first read waits for it, as the cuda backend's host waits for its copy)."""

    def __init__(self, host: np.ndarray, be):
        self.host, self._be, self._done = host, be, False

    @property
    def cnt(self) -> np.ndarray:
        if not self._done:
            with self._be.host_phase("router sync"):
                self._be.streams.synchronize("compute")
            self._be.counters["host_reads"] += 1
            self._done = True
        return self.host


class SimBackend(BackendBase):
    name = "sim"

    def __init__(self, timing=None, schedule_seed: int | None = 0, policy: str = "random"):
        self.counters = collections.Counter()
        self.streams = SimStreams(schedule_seed, policy)
        self.phases = PhaseRecorder(HostClock.mark, HostClock.seconds, timing_enabled(timing))
        self._phase_now: tuple = ("", {})  # the phase enqueueing now: names ops in a trace
        self._n_events = 0

    # ---- timing and traces ----------------------------------------------------------------
    @contextlib.contextmanager
    def phase(self, name: str, **args):
        outer, self._phase_now = self._phase_now, (name, args)
        try:
            with self.phases.phase(name, **args):
                yield
        finally:
            self._phase_now = outer

    def chunk_end(self) -> None:
        if self.phases.chunk_timing:  # the chunk's total: its queued work run, not only enqueued
            self.streams.synchronize()
        self.phases.chunk_end()

    def chunk_tables(self) -> list:
        """Host seconds per phase and per chunk since the last call (strata_prefill.fast.phases.ChunkTimes)."""
        self.streams.synchronize()  # a chunk's total ends when its queued work has run
        return self.phases.chunk_tables()

    def trace_begin(self) -> None:
        """Start the modelled clock at 0 with both streams empty."""
        self.streams.synchronize()
        self.phases.reset()
        self.streams.clock = ModelClock()

    def trace_end(self) -> list:
        """Run what is queued; the spans since trace_begin (strata_prefill.fast.trace.Span)."""
        self.streams.synchronize()
        clock, self.streams.clock = self.streams.clock, None
        return clock.spans if clock is not None else []

    def _span(self, kernel: str) -> tuple[str, dict | None]:
        """(name, args) of a compute op's span: its phase's name (the kernel's outside phases)."""
        if self.streams.clock is None:
            return "", None
        name, args = self._phase_now
        return name or kernel, {"chunk": self.phases.chunk, "kernel": kernel, **args}

    @staticmethod
    def oom_guard(what: str):
        return contextlib.nullcontext()

    # ---- enqueueing ---------------------------------------------------------------------
    def _launch(self, kernel: str, fn, n: int = 1, reads=None) -> None:
        """Enqueue a launch (n of them, counted). reads: the ring slots it reads, [(ring, slot,
        tag)] (ring_in_place products): checked as a gather's are (SimStreams.gather_from)."""
        self.counters[kernel] += n
        self.counters["launches"] += n
        if reads:
            slots = ", ".join(f"{r} slot {s}" for r, s, _t in reads)
            self.streams.gather_from(reads, f"{kernel} reading {slots}", fn, *self._span(kernel))
        else:
            self.streams.enqueue("compute", kernel, fn, *self._span(kernel))

    def _step(self, kernel: str, out: np.ndarray, fn) -> np.ndarray:
        """Enqueue `out[...] = fn()`; return out (filled when the step runs)."""
        def run():
            out[...] = fn()

        self._launch(kernel, run)
        return out

    # ---- set-up -------------------------------------------------------------------------
    def load(self, pack, *, placement, ring_slots: int, staging_slots: int) -> None:
        self.pack = pack
        cfg = self.config = pack.config
        self.placement = placement
        self.kv = attention.KVCache(cfg.n_layer, cfg.n_head_kv, cfg.head_dim)
        self._weights: dict = {}
        self._blob_bytes = [pack.expert_blob_bytes(l) for l in range(cfg.n_layer)]
        self._blob_sizes = [pack.expert_blob_size(l) for l in range(cfg.n_layer)]
        slot_bytes = max(self._blob_sizes)
        self._rings = {Place.RING: np.full((ring_slots, slot_bytes), 0xA5, np.uint8),
                       Place.STAGE: np.full((staging_slots, slot_bytes), 0xA5, np.uint8)}
        max_gu = max(gu for gu, _ in self._blob_bytes)
        max_d = max(d for _, d in self._blob_bytes)
        self._gu_buf = np.full(MMQ_GROUP * 2 * max_gu + GROUP_TAIL_BYTES, 0xA5, np.uint8)
        self._d_buf = np.full(MMQ_GROUP * max_d + GROUP_TAIL_BYTES, 0xA5, np.uint8)

    @staticmethod
    def expert_cache_capacity(pack, *, reserve_mib: int, ring_slots: int, staging_slots: int) -> int:
        """The sim has no device memory to run out of: every expert fits."""
        return pack.config.n_layer * pack.config.n_expert

    @staticmethod
    def streamed_bytes_pinned() -> float:
        return 1.0  # the simulated host tier stands for page-locked memory

    @staticmethod
    def window_budget_bytes() -> int:
        """The sim has no device memory: `--window auto` sizes windows from a fixed budget."""
        return SIM_WINDOW_BUDGET

    def reset_cache(self) -> None:
        cfg = self.config
        self.streams.synchronize()
        self.kv = attention.KVCache(cfg.n_layer, cfg.n_head_kv, cfg.head_dim)

    def w(self, name: str):
        got = self._weights.get(name)
        if got is None:
            if self.pack.is_vector(name):  # a norm (the architecture's table)
                got = self.pack.vector(name)
            else:
                m = self.pack.output() if name == "output" else self.pack.matrix(name)
                got = Weight(m.qtype, m.n_rows, m.n_cols, np.asarray(m.data))
            self._weights[name] = got
        return got

    # ---- buffers ------------------------------------------------------------------------
    def download(self, a):
        self.streams.synchronize("compute")
        self.counters["host_reads"] += 1  # a device-to-host read, as the cuda backend counts it
        return np.array(a.data if isinstance(a, Q8Buf) else a, copy=True)

    @staticmethod
    def alloc_f32(shape):
        return np.full(shape, np.nan, dtype=F32)  # poisoned: an unwritten row shows

    @staticmethod
    def alloc_q8(n_rows: int, K: int):
        return Q8Buf(np.full(q8_1.buffer_nbytes(n_rows, K), 0xA5, np.uint8), n_rows, K)

    # ---- dense steps --------------------------------------------------------------------
    def embed(self, ids):
        ids = np.array(ids, copy=True)
        return self._step("embed", self.alloc_f32((len(ids), self.config.n_embd)),
                          lambda: self.pack.embedding_rows(ids))

    def rmsnorm(self, x, w, eps):
        return self._step("rmsnorm", self.alloc_f32(x.shape), lambda: numerics.rmsnorm(x, w, eps))

    def quantize_rows(self, x, layout):
        out = self.alloc_q8(x.shape[0], x.shape[1])
        self._step("q8_1_gather", out.data, lambda: q8_1.pack_rows(q8_1.quantize_rows(x, layout)))
        return out

    @staticmethod
    def _decode(buf: Q8Buf, r0: int, r1: int, layout) -> q8_1.Q8Rows:
        rows = q8_1.unpack_rows(buf.data, buf.n_rows)[r0:r1]
        return q8_1.decode_rows(np.ascontiguousarray(rows), r1 - r0, layout)

    def mmq_dense(self, w: Weight, act: Q8Buf):
        layout = q8_1.layout_for(w.qtype)
        return self._step("mmq", self.alloc_f32((act.n_rows, w.n_rows)),
                          lambda: mmq.mmq(w.qtype, w.data, self._decode(act, 0, act.n_rows, layout)))

    def float_dense(self, w: Weight, x):
        """x [T, K] times an F32/F16/BF16 weight, float32 [T, N] (strata_prefill.contract.dense.float_matmul)."""
        return self._step("float_dense", self.alloc_f32((x.shape[0], w.n_rows)),
                          lambda: dense.float_matmul(dense.decode_float(w.qtype, w.data), x))

    def _make_rope(self, n_pos: int):
        return numerics.rope_table(n_pos, self.config.head_dim, self.config.rope_base,
                                   self.config.rope_scaling)

    def rope(self, x, positions):
        table = self.rope_table(int(positions.max()) + 1)
        positions = np.array(positions, copy=True)
        return self._step("rope", self.alloc_f32(x.shape), lambda: numerics.rope_neox(x, positions, *table))

    def kv_write(self, layer, positions, k, v):
        positions = np.array(positions, copy=True)
        self._launch("kv_write", lambda: self.kv.write(layer, positions, k, v))

    def attend(self, layer, q, positions, sinks=None, window=None):
        positions = np.array(positions, copy=True)
        return self._step("attention", self.alloc_f32(q.shape),
                          lambda: attention.attend(self.kv, layer, q, positions, sinks=sinks, window=window))

    # ---- the NaN/Inf watch (formats/nonfinite.py), a step on the compute stream like the kernel's
    def nonfinite_reset(self) -> None:
        self._nonfinite = [NOTHING]  # a new box: a mark still queued from before writes the old one

    def nonfinite_mark(self, x, code: int) -> None:
        box = self._watch()

        def run():
            box[0] = nonfinite.mark(box[0], x, code)

        self._launch("nonfinite_mark", run)

    def nonfinite_first(self) -> int:
        if self._nonfinite is None:
            return NOTHING
        self.streams.synchronize("compute")
        self.counters["host_reads"] += 1
        return self._nonfinite[0]

    def add(self, x, y):
        return self._step("add", self.alloc_f32(x.shape), lambda: x + y)

    def add_row_bias(self, y, b):
        return self._step("add_row_bias", self.alloc_f32(y.shape), lambda: dense.add_row_bias(y, b))

    def join_rows(self, x, parts):
        """The window residual from its chunks' attention outputs. The sim's add writes a new
        array (its poison shows a read before the write), so the parts are copied into one;
        the cuda backend's add writes in place, where nothing is launched: not counted."""
        out = self.alloc_f32((sum(p.shape[0] for p in parts), *x.shape[1:]))

        def run():
            out[...] = np.concatenate(parts, axis=0)

        self.streams.enqueue("compute", "join_rows", run, *self._span("join_rows"))
        return out

    def sigmoid(self, v):
        return self._step("sigmoid", self.alloc_f32((v.size,)), lambda: numerics.sigmoid(v.reshape(-1)))

    # ---- the MoE half -------------------------------------------------------------------
    def top_k(self, logits, k, *, bias=None, gating="softmax"):
        n_tok = logits.shape[0]
        ids = np.full((n_tok, k), -1, np.int32)
        weights = self.alloc_f32((n_tok, k))

        def run():
            ids[...], weights[...] = top_k(logits, k, bias=bias, gating=gating)

        self._launch("router", run)
        return ids, weights

    def row_experts(self, ids, slot):
        return self._step("row_experts", np.full(ids.size, -1, np.int32), lambda: row_experts(ids, slot))

    def routing_tables(self, ids, n_expert, to_host: bool = True):
        """to_host: the counts come back at once (the walk plans on the host); else they stay on
        the device (a DeviceTables: device_plan) and are read only if something asks."""
        n_rows = ids.size
        t = Tables(np.full(n_rows, -1, np.int32), np.full(n_rows, -1, np.int32),
                   np.zeros(n_expert, np.int32), np.zeros(n_expert, np.int32), None)

        def run():
            tab = routing_tables(ids, n_expert)
            t.slot[...], t.src[...], t.cnt[...], t.off[...] = tab.slot, tab.src, tab.cnt, tab.off

        self._launch("routing_tables", run)
        if not to_host:
            return DeviceTables(t.slot, t.src, t.cnt, t.off, self)
        with self.host_phase("router sync"):
            self.streams.synchronize("compute")  # the walk plans on the host: the counts come back
        self.counters["host_reads"] += 1
        t.order = np.nonzero(t.cnt)[0].astype(np.int32)
        return t

    def expert_counts(self, ids, n_expert):
        counts = _Counts(np.zeros(n_expert, np.int32), self)

        def run():
            counts.host[...] = np.bincount(ids.reshape(-1), minlength=n_expert)[:n_expert]

        self._launch("expert_counts", run)
        return counts

    def quantize_gather(self, *, x, src, n_rows, layout, out: Q8Buf, row0, n_rows_total):
        def run():
            rows_x = x if src is None else x[src]
            q8_1.unpack_rows(out.data, n_rows_total)[row0:row0 + n_rows] = q8_1.quantize_rows(rows_x, layout)

        self._launch("q8_1_gather", run)

    def quantize_scatter(self, *, x, slot, n_tok, k_used, layout, out: Q8Buf):
        self._launch("q8_1_scatter", lambda: q8_1.scatter_quantize(x, slot, k_used, layout, out.data))

    def gather_rows(self, *, x, src, n_rows):
        return self._step("gather_rows", self.alloc_f32((n_rows, x.shape[1])), lambda: gather_rows(x, src))

    def scatter_rows(self, *, x, slot, n_tok, k_used):
        return self._step("scatter_rows", self.alloc_f32((n_tok * k_used, x.shape[1])),
                          lambda: scatter_rows(x, slot, k_used))

    @staticmethod
    def group_bounds(bounds_list):
        return bounds_list

    def _mmq(self, qtype, n_out, k_in, act, bounds, weights, outs, reads=None):
        """One MMQ launch (as mmq.cu's): for each (offset, out) of outs and each i of bounds,
        the n_out-row matrix at weights(i)[offset:] times rows bounds[i] of act into out. A
        float type: float_matmul of act's float rows instead (_float_experts). reads: the ring
        slots weights() reads (_launch)."""
        if dense.is_float(qtype):
            return self._float_experts(qtype, n_out, k_in, act, bounds, weights, outs, reads)
        rb = quants.row_bytes(qtype, k_in)
        layout = q8_1.layout_for(qtype)

        def run():
            for offset, out in outs:
                for i, (b0, b1) in enumerate(bounds):
                    b0, b1 = int(b0), int(b1)
                    if b1 > b0:
                        w = weights(i)[offset:offset + n_out * rb].reshape(n_out, rb)
                        out[b0:b1] = mmq.mmq(qtype, w, self._decode(act, b0, b1, layout))

        self._launch("mmq", run, reads=reads)

    def _float_experts(self, qtype, n_out, k_in, x, bounds, weights, outs, reads=None):
        """Float experts (as the cuda backend launches float_dense.cu): for each (offset, out)
        and each expert i with rows, one launch: its matrix at weights(i)[offset:] times rows
        bounds[i] of the float rows x into out (strata_prefill.contract.dense.float_matmul)."""
        rb = dense.row_bytes(qtype, k_in)
        jobs = [(offset, out, int(b0), int(b1), i) for offset, out in outs
                for i, (b0, b1) in enumerate(bounds) if int(b1) > int(b0)]

        def run():
            for offset, out, b0, b1, i in jobs:
                w = weights(i)[offset:offset + n_out * rb].reshape(n_out, rb)
                out[b0:b1] = dense.float_matmul(dense.decode_float(qtype, w), x[b0:b1])

        if jobs:
            self._launch("float_dense", run, len(jobs), reads=reads)

    def _mmq_group(self, qtype, wbuf, stride, n_out, k_in, n_exp, act: Q8Buf, bounds, outs):
        """One launch of the bounds form: expert q's matrices at wbuf[offset + q * stride]."""
        self._mmq(qtype, n_out, k_in, act, np.asarray(bounds)[:n_exp], lambda q: wbuf[q * stride:], outs)

    @staticmethod
    def _gate_up_outs(gu_bytes: int, gate, up, one_launch: bool) -> list:
        """The (offset, out) pairs of each gate/up launch: gate at a blob's start, up gu_bytes
        after it; one launch for both, or one each."""
        pairs = ((0, gate), (gu_bytes, up))
        return [pairs] if one_launch else [(p,) for p in pairs]

    def mmq_group_gate_up(self, *, layer, group, bounds, act, n_rows, gate, up, one_launch=True):
        gu_t, _ = self.expert_types(layer)
        gu_bytes, _ = self._blob_bytes[layer]
        cfg, n = self.config, len(group.experts)
        for outs in self._gate_up_outs(gu_bytes, gate, up, one_launch):
            self._mmq_group(gu_t, self._gu_buf, 2 * gu_bytes, cfg.n_ff_exp, cfg.n_embd, n, act, bounds, outs)

    def mmq_group_down(self, *, layer, group, bounds, act, n_rows, y):
        _, d_t = self.expert_types(layer)
        _, d_bytes = self._blob_bytes[layer]
        cfg = self.config
        self._mmq_group(d_t, self._d_buf, d_bytes, cfg.n_embd, cfg.n_ff_exp, len(group.experts), act, bounds,
                        ((0, y),))

    def prepare_batches(self, *, layer, batches, add: bool = False) -> None:
        """A DeviceBatch's row tiles cut on the device (device_plan): one launch of the
        routed_row_lists definition over the routing tables' device counts, one list (the sim has
        no tile configurations) padded to the worst case (strata_prefill.fast.tiles.max_row_tiles)
        with its live count. The sim's weight offsets name
        each expert: 2e (even, as the kernel's byte offsets are), -1 where it streams. Host-cut
        batches need nothing here (their bounds are the host's)."""
        if not add:
            self._device_tiles = {}
        for b in batches:
            if not isinstance(b, DeviceBatch):
                continue
            n_max = max_row_tiles(b.n_rows, self.config.n_expert, DEFAULT_TILE_ROWS)
            resident = self.placement.resident[layer]
            woff = np.where(resident, 2 * np.arange(resident.size, dtype=np.int64), -1)
            tiles = np.full((n_max, 4), -1, np.int32)  # poisoned until the launch runs
            live = np.full(1, -1, np.int32)
            tab = b.tab

            def run(tiles=tiles, live=live, tab=tab, woff=woff, n_max=n_max):
                tiles[...], live[...] = routed_row_lists(tab.dev_cnt, tab.dev_off, woff,
                                                         [ListPlan(DEFAULT_TILE_ROWS, 0, n_max)])

            self._launch("routed_row_tiles", run)
            self._device_tiles[id(b)] = (b, tiles, live)

    def _mmq_device_batch(self, layer, qtype, n_out, k_in, batch, act: Q8Buf, outs):
        """One tile-list launch over a DeviceBatch's device-cut tiles (prepare_batches): each
        live entry's rows times its expert's matrix at `offset` in the expert cache; the entries
        past the live count are not read, as mmq.cu's MMQ_EMPTY_EXIT reads none."""
        got, tiles, live = self._device_tiles[id(batch)]
        assert got is batch, "a DeviceBatch multiplied before prepare_batches cut its tiles"
        rb = quants.row_bytes(qtype, k_in)
        layout = q8_1.layout_for(qtype)

        def run():
            for offset, out in outs:
                for b0, b1, lo, hi in tiles[:int(live[0])].tolist():
                    if b1 <= b0:
                        continue
                    e = (((hi & 0xFFFFFFFF) << 32) | (lo & 0xFFFFFFFF)) // 2
                    w = self.pack.expert_blob(layer, e)[offset:offset + n_out * rb].reshape(n_out, rb)
                    out[b0:b1] = mmq.mmq(qtype, w, self._decode(act, b0, b1, layout))

        self._launch("mmq", run)

    def _mmq_batch(self, layer, qtype, n_out, k_in, batch, act: Q8Buf, outs):
        """One launch of the tile-list form: each expert's matrix at `offset` in its blob, read
        where it lies: the expert cache (the pack's bytes stand for it) or, for a batch with
        places, its ring slot, a read the streams check like a gather's."""
        if isinstance(batch, DeviceBatch):
            self._mmq_device_batch(layer, qtype, n_out, k_in, batch, act, outs)
            return
        experts = list(batch.experts)
        if batch.places is None:
            self._mmq(qtype, n_out, k_in, act, np.array(batch.bounds),
                      lambda i: self.pack.expert_blob(layer, experts[i]), outs)
            return
        places = list(batch.places)
        reads = [p for p in places if p[0] != Place.CACHE]

        def blob(i):
            where, idx, _tag = places[i]
            return self.pack.expert_blob(layer, idx) if where == Place.CACHE else self._rings[where][idx]

        self._mmq(qtype, n_out, k_in, act, np.array(batch.bounds), blob, outs, reads)

    def mmq_batch_gate_up(self, *, layer, batch, act, n_rows, gate, up, one_launch=True):
        gu_t, _ = self.expert_types(layer)
        gu_bytes, _ = self._blob_bytes[layer]
        cfg = self.config
        for outs in self._gate_up_outs(gu_bytes, gate, up, one_launch):
            self._mmq_batch(layer, gu_t, cfg.n_ff_exp, cfg.n_embd, batch, act, outs)

    def mmq_batch_down(self, *, layer, batch, act, n_rows, y):
        _, d_t = self.expert_types(layer)
        gu_bytes, _ = self._blob_bytes[layer]
        cfg = self.config
        self._mmq_batch(layer, d_t, cfg.n_embd, cfg.n_ff_exp, batch, act, ((2 * gu_bytes, y),))

    @staticmethod
    def _glu_rows(gate, up, r0, r1, act, expert_bias):
        """strata_prefill.contract.moe.glu of rows r0 .. r1, each plus its expert's gate and up bias first."""
        g, u = gate[r0:r1], up[r0:r1]
        if expert_bias is not None:
            rexp, bg, bu = expert_bias
            g, u = add_expert_bias(g, bg, rexp[r0:r1]), add_expert_bias(u, bu, rexp[r0:r1])
        return glu(g, u, act)

    def _glu_marks(self, gate, up, r0, r1, mark):
        """What a SwiGLU step's mark does first, as the kernels do it (fast/cuda/kernels/swiglu.cu):
        strata_prefill.formats.nonfinite.mark of rows r0 .. r1 of gate under code_gate, then of up
        under code_up, in the watch's box of now; mark None: nothing."""
        if mark is None:
            return lambda: None
        box, (code_gate, code_up) = self._watch(), mark

        def run():
            box[0] = nonfinite.mark(box[0], gate[r0:r1], code_gate)
            box[0] = nonfinite.mark(box[0], up[r0:r1], code_up)

        return run

    def swiglu_rows(self, gate, up, r0, r1, out=None, *, act=None, expert_bias=None, mark=None):
        dst = self.alloc_f32((r1 - r0, gate.shape[1])) if out is None else out[r0:r1]
        marks = self._glu_marks(gate, up, r0, r1, mark)

        def run():
            marks()
            return self._glu_rows(gate, up, r0, r1, act, expert_bias)

        return self._step("swiglu", dst, run)

    def swiglu_quantize(self, *, gate, up, r0, r1, layout, out: Q8Buf, row0, n_rows_total, act=None,
                        expert_bias=None, mark=None):
        marks = self._glu_marks(gate, up, r0, r1, mark)

        def run():
            marks()
            h = self._glu_rows(gate, up, r0, r1, act, expert_bias)
            q8_1.unpack_rows(out.data, n_rows_total)[row0:row0 + (r1 - r0)] = q8_1.quantize_rows(h, layout)

        self._launch("swiglu_q8_1", run)

    def combine(self, x, weights, slot, y, shared, *, down_bias=None):
        return self._step("combine", self.alloc_f32(x.shape),
                          lambda: combine(x, weights, slot, y, shared, down_bias=down_bias))

    # ---- streaming ----------------------------------------------------------------------
    def _host_blob(self, layer: int, expert: int) -> np.ndarray:
        return self.pack.expert_blob(layer, expert)

    def copy_experts(self, *, ring, slots, experts, tags, wait_for):
        streams = self.streams
        chunk = {"chunk": self.phases.chunk}
        for ev in wait_for:
            streams.wait("copy", ev, f"the release of a {ring} slot", chunk)
            self.counters["copy_waits"] += 1
        runs = adjacent_runs(slots, experts, self.placement.host_index,
                             self._blob_sizes, self._rings[ring].shape[1])
        for s, (layer, expert), tag in zip(slots, experts, tags):
            blob = self._host_blob(layer, expert)

            def run(s=s, blob=blob):
                self._rings[ring][s, :blob.nbytes] = blob

            streams.copy_into(ring, s, tag, f"copy of expert {expert} of layer {layer} into {ring} slot {s}",
                              run, blob.nbytes, {**chunk, "layer": layer, "expert": expert, "ring": ring,
                                                 "slot": s, "bytes": blob.nbytes})
            self.counters["copy_bytes"] += blob.nbytes
        self.counters["copies"] += len(runs)
        self._n_events += 1
        self.counters["copy_events"] += 1
        return streams.record("copy", SimEvent(f"copied#{self._n_events} ({ring} slots {list(slots)})"))

    def released(self, *, ring, slots, tags, event):
        for s, tag in zip(slots, tags):
            self.streams.release(ring, s, tag, event)

    def wait(self, *, event, what):
        self.counters["waits"] += 1
        self.streams.wait("compute", event, what, {"chunk": self.phases.chunk, **self._phase_now[1]})

    def record(self):
        self._n_events += 1
        self.counters["events"] += 1
        return self.streams.record("compute", SimEvent(f"used#{self._n_events}"))

    def gather(self, *, layer, members, q0):
        gu_bytes, d_bytes = self._blob_bytes[layer]
        blob_bytes = 2 * gu_bytes + d_bytes
        reads = [(where, slot, tag) for where, slot, tag in members if where != Place.CACHE]
        sources = []
        for where, idx, _tag in members:
            if where == Place.CACHE:
                sources.append(lambda e=idx: self.pack.expert_blob(layer, e))
            else:
                sources.append(lambda r=where, s=idx: self._rings[r][s, :blob_bytes])

        def run():
            for q, src in enumerate(sources, start=q0):
                blob = src()
                self._gu_buf[q * 2 * gu_bytes:(q + 1) * 2 * gu_bytes] = blob[:2 * gu_bytes]
                self._d_buf[q * d_bytes:(q + 1) * d_bytes] = blob[2 * gu_bytes:]
            end = q0 + len(sources)
            self._gu_buf[end * 2 * gu_bytes:end * 2 * gu_bytes + GROUP_TAIL_BYTES] = 0
            self._d_buf[end * d_bytes:end * d_bytes + GROUP_TAIL_BYTES] = 0

        kernel = "gather_group" if len(members) > 1 else "gather_one"
        self.counters[kernel] += 1
        self.counters["gathers"] += 1
        self.counters["launches"] += 1
        label = f"{kernel} of layer {layer}, experts at q {q0}..{q0 + len(members) - 1}"
        self.streams.gather_from(reads, label, run, *self._span(kernel))

