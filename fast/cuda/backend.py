"""The `cuda` backend: each step of the fast engine as a PyCUDA kernel launch.

Buffers are pycuda GPUArrays; every expert is resident (one VRAM slot per expert holding its
blob [gate | up | down]); everything runs on one stream, so a group buffer can be reused by
the next group without a wait. Counters come from the two wrapper modules.
"""
from __future__ import annotations

import collections
import contextlib
from dataclasses import dataclass

import numpy as np

from strata import q8_1, quants
from strata.errors import DeviceError

from fast import ops_cuda, ops_model_cuda as ops
from fast.backend_base import BackendBase
from fast.cuda import dense as cuda_dense
from fast.cuda import runtime
from fast.phases import timing_enabled

GROUP_TAIL_BYTES = 256  # zeroed bytes after the last expert of a group buffer


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


@dataclass
class DevTables:
    slot: object
    src: object
    cnt: np.ndarray  # host copies for the walk
    off: np.ndarray
    order: np.ndarray


@dataclass
class DevGroup:
    experts: tuple
    gu_bytes: int
    d_bytes: int


class CudaBackend(BackendBase):
    name = "cuda"

    def __init__(self, timing=None):
        runtime.context()
        from pycuda import gpuarray

        self.ga = gpuarray
        self._weights: dict = {}
        self._iota_dev = None
        self.timing = timing_enabled(timing)
        self._events: list = []  # (phase, start event, end event), summed by phase_table()

    @contextlib.contextmanager
    def oom_guard(self, what: str):
        """Out of device memory inside: a DeviceError naming `what` and the free memory."""
        import pycuda.driver as cuda

        try:
            yield
        except cuda.MemoryError as e:
            raise DeviceError(f"out of GPU memory: {what} did not fit ({runtime._free_total()}): "
                              f"{' '.join(str(e).split())}") from e

    @contextlib.contextmanager
    def phase(self, name: str):
        """CUDA events around a phase's launches (default stream), when timing is on."""
        if not self.timing:
            yield
            return
        import pycuda.driver as cuda

        start, end = cuda.Event(), cuda.Event()
        start.record()
        try:
            yield
        finally:
            end.record()
            self._events.append((name, start, end))

    def phase_table(self) -> dict:
        """Seconds per phase since the last call (synchronizes)."""
        out = collections.Counter()
        for name, start, end in self._events:
            end.synchronize()
            out[name] += start.time_till(end) / 1e3
        self._events.clear()
        return dict(out)

    # ---- counters --------------------------------------------------------------------
    @property
    def counters(self) -> collections.Counter:
        return ops_cuda.counters + ops.counters + cuda_dense.counters

    # ---- weights ---------------------------------------------------------------------
    def load(self, pack) -> None:
        """Upload the pack: dense weights on first use, every layer's experts now (all
        resident: one slot per expert, blob [gate | up | down])."""
        self.pack = pack
        cfg = self.config = pack.config
        self.kv = ops.DeviceKVCache(cfg.n_layer, cfg.n_head_kv, cfg.head_dim)
        self._slots = []
        self._blob = []
        max_gu = max_d = 0
        for layer in range(cfg.n_layer):
            gu, d = pack.expert_blob_bytes(layer)
            L = pack.layer(layer)
            E = cfg.n_expert
            host = np.concatenate([L.ffn_gate_exps.data.reshape(E, -1), L.ffn_up_exps.data.reshape(E, -1),
                                   L.ffn_down_exps.data.reshape(E, -1)], axis=1)
            dev = runtime.alloc(host.nbytes, f"expert slots of layer {layer} ({host.nbytes >> 20} MiB)")
            import pycuda.driver as cuda

            cuda.memcpy_htod(dev, np.ascontiguousarray(host))
            self._slots.append(dev)
            self._blob.append(host.shape[1])
            max_gu, max_d = max(max_gu, gu), max(max_d, d)
        gu_n, d_n = ops.group_buffer_bytes(16, max_gu, max_d, GROUP_TAIL_BYTES)
        self._gu_buf = self.ga.empty(gu_n, np.uint8)
        self._d_buf = self.ga.empty(d_n, np.uint8)

    def reset_cache(self) -> None:
        cfg = self.config
        self.kv = ops.DeviceKVCache(cfg.n_layer, cfg.n_head_kv, cfg.head_dim, capacity=self.kv.capacity)

    def w(self, name: str):
        got = self._weights.get(name)
        if got is not None:
            return got
        if name.endswith("_norm"):
            got = self.ga.to_gpu(np.ascontiguousarray(self.pack.vector(name), dtype=np.float32))
        else:
            m = self.pack.output() if name == "output" else self.pack.matrix(name)
            data = self.ga.to_gpu(np.ascontiguousarray(m.data).reshape(-1))
            got = DevWeight(m.qtype, m.n_rows, m.n_cols, data)
        self._weights[name] = got
        return got

    def expert_types(self, layer: int):
        return self.pack.expert_types(layer)

    # ---- buffers ---------------------------------------------------------------------
    @staticmethod
    def download(a):
        return (a.buf if isinstance(a, Q8Dev) else a).get()

    def alloc_f32(self, shape):
        return self.ga.empty(shape, np.float32)

    def alloc_q8(self, n_rows: int, K: int):
        return Q8Dev(self.ga.empty(q8_1.buffer_nbytes(n_rows, K), np.uint8), n_rows, K)

    def _iota(self, n: int):
        """A device int32 arange of at least n entries (rows in order)."""
        if self._iota_dev is None or self._iota_dev.size < n:
            self._iota_dev = self.ga.to_gpu(np.arange(max(n, 1024), dtype=np.int32))
        return self._iota_dev

    # ---- dense steps -----------------------------------------------------------------
    def embed(self, ids):
        if self.pack.tensor_type("token_embd") == quants.QT.Q8_0:
            return ops.embed_q8_0(self.ga.to_gpu(np.asarray(ids, np.int32)), self.w("token_embd").data,
                                  self.config.n_embd)
        return self.ga.to_gpu(np.ascontiguousarray(self.pack.embedding_rows(ids), dtype=np.float32))

    def rmsnorm(self, x, w, eps):
        return ops.rmsnorm(x, w, float(eps))

    def quantize_rows(self, x, layout):
        R, K = (int(s) for s in x.shape)
        out = self.alloc_q8(R, K)
        ops_cuda.quantize_gather(x, self._iota(R), R, K, layout, out.buf)
        return out

    def mmq_dense(self, w: DevWeight, act: Q8Dev):
        out = self.ga.empty((act.n_rows, w.n_rows), np.float32)
        ops_cuda.mmq_dense(w.qtype, w.data, w.n_rows, w.n_cols, act.buf, act.n_rows, out)
        return out

    def float_dense(self, w: DevWeight, x):
        """x [T, K] times an F32/F16/BF16 weight, float32 [T, N] (strata.dense.float_matmul)."""
        out = self.ga.empty((int(x.shape[0]), w.n_rows), np.float32)
        cuda_dense.float_dense(w.qtype, w.data, w.n_rows, w.n_cols, x, int(x.shape[0]), out)
        return out

    def _make_rope(self, n_pos: int):
        return ops.rope_table(n_pos, self.config.head_dim, self.config.rope_base)

    def rope(self, x, positions):
        return ops.rope_neox(x, np.asarray(positions, np.int32), *self.rope_table(int(positions.max()) + 1))

    def kv_write(self, layer, positions, k, v):
        self.kv.write(layer, np.asarray(positions, np.int32), k, v)

    def attend(self, layer, q, positions):
        return self.kv.attend(layer, q, np.asarray(positions, np.int32))

    def add(self, x, y):
        return ops.add(x, y, out=x)

    def sigmoid(self, v):
        return ops.sigmoid(v)

    # ---- the MoE steps ---------------------------------------------------------------
    def top_k(self, logits, k):
        return ops.top_k(logits, k)

    def routing_tables(self, ids, n_expert):
        t = ops.routing_tables(ids, n_expert)
        cnt = t.cnt.get()  # the walk plans on the host: one small copy per layer
        off = t.off.get()
        return DevTables(t.slot, t.src, cnt, off, np.nonzero(cnt)[0].astype(np.int32))

    def quantize_gather(self, x, src, n_rows, layout, out: Q8Dev, row0: int, n_rows_total: int):
        """Rows row0 .. row0+n_rows of `out` <- q8_1(x[src[r]]) (src None: x's rows in order)."""
        K = int(x.shape[1])
        src = self._iota(n_rows) if src is None else src
        ops_cuda.quantize_gather(x, src, n_rows, K, layout, int(out.buf.gpudata) + row0 * q8_1.BLOCK_BYTES,
                                 R_total=n_rows_total)

    def quantize_scatter(self, x, slot, n_tok, k_used, layout, out: Q8Dev):
        ops_cuda.quantize_scatter(x, slot, n_tok, k_used, int(x.shape[1]), layout, out.buf)

    def group_bounds(self, bounds_list):
        """All of a layer's group bounds in one upload; one device address per group."""
        if not bounds_list:
            return []
        flat = np.concatenate([np.asarray(b, np.int32).reshape(-1, 2) for b in bounds_list])
        dev = self.ga.to_gpu(flat)
        self._bounds_keep = dev  # alive until the next layer's upload (one stream: in order)
        addrs, at = [], 0
        for b in bounds_list:
            addrs.append(int(dev.gpudata) + at * 8)
            at += len(b)
        return addrs

    def _blob_addr(self, layer, e):
        return int(self._slots[layer]) + int(e) * self._blob[layer]

    def gather_group(self, layer, experts):
        gu, d = self.pack.expert_blob_bytes(layer)
        ops.gather_native_group([self._blob_addr(layer, e) for e in experts], gu, d, GROUP_TAIL_BYTES,
                                self._gu_buf, self._d_buf)
        return DevGroup(tuple(experts), gu, d)

    def gather_each(self, layer, experts):
        gu, d = self.pack.expert_blob_bytes(layer)
        last = len(experts) - 1
        for q, e in enumerate(experts):
            ops.gather_native_one(self._blob_addr(layer, e), q, gu, d, self._gu_buf, self._d_buf,
                                  tail_bytes=GROUP_TAIL_BYTES if q == last else 0)
        return DevGroup(tuple(experts), gu, d)

    def release(self, bufs) -> None:
        """Nothing to release with every expert resident (the ring's event goes here)."""

    def mmq_group_gate_up(self, layer, g: DevGroup, grp, bounds, act: Q8Dev, n_rows, gate, up):
        gu_t, _ = self.expert_types(layer)
        cfg = self.config
        base = int(self._gu_buf.gpudata)
        for w, out in ((base, gate), (base + g.gu_bytes, up)):
            ops_cuda.mmq_group(gu_t, w, 2 * g.gu_bytes, cfg.n_ff_exp, cfg.n_embd, act.buf, n_rows, bounds,
                               len(grp.experts), out, rows=grp.n_rows)

    def mmq_group_down(self, layer, g: DevGroup, grp, bounds, act: Q8Dev, n_rows, y):
        _, d_t = self.expert_types(layer)
        cfg = self.config
        ops_cuda.mmq_group(d_t, self._d_buf, g.d_bytes, cfg.n_embd, cfg.n_ff_exp, act.buf, n_rows, bounds,
                           len(grp.experts), y, rows=grp.n_rows)



    def swiglu_rows(self, gate, up, r0, r1):
        return ops.swiglu(gate, up, r0=r0, r1=r1)

    def combine(self, x, weights, slot, y, shared):
        return ops.combine(x, weights, slot, y, shared, out=x)
