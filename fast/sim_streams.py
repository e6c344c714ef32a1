"""Simulated streams and events for the `sim` backend, and the ring-hazard detector.

The host enqueues operations on two in-order streams, `compute` and `copy`, as it does on the
GPU; nothing runs at enqueue time. A seeded scheduler then runs them in any order the streams
and the recorded events allow:

  random         after each enqueue, a few steps, each on a stream picked at random (seeded)
  copy_first     the copy stream runs as early as its waits allow; compute only when forced
  compute_first  compute runs as early as its waits allow; copies only when forced

so the same walk is tried with copies far ahead of compute, far behind it, and interleaved.

Ring slots carry versions. Two kinds of check report a hazard (ScheduleHazard, naming the ring,
the slot, the expert and layer and the two operations):

- happens-before, at enqueue time, independent of the order chosen: a gather of a ring slot
  (or, with ring_in_place, a product reading it: every read of a slot counts as a gather here)
  must follow (through a compute-side wait) the copy that filled it; a copy into a ring slot
  must follow (through a copy-side wait) every gather enqueued on the slot's previous
  contents; a wait must name an event the host has recorded ("a wait on an event nothing
  will record");
- releases (the walk tells the backend of each, `release`): a slot released by an event
  recorded before a read of its contents enqueued so far, or released unused after a read, or
  read after its contents were released, is a hazard, whether or not the copy side has
  refilled it yet (a slot held through its products is released late; a planted early release
  is caught even where the ring is deep enough that no refill follows it);
- on execution: a gather finds the slot holding another copy than the one it was promised
  (refilled, or not yet landed).

A stream that cannot move while the other cannot either is reported as a deadlock.

For traces (`--trace`), a ModelClock gives the operations a modelled time as they execute;
the order the scheduler picks does not change it.
"""
from __future__ import annotations

import random
import time
from collections import deque
from dataclasses import dataclass, field

from strata_prefill.fast.tuning import COPY_BYTES_PER_S

from strata_prefill.fast.trace import Span

POLICIES = ("random", "copy_first", "compute_first")
STREAMS = ("compute", "copy")


class ScheduleHazard(RuntimeError):
    """The walk's schedule lets a copy and a gather of a ring slot race, or waits on nothing."""


@dataclass(eq=False)
class SimEvent:
    """An event: each record() is a new version; a wait captures the version at enqueue time."""

    label: str
    stream: str = ""
    version: int = 0  # records enqueued
    done: int = 0  # records executed
    seq: int = -1  # position of the latest record in its stream (for happens-before)
    times: dict = field(default_factory=dict)  # version -> modelled time of its record (ModelClock)

    def __repr__(self) -> str:
        return f"event({self.label})"


@dataclass(eq=False)
class _Op:
    stream: str
    seq: int
    label: str
    fn: object = None  # callable run on execution
    wait: tuple | None = None  # (event, version) this op waits for
    records: tuple | None = None  # (event, version) this op records
    name: str = ""  # its span's name in a trace ("": no span)
    args: dict | None = None  # its span's args
    nbytes: int = 0  # bytes a copy moves


class ModelClock:
    """Modelled time of the simulated streams, for traces. An operation starts when its stream
    is free and the event it waits for has been recorded (a record takes no time, at its
    stream's time then); a copy lasts its bytes / COPY_BYTES_PER_S (the host-to-device rate
    measured on the H200), a compute operation its measured host time (the NumPy kernel's).
    The host is taken as always ahead of both streams (launch costs are not modelled), so idle
    time on the compute stream is time spent waiting for copies. A wait that stalls its stream
    becomes a span of its own."""

    def __init__(self):
        self.free = {s: 0.0 for s in STREAMS}
        self.spans: list[Span] = []

    def run(self, op: "_Op") -> None:
        start = self.free[op.stream]
        if op.wait is not None:
            event, version = op.wait
            ready = event.times.get(version, 0.0)  # recorded before the clock started: at 0
            if ready > start:
                self.spans.append(Span(op.stream, op.name, start, ready - start, dict(op.args or {})))
                start = ready
        t0 = time.perf_counter()
        if op.fn is not None:
            op.fn()
        host = time.perf_counter() - t0
        if op.records is not None:
            event, version = op.records
            event.times[version] = start
            dur = 0.0
        elif op.wait is not None:  # a wait takes no time once its event is there
            dur = 0.0
        elif op.stream == "copy":
            dur = op.nbytes / COPY_BYTES_PER_S
        else:
            dur = host
        if op.name and op.wait is None and op.records is None:
            self.spans.append(Span(op.stream, op.name, start, dur, dict(op.args or {})))
        self.free[op.stream] = start + dur


@dataclass
class SlotState:
    """What the host has promised a ring slot holds, and what it really holds now."""

    copy_label: str = ""  # the latest copy enqueued into the slot
    copy_seq: int = -1  # its position in the copy stream
    copy_tag: object = None  # (ring, slot, layer, expert, entry) of that copy
    holds: object = None  # tag of the copy that last executed into the slot
    version: int = 0  # copies executed into the slot
    gathers_seq: int = -1  # latest gather of the current contents (compute stream position)
    gather_label: str = ""
    released: object = None  # tag of the contents the walk released (None: held, or refilled)
    release_label: str = ""


@dataclass
class SimStreams:
    seed: int | None = None
    policy: str = "random"
    queues: dict = field(default_factory=lambda: {s: deque() for s in STREAMS})
    # the latest position of the other stream this stream has waited for (host-time)
    awaited: dict = field(default_factory=lambda: {s: -1 for s in STREAMS})
    slots: dict = field(default_factory=dict)  # (ring, slot) -> SlotState
    ops_run: int = 0
    clock: ModelClock | None = None  # set while a trace is taken

    def __post_init__(self):
        if self.policy not in POLICIES:
            raise ValueError(f"schedule policy must be one of {POLICIES}, got {self.policy!r}")
        self.rng = random.Random(self.seed)
        self._seq = {s: 0 for s in STREAMS}

    # ---- enqueue ------------------------------------------------------------------------
    def _push(self, stream: str, label: str, fn=None, wait=None, name: str = "", args=None) -> _Op:
        op = _Op(stream, self._seq[stream], label, fn, wait, name=name, args=args)
        self._seq[stream] += 1
        self.queues[stream].append(op)
        return op

    def enqueue(self, stream: str, label: str, fn, name: str = "", args=None) -> None:
        """An operation on `stream`; runs when the scheduler reaches it. name and args: its
        span in a trace."""
        self._push(stream, label, fn, name=name, args=args)
        self._advance()

    def record(self, stream: str, event: SimEvent) -> SimEvent:
        """Record `event` on `stream` (a new version of it)."""
        event.version += 1
        version = event.version
        op = self._push(stream, f"record {event.label}", lambda: _set_done(event, version))
        op.records = (event, version)
        event.stream, event.seq = stream, op.seq
        self._advance()
        return event

    def wait(self, stream: str, event: SimEvent | None, why: str, args=None) -> None:
        """`stream` waits for the latest record of `event` enqueued so far (args: its span's,
        should the wait stall the stream in a trace)."""
        if event is None or event.version == 0:
            raise ScheduleHazard(f"{stream} stream waits on an event nothing will record: {why}")
        if event.stream != stream:
            self.awaited[stream] = max(self.awaited[stream], event.seq)
        name = "wait copy" if stream == "compute" else "wait release"
        self._push(stream, f"wait {event.label}", wait=(event, event.version), name=name,
                   args={"what": why, **(args or {})})
        self._advance()

    # ---- ring slots: the happens-before checks --------------------------------------------
    def slot(self, ring: str, slot: int) -> SlotState:
        return self.slots.setdefault((ring, slot), SlotState())

    def copy_into(self, ring: str, slot: int, tag, label: str, fn, nbytes: int = 0, args=None) -> None:
        """A copy on the copy stream into ring slot `slot`; `fn` writes the bytes (nbytes of
        them: its modelled time; args: its span's)."""
        st = self.slot(ring, slot)
        if st.gathers_seq > self.awaited["copy"]:
            raise ScheduleHazard(
                f"{ring} slot {slot}: {label} is enqueued without waiting for the release of "
                f"the slot's previous contents ({_tag_text(st.copy_tag)}), which "
                f"{st.gather_label} (compute op #{st.gathers_seq}) still reads")
        op = self._push("copy", label, name="copy", args=args)
        op.nbytes = nbytes
        st.copy_label, st.copy_seq, st.copy_tag, st.gathers_seq = label, op.seq, tag, -1
        st.released, st.release_label = None, ""

        def run(st=st, tag=tag):
            fn()
            st.holds = tag
            st.version += 1

        op.fn = run
        self._advance()

    def gather_from(self, reads: list, label: str, fn, name: str = "", args=None) -> None:
        """A gather on the compute stream reading ring slots; reads: [(ring, slot, tag)] with the
        tag of the copy the walk expects each slot to hold (name, args: its span's)."""
        checks = []
        for ring, slot, tag in reads:
            st = self.slot(ring, slot)
            if st.copy_tag != tag:
                raise ScheduleHazard(
                    f"{ring} slot {slot}: {label} expects {_tag_text(tag)} but the latest copy "
                    f"enqueued into the slot is {st.copy_label or 'none'} ({_tag_text(st.copy_tag)}): "
                    "the slot was refilled before this gather, or the expected copy was never enqueued")
            if st.released == tag:
                raise ScheduleHazard(
                    f"{ring} slot {slot}: {label} reads {_tag_text(tag)} after the walk released it "
                    f"({st.release_label}): the copy side may refill the slot before this read runs")
            if st.copy_seq > self.awaited["compute"]:
                raise ScheduleHazard(
                    f"{ring} slot {slot}: {label} reads {_tag_text(tag)} without waiting for "
                    f"{st.copy_label} (copy op #{st.copy_seq}) to land")
            checks.append((ring, slot, tag, st))
        op = self._push("compute", label, name=name, args=args)
        for _ring, _slot, _tag, st in checks:
            st.gathers_seq, st.gather_label = op.seq, label

        def run():
            for ring, slot, tag, st in checks:
                if st.holds != tag:
                    raise ScheduleHazard(
                        f"{ring} slot {slot}: {label} ran while the slot held "
                        f"{_tag_text(st.holds)} instead of {_tag_text(tag)} (version {st.version})")
            fn()

        op.fn = run
        self._advance()

    def release(self, ring: str, slot: int, tag, event: SimEvent | None) -> None:
        """The walk released ring slot `slot`, holding the copy `tag`: refills may follow once
        `event` has happened (None: released unused). Every read of the contents must be
        enqueued before the event's record, and none after the release."""
        st = self.slot(ring, slot)
        if st.copy_tag != tag:
            return  # not the contents the slot holds now (a stale tag): the refill checks report it
        if event is None:
            label = "released unused"
            if st.gathers_seq >= 0:
                raise ScheduleHazard(
                    f"{ring} slot {slot}: {_tag_text(tag)} is released unused, but {st.gather_label} "
                    f"(compute op #{st.gathers_seq}) reads it: a refill need not wait for that read")
        else:
            label = f"released by {event.label} (compute op #{event.seq})"
            if event.stream == "compute" and event.seq < st.gathers_seq:
                raise ScheduleHazard(
                    f"{ring} slot {slot}: {_tag_text(tag)} is {label}, recorded before "
                    f"{st.gather_label} (compute op #{st.gathers_seq}), which still reads it")
        st.released, st.release_label = tag, label

    # ---- the scheduler --------------------------------------------------------------------
    def _ready(self, stream: str) -> bool:
        q = self.queues[stream]
        if not q:
            return False
        w = q[0].wait
        return w is None or w[0].done >= w[1]

    def _step(self, stream: str) -> None:
        op = self.queues[stream].popleft()
        if self.clock is not None:
            self.clock.run(op)
        elif op.fn is not None:
            op.fn()
        self.ops_run += 1

    def _advance(self) -> None:
        """Run what the policy wants run now (never more than the events allow)."""
        if self.policy == "copy_first":
            while self._ready("copy"):
                self._step("copy")
        elif self.policy == "compute_first":
            while self._ready("compute"):
                self._step("compute")
        else:
            for _ in range(self.rng.randint(0, 3)):
                ready = [s for s in STREAMS if self._ready(s)]
                if not ready:
                    break
                self._step(self.rng.choice(ready))

    def synchronize(self, stream: str | None = None) -> None:
        """Run until `stream` (or both) is empty, interleaving as the policy likes."""
        targets = STREAMS if stream is None else (stream,)
        while any(self.queues[s] for s in targets):
            ready = [s for s in STREAMS if self._ready(s)]
            if not ready:
                heads = "; ".join(f"{s}: {self.queues[s][0].label}" for s in STREAMS if self.queues[s])
                raise ScheduleHazard(f"deadlock: no stream can move ({heads})")
            if self.policy == "copy_first" and "copy" in ready:
                pick = "copy"
            elif self.policy == "compute_first" and "compute" in ready:
                pick = "compute"
            else:
                pick = self.rng.choice(ready)
            self._step(pick)


def _set_done(event: SimEvent, version: int) -> None:
    event.done = max(event.done, version)


def _tag_text(tag) -> str:
    if tag is None:
        return "nothing"
    ring, slot, layer, expert, entry = tag
    return f"expert {expert} of layer {layer} (entry {entry})"
