"""Where each expert lives, and the copy side of the rings that bring streamed experts in.

Placement (the expert cache): `--expert-cache N` VRAM slots hold resident experts; every other
expert lives in the host tier (page-locked host memory, blobs [gate | up | down] in (layer, id)
order) and is copied into a ring slot when a walk needs it. The policy is deterministic and
depends only on (n_layer, n_expert, N):

  layer l gets q_l = N // n_layer slots, plus one for the first N % n_layer layers;
  within a layer the q_l residents are spread evenly over the ids: expert e is resident
  iff floor((e + 1) * q_l / n_expert) > floor(e * q_l / n_expert).

Spreading them (rather than taking the lowest ids) makes every MMQ group mix resident and
streamed experts, as a cache filled by use would.

The copy side (`RingPass`): one pass of entries through a ring of VRAM slots, filled in entry
order by the copy stream. Entry k goes to slot k % n_slots, after the release of entry
k - n_slots (the event named by `used_of[slot]`), so copies run ahead of compute by at most the
ring's depth. `Passes` opens them; which entries a pass holds, and when, is the copy schedule's
(fast/schedule.py). A blob is read from one of three places (`Place`): the expert cache, the
streamed walk's ring, or the staging ring.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np

from strata_prefill.fast.tuning import COALESCE_MAX
from strata_prefill.contract.errors import InputError

#: the streamed walk's copies queued before layer 0's attention; the rest follow it. Four
#: coalesced copies keep the link busy while the host queues the attention half, and the device
#: starts that half before the host has queued a ring's worth of copies (tens of calls)
PASS_HEAD = 4 * COALESCE_MAX


class Place(enum.StrEnum):
    """Where a read finds an expert's blob: the expert cache (resident experts), the streamed
    walk's ring, or the 8-slot staging ring (stage_in_ring 0). A str whose value is the word the
    traces, hazard reports and the backends' notes print, so what they write stays as it was."""

    CACHE = "cache"
    RING = "ring"
    STAGE = "stage"


@dataclass(frozen=True)
class Placement:
    """Which experts are resident. resident[l, e]; cache_slot[l, e] (-1: streamed);
    host_index[l, e]: the blob's position in the host tier (-1: resident)."""

    resident: np.ndarray
    cache_slot: np.ndarray
    host_index: np.ndarray

    @property
    def n_resident(self) -> int:
        return int(self.resident.sum())

    @property
    def n_streamed(self) -> int:
        return int(self.resident.size - self.resident.sum())

    def streamed(self, layer: int) -> np.ndarray:
        """The layer's streamed expert ids, ascending."""
        return np.nonzero(~self.resident[layer])[0]


def place_experts(n_layer: int, n_expert: int, cache_slots: int) -> Placement:
    """The deterministic policy above for `cache_slots` VRAM slots (capped at every expert)."""
    if cache_slots < 0:
        raise InputError(f"--expert-cache must be >= 0, got {cache_slots}")
    n = min(int(cache_slots), n_layer * n_expert)
    quota = [n // n_layer + (1 if l < n % n_layer else 0) for l in range(n_layer)]
    e = np.arange(n_expert)
    resident = np.stack([(e + 1) * q // n_expert > e * q // n_expert for q in quota])
    cache_slot = np.full((n_layer, n_expert), -1, np.int32)
    cache_slot[resident] = np.arange(n, dtype=np.int32)
    host_index = np.full((n_layer, n_expert), -1, np.int32)
    host_index[~resident] = np.arange(resident.size - n, dtype=np.int32)
    return Placement(resident, cache_slot, host_index)


@dataclass
class Ring:
    """Host-side state of a ring of VRAM slots; it outlives chunks and layers.

    place         which ring it is (Place.RING or Place.STAGE), as copies and reads name it
    used_of[s]    the compute-side event that releases slot s (None: nothing to wait for)
    copied_of[s]  the copy-side event recorded after slot s's current copy (None: none pending)
    tag_of[s]     what that copy brought: (ring, slot, layer, expert, entry)"""

    place: Place
    n_slots: int
    used_of: list = field(default_factory=list)
    copied_of: list = field(default_factory=list)
    tag_of: list = field(default_factory=list)

    def __post_init__(self):
        if self.n_slots < 1:
            raise InputError(f"a ring needs at least one slot, got {self.n_slots}")
        self.used_of = [None] * self.n_slots
        self.copied_of = [None] * self.n_slots
        self.tag_of = [None] * self.n_slots


class RingPass:
    """One pass of entries (layer, expert) through a ring. A unit's pass (a chunk's or a
    window's) grows layer by layer as its copy schedule chooses (fast/schedule.py): a streamed
    layer appends every one of its streamed experts, a staged one only its routed ones once its
    routing is known, always in layer order. With stage_in_ring 0 a staged layer has a pass of
    its own through the 8-slot staging ring."""

    def __init__(self, be, ring: Ring, entries: list[tuple[int, int]], pass_id: int, coalesce: bool):
        self.be, self.ring, self.entries = be, ring, list(entries)
        self.pass_id = pass_id  # tells apart the passes of one ring in hazard reports
        self.coalesce = coalesce
        self.index = {le: k for k, le in enumerate(entries)}
        self.released = [False] * len(entries)
        self.next_copy = 0

    def extend(self, entries: list[tuple[int, int]]) -> None:
        """Append entries after the pass's last one (their copies follow it: copy_ahead queues
        them once the ring has room)."""
        for le in entries:
            if le in self.index:
                raise ValueError(f"entry {le} is already in pass {self.pass_id}")
            self.index[le] = len(self.entries)
            self.entries.append(le)
            self.released.append(False)

    def slot_of(self, k: int) -> int:
        return k % self.ring.n_slots

    def tag(self, k: int):
        layer, expert = self.entries[k]
        return (self.ring.place, self.slot_of(k), layer, expert, f"{self.pass_id}:{k}")

    def copy_ahead(self, limit: int | None = None) -> None:
        """Enqueue every copy the ring has room for (at most `limit` entries): entry k once entry
        k - n_slots is released. Coalescing hands the backend up to COALESCE_MAX entries a call
        (it merges the ones whose host blobs and slots are adjacent into one copy, with one event
        for them); otherwise one call, one copy and one event per entry."""
        n_slots, due = self.ring.n_slots, []
        end = len(self.entries) if limit is None else min(len(self.entries), self.next_copy + limit)
        while self.next_copy < end:
            k = self.next_copy
            if k >= n_slots and not self.released[k - n_slots]:
                break
            due.append(k)
            self.next_copy += 1
        step = COALESCE_MAX if self.coalesce else 1
        for i in range(0, len(due), step):
            self._copy(due[i:i + step])

    def _copy(self, run: list[int]) -> None:
        ring = self.ring
        slots = [self.slot_of(k) for k in run]
        waits = []
        for s in slots:  # each slot's release; one wait per distinct event
            ev = ring.used_of[s]
            if ev is not None and all(ev is not w for w in waits):
                waits.append(ev)
        tags = [self.tag(k) for k in run]
        done = self.be.copy_experts(ring=ring.place, slots=slots, experts=[self.entries[k] for k in run],
                                    tags=tags, wait_for=waits)
        for s, t in zip(slots, tags):
            ring.copied_of[s], ring.tag_of[s] = done, t

    def release(self, ks: list[int], event) -> None:
        """Entries ks were read by the steps before `event` (their gather, or with ring_in_place
        their products): their slots may be refilled once it has happened (event None: never
        read, nothing to wait for). The backend hears of it (released: the sim checks that no
        read of the slots comes after it)."""
        ring = self.ring
        self.be.released(ring=ring.place, slots=[self.slot_of(k) for k in ks], tags=[self.tag(k) for k in ks],
                         event=event)
        for k in ks:
            s = self.slot_of(k)
            if event is not None or k < self.next_copy:
                # the slot holds entry k's copy: a refill waits for `event` (None: for nothing,
                # the copy stream's own order keeps it behind that copy)
                ring.used_of[s] = event
                ring.copied_of[s] = None
            # else entry k was skipped before its copy was due: the slot still holds an earlier
            # entry (of this pass or the one before), whose release its refill must still wait for
            self.released[k] = True
        self.copy_ahead()


class Passes:
    """Opens an engine's ring passes. One count numbers the passes of all its rings (a copy's
    tag names its pass, so a stale copy from an earlier pass is told apart)."""

    def __init__(self, be, coalesce: bool):
        self.be, self.coalesce = be, coalesce
        self.count = 0

    def open(self, ring: Ring, entries: list[tuple[int, int]], head: int | None = None) -> RingPass:
        """A new pass of `entries` through `ring`, its first copies enqueued (at most `head`
        entries: the caller enqueues the rest with copy_ahead)."""
        self.count += 1
        ring_pass = RingPass(self.be, ring, entries, self.count, self.coalesce)
        with self.be.host_phase("host planning"):  # enqueueing the first copies is host work
            ring_pass.copy_ahead(head)
        return ring_pass


def adjacent_runs(slots, experts, host_index: np.ndarray, blob_bytes: list, slot_bytes: int) -> list[list[int]]:
    """The copies a run of entries takes when adjacent ones are merged, as lists of positions:
    entry i joins entry i-1's copy when its slot follows, its host blob follows in the host
    tier, and the previous blob fills its slot to the brim (contiguous bytes on both sides)."""
    runs: list[list[int]] = []
    for i, (s, (l, e)) in enumerate(zip(slots, experts)):
        if i > 0:
            pl, pe = experts[i - 1]
            if (s == slots[i - 1] + 1 and host_index[l, e] == host_index[pl, pe] + 1
                    and blob_bytes[pl] == slot_bytes):
                runs[-1].append(i)
                continue
        runs.append([i])
    return runs
