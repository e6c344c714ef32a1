"""The `sim` backend: every kernel of the fast path as its NumPy definition from strata/,
on host arrays standing in for device buffers.

It runs the fast engine's walk exactly as the GPU does (the same buffers, the same group
buffers filled by the same gathers, the same row bounds), so on a machine with no GPU the
walk, the switches and the buffer layouts are checked against the reference byte for byte.
Launch counters count what the CUDA backend would launch.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass

import numpy as np

from strata import attention, dense, mmq, numerics, q8_1, quants
from strata.moe import combine, group_buffers, swiglu
from strata.routing import routing_tables, top_k

from fast.backend_base import BackendBase
from fast.phases import HostPhases, timing_enabled

F32 = np.float32
GROUP_TAIL_BYTES = 256  # zeroed bytes after the last expert of a group buffer


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
    layout: q8_1.Layout


@dataclass
class Tables:
    """Routing tables: device copies (slot, src) and host copies for the walk."""

    slot: np.ndarray
    src: np.ndarray
    cnt: np.ndarray
    off: np.ndarray
    order: np.ndarray


@dataclass
class GroupBufs:
    experts: tuple
    gu: np.ndarray  # gate|up of expert q at q * 2*gu_bytes
    dn: np.ndarray  # down of expert q at q * d_bytes
    gu_bytes: int
    d_bytes: int


class SimBackend(BackendBase):
    name = "sim"

    def __init__(self, timing=None):
        self.counters = collections.Counter()
        self._phases = HostPhases(timing_enabled(timing))

    @property
    def timing(self) -> bool:
        return self._phases.enabled

    @timing.setter
    def timing(self, on: bool) -> None:
        self._phases.enabled = bool(on)

    def phase(self, name: str):
        return self._phases.phase(name)

    def phase_table(self) -> dict:
        """Seconds per phase since the last call."""
        table = self._phases.table()
        self._phases.reset()
        return table

    def _launch(self, kernel: str, n: int = 1) -> None:
        self.counters[kernel] += n
        self.counters["launches"] += n

    # ---- weights ------------------------------------------------------------------------
    def load(self, pack) -> None:
        self.pack = pack
        cfg = pack.config
        self.config = cfg
        self.kv = attention.KVCache(cfg.n_layer, cfg.n_head_kv, cfg.head_dim)
        self._weights: dict = {}
        # the expert cache: every expert resident, one blob [gate | up | down] a slot
        self._slots = {}

    def reset_cache(self) -> None:
        """A fresh KV cache (a new prompt from position 0)."""
        cfg = self.config
        self.kv = attention.KVCache(cfg.n_layer, cfg.n_head_kv, cfg.head_dim)

    def w(self, name: str):
        got = self._weights.get(name)
        if got is None:
            if name == "output":
                m = self.pack.output()
            elif name.endswith("_norm"):
                got = self.pack.vector(name)
                self._weights[name] = got
                return got
            else:
                m = self.pack.matrix(name)
            got = Weight(m.qtype, m.n_rows, m.n_cols, np.asarray(m.data))
            self._weights[name] = got
        return got

    def expert_types(self, layer: int):
        return self.pack.expert_types(layer)

    def _slot(self, layer: int, e: int) -> np.ndarray:
        key = (layer, e)
        blob = self._slots.get(key)
        if blob is None:
            blob = self.pack.expert_blob(layer, e)
            self._slots[key] = blob
        return blob

    # ---- buffers ------------------------------------------------------------------------
    @staticmethod
    def download(a):
        return np.array(a.data if isinstance(a, Q8Buf) else a, copy=True)

    @staticmethod
    def alloc_f32(shape):
        return np.full(shape, np.nan, dtype=F32)  # poisoned: an unwritten row shows

    @staticmethod
    def alloc_q8(n_rows: int, K: int, layout=q8_1.Layout.D4):
        buf = np.full(q8_1.buffer_nbytes(n_rows, K), 0xA5, np.uint8)
        return Q8Buf(buf, n_rows, K, layout)

    # ---- dense steps --------------------------------------------------------------------
    def embed(self, ids):
        self._launch("embed")
        return self.pack.embedding_rows(ids)

    def rmsnorm(self, x, w, eps):
        self._launch("rmsnorm")
        return numerics.rmsnorm(x, w, eps)

    def quantize_rows(self, x, layout):
        self._launch("q8_1_gather")
        rows = q8_1.quantize_rows(x, layout)
        return Q8Buf(q8_1.pack_rows(rows), x.shape[0], x.shape[1], layout)

    def _decode(self, buf: Q8Buf, r0: int, r1: int, layout) -> q8_1.Q8Rows:
        rows = q8_1.unpack_rows(buf.data, buf.n_rows)[r0:r1]
        return q8_1.decode_rows(np.ascontiguousarray(rows), r1 - r0, layout)

    def mmq_dense(self, w: Weight, act: Q8Buf):
        self._launch("mmq")
        rows = self._decode(act, 0, act.n_rows, q8_1.layout_for(w.qtype))
        return mmq.mmq(w.qtype, w.data, rows)

    def float_dense(self, w: Weight, x):
        """x [T, K] times an F32/F16/BF16 weight, float32 [T, N] (strata.dense.float_matmul)."""
        self._launch("float_dense")
        return dense.float_matmul(dense.decode_float(w.qtype, w.data), x)

    def _make_rope(self, n_pos: int):
        return numerics.rope_table(n_pos, self.config.head_dim, self.config.rope_base)

    def rope(self, x, positions):
        self._launch("rope")
        return numerics.rope_neox(x, positions, *self.rope_table(int(positions.max()) + 1))

    def kv_write(self, layer, positions, k, v):
        self._launch("kv_write")
        self.kv.write(layer, positions, k, v)

    def attend(self, layer, q, positions):
        self._launch("attention")
        return attention.attend(self.kv, layer, q, positions)

    def add(self, x, y):
        self._launch("add")
        return x + y

    def sigmoid(self, v):
        self._launch("sigmoid")
        return numerics.sigmoid(v.reshape(-1))

    # ---- the MoE steps ------------------------------------------------------------------
    def top_k(self, logits, k):
        self._launch("router")
        return top_k(logits, k)

    def routing_tables(self, ids, n_expert):
        self._launch("routing_tables")
        tab = routing_tables(ids, n_expert)
        return Tables(tab.slot, tab.src, tab.cnt, tab.off, tab.order)

    def quantize_gather(self, x, src, n_rows, layout, out: Q8Buf, row0: int, n_rows_total: int):
        """Rows row0 .. row0+n_rows of `out` <- q8_1(x[src[r]]) (src None: x's rows in order)."""
        self._launch("q8_1_gather")
        out.layout = layout
        rows_x = x if src is None else x[src]
        view = q8_1.unpack_rows(out.data, n_rows_total)
        view[row0:row0 + n_rows] = q8_1.quantize_rows(rows_x, layout)

    def quantize_scatter(self, x, slot, n_tok, k_used, layout, out: Q8Buf):
        self._launch("q8_1_scatter")
        out.layout = layout
        q8_1.scatter_quantize(x, slot, k_used, layout, out.data)

    def _group(self, layer, experts) -> GroupBufs:
        gu_bytes, d_bytes = self.pack.expert_blob_bytes(layer)
        gu, dn = group_buffers([self._slot(layer, e) for e in experts], gu_bytes, d_bytes,
                               GROUP_TAIL_BYTES)
        return GroupBufs(tuple(experts), gu, dn, gu_bytes, d_bytes)

    def gather_group(self, layer, experts):
        """gather_native_group: one launch for the whole group."""
        self._launch("gather_group")
        return self._group(layer, experts)

    def gather_each(self, layer, experts):
        """One gather launch per expert (the opt-out path); the same buffers."""
        self._launch("gather_one", len(experts))
        return self._group(layer, experts)

    def release(self, bufs) -> None:
        """Nothing to release with every expert resident (the ring's event goes here)."""

    def _mmq_group(self, qtype, wbuf, offset, stride, n_out, k_in, n_exp, act: Q8Buf, bounds, out):
        self._launch("mmq")
        rb = quants.row_bytes(qtype, k_in)
        layout = q8_1.layout_for(qtype)
        for q in range(n_exp):
            b0, b1 = int(bounds[q, 0]), int(bounds[q, 1])
            if b1 <= b0:
                continue
            w = wbuf[offset + q * stride: offset + q * stride + n_out * rb].reshape(n_out, rb)
            out[b0:b1] = mmq.mmq(qtype, w, self._decode(act, b0, b1, layout))

    @staticmethod
    def group_bounds(bounds_list):
        return bounds_list

    def mmq_group_gate_up(self, layer, bufs: GroupBufs, grp, bounds, act, n_rows, gate, up):
        n_exp = len(grp.experts)
        gu_t, _ = self.expert_types(layer)
        cfg = self.config
        stride = 2 * bufs.gu_bytes
        self._mmq_group(gu_t, bufs.gu, 0, stride, cfg.n_ff_exp, cfg.n_embd, n_exp, act, bounds, gate)
        self._mmq_group(gu_t, bufs.gu, bufs.gu_bytes, stride, cfg.n_ff_exp, cfg.n_embd, n_exp, act, bounds, up)

    def mmq_group_down(self, layer, bufs: GroupBufs, grp, bounds, act, n_rows, y):
        n_exp = len(grp.experts)
        _, d_t = self.expert_types(layer)
        cfg = self.config
        self._mmq_group(d_t, bufs.dn, 0, bufs.d_bytes, cfg.n_embd, cfg.n_ff_exp, n_exp, act, bounds, y)

    def swiglu_rows(self, gate, up, r0, r1):
        self._launch("swiglu")
        return swiglu(gate[r0:r1], up[r0:r1])

    def combine(self, x, weights, slot, y, shared):
        self._launch("combine")
        return combine(x, weights, slot, y, shared)
