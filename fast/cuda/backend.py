"""The `cuda` backend: each step of the fast engine (fast/backend.py) as a PyCUDA kernel launch.

Buffers are pycuda GPUArrays. Launches go through this instance's
:class:`strata_prefill.fast.cuda.runtime.Device`, which counts them and allocates every output from its pool,
on the compute stream: an explicit blocking stream, so it stays ordered with the few
legacy-stream operations PyCUDA issues itself (uploads at load, zero fills). Experts live in
the expert cache, the page-locked host tier and the rings' slots (fast/cuda/tiers.py), which
the non-blocking copy stream fills; the compute stream waits for a copy, and the copy stream
for a slot's release, through events only (the walk, fast/walk.py, says which).

Timing and traces use CUDA events with timing on: a pair around each phase on the compute
stream (fast/phases.py), around each copy on the copy stream when tracing (fast/cuda/tiers.py),
and one base event recorded at the trace's start, against which every span is placed
(cuEventElapsedTime works across streams of one context).

The stress mode (STRATA_PREFILL_STRESS=SEED, fast/cuda/stress.py) adds seeded spins before
copies and launches; made with the backend, off by default.
"""
from __future__ import annotations

import collections
import contextlib
import functools
from dataclasses import dataclass

import numpy as np

from strata_prefill.contract import dense, q8_1, quants
from strata_prefill.contract.constants import GROUP_TAIL_BYTES, MMQ_GROUP
from strata_prefill.contract.errors import DeviceError, InternalError
from strata_prefill.formats.nonfinite import NOTHING

from strata_prefill.fast.backend_base import BackendBase
from strata_prefill.fast.cuda import attention, dense as cuda_dense, elementwise as ops, float_rows, kernel_cache, products, runtime
from strata_prefill.fast.cuda import stress
from strata_prefill.fast.cuda.tiers import ExpertTiers
from strata_prefill.fast.phases import PhaseRecorder, timing_enabled
from strata_prefill.fast.tiles import list_starts
from strata_prefill.fast.trace import Span
from strata_prefill.fast.walk import DeviceBatch


#: a 16-bit float matrix is widened to F32 on the device (float_dense.cu's F32 forms are
#: faster) up to this many F32 bytes; larger ones (a 16-bit output head) stay as stored
WIDEN_MAX_BYTES = 256 << 20


@dataclass
class DevWeight:
    qtype: object
    n_rows: int
    n_cols: int
    data: object  # GPUArray uint8 [n_rows * row_bytes]


@dataclass
class Q8Dev:
    buf: object  # GPUArray uint8 [buffer_nbytes(n_rows, K)]
    n_rows: int
    K: int


class DevTables:
    """Routing tables: slot and src on the device; cnt, off and order on the host for the walk,
    copied into page-locked memory behind the router's launches and read on first use. Between
    the copy and that first use the engine queues work that needs no routing (the quantize, the
    shared expert), so the device runs it while the host waits for the counts and plans."""

    def __init__(self, dev_tables, ready, host_counts, phases, counters, download=None):
        """ready, host_counts: the event behind the counts' copy and the page-locked buffer it
        fills; None where the counts stay on the device (device_plan), when download (a blocking
        device-to-host read) fetches them if something asks (op records)."""
        self.slot, self.src = dev_tables.slot, dev_tables.src
        self.dev_cnt, self.dev_off = dev_tables.cnt, dev_tables.off  # where the device reads them
        self._ready, self._host, self._phases = ready, host_counts, phases
        self._counters, self._download = counters, download
        self._cnt = self._off = self._order = None

    def resolve(self) -> None:
        """Wait for the counts (once) and keep host copies (the page-locked buffer is reused)."""
        if self._cnt is None:
            with self._phases.host_phase("router sync"):
                if self._ready is None:
                    self._cnt, self._off = self._download(self.dev_cnt), self._download(self.dev_off)
                else:
                    self._ready.synchronize()
                    self._cnt, self._off = self._host[0].copy(), self._host[1].copy()
            self._counters["host_reads"] += 1
            self._order = np.nonzero(self._cnt)[0].astype(np.int32)

    @property
    def cnt(self) -> np.ndarray:
        self.resolve()
        return self._cnt

    @property
    def off(self) -> np.ndarray:
        self.resolve()
        return self._off

    @property
    def order(self) -> np.ndarray:
        self.resolve()
        return self._order


def _timing_event(dev):
    """A timing event recorded on dev's compute stream now."""
    import pycuda.driver as cuda

    ev = cuda.Event()
    ev.record(dev.stream)
    return ev


class CudaBackend(BackendBase):
    name = "cuda"

    def __init__(self, timing=None):
        # STRATA_MMQ_CONFIG and STRATA_MMQ_DEFINES are read at each MMQ launch; a bad value is
        # named here, before any weight reaches the device
        products.default_config()
        stress_cfg = stress.current()  # likewise STRATA_PREFILL_STRESS
        kernel_cache.cache_dir()  # and a STRATA_PREFILL_KERNEL_CACHE folder that cannot be made
        runtime.context()
        import pycuda.driver as cuda

        self.dev = runtime.Device(stream=cuda.Stream())
        self.stress = None if stress_cfg is None else stress.Stress(stress_cfg, self.dev.counters).prepare()
        self.dev.stress = self.stress
        self.tiers = None
        from pycuda import gpuarray

        self.ga = gpuarray
        self._weights: dict = {}
        self._iota_dev = None
        # page-locked [2, n_expert] int32 buffers of counts and offsets, one per reader ("routing":
        # a layer's routing tables; "predicted": head_predict's counts), and the last DevTables
        # each was lent to, whose counts may not be read yet
        self._counts_host: dict = {}
        self._counts_pending: dict = {}
        self._tiles_keep = None  # the last in-place batch and its uploaded row tiles (_batch_tiles)
        self._prepared: dict = {}  # id(batch) -> (batch, its tiles' handles): a layer's, uploaded at once
        self._prepared_keep: list = []  # those uploads, alive until the next layer's
        self._woff: dict = {}  # layer -> its experts' cache offsets on the device (_layer_woff)
        # the clock holds the Device, not self: a bound method would make the backend a cycle,
        # freed only by the cyclic collector on whichever thread it runs, where PyCUDA cannot
        # make the context current and leaks the device objects with a warning
        self.phases = PhaseRecorder(functools.partial(_timing_event, self.dev), self._seconds,
                                    timing_enabled(timing))
        self._trace_base = None  # the event every traced span is timed from

    @contextlib.contextmanager
    def oom_guard(self, what: str):
        """Out of device memory inside: a DeviceError naming `what` and the free memory."""
        import pycuda.driver as cuda

        try:
            yield
        except cuda.MemoryError as e:
            raise DeviceError(f"out of GPU memory: {what} did not fit ({runtime._free_total()}): "
                              f"{' '.join(str(e).split())}") from e

    # ---- timing and traces -----------------------------------------------------------
    @staticmethod
    def _seconds(start, end) -> float:
        end.synchronize()
        return start.time_till(end) / 1e3  # time_till: milliseconds from start to end

    def trace_begin(self) -> None:
        """Both streams drained, then the base event: no traced event can complete before it."""
        self.dev.stream.synchronize()
        if self.tiers is not None:
            self.tiers.copy_stream.synchronize()
            self.tiers.copy_spans.clear()
            self.tiers.copy_timing = True
        self.phases.reset()
        self.phases.tracing = True
        self._trace_base = _timing_event(self.dev)

    def trace_end(self) -> list:
        """The spans since trace_begin (strata_prefill.fast.trace.Span), seconds from the base event;
        synchronizes, then stops tracing."""
        self.dev.stream.synchronize()
        base = self._trace_base
        spans = []
        for chunk, name, a, b, args in self.phases.trace_spans:
            spans.append(Span("compute", name, base.time_till(a) / 1e3, a.time_till(b) / 1e3,
                              {"chunk": chunk, **args}))
        if self.tiers is not None:
            self.tiers.copy_stream.synchronize()
            for a, b, nbytes, note in self.tiers.copy_spans:
                spans.append(Span("copy", "copy", base.time_till(a) / 1e3, a.time_till(b) / 1e3,
                                  {**note, "bytes": nbytes}))
            self.tiers.copy_spans.clear()
            self.tiers.copy_timing = False
        self.phases.tracing = False
        self.phases.reset()
        self._trace_base = None
        return spans

    # ---- counters --------------------------------------------------------------------
    @property
    def counters(self) -> collections.Counter:
        return self.dev.counters

    # ---- set-up ---------------------------------------------------------------------
    def load(self, pack, *, placement, ring_slots, staging_slots) -> None:
        """Dense weights on first use; resident experts into the expert cache, streamed ones into
        the page-locked host tier, the rings' slots and the group buffers now."""
        self.pack = pack
        cfg = self.config = pack.config
        self.kv = attention.DeviceKVCache(self.dev, cfg.n_layer, cfg.n_head_kv, cfg.head_dim)
        self.tiers = ExpertTiers(pack, placement, ring_slots, staging_slots, stress=self.stress)
        self._blob_bytes = [pack.expert_blob_bytes(l) for l in range(cfg.n_layer)]
        max_gu = max(gu for gu, _ in self._blob_bytes)
        max_d = max(d for _, d in self._blob_bytes)
        gu_n, d_n = products.group_buffer_bytes(MMQ_GROUP, max_gu, max_d, GROUP_TAIL_BYTES)
        self._gu_buf = self.ga.empty(gu_n, np.uint8)
        self._d_buf = self.ga.empty(d_n, np.uint8)

    def expert_cache_capacity(self, pack, *, reserve_mib, ring_slots, staging_slots) -> int:
        """Experts that fit in the free device memory less reserve_mib, the rings' slots and the
        dense weights (every tensor of the pack that is not an expert, at the size it will have
        on the device: widened 16-bit matrices take twice their file bytes)."""
        cfg = pack.config
        blobs = [pack.expert_blob_size(l) for l in range(cfg.n_layer)]
        free, _total = runtime.mem_info()
        dense = pack.file_size - cfg.n_expert * sum(blobs) + self.widened_extra_bytes(pack)
        left = free - (reserve_mib << 20) - (ring_slots + staging_slots) * max(blobs) - dense
        return max(0, int(left // max(blobs)))

    def widened_extra_bytes(self, pack) -> int:
        """Device bytes that widening adds over the file's: 2 a value of every F16/BF16 matrix
        widened (not the stacked experts, which are never widened)."""
        extra = 0
        for name in pack.tensor_names():
            if pack.tensor_type(name) in (quants.QT.F16, quants.QT.BF16):
                m = pack.matrix(name)
                if m.n_expert is None and self._widens(m):
                    extra += 2 * m.n_rows * m.n_cols
        return extra

    def _widens(self, m) -> bool:
        """Whether w() holds the matrix m widened to F32 (a 16-bit type, at most WIDEN_MAX_BYTES
        widened): float_dense.cu's F32 forms are faster than its 16-bit ones."""
        return m.qtype in (quants.QT.F16, quants.QT.BF16) and 4 * m.n_rows * m.n_cols <= WIDEN_MAX_BYTES

    @staticmethod
    def streamed_bytes_pinned() -> float:
        """The host tier is page-locked whole, or the load fails with one line saying so."""
        return 1.0

    def copy_busy(self) -> tuple[float, int]:
        """(seconds the copy stream spent copying, bytes) since the last call; needs
        copy_timing on (an event pair around each copy)."""
        return self.tiers.copy_busy() if self.tiers else (0.0, 0)

    @property
    def copy_timing(self) -> bool:
        return bool(self.tiers and self.tiers.copy_timing)

    @copy_timing.setter
    def copy_timing(self, on: bool) -> None:
        self.tiers.copy_timing = bool(on)

    def reset_cache(self) -> None:
        cfg = self.config
        self.kv = attention.DeviceKVCache(self.dev, cfg.n_layer, cfg.n_head_kv, cfg.head_dim,
                                          capacity=self.kv.capacity)

    def w(self, name: str):
        got = self._weights.get(name)
        if got is not None:
            return got
        if self.pack.is_vector(name):  # a norm (the architecture's table)
            got = self.ga.to_gpu(np.ascontiguousarray(self.pack.vector(name), dtype=np.float32))
        else:
            m = self.pack.output() if name == "output" else self.pack.matrix(name)
            if self._widens(m):
                # widened once, exactly (strata_prefill.contract.dense.decode_float): the F32 forms of
                # float_dense.cu run faster than the 16-bit ones, with the same products
                f32 = dense.decode_float(m.qtype, np.asarray(m.data).reshape(m.n_rows, -1))
                got = DevWeight(quants.QT.F32, m.n_rows, m.n_cols, self.ga.to_gpu(f32.reshape(-1)))
            else:
                data = self.ga.to_gpu(np.ascontiguousarray(m.data).reshape(-1))
                got = DevWeight(m.qtype, m.n_rows, m.n_cols, data)
        self._weights[name] = got
        return got

    # ---- buffers ---------------------------------------------------------------------
    def download(self, a):
        self.counters["host_reads"] += 1
        return self.dev.download(a.buf if isinstance(a, Q8Dev) else a)

    def alloc_f32(self, shape):
        return self.dev.empty(shape, np.float32)

    def alloc_q8(self, n_rows: int, K: int):
        return Q8Dev(self.dev.empty(q8_1.buffer_nbytes(n_rows, K), np.uint8), n_rows, K)

    def _iota(self, n: int):
        """A device int32 arange of at least n entries (rows in order)."""
        if self._iota_dev is None or self._iota_dev.size < n:
            self._iota_dev = self.dev.upload(np.arange(max(n, 1024), dtype=np.int32))
        return self._iota_dev

    # ---- dense steps -----------------------------------------------------------------
    def embed(self, ids):
        qt = self.pack.tensor_type("token_embd")
        if self.device_embed and qt in ops.EMBED_TYPES:  # the host's dequantize would hold the first kernel back
            return ops.embed(self.dev, qt, ids, self.w("token_embd").data, self.config.n_embd)  # ids uploaded there
        return self.dev.upload(np.ascontiguousarray(self.pack.embedding_rows(ids), dtype=np.float32))

    def rmsnorm(self, x, w, eps):
        return ops.rmsnorm(self.dev, x, w, float(eps))

    def quantize_rows(self, x, layout):
        R, K = (int(s) for s in x.shape)
        out = self.alloc_q8(R, K)
        products.quantize_gather(self.dev, x, self._iota(R), n_rows=R, K=K, layout=layout, out=out.buf)
        return out

    def mmq_dense(self, w: DevWeight, act: Q8Dev):
        out = self.dev.empty((act.n_rows, w.n_rows), np.float32)
        products.mmq_dense(self.dev, w.qtype, w.data, N=w.n_rows, K=w.n_cols, act=act.buf, R=act.n_rows, out=out)
        return out

    def float_dense(self, w: DevWeight, x):
        """x [T, K] times an F32/F16/BF16 weight, float32 [T, N] (strata_prefill.contract.dense.float_matmul)."""
        out = self.dev.empty((int(x.shape[0]), w.n_rows), np.float32)
        cuda_dense.float_dense(self.dev, w.qtype, w.data, w.n_rows, w.n_cols, x, int(x.shape[0]), out)
        return out

    def _make_rope(self, n_pos: int):
        return ops.rope_table(self.dev, n_pos, self.config.head_dim, self.config.rope_base,
                              self.config.rope_scaling)

    def rope(self, x, positions):
        return ops.rope_neox(self.dev, x, np.asarray(positions, np.int32),
                             *self.rope_table(int(positions.max()) + 1))

    def kv_write(self, layer, positions, k, v):
        self.kv.write(layer, np.asarray(positions, np.int32), k, v)

    def attend(self, layer, q, positions, sinks=None, window=None):
        return self.kv.attend(layer, q, np.asarray(positions, np.int32), sinks=sinks, window=window)

    def add(self, x, y):
        return ops.add(self.dev, x, y, out=x)

    def add_row_bias(self, y, b):
        return ops.add_row_bias(self.dev, y, b, out=y)

    def join_rows(self, x, parts):
        """add writes in place, so the chunks' attention outputs already lie in the window's rows:
        x itself; parts elsewhere are copied into a new array on the compute stream."""
        row = int(x.strides[0])
        at, in_place = int(x.gpudata), True
        for p in parts:
            in_place = in_place and int(p.gpudata) == at
            at += int(p.shape[0]) * row
        if in_place and at == int(x.gpudata) + int(x.shape[0]) * row:
            return x
        import pycuda.driver as cuda

        out = self.alloc_f32((sum(int(p.shape[0]) for p in parts), *x.shape[1:]))
        at = int(out.gpudata)
        for p in parts:
            if p.nbytes:
                cuda.memcpy_dtod_async(at, int(p.gpudata), int(p.nbytes), self.dev.stream)
            at += int(p.nbytes)
        return out

    def window_budget_bytes(self) -> int:
        """Half the free device memory: the rest is left to the chunks' own buffers and the KV
        cache's growth."""
        free, _total = runtime.mem_info()
        return int(free) // 2

    def sigmoid(self, v):
        return ops.sigmoid(self.dev, v)

    # ---- the NaN/Inf watch (formats/nonfinite.py): one uint64 on the device -------------
    def nonfinite_reset(self) -> None:
        self._nonfinite = self.dev.upload(np.array([NOTHING], np.uint64))

    def nonfinite_mark(self, x, code: int) -> None:
        ops.nonfinite_mark(self.dev, x, self._watch(), code)

    def _watch_mark(self, mark):
        """A SwiGLU step's mark, (code_gate, code_up) or None, as the wrappers' (first, codes)."""
        return None if mark is None else (self._watch(), *mark)

    def nonfinite_first(self) -> int:
        if self._nonfinite is None:
            return NOTHING
        self.counters["host_reads"] += 1
        return int(self.dev.download(self._nonfinite)[0])

    # ---- the MoE steps ---------------------------------------------------------------
    def top_k(self, logits, k, *, bias=None, gating="softmax"):
        return ops.top_k(self.dev, logits, k, bias=bias, gating=gating)

    def row_experts(self, ids, slot):
        return ops.row_experts(self.dev, ids, slot)

    def routing_tables(self, ids, n_expert, to_host: bool = True):
        """The tables on the device; with to_host their counts and offsets copied to page-locked
        host memory on the compute stream, behind the launch, with an event the host waits on
        when the walk first reads them (DevTables). Without (device_plan) nothing is copied: the
        walk reads them where they lie, and a host read (op records) downloads them then."""
        if not to_host:
            t = ops.routing_tables(self.dev, ids, n_expert)
            return DevTables(t, None, None, self.phases, self.counters, self.dev.download)
        return self._tables_to_host(ids, n_expert, "routing")

    def expert_counts(self, ids, n_expert):
        """routing_tables' launch over ids, its counts copied behind it into a page-locked buffer
        of their own (a DevTables whose cnt the host reads when it needs them)."""
        return self._tables_to_host(ids, n_expert, "predicted")

    def _tables_to_host(self, ids, n_expert, reader: str) -> DevTables:
        """ops.routing_tables over ids, its counts and offsets copied behind the launch into the
        page-locked buffer of `reader`, as a DevTables the host reads on first use; the buffer's
        last DevTables is resolved first (its copy is about to be overwritten)."""
        import pycuda.driver as cuda

        t = ops.routing_tables(self.dev, ids, n_expert)
        pending = self._counts_pending.get(reader)
        if pending is not None:
            pending.resolve()
        host = self._counts_host.get(reader)
        if host is None or host.shape[1] != n_expert:
            # zeroed: a read that came before its copy landed (a race) would find no routing,
            # wrong bytes, rather than garbage counts that send launches out of bounds
            host = self._counts_host[reader] = cuda.pagelocked_zeros((2, n_expert), np.int32)
        if self.stress is not None:
            self.stress.before_copy(self.dev.stream)
        cuda.memcpy_dtoh_async(host[0], t.cnt.gpudata, self.dev.stream)
        cuda.memcpy_dtoh_async(host[1], t.off.gpudata, self.dev.stream)
        ready = cuda.Event(cuda.event_flags.DISABLE_TIMING)
        ready.record(self.dev.stream)
        self._counts_pending[reader] = DevTables(t, ready, host, self.phases, self.counters)
        return self._counts_pending[reader]

    def quantize_gather(self, *, x, src, n_rows, layout, out: Q8Dev, row0, n_rows_total):
        K = int(x.shape[1])
        src = self._iota(n_rows) if src is None else src
        products.quantize_gather(self.dev, x, src, n_rows=n_rows, K=K, layout=layout,
                                 out=int(out.buf.gpudata) + row0 * q8_1.BLOCK_BYTES, R_total=n_rows_total)

    def quantize_scatter(self, *, x, slot, n_tok, k_used, layout, out: Q8Dev):
        products.quantize_scatter(self.dev, x, slot, T=n_tok, K_used=k_used, K=int(x.shape[1]), layout=layout,
                                  out=out.buf)

    def gather_rows(self, *, x, src, n_rows):
        return float_rows.gather_rows(self.dev, x, src, n_rows)

    def scatter_rows(self, *, x, slot, n_tok, k_used):
        return float_rows.scatter_rows(self.dev, x, slot, k_used)

    def _float_experts(self, qtype, n_out: int, k_in: int, x, bounds, w_of, outs) -> None:
        """Float experts: for each (offset, out) of outs and each expert i with rows, one
        float_dense.cu launch: the n_out x k_in matrix at device address w_of(i) + offset times
        rows bounds[i] (host int pairs) of the float32 rows x into the same rows of out."""
        for offset, out in outs:
            for i, (b0, b1) in enumerate(np.asarray(bounds).reshape(-1, 2).tolist()):
                if b1 > b0:
                    cuda_dense.float_dense(self.dev, qtype, w_of(i) + offset, n_out, k_in,
                                           int(x.gpudata) + 4 * b0 * k_in, b1 - b0,
                                           int(out.gpudata) + 4 * b0 * n_out)

    def group_bounds(self, bounds_list):
        """All of a layer's group bounds in one upload; one device address per group."""
        if not bounds_list:
            return []
        flat = np.concatenate([np.asarray(b, np.int32).reshape(-1, 2) for b in bounds_list])
        dev = self.dev.upload(flat)
        self._bounds_keep = dev  # alive until the next layer's upload (one stream: in order)
        addrs, at = [], 0
        for b in bounds_list:
            addrs.append(int(dev.gpudata) + at * 8)
            at += len(b)
        return addrs

    @staticmethod
    def _gate_up_launches(base: int, gu_bytes: int, gate, up, one_launch: bool) -> list:
        """(weights, out, pair) of each gate/up launch. An expert's gate matrix is at base (+ its
        stride or offset), its up matrix gu_bytes after it, as in a blob [gate | up | down]: one
        launch multiplies both (blockIdx.y picks the matrix), or one launch each."""
        if one_launch:
            return [(base, gate, (gu_bytes, up))]
        return [(base, gate, None), (base + gu_bytes, up, None)]

    def mmq_group_gate_up(self, *, layer, group, bounds, act: Q8Dev, n_rows, gate, up, one_launch=True):
        gu_t, _ = self.expert_types(layer)
        gu_bytes, _ = self._blob_bytes[layer]
        cfg = self.config
        if dense.is_float(gu_t):  # expert q's gate at q * (2 * gu_bytes) of the group buffer, its up after it
            base = int(self._gu_buf.gpudata)
            self._float_experts(gu_t, cfg.n_ff_exp, cfg.n_embd, act, group.bounds, lambda q: base + q * 2 * gu_bytes,
                                ((0, gate), (gu_bytes, up)))
            return
        for w, out, pair in self._gate_up_launches(int(self._gu_buf.gpudata), gu_bytes, gate, up, one_launch):
            products.mmq_group(self.dev, gu_t, w, w_stride=2 * gu_bytes, N=cfg.n_ff_exp, K=cfg.n_embd, act=act.buf,
                               R_total=n_rows, bounds=bounds, n_exp=len(group.experts), out=out, rows=group.n_rows,
                               pair=pair)

    def mmq_group_down(self, *, layer, group, bounds, act: Q8Dev, n_rows, y):
        _, d_t = self.expert_types(layer)
        _, d_bytes = self._blob_bytes[layer]
        cfg = self.config
        if dense.is_float(d_t):
            base = int(self._d_buf.gpudata)
            self._float_experts(d_t, cfg.n_embd, cfg.n_ff_exp, act, group.bounds, lambda q: base + q * d_bytes,
                                ((0, y),))
            return
        products.mmq_group(self.dev, d_t, self._d_buf, w_stride=d_bytes, N=cfg.n_embd, K=cfg.n_ff_exp, act=act.buf,
                           R_total=n_rows, bounds=bounds, n_exp=len(group.experts), out=y, rows=group.n_rows)

    def _batch_offsets(self, layer: int, batch) -> tuple[int, np.ndarray]:
        """(a base address, int64 byte offsets of each of the batch's experts' blobs from it). In
        the expert cache: the layer's cache allocation and the ranks' offsets. With places (a
        ring_in_place run, maybe mixed with cached experts): the lowest of the blobs' addresses,
        so that every offset is non-negative whichever allocations the blobs lie in (the tile
        entries' offsets are 64-bit: any two allocations are covered)."""
        if batch.places is None:
            return self.tiers.cache_offsets(layer, batch.experts)
        addrs = np.array([self.tiers.addr(layer, where, index) for where, index, _tag in batch.places], np.int64)
        base = int(addrs.min())
        return base, addrs - base

    def _tiles_host(self, layer: int, batch):
        """(base, the batch's row tiles on the host (products.row_tiles), their configuration):
        the automatic one for the mean rows per routed expert."""
        cfg = products.tile_config(batch.n_rows / len(batch.experts))
        base, woff = self._batch_offsets(layer, batch)
        return base, products.row_tiles(batch.bounds, woff, products.tile_rows_for(cfg)), cfg

    def _layer_woff(self, layer: int):
        """(the layer's cache base address, int64 device [E]: each expert's blob offset from it,
        -1 where the expert streams), uploaded once: what routed_row_tiles reads."""
        got = self._woff.get(layer)
        if got is None:
            resident = self.tiers.placement.resident[layer]
            base, offs = self.tiers.cache_offsets(layer, np.flatnonzero(resident))
            woff = np.full(resident.size, -1, np.int64)
            woff[resident] = offs
            got = self._woff[layer] = (base, self.ga.to_gpu(woff))
        return got

    def _device_tiles(self, layer: int, batch) -> None:
        """A DeviceBatch's row tiles cut on the device from its routing tables (one
        routed_row_tiles launch, no host read): one list per configuration its rows could call
        for (products.routed_tile_plans), each padded to the most its rows can cut into; the
        device cuts the one the counts choose, the others stay empty with a live count of 0."""
        base, woff = self._layer_woff(layer)
        plans = products.routed_tile_plans(batch.n_rows, batch.n_experts)
        tiles, live = ops.routed_row_tiles(self.dev, batch.tab.dev_cnt, batch.tab.dev_off, woff,
                                           [p for _cfg, p in plans])
        starts = list_starts([p for _cfg, p in plans])
        lists = [(int(tiles.gpudata) + 16 * at, p.n_max, cfg, int(live.gpudata) + 4 * i)
                 for i, ((cfg, p), at) in enumerate(zip(plans, starts))]
        self._prepared[id(batch)] = (batch, base, lists)
        self._prepared_keep += [tiles, live]  # alive until the next layer's first call

    def prepare_batches(self, *, layer, batches, add: bool = False) -> None:
        """Every batch's row tiles in one upload (a layer's resident batch, then its ring_in_place
        runs: add keeps the layer's earlier uploads): one host-to-device copy per call instead
        of one a batch; a DeviceBatch's cut on the device instead (_device_tiles). Float experts
        have no tiles."""
        gu_t, d_t = self.expert_types(layer)
        if not add:
            self._prepared, self._prepared_keep = {}, []
        for b in [b for b in batches if isinstance(b, DeviceBatch)]:
            self._device_tiles(layer, b)
        batches = [b for b in batches if not isinstance(b, DeviceBatch)]
        if not batches or (dense.is_float(gu_t) and dense.is_float(d_t)):
            return
        parts = [(b, *self._tiles_host(layer, b)) for b in batches]
        flat = np.concatenate([host for _b, _base, host, _cfg in parts]).reshape(-1, 4)
        if not len(flat):
            return
        dev = self.dev.upload(np.ascontiguousarray(flat, np.int32))
        at = 0
        for b, base, host, cfg in parts:
            self._prepared[id(b)] = (b, base, [(int(dev.gpudata) + 16 * at, len(host), cfg, None)])
            at += len(host)
        self._prepared_keep.append(dev)  # alive until the next layer's first upload (one stream: in order)

    def _batch_tiles(self, layer: int, batch):
        """(base, the batch's tile lists: (device address, entries, configuration, live count's
        device address or None)), one list cut on the host or one a configuration cut on the
        device; uploaded once, for gate/up and down alike (the same rows, so the same
        configuration): by prepare_batches, else here."""
        got = self._prepared.get(id(batch))
        if got is not None and got[0] is batch:
            return got[1:]
        keep = self._tiles_keep
        if keep is not None and keep[0] is batch:
            return keep[1:3]
        base, host, cfg = self._tiles_host(layer, batch)
        dev = self.dev.upload(host)
        self._tiles_keep = (batch, base, [(dev, len(host), cfg, None)], dev)  # alive for the batch's launches
        return self._tiles_keep[1:3]

    def _cache_blobs(self, layer: int, batch):
        """Device address of each of the batch's experts' blobs (expert cache or ring slot), by
        position."""
        base, woff = self._batch_offsets(layer, batch)
        return lambda i: base + int(woff[i])

    def mmq_batch_gate_up(self, *, layer, batch, act: Q8Dev, n_rows, gate, up, one_launch=True):
        gu_t, _ = self.expert_types(layer)
        gu_bytes, _ = self._blob_bytes[layer]
        cfg = self.config
        if dense.is_float(gu_t):  # each read where it lies in the expert cache: no tiles
            self._float_experts(gu_t, cfg.n_ff_exp, cfg.n_embd, act, batch.bounds, self._cache_blobs(layer, batch),
                                ((0, gate), (gu_bytes, up)))
            return
        base, lists = self._batch_tiles(layer, batch)
        for w, out, pair in self._gate_up_launches(base, gu_bytes, gate, up, one_launch):
            for tiles, n_tiles, mcfg, live in lists:
                products.mmq_tiles(self.dev, gu_t, w, N=cfg.n_ff_exp, K=cfg.n_embd, act=act.buf, R_total=n_rows,
                                   tiles=tiles, n_tiles=n_tiles, out=out, config=mcfg, pair=pair,
                                   live=live)

    def mmq_batch_down(self, *, layer, batch, act: Q8Dev, n_rows, y):
        _, d_t = self.expert_types(layer)
        gu_bytes, _ = self._blob_bytes[layer]
        cfg = self.config
        if dense.is_float(d_t):
            self._float_experts(d_t, cfg.n_embd, cfg.n_ff_exp, act, batch.bounds, self._cache_blobs(layer, batch),
                                ((2 * gu_bytes, y),))
            return
        base, lists = self._batch_tiles(layer, batch)
        for tiles, n_tiles, mcfg, live in lists:
            products.mmq_tiles(self.dev, d_t, base + 2 * gu_bytes, N=cfg.n_embd, K=cfg.n_ff_exp, act=act.buf,
                               R_total=n_rows, tiles=tiles, n_tiles=n_tiles, out=y, config=mcfg,
                               live=live)

    # ---- streaming -------------------------------------------------------------------
    def copy_experts(self, *, ring, slots, experts, tags, wait_for):
        note = {"chunk": self.phases.chunk, "ring": ring, "slots": list(slots),
                "experts": [list(le) for le in experts]} if self.phases.tracing else None
        return self.tiers.copy(ring, slots, experts, wait_for, self.counters, note)

    def wait(self, *, event, what):
        if event is None:
            raise InternalError(f"the walk waits on no event: {what} was never enqueued")
        self.dev.stream.wait_for_event(event)
        self.counters["waits"] += 1

    def record(self):
        import pycuda.driver as cuda

        ev = cuda.Event(cuda.event_flags.DISABLE_TIMING)
        ev.record(self.dev.stream)
        self.counters["events"] += 1
        return ev

    def gather(self, *, layer, members, q0):
        """gather_native_group for several members, gather_native_one for one (the per-expert
        mode); both write the zeroed tail after the last."""
        gu, d = self._blob_bytes[layer]
        addrs = [self.tiers.addr(layer, where, index) for where, index, _tag in members]
        self.counters["gathers"] += 1
        if len(addrs) == 1:
            products.gather_native_one(self.dev, addrs[0], q=q0, gu_bytes=gu, d_bytes=d, gu_buf=self._gu_buf,
                                       d_buf=self._d_buf, tail_bytes=GROUP_TAIL_BYTES)
        else:
            products.gather_native_group(self.dev, addrs, gu_bytes=gu, d_bytes=d, tail_bytes=GROUP_TAIL_BYTES,
                                         gu_buf=int(self._gu_buf.gpudata) + q0 * 2 * gu,
                                         d_buf=int(self._d_buf.gpudata) + q0 * d)

    def swiglu_rows(self, gate, up, r0, r1, out=None, *, act=None, expert_bias=None, mark=None):
        return ops.swiglu(self.dev, gate, up, None if out is None else out[r0:r1], r0=r0, r1=r1, act=act,
                          expert_bias=expert_bias, mark=self._watch_mark(mark))

    def swiglu_quantize(self, *, gate, up, r0, r1, layout, out: Q8Dev, row0, n_rows_total, act=None,
                        expert_bias=None, mark=None):
        products.swiglu_quantize(self.dev, gate, up, r0=r0, r1=r1, layout=layout, out=out.buf, row0=row0,
                                 R_total=n_rows_total, act=act, expert_bias=expert_bias, mark=self._watch_mark(mark))

    def combine(self, x, weights, slot, y, shared, *, down_bias=None):
        return ops.combine(self.dev, x, weights, slot, y, shared, out=x, down_bias=down_bias)
