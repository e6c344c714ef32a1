"""The steps a backend carries out for the fast engine (fast/engine.py) and the walk
(fast/walk.py, fast/experts.py). Two backends implement it: `cuda` (fast/cuda/backend.py) and
`sim` (fast/sim.py); tests/test_backend_protocol.py checks both against these signatures.

Arrays are the backend's own (pycuda GPUArrays, NumPy arrays in the sim); `Q8` is a q8_1
buffer (contract/q8_1.py); `Event` a stream event. Every step is enqueued on the compute stream
and returns at once, except `download`, `routing_tables` (its counts come back to the host for
the walk to plan, unless the walk is planned on the device: device_plan) and the load/reset steps. Copies run on a second stream, the copy stream.
"""
from __future__ import annotations

from typing import Any, ContextManager, Protocol, Sequence

import numpy as np

from strata_prefill.fast.experts import Place

Array = Any
Q8 = Any
Event = Any
Weight = Any


class Backend(Protocol):
    name: str
    counters: Any  # collections.Counter: launches, per-kernel launches, waits, events, copies, bytes

    # ---- set-up ---------------------------------------------------------------------------
    def load(self, pack, *, placement, ring_slots: int, staging_slots: int) -> None:
        """Take the pack: dense weights, resident experts into the expert cache (placement),
        streamed ones into the host tier, the rings' VRAM slots."""

    def expert_cache_capacity(self, pack, *, reserve_mib: int, ring_slots: int, staging_slots: int) -> int:
        """How many experts fit in the expert cache with reserve_mib MiB left free (--expert-cache auto)."""

    def streamed_bytes_pinned(self) -> float:
        """Share of the host tier's bytes in page-locked memory (the ring's default depends on it)."""

    def reset_cache(self) -> None:
        """A fresh KV cache: the next prompt starts at position 0."""

    def oom_guard(self, what: str) -> ContextManager:
        """Out of device memory inside: one-line error naming `what`."""

    # ---- timing and traces (fast/phases.py, fast/trace.py) -------------------------------------
    def phase(self, name: str, **args) -> ContextManager:
        """Time the enclosed steps as phase `name` (when timing is on); a span named `name`
        with args (layer, experts, ...) in a trace."""

    def host_phase(self, name: str) -> ContextManager:
        """Time the enclosed host work as phase `name` (host perf_counter, when timing is on)."""

    def chunk_begin(self) -> None:
        """A chunk starts: later phases count to it (a marker when phases.chunk_timing is on)."""

    def chunk_end(self) -> None:
        """The chunk's work is enqueued (its end marker when phases.chunk_timing is on)."""

    def phase_table(self) -> dict:
        """Seconds per phase since the last call."""

    def chunk_tables(self) -> list:
        """strata_prefill.fast.phases.ChunkTimes per chunk since the last call."""

    def trace_begin(self) -> None:
        """Start a trace: the streams drained, time 0 now."""

    def trace_end(self) -> list:
        """The compute and copy streams' spans since trace_begin (strata_prefill.fast.trace.Span)."""

    # ---- arrays ---------------------------------------------------------------------------
    def w(self, name: str) -> Weight:
        """The weight (or norm vector) `name` of the pack, uploaded on first use."""

    def expert_types(self, layer: int) -> tuple:
        """(gate/up type, down type) of the layer's experts."""

    def download(self, a: Array) -> np.ndarray:
        """A host copy of `a` (waits for the compute stream)."""

    def view(self, a: Array, shape: tuple) -> Array:
        """`a` with another shape, same memory."""

    def shape(self, a: Array) -> tuple:
        """The shape of `a`."""

    def last_row(self, x: Array) -> Array:
        """x[-1:] as a view."""

    def rows(self, x: Array, r0: int, r1: int) -> Array:
        """x[r0:r1] as a view (a chunk of a layer-major window's residual)."""

    def join_rows(self, x: Array, parts: Sequence[Array]) -> Array:
        """The window residual whose consecutive row ranges are `parts` (the attention halves'
        outputs for the chunks of x, in order): x itself where every part lies in place in x's
        rows, else a new array holding them."""

    def window_budget_bytes(self) -> int:
        """The device bytes `--window auto` sizes a window's buffers from."""

    def alloc_f32(self, shape: tuple) -> Array:
        """An uninitialized float32 array."""

    def alloc_q8(self, n_rows: int, K: int) -> Q8:
        """An uninitialized q8_1 buffer of n_rows rows of K values."""

    # ---- dense steps ----------------------------------------------------------------------
    def embed(self, ids: np.ndarray) -> Array:
        """float32 [T, n_embd]: the embedding rows of token ids."""

    def rmsnorm(self, x: Array, w: Array, eps: float) -> Array:
        """strata_prefill.contract.numerics.rmsnorm over x's rows."""

    def quantize_rows(self, x: Array, layout) -> Q8:
        """x's rows as a q8_1 buffer in `layout`."""

    def mmq_dense(self, w: Weight, act: Q8) -> Array:
        """float32 [rows of act, rows of w]: the MMQ product of a quantized weight."""

    def float_dense(self, w: Weight, x: Array) -> Array:
        """float32 [T, rows of w]: x times an F32/F16/BF16 weight (strata_prefill.contract.dense.float_matmul)."""

    def rope(self, x: Array, positions: np.ndarray) -> Array:
        """NeoX RoPE of x [T, heads, head_dim] at absolute positions."""

    def kv_write(self, layer: int, positions: np.ndarray, k: Array, v: Array) -> None:
        """Quantize k and v into the layer's KV cache at positions (strata_prefill.contract.attention.KVCache.write)."""

    def attend(self, layer: int, q: Array, positions: np.ndarray, sinks=None, window: int | None = None) -> Array:
        """Causal attention of q [T, heads, head_dim] over the layer's cache; sinks (the
        layer's sink logits, float32 [heads]: a host array, or on the GPU a device copy) and
        window (keys a query sees) as strata_prefill.contract.attention.attend's, None: none."""

    def add(self, x: Array, y: Array) -> Array:
        """x + y (may reuse x's memory)."""

    def add_row_bias(self, y: Array, b: Array) -> Array:
        """y + b on every row (strata_prefill.contract.dense.add_row_bias): a dense product's bias
        b float32 [n] (the backend's handle, uploaded once) on y [..., n] (may reuse y's memory)."""

    def sigmoid(self, v: Array) -> Array:
        """strata_prefill.contract.numerics.sigmoid of v's values, flat."""

    # ---- the NaN/Inf watch (formats/nonfinite.py) ------------------------------------------
    def nonfinite_reset(self) -> None:
        """Forget what the watch saw: a run starts."""

    def nonfinite_mark(self, x: Array, code: int) -> None:
        """strata_prefill.formats.nonfinite.mark of x under code, queued behind the op that wrote x (no wait)."""

    def nonfinite_first(self) -> int:
        """The watch's value (strata_prefill.formats.nonfinite.NOTHING: nothing seen); waits for the marks."""

    # ---- the MoE half ---------------------------------------------------------------------
    def top_k(self, logits: Array, k: int, *, bias: Array | None = None, gating: str = "softmax") -> tuple:
        """(ids int32 [T, k], weights float32 [T, k]): strata_prefill.contract.routing.top_k (bias: the router's
        bias [E] or None; gating: strata_prefill.contract.routing.GATINGS)."""

    def row_experts(self, ids: Array, slot: Array) -> Array:
        """The expert of each expert-sorted row, int32 [T*K] (strata_prefill.contract.routing.row_experts): what
        the expert-bias steps read."""

    def routing_tables(self, ids: Array, n_expert: int, to_host: bool = True) -> Any:
        """Tables with device slot/src/dev_cnt/dev_off and host cnt/off/order
        (strata_prefill.contract.routing.routing_tables). to_host: the counts' copy back is queued behind the
        launch and read on first use; False (device_plan): nothing is copied, and a read of the
        host fields downloads them then (op records)."""

    def expert_counts(self, ids: Array, n_expert: int) -> Any:
        """How many of ids' entries name each expert, for the host without a wait now: an object
        whose `cnt` (int32 [n_expert]) waits for them on first read (head_predict's predicted
        routing; it shares no host buffer with routing_tables)."""

    def quantize_gather(self, *, x: Array, src: Array | None, n_rows: int, layout, out: Q8, row0: int,
                        n_rows_total: int) -> None:
        """Rows row0 .. row0+n_rows of out <- q8_1(x[src[r]]) (src None: x's rows in order)."""

    def quantize_scatter(self, *, x: Array, slot: Array, n_tok: int, k_used: int, layout, out: Q8) -> None:
        """Each token's row quantized once and written to its rows slot[t*k_used + k]."""

    def gather_rows(self, *, x: Array, src: Array, n_rows: int) -> Array:
        """float32 [n_rows, K]: row r is x[src[r]] (strata_prefill.contract.moe.gather_rows), the MoE input of
        float gate/up experts."""

    def scatter_rows(self, *, x: Array, slot: Array, n_tok: int, k_used: int) -> Array:
        """float32 [n_tok * k_used, K]: row slot[t*k_used + k] is x[t] (strata_prefill.contract.moe.scatter_rows)."""

    def group_bounds(self, bounds_list: list) -> list:
        """The layer's group bounds uploaded at once; one handle per group."""

    def mmq_group_gate_up(self, *, layer: int, group, bounds, act: Q8, n_rows: int, gate: Array,
                          up: Array, one_launch: bool = True) -> None:
        """Gate and up products of the group buffers' experts over their rows (bounds), in one
        launch (or one each: one_launch False). Float experts (F16, BF16, F32): the float product
        of act's float32 rows, one launch per expert and matrix (group.bounds on the host); the
        same for every product step below."""

    def prepare_batches(self, *, layer: int, batches: Sequence, add: bool = False) -> None:
        """The layer's batches (strata_prefill.fast.walk.Batch) are about to be multiplied: whatever their
        launches need on the device (the cuda backend's tile lists) may be uploaded at once.
        add: more of the same layer's (its runs after its resident batch); else the layer's first."""

    def mmq_batch_gate_up(self, *, layer: int, batch, act: Q8, n_rows: int, gate: Array, up: Array,
                          one_launch: bool = True) -> None:
        """Gate and up products of a batch of experts (strata_prefill.fast.walk.Batch), each read where it lies:
        in the expert cache, or (batch.places) in its ring slot; over their rows, in one launch
        (or one each)."""

    def mmq_batch_down(self, *, layer: int, batch, act: Q8, n_rows: int, y: Array) -> None:
        """Down products of a batch of experts, read where they lie, into their rows of y."""

    def swiglu_rows(self, gate: Array, up: Array, r0: int, r1: int, out: Array | None = None, *, act=None,
                    expert_bias=None, mark=None) -> Array:
        """H = silu(gate) * up over rows r0 .. r1 (out given: written into its rows r0 .. r1,
        and that view returned). act: None, or a strata_prefill.contract.moe.SwigluOai (strata_prefill.contract.moe.glu);
        expert_bias: None, or (rexp [R] from row_experts, gate bias [E, n], up bias [E, n]) added
        to gate and up first (strata_prefill.contract.moe.add_expert_bias). mark: None, or (code_gate,
        code_up): the watch's nonfinite_mark of rows r0 .. r1 of gate under code_gate and of up
        under code_up (their values as read, before any bias), made by the same step."""

    def swiglu_quantize(self, *, gate: Array, up: Array, r0: int, r1: int, layout, out: Q8, row0: int,
                        n_rows_total: int, act=None, expert_bias=None, mark=None) -> None:
        """One launch: H = silu(gate) * up over rows r0 .. r1, quantized into rows row0 .. of out
        (n_rows_total rows): swiglu_rows then quantize_gather (src None), the same bytes
        (act, expert_bias, mark: as swiglu_rows)."""

    def mmq_group_down(self, *, layer: int, group, bounds, act: Q8, n_rows: int, y: Array) -> None:
        """Down products of the group buffers' experts into their rows of y."""

    def combine(self, x: Array, weights: Array, slot: Array, y: Array, shared, *, down_bias=None) -> Array:
        """strata_prefill.contract.moe.combine: x + the rank-ordered weighted sum (+ the shared expert); down_bias:
        None, or (bias [E, D], ids [T, K]) added to each routed output first."""

    # ---- streaming ------------------------------------------------------------------------
    def copy_experts(self, *, ring: Place, slots: Sequence[int], experts: Sequence[tuple],
                     tags: Sequence[tuple], wait_for: Sequence[Event]) -> Event:
        """On the copy stream: wait for each event of wait_for, copy the host-tier blobs of
        experts [(layer, id)] into the ring's slots (adjacent ones in one copy when the
        run was handed over whole), record and return one event."""

    def released(self, *, ring: Place, slots: Sequence[int], tags: Sequence[tuple], event: Event | None) -> None:
        """The walk released ring slots holding the copies `tags`: refills may follow once `event`
        has happened (None: never read). Nothing to enqueue; the sim checks it against the
        slots' reads."""

    def wait(self, *, event: Event, what: str) -> None:
        """The compute stream waits for `event` (what: the copy it stands for, for reports)."""

    def record(self) -> Event:
        """An event recorded on the compute stream now."""

    def gather(self, *, layer: int, members: Sequence[tuple], q0: int) -> None:
        """One launch: members' blobs ((Place.CACHE, expert, None) or (ring, slot, tag)) into the
        group buffers at positions q0, q0+1, ..., zeroed tail after the last."""
