"""The walk over a layer's routed experts: which groups, which rows, and in what order the
waits, gathers, releases and products happen. It knows nothing of PyCUDA: a backend carries
out each step (fast/cuda/backend.py on the GPU, fast/sim.py in NumPy); the copy side of the
rings is fast/experts.py.

The routed experts are visited in id order, in groups of `group_size` (MMQ_GROUP) consecutive
routed experts, resident and streamed mixed. A streamed expert is a ring entry: in the
streamed walk (chunks from STREAM_MIN tokens) the chunk's ring pass holds every streamed
expert of every layer, so the walk also meets the entries the routing skipped; in the staged
walk the layer's pass holds only its routed streamed experts.

A group's experts are gathered into the group buffers by one or more *flushes*. A flush takes
every member not yet gathered:

  group mode (default)   one wait on the copy of its last streamed member (the copy stream is
                         in order, so the earlier ones have landed too), one gather launch for
                         all of them, one event that releases all of their slots (used_of)
  per-expert mode        per member: one wait, one gather launch, one event

A group is flushed when it is complete, and earlier when
  - the walk meets a skipped ring entry while the group holds streamed members: the held
    entries then stay contiguous, so no more than a group's entries are held back from the
    copy side and the ring keeps moving;
  - the group holds as many streamed members as the ring has slots (the 8-slot staging ring,
    or any ring smaller than a group): the next copy needs one of them released.
Then the group's products run: gate/up over its rows, SwiGLU, the quantize of H, down.

With in_place (the default) only streamed experts make groups: the layer's routed resident
experts are one Batch, multiplied where they lie in the expert cache (fast/engine.py runs its
gate/up before the walk and its SwiGLU and down after it), so the walk never meets them.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from strata.constants import MMQ_GROUP


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
    on a 1K-token chunk of 512 experts a per-expert Python loop here cost the GPU ~0.5 ms of idle
    time per layer, since the host plans while the device waits for the first gather."""
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
    """A layer's routed resident experts, multiplied where they lie in the expert cache (the
    in_place switch): one launch for all of their gate/up products and one for their down
    products, no gather, no wait, no event. Their rows need not be contiguous."""

    experts: tuple[int, ...]
    bounds: np.ndarray  # int32 [n, 2]: (row_begin, row_end) of each expert

    @property
    def n_rows(self) -> int:
        return int((self.bounds[:, 1] - self.bounds[:, 0]).sum()) if len(self.experts) else 0


def split_resident(order: np.ndarray, cnt: np.ndarray, off: np.ndarray, resident: np.ndarray):
    """(the Batch of the routed resident experts, the routed streamed ones in id order)."""
    order = np.asarray(order, dtype=np.int64)
    mine = np.asarray(resident, dtype=bool)[order]
    res = order[mine]
    return Batch(tuple(res.tolist()), expert_bounds(res, cnt, off)), order[~mine]


@dataclass(frozen=True)
class Member:
    """A routed expert in a group: its position q in the group buffers and, when streamed,
    its ring entry (None: resident in the expert cache)."""

    expert: int
    q: int
    entry: int | None


class LayerWalk:
    """One layer's walk. `stream` is the ring pass the layer's streamed experts come through;
    `products(group, bounds)` runs a group's products once its buffers are complete."""

    def __init__(self, be, layer: int, placement, stream, group_gather: bool, products):
        self.be, self.layer, self.stream = be, layer, stream
        self.resident = placement.resident[layer]
        self.group_gather = group_gather
        self.products = products
        self.members: list[Member] = []  # the open group's members
        self.flushed = 0  # members[:flushed] are gathered

    def run(self, groups: list[Group], bounds: list, visit: list[int]) -> None:
        """Visit `visit` (ascending ids: the routed experts, and in the streamed walk every
        streamed expert of the layer) and walk the groups."""
        routed_group = {e: gi for gi, g in enumerate(groups) for e in g.experts}
        gi = 0
        for e in visit:
            entry = None if self.resident[e] else self.stream.index[(self.layer, e)]
            if e not in routed_group:  # a ring entry the routing skipped
                self.skip(entry)
                continue
            if entry is not None and self.held_streamed() >= self.stream.ring.n_slots:
                self.flush()  # the next copy needs one of the held slots
            self.stream.copy_ahead()
            self.members.append(Member(e, len(self.members), entry))
            if len(self.members) == len(groups[gi].experts):
                self.flush()
                self.products(groups[gi], bounds[gi])
                self.members, self.flushed = [], 0
                gi += 1

    def held_streamed(self) -> int:
        return sum(m.entry is not None for m in self.members[self.flushed:])

    def skip(self, entry: int) -> None:
        """A skipped ring entry: gather what the open group holds first, then release the
        entry unused (nothing read it: the copy stream's order is all its slot needs)."""
        if self.held_streamed():
            self.flush()
        self.stream.release([entry], None)

    def flush(self) -> None:
        """Gather every member not yet gathered, then release their slots."""
        todo = self.members[self.flushed:]
        if not todo:
            return
        batches = [todo] if self.group_gather else [[m] for m in todo]
        for batch in batches:
            self.gather(batch)
        self.flushed = len(self.members)

    def gather(self, batch: list[Member]) -> None:
        """One wait (on the last streamed member's copy), one gather launch, one event."""
        be, stream = self.be, self.stream
        streamed = [m.entry for m in batch if m.entry is not None]
        if streamed:
            last = streamed[-1]
            slot = stream.slot_of(last)
            with be.phase("wait copy", layer=self.layer, experts=len(streamed)):
                be.wait(event=stream.ring.copied_of[slot],
                        what=f"the copy of expert {stream.entries[last][1]} of layer {self.layer} "
                             f"into {stream.ring.name} slot {slot}")
        with be.phase("gather", layer=self.layer, experts=len(batch), streamed=len(streamed)):
            be.gather(layer=self.layer, members=self._places(batch), q0=batch[0].q)
        if streamed:
            stream.release(streamed, be.record())

    def _places(self, members: list[Member]) -> list:
        """Where each member's blob is: ("cache", expert) or the ring slot and the tag of the
        copy the walk expects there."""
        out = []
        for m in members:
            if m.entry is None:
                out.append(("cache", m.expert, None))
            else:
                out.append((self.stream.ring.name, self.stream.slot_of(m.entry), self.stream.tag(m.entry)))
        return out
