"""The walk over a layer's routed experts (step 4 of the MoE half, `run_experts`): which
groups, which rows, and in what order the waits, gathers, releases and products happen. It
knows nothing of PyCUDA: a backend carries out each step (fast/cuda/backend.py on the GPU,
fast/sim.py in NumPy); the copy side of the rings is fast/experts.py.

The routed experts are visited in id order, in groups of `group_size` (MMQ_GROUP) consecutive
routed experts, resident and streamed mixed. A streamed expert is a ring entry. Which entries a
layer's ring pass holds, and in what order, is the copy schedule's (fast/schedule.py): in the
streamed walk every streamed expert of the layer, so the walk also meets the entries the routing
skipped; in the staged walk a head (stage_head) and the routed ones past it. The walk meets them
in entry order (`visit_order`): ascending ids, except that a predicted head (head_predict) comes
first and the routed ones it lacks follow it, so the ids fall once where the head ends and runs
are cut there.

A group's experts are gathered into the group buffers by one or more *flushes*. A flush takes
every member not yet gathered:

  group mode (default)   one wait on the copy of its last streamed member (the copy stream is
                         in order, so the earlier ones have landed too), one gather launch for
                         all of them, one event that releases all of their slots (used_of)
  per-expert mode        per member: one wait, one gather launch, one event

A group is flushed when it is complete, and earlier when
  - the walk meets a ring entry a ring's length or more after the group's first held entry
    (the 8-slot staging ring, or any ring smaller than a group's span): that entry's copy goes
    into the held entry's slot and waits for its release;
  - with flush_on_skip 1 (the earlier rule), the walk meets a skipped ring entry while the
    group holds streamed members: the held entries then stay contiguous. By default (0)
    skipped entries are released unused as the walk meets them and the group is gathered once,
    in one wait, launch and event, however many entries the routing skipped between its
    members (docs/results/2026-12-02-streaming-8layer.md: 1.25x of the floor at 8K became 1.11x).
Then the group's products run: gate/up over its rows, SwiGLU, the quantize of H, down.
Float experts (F16, BF16, F32) take the same walk, rings and gathers (their blobs are bytes
like any others); the backend multiplies them by the float product, one launch per expert and
matrix, on float rows: the MoE input is the normed rows themselves and H is not quantized
(down_layout None), docs/numerics.md section 6.

With in_place (the default) only streamed experts make groups: the layer's routed resident
experts are one Batch, multiplied where they lie in the expert cache (its gate/up before the
groups, its SwiGLU and down after them), so the groups never meet them. "Batch" means that
only; the members one flush gathers together are a flush's members.

With device_plan as well (the default), a layer whose experts are all resident is planned on
the device: its routing counts never come back to the host. The backend cuts the resident
Batch's row tiles from the routing tables where they lie (a DeviceBatch: one small launch,
strata_prefill.fast.tiles.routed_row_tiles), padded to the most tiles the layer's rows can cut into, and
the gate/up and down launches cover that worst case, the padding exiting at once (llama.cpp's
MUL_MAT_ID keeps its expert bounds on the device the same way). Its SwiGLU covers every row of
the layer, which is what the Batch's first-to-last rows are when every expert is resident; the
combine reads the device's slot table. The same products in the same order: not a byte moves.

With ring_in_place as well, streamed experts are not gathered either: the walk cuts the layer's
ring entries into *runs* (plan_runs) and multiplies each run's routed experts where their copies
lie in the ring slots, as a Batch whose places name the slots (the same tile-list launches as
the resident Batch). A run is one wait (on its last member's copy: group mode) and, after its
down product, one event that releases all of its slots; in per-expert mode every run holds one
expert. A run holds at most `ring_run` routed experts (RING_RUN, 64, by default), and its first
and last entries are fewer than the ring's slots apart: the copy of entry k needs entry
k - n_slots released, so a run that spanned the whole ring would wait for a release only its own
products can give (the deadlock that cutting runs in pieces rules out). Entries the routing skipped inside a run are
released unused as the walk meets them; the ring refills their slots while the run is held.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from strata_prefill.contract import dense
from strata_prefill.contract.constants import MMQ_GROUP

from strata_prefill.fast.experts import Place


@dataclass(frozen=True)
class Group:
    """Up to MMQ_GROUP consecutive routed experts and their expert-sorted rows."""

    experts: tuple[int, ...]
    bounds: np.ndarray  # int32 [n, 2]: (row_begin, row_end) of each expert
    row_begin: int  # the group's rows are contiguous: row_begin .. row_end
    row_end: int

    @property
    def n_rows(self) -> int:
        return self.row_end - self.row_begin


def expert_bounds(experts: np.ndarray, cnt: np.ndarray, off: np.ndarray) -> np.ndarray:
    """int32 [n, 2]: each expert's (row_begin, row_end) in the expert-sorted rows."""
    begin = np.asarray(off)[experts].astype(np.int32)
    return np.stack([begin, begin + np.asarray(cnt)[experts].astype(np.int32)], axis=1).reshape(-1, 2)


def plan_groups(order: np.ndarray, cnt: np.ndarray, off: np.ndarray, group: int = MMQ_GROUP) -> list[Group]:
    """Cut the routed experts (ascending id) into groups of `group` consecutive ones. Vectorized:
    a per-expert Python loop here left the GPU idle, since the host plans while the device waits
    for the first gather."""
    order = np.asarray(order, dtype=np.int64)
    bounds = expert_bounds(order, cnt, off)
    experts = order.tolist()
    out = []
    for g0 in range(0, len(experts), group):
        b = bounds[g0:g0 + group]
        out.append(Group(tuple(experts[g0:g0 + group]), b, int(b[0, 0]), int(b[-1, 1])))
    return out


@dataclass(frozen=True)
class Batch:
    """Experts multiplied where they lie: a layer's routed resident experts in the expert cache
    (the in_place switch: no gather, no wait, no event), or a run of streamed ones in their ring
    slots (ring_in_place). One launch for all of their gate/up products and one for their down
    products. Their rows need not be contiguous."""

    experts: tuple[int, ...]
    bounds: np.ndarray  # int32 [n, 2]: (row_begin, row_end) of each expert
    # where each expert's blob is, as the gather's members name it ((ring, slot, tag)); None:
    # every one in the expert cache
    places: tuple | None = None

    @property
    def n_rows(self) -> int:
        return int((self.bounds[:, 1] - self.bounds[:, 0]).sum()) if len(self.experts) else 0

    @property
    def n_experts(self) -> int:
        return len(self.experts)

    def row_span(self) -> tuple[int, int]:
        """The rows from its first expert's to its last one's (its SwiGLU covers them all)."""
        return int(self.bounds[:, 0].min()), int(self.bounds[:, 1].max())


@dataclass(frozen=True)
class DeviceBatch:
    """A layer's routed experts multiplied where they lie in the expert cache, planned on the
    device (device_plan): the host never reads the routing counts. The backend cuts the row
    tiles from the routing tables `tab` where they lie (strata_prefill.fast.tiles.routed_row_tiles, one
    launch), padded to the most tiles `n_rows` rows can cut into; the products are launched over
    that worst case and skip the padding. Every expert of the layer is resident (plans_on_device),
    so the batch's rows are all of the layer's: 0 .. n_rows."""

    tab: object  # the layer's routing tables, device cnt/off (the backend's routing_tables, to_host False)
    n_rows: int
    n_experts: int  # the layer's experts: the most the routing can name
    places = None  # every one in the expert cache

    def row_span(self) -> tuple[int, int]:
        """The rows its SwiGLU covers: every row of the layer (each belongs to a resident expert)."""
        return 0, self.n_rows


def plans_on_device(be, options, placement, layer: int) -> bool:
    """Whether `layer`'s walk is planned on the device (device_plan): in_place on, every expert of
    the layer resident (so every routed one is, whatever the routing), and quantized gate/up and
    down types (float experts are multiplied one launch per expert, over host bounds). Such a
    layer's routing tables stay on the device (routing_tables to_host False): no counts come back."""
    if not (options.in_place and options.device_plan and bool(np.all(placement.resident[layer]))):
        return False
    return not any(dense.is_float(t) for t in be.expert_types(layer))


def split_resident(order: np.ndarray, cnt: np.ndarray, off: np.ndarray, resident: np.ndarray):
    """(the Batch of the routed resident experts, the routed streamed ones in id order)."""
    order = np.asarray(order, dtype=np.int64)
    mine = np.asarray(resident, dtype=bool)[order]
    res = order[mine]
    return Batch(tuple(res.tolist()), expert_bounds(res, cnt, off)), order[~mine]


def plan_runs(visit: list[int], routed, entry_of, n_slots: int, cap: int) -> list[list[int]]:
    """The runs of ring_in_place: the routed streamed experts of `visit` (in entry order; entry_of:
    each one's ring entry, ascending along visit) cut, in order, into runs of at most `cap`
    experts whose first and last entries are fewer than n_slots apart (see the module's
    docstring) and whose ids ascend (a run's rows are its experts' in id order: visit's ids
    ascend but where a predicted head ends, head_predict). routed: the set of routed ids; the
    others in visit are skipped entries."""
    runs: list[list[int]] = []
    first = None
    for e in visit:
        if e not in routed:
            continue
        k = entry_of[e]
        if runs and first is not None and (len(runs[-1]) >= cap or k - first >= n_slots or e < runs[-1][-1]):
            first = None
        if first is None:
            runs.append([])
            first = k
        runs[-1].append(e)
    return runs


@dataclass(frozen=True)
class Member:
    """A routed expert in a group: its position q in the group buffers and, when streamed,
    its ring entry (None: resident in the expert cache)."""

    expert: int
    q: int
    entry: int | None


@dataclass
class ExpertRows:
    """A layer's expert-sorted buffers (n_rows = T*K rows): the quantized MoE input, the gate
    and up products, H quantized in the layout of the down type (down_in), the experts'
    outputs y; h: the host copy of H when op records ask for it (H itself lives one group at
    a time when SwiGLU and its quantize are one launch). Float experts: moe_in holds float32
    rows (float gate/up), down_in H itself, float32 (float down)."""

    n_rows: int
    moe_in: object
    gate: object
    up: object
    down_in: object
    y: object
    h: np.ndarray | None = None
    #: every row of gate and up passed a SwiGLU step that made glu's mark: False where a step's
    #: rows held some no product had written yet (LayerWalk.swiglu_h), so the caller marks them
    marked: bool = True


def run_experts(be, *, config, layer: int, tab, n_rows: int, moe_in, down_layout, placement, ring_pass,
                ahead: list[int], options, group_size: int, on_device: bool, keep_h: bool = False,
                glu: dict | None = None) -> ExpertRows:
    """Step 4 of the MoE half: every routed expert's gate/up, SwiGLU, quantize of H and down,
    over the routing tables `tab` and the quantized MoE input `moe_in` (n_rows rows). Plans
    the groups (and with in_place the resident Batch), takes the layer's streamed experts
    through `ring_pass`, which holds the layer's entries: `ahead`, the streamed experts queued
    before its routing was known, in entry order (the streamed walk: every one; a staged
    layer's head, stage_head: its lowest ids, or with head_predict the predicted ones, ascending),
    then its routed ones not among them (the staged walk's, queued after the routing, ascending);
    and returns the filled buffers. on_device: the layer is planned on the device
    (plans_on_device, decided once by the caller, whose routing tables then kept the counts on
    the device). keep_h: keep H on the host for the op records.
    down_layout None: a float down type, whose input H is not quantized. glu: the gated
    activation's keywords of the backend's SwiGLU steps where the architecture's MoE asks for
    them (act, expert_bias: fast/engine.py's MoeSteps), None or empty for plain SwiGLU, and the
    watch's mark of gate and up (fast/engine.py): every row of them passes one SwiGLU step or
    more after its product, in every form of the walk, so those steps are the watch's marks of
    both, but where rows.marked comes back False (LayerWalk.swiglu_h)."""
    n_ff = config.n_ff_exp
    down_in = be.alloc_f32((n_rows, n_ff)) if down_layout is None else be.alloc_q8(n_rows, n_ff)
    rows = ExpertRows(n_rows, moe_in, gate=be.alloc_f32((n_rows, n_ff)), up=be.alloc_f32((n_rows, n_ff)),
                      down_in=down_in, y=be.alloc_f32((n_rows, config.n_embd)),
                      h=np.full((n_rows, n_ff), np.nan, np.float32) if keep_h else None)  # rows no product writes stay NaN
    if on_device:  # no host planning: the counts stay on the device
        batch = DeviceBatch(tab, n_rows, int(placement.resident.shape[1]))
        lw = LayerWalk(be, layer, placement, ring_pass, options, rows, down_layout, keep_h, glu)
        be.prepare_batches(layer=layer, batches=[batch] if n_rows else [])
        if n_rows:
            lw.batch_gate_up(batch)
            lw.batch_rest(batch)
        return rows
    resident = placement.resident[layer]
    in_ring = bool(options.in_place and options.ring_in_place)  # streamed experts read in their slots
    with be.host_phase("host planning"):
        if options.in_place:  # the routed resident experts are one batch; groups hold streamed ones
            batch, walked = split_resident(tab.order, tab.cnt, tab.off, resident)
        else:
            batch, walked = None, tab.order
        walked = [int(e) for e in walked]
    in_place = batch if batch is not None and len(batch.experts) > 0 else None
    lw = LayerWalk(be, layer, placement, ring_pass, options, rows, down_layout, keep_h, glu)
    # the layer's first upload, made even without a resident batch: it drops the last layer's tiles
    be.prepare_batches(layer=layer, batches=[] if in_place is None else [in_place])
    if in_place is not None:  # queued before the rest is planned: the device multiplies while the host plans
        lw.batch_gate_up(in_place)
    with be.host_phase("host planning"):
        visit = visit_order(walked, ahead, placement.streamed(layer))
        groups = [] if in_ring else plan_groups(walked, tab.cnt, tab.off, group_size)
        bounds = be.group_bounds([g.bounds for g in groups])  # one upload per layer
    if in_ring:
        with be.host_phase("host planning"):
            runs = ring_runs(ring_pass, layer, visit, walked, tab, options.ring_run if options.group_gather else 1)
            be.prepare_batches(layer=layer, batches=runs, add=True)
        lw.run_in_ring(visit, runs, in_place)
    else:
        lw.run(groups, bounds, visit, in_place)
    return rows


def visit_order(walked: list[int], ahead: list[int], streamed) -> list[int]:
    """The order the walk meets a layer's experts: its ring entries' order. A prefix of the
    layer's streamed experts by id ahead (the streamed walk, a head of the lowest ids) joins the
    routed ones in id order (with in_place 0 resident experts among them, met where their ids
    fall); a predicted head (head_predict, which needs in_place: `walked` is then streamed
    experts only) comes first, then the routed experts it lacks."""
    if not ahead:
        return walked
    if list(ahead) == [int(e) for e in streamed[:len(ahead)]]:
        return sorted(set(walked) | set(ahead))
    head = set(ahead)
    return list(ahead) + [e for e in walked if e not in head]


def ring_runs(ring_pass, layer: int, visit: list[int], walked: list[int], tab, cap: int) -> list[Batch]:
    """The layer's runs (plan_runs) as Batches whose places are their ring slots and the copies
    the walk expects there."""
    entry_of = {e: ring_pass.index[(layer, e)] for e in visit}
    out = []
    for run in plan_runs(visit, set(walked), entry_of, ring_pass.ring.n_slots, cap):
        ks = [entry_of[e] for e in run]
        places = tuple((ring_pass.ring.place, ring_pass.slot_of(k), ring_pass.tag(k)) for k in ks)
        out.append(Batch(tuple(run), expert_bounds(np.asarray(run, np.int64), tab.cnt, tab.off), places))
    return out


class LayerWalk:
    """One layer's walk. `ring_pass` is the ring pass the layer's streamed experts come through;
    `rows` the expert-sorted buffers the products read and write."""

    def __init__(self, be, layer: int, placement, ring_pass, options, rows: ExpertRows, down_layout,
                 keep_h: bool = False, glu: dict | None = None):
        self.be, self.layer, self.ring_pass = be, layer, ring_pass
        self.glu = glu or {}  # act and expert_bias of the SwiGLU steps (none: plain SwiGLU, unbiased)
        self.resident = placement.resident[layer]
        self.options = options
        self.group_gather = options.group_gather
        self.rows, self.down_layout, self.keep_h = rows, down_layout, keep_h
        self.members: list[Member] = []  # the open group's members (ring_in_place: the open run's)
        self.written = np.zeros(rows.n_rows, bool)  # the rows of gate and up a product has written
        self.flushed = 0  # members[:flushed] are gathered
        self.in_ring = False  # walking runs (run_in_ring), not groups

    def run(self, groups: list[Group], bounds: list, visit: list[int], batch: Batch | None = None) -> None:
        """Visit `visit` (ascending ids: the routed experts, and in the streamed walk every
        streamed expert of the layer) and walk the groups; then the SwiGLU and down of the
        resident `batch`, whose gate/up run_experts queued first (the device multiplies while
        the host plans and the copies land)."""
        routed_group = {e: gi for gi, g in enumerate(groups) for e in g.experts}
        gi = 0
        for e in visit:
            entry = None if self.resident[e] else self.ring_pass.index[(self.layer, e)]
            if entry is not None and self.spans_ring(entry):
                self.flush()  # entry's copy waits for the release of a held entry
            if e not in routed_group:  # a ring entry the routing skipped
                self.skip(entry)
                continue
            self.ring_pass.copy_ahead()
            self.members.append(Member(e, len(self.members), entry))
            if len(self.members) == len(groups[gi].experts):
                self.flush()
                self.products(groups[gi], bounds[gi])
                self.members, self.flushed = [], 0
                gi += 1
        if batch is not None:
            self.batch_rest(batch)

    def run_in_ring(self, visit: list[int], runs: list[Batch], batch: Batch | None = None) -> None:
        """The walk with ring_in_place: visit the layer's ring entries, release the skipped ones
        unused, and multiply each run where it lies once its last member is met; the resident
        `batch` as in run()."""
        self.in_ring = True  # skip() then releases at once: a run holds its slots across skips
        last = {b.experts[-1]: b for b in runs}
        routed = {e for b in runs for e in b.experts}
        for e in visit:
            entry = self.ring_pass.index[(self.layer, e)]
            if e not in routed:
                self.skip(entry)
                continue
            self.ring_pass.copy_ahead()
            self.members.append(Member(e, len(self.members), entry))  # the open run's (held_streamed)
            if e in last:
                self.multiply_run(last[e])
                self.members = []
        if batch is not None:
            self.batch_rest(batch)

    def multiply_run(self, run: Batch) -> None:
        """A run's products read straight from its ring slots: one wait on its last copy (the
        copy stream is in order), gate/up, SwiGLU and the quantize of H, down, then one event
        that releases every slot the products read."""
        be, ring_pass, r, layer = self.be, self.ring_pass, self.rows, self.layer
        entries = [ring_pass.index[(layer, e)] for e in run.experts]
        slot = ring_pass.slot_of(entries[-1])
        n = len(run.experts)
        with be.phase("wait copy", layer=layer, experts=n):
            be.wait(event=ring_pass.ring.copied_of[slot],
                    what=f"the copy of expert {run.experts[-1]} of layer {layer} into {ring_pass.ring.place} "
                         f"slot {slot}")
        args = dict(layer=layer, experts=n, rows=run.n_rows, streamed=n)
        self.batch_gate_up(run, args)
        self.swiglu_h(int(run.bounds[0, 0]), int(run.bounds[-1, 1]), args)
        with be.phase("down", **args):
            be.mmq_batch_down(layer=layer, batch=run, act=r.down_in, n_rows=r.n_rows, y=r.y)
        ring_pass.release(entries, be.record())

    def held_streamed(self) -> int:
        return sum(m.entry is not None for m in self.members[self.flushed:])

    def spans_ring(self, entry: int) -> bool:
        """Whether the open group holds an entry a ring's length or more before `entry`: the
        copy of `entry` goes into that entry's slot and waits for its release, so the group
        must be gathered before the walk waits for (or releases) `entry`."""
        first = next((m.entry for m in self.members[self.flushed:] if m.entry is not None), None)
        return first is not None and entry - first >= self.ring_pass.ring.n_slots

    def skip(self, entry: int) -> None:
        """A skipped ring entry, released unused (nothing read it: the copy stream's order is
        all its slot needs). With flush_on_skip the open group is gathered first, so the held
        entries stay contiguous; without it the group is held across skips (run() gathers it
        earlier only where it spans the ring). An open run (ring_in_place) is not cut here:
        plan_runs already bounds what it holds."""
        if self.options.flush_on_skip and self.held_streamed() and not self.in_ring:
            self.flush()
        self.ring_pass.release([entry], None)

    def flush(self) -> None:
        """Gather every member not yet gathered, then release their slots."""
        todo = self.members[self.flushed:]
        if not todo:
            return
        for members in [todo] if self.group_gather else [[m] for m in todo]:
            self.gather(members)
        self.flushed = len(self.members)

    def gather(self, members: list[Member]) -> None:
        """One wait (on the last streamed member's copy), one gather launch, one event."""
        be, ring_pass = self.be, self.ring_pass
        streamed = [m.entry for m in members if m.entry is not None]
        if streamed:
            last = streamed[-1]
            slot = ring_pass.slot_of(last)
            with be.phase("wait copy", layer=self.layer, experts=len(streamed)):
                be.wait(event=ring_pass.ring.copied_of[slot],
                        what=f"the copy of expert {ring_pass.entries[last][1]} of layer {self.layer} "
                             f"into {ring_pass.ring.place} slot {slot}")
        with be.phase("gather", layer=self.layer, experts=len(members), streamed=len(streamed)):
            be.gather(layer=self.layer, members=self._places(members), q0=members[0].q)
        if streamed:
            ring_pass.release(streamed, be.record())

    def _places(self, members: list[Member]) -> list:
        """Where each member's blob is: (Place.CACHE, expert) or the ring slot and the tag of the
        copy the walk expects there."""
        out = []
        for m in members:
            if m.entry is None:
                out.append((Place.CACHE, m.expert, None))
            else:
                out.append((self.ring_pass.ring.place, self.ring_pass.slot_of(m.entry), self.ring_pass.tag(m.entry)))
        return out

    # ---- the products -------------------------------------------------------------------
    def products(self, grp: Group, gb) -> None:
        """A gathered group's products: gate/up over its rows, SwiGLU and the quantize of H, down."""
        be, r, layer = self.be, self.rows, self.layer
        args = dict(layer=layer, experts=len(grp.experts), rows=grp.n_rows)
        with be.phase("gate/up", **args):
            be.mmq_group_gate_up(layer=layer, group=grp, bounds=gb, act=r.moe_in, n_rows=r.n_rows, gate=r.gate,
                                 up=r.up, one_launch=self.options.fuse_group)
        self._written(grp.bounds)
        self.swiglu_h(grp.row_begin, grp.row_end, args)
        with be.phase("down", **args):
            be.mmq_group_down(layer=layer, group=grp, bounds=gb, act=r.down_in, n_rows=r.n_rows, y=r.y)

    @staticmethod
    def resident_args(layer: int, batch: Batch | DeviceBatch) -> dict:
        """A resident batch's phase arguments (a DeviceBatch's experts: the most it may hold)."""
        return dict(layer=layer, experts=batch.n_experts, rows=batch.n_rows, resident=True)

    def batch_gate_up(self, batch: Batch, args: dict | None = None) -> None:
        """A batch's gate/up in one launch; args (the phase's): the resident batch's by default."""
        be, r = self.be, self.rows
        args = self.resident_args(self.layer, batch) if args is None else args
        with be.phase("gate/up", **args):
            be.mmq_batch_gate_up(layer=self.layer, batch=batch, act=r.moe_in, n_rows=r.n_rows, gate=r.gate, up=r.up,
                                 one_launch=self.options.fuse_group)
        self._written(None if isinstance(batch, DeviceBatch) else batch.bounds)

    def _written(self, bounds) -> None:
        """The rows of experts' (row_begin, row_end) bounds now hold their gate and up (None: all)."""
        if bounds is None:
            self.written[:] = True
            return
        for b0, b1 in np.asarray(bounds).tolist():
            self.written[b0:b1] = True

    def batch_rest(self, batch: Batch) -> None:
        """The resident batch's SwiGLU over the rows from its first to its last (when streamed
        experts' rows lie between, they are computed again from the same gate and up, the same
        bytes), then its down."""
        be, r = self.be, self.rows
        args = self.resident_args(self.layer, batch)
        self.swiglu_h(*batch.row_span(), args)
        with be.phase("down", **args):
            be.mmq_batch_down(layer=self.layer, batch=batch, act=r.down_in, n_rows=r.n_rows, y=r.y)

    def swiglu_h(self, r0: int, r1: int, args: dict) -> None:
        """H = silu(gate) * up over rows r0..r1 (or the architecture's activation of the biased
        gate and up: self.glu), quantized into down_in (a float down type: written there as it
        is, one launch). glu's mark (the watch's, of gate and up) is made only where every row
        of r0..r1 was written by a product before: a ring run's rows span those of experts a
        later run multiplies where a predicted head comes first (head_predict); H of those rows
        is computed again, from their values, by that run, but their values now are no one's.
        Such a step marks nothing and rows.marked becomes False."""
        be, r, glu = self.be, self.rows, self.glu
        if "mark" in glu and not self.written[r0:r1].all():
            glu = {k: v for k, v in glu.items() if k != "mark"}
            r.marked = False
        with be.phase("swiglu+quantize H", **args):
            if self.down_layout is None:
                hh = be.swiglu_rows(r.gate, r.up, r0, r1, out=r.down_in, **glu)
                if self.keep_h:
                    self._keep_h(hh, r0)
            elif not self.options.fuse_group or self.keep_h:  # op records keep H: two launches
                hh = be.swiglu_rows(r.gate, r.up, r0, r1, **glu)
                if self.keep_h:
                    self._keep_h(hh, r0)
                be.quantize_gather(x=hh, src=None, n_rows=r1 - r0, layout=self.down_layout, out=r.down_in,
                                   row0=r0, n_rows_total=r.n_rows)
            else:  # one launch, H never written
                be.swiglu_quantize(gate=r.gate, up=r.up, r0=r0, r1=r1, layout=self.down_layout, out=r.down_in,
                                   row0=r0, n_rows_total=r.n_rows, **glu)

    def _keep_h(self, hh, r0: int) -> None:
        """Rows r0.. of H into the host copy (rows no product wrote stay NaN)."""
        part = self.be.download(hh)
        self.rows.h[r0:r0 + part.shape[0]] = part
