"""Phase timing (STRATA_PREFILL_TIMING=1, `strata-prefill run --timing`): time per phase of the
walk, per chunk, and one uninstrumented total per chunk beside it.

A backend's `phase(name, **args)` is a context manager around the launches of one phase. With
timing off it does nothing. With it on, a marker pair goes around the phase on the backend's
clock: CUDA events on the compute stream (cuda), host perf_counter (sim, where every time is a
host time). Markers are only read when a table is asked for, so a prefill is not synchronized
while it runs. Host phases (HOST_PHASES) are host perf_counter time on both backends: the
walk's planning and the wait for the routing counts; on the GPU they overlap the device phases,
so they are listed apart, left out of the instrumented sum, and shown each and together as a
share of the unit's span in the same prefill (a host wait the device sat idle through is part
of the span, not of any device phase).

Per-op markers inflate what they time (each pair is two more stream operations, and a phase's
end cannot be recorded before the host reaches it). So the honest number for a chunk is the
`chunk_timing` one: a single marker pair around the whole chunk with phase timing off, measured
by a second prefill of the same prompt (strata_prefill/commands/run.py).
"""
from __future__ import annotations

import collections
import contextlib
import os
import time
from dataclasses import dataclass, field

# host-side phases: perf_counter time on the host, never a device marker
HOST_PHASES = ("host planning", "router sync")

# how the printed tables were measured (printed under them)
HOW_MEASURED = ("phases: CUDA events around each phase on the compute stream; per-op events inflate "
                "what they time; uninstrumented: the same prompt again with one event pair per chunk "
                "(or window)")
HOW_MEASURED_SIM = ("phases: host time around each phase (sim backend: host times, not device times); "
                    "per-op timing inflates what it times; uninstrumented: the same prompt again with "
                    "one host-time pair per chunk (or window)")


def timing_enabled(value=None) -> bool:
    if value is not None:
        return bool(int(value))
    return os.environ.get("STRATA_PREFILL_TIMING", "0") == "1"


@dataclass
class ChunkTimes:
    """One chunk's seconds: device phases, host phases, and its whole span (None: not timed)."""

    phases: dict = field(default_factory=dict)
    host: dict = field(default_factory=dict)
    total: float | None = None


class PhaseRecorder:
    """Phase and chunk markers on a backend's clock: mark() returns a marker, seconds(a, b) the
    time from marker a to marker b (it may wait for b to complete)."""

    def __init__(self, mark, seconds, timing: bool):
        self.mark, self.seconds = mark, seconds
        self.timing = timing  # a marker pair around each phase
        self.chunk_timing = False  # a marker pair around each chunk
        self.tracing = False  # keep each phase's markers for a trace (fast/trace.py)
        self._spans: list = []  # (chunk, name, a, b)
        self._host: list = []  # (chunk, name, seconds)
        self._chunks: list = []  # [a, b] per chunk begun
        self.trace_spans: list = []  # (chunk, name, a, b, args), read by the backend's trace()

    @property
    def chunk(self) -> int:
        """The index of the chunk running now (-1 before the first)."""
        return len(self._chunks) - 1

    @contextlib.contextmanager
    def phase(self, name: str, **args):
        if not (self.timing or self.tracing):
            yield
            return
        a = self.mark()
        try:
            yield
        finally:
            b = self.mark()
            if self.timing:
                self._spans.append((self.chunk, name, a, b))
            if self.tracing:
                self.trace_spans.append((self.chunk, name, a, b, args))

    @contextlib.contextmanager
    def host_phase(self, name: str):
        if not self.timing:
            yield
            return
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._host.append((self.chunk, name, time.perf_counter() - t0))

    def chunk_begin(self) -> None:
        # counted always, so spans and trace args name their chunk; marked only when asked
        self._chunks.append([self.mark() if self.chunk_timing else None, None])

    def chunk_end(self) -> None:
        if self._chunks and self.chunk_timing and self._chunks[-1][0] is not None:
            self._chunks[-1][1] = self.mark()

    def phase_table(self) -> dict:
        """Seconds per phase (device and host) since the last call, over all chunks."""
        out = collections.Counter()
        for _chunk, name, a, b in self._spans:
            out[name] += self.seconds(a, b)
        for _chunk, name, s in self._host:
            out[name] += s
        self._clear()
        return dict(out)

    def chunk_tables(self) -> list[ChunkTimes]:
        """One ChunkTimes per chunk begun since the last call (a table also clears them)."""
        # anything recorded before the first chunk began counts to chunk 0
        n = max(len(self._chunks), 1 + max((c for c, *_ in self._spans + self._host), default=-1))
        out = [ChunkTimes() for _ in range(n)]
        for chunk, name, a, b in self._spans:
            phases = out[max(chunk, 0)].phases
            phases[name] = phases.get(name, 0.0) + self.seconds(a, b)
        for chunk, name, s in self._host:
            host = out[max(chunk, 0)].host
            host[name] = host.get(name, 0.0) + s
        for times, (a, b) in zip(out, self._chunks):
            if a is not None and b is not None:
                times.total = self.seconds(a, b)
        self._clear()
        return out

    def reset(self) -> None:
        """Drop every marker, chunk count and trace span (a trace starts from here)."""
        self._clear()
        self.trace_spans.clear()

    def _clear(self) -> None:
        self._spans.clear()
        self._host.clear()
        self._chunks.clear()


class HostClock:
    """The sim's clock: host perf_counter seconds."""

    @staticmethod
    def mark() -> float:
        return time.perf_counter()

    @staticmethod
    def seconds(a: float, b: float) -> float:
        return b - a


def format_phase_table(seconds: dict, span: float | None = None) -> str:
    """A phase table: the device phases by time with their share of the instrumented sum (the
    GPU's work, which adds up), then the host phases (HOST_PHASES: host time, which on the GPU
    overlaps the device phases, so none is a share of their sum), each and together as a share
    of `span` (the unit's wall span in the same prefill, host waits included) where it is given."""
    device = {k: v for k, v in seconds.items() if k not in HOST_PHASES}
    host = {k: v for k, v in seconds.items() if k in HOST_PHASES}
    total = sum(device.values())
    lines = [f"{'phase':<20} {'ms':>10} {'share':>7}"]
    for name, s in sorted(device.items(), key=lambda kv: -kv[1]):
        lines.append(f"{name:<20} {s * 1e3:>10.2f} {100 * s / (total or 1.0):>6.1f}%")
    lines.append(f"{'instrumented sum':<20} {total * 1e3:>10.2f}")

    def of_span(s: float) -> str:
        return f"  ({100 * s / span:.1f}% of the span)" if span else ""

    for name, s in sorted(host.items(), key=lambda kv: -kv[1]):
        lines.append(f"{name + ' (host)':<20} {s * 1e3:>10.2f}{of_span(s)}")
    if host:
        lines.append(f"{'host waits (host)':<20} {sum(host.values()) * 1e3:>10.2f}{of_span(sum(host.values()))}")
    if span:
        lines.append(f"{'span':<20} {span * 1e3:>10.2f}  (the unit in the timed prefill, host waits included)")
    return "\n".join(lines)


def format_chunk_tables(instrumented: list[ChunkTimes], plain: list[ChunkTimes], sim: bool,
                        labels: list[str] | None = None, overlap: list | None = None,
                        walks: list[str] | None = None) -> str:
    """Per chunk (or window: labels name each unit, strata_prefill.fast.trace.units; default "chunk i"): the
    phase table (its host phases as shares of the unit's span in the timed prefill, where
    `instrumented` has it), the uninstrumented total of the same unit and, where overlap gives the unit's
    strata_prefill.fast.trace.Overlap, its line; where walks gives it, the walk the unit took and why
    (strata_prefill.fast.schedule.WalkChoice.line) under its head; last, how they were measured."""
    blocks = []
    for i, times in enumerate(instrumented):
        total = plain[i].total if i < len(plain) else None
        inst = sum(times.phases.values())
        head = labels[i] if labels is not None and i < len(labels) else f"chunk {i}"
        if walks is not None and i < len(walks) and walks[i]:
            head += f"\n{'walk':<20} {walks[i]}"
        text = format_phase_table({**times.phases, **times.host}, times.total)
        if total is None:
            tail = f"{'uninstrumented':<20} {'-':>10}"
        else:
            tail = (f"{'uninstrumented':<20} {total * 1e3:>10.2f}  "
                    f"(instrumented sum is {100 * inst / total if total > 0 else float('inf'):.0f}% of it)")
        if overlap is not None and i < len(overlap) and overlap[i] is not None:
            tail += "\n" + overlap_line(overlap[i], sim)
        blocks.append(f"{head}\n{text}\n{tail}")
    blocks.append(HOW_MEASURED_SIM if sim else HOW_MEASURED)
    return "\n\n".join(blocks)


def overlap_line(o, sim: bool = False) -> str:
    """A unit's overlap (strata_prefill.fast.trace.Overlap) in one line of its phase table (sim: its times are
    the modelled clock's, not the host times above it)."""
    return (f"{'overlap':<20} copy {o.copy * 1e3:.2f} ms, not covered by compute {o.uncovered * 1e3:.2f} ms, "
            f"compute waiting for copies {o.waiting * 1e3:.2f} ms{' (modelled clock)' if sim else ''}")


OVERLAP_HOW = ("overlap: copy = the copy stream copying the layer's experts; not covered = the part of "
               "it with no compute running; waiting = the compute stream stalled at the layer's waits "
               "while a copy ran; link idle = the copy stream idle right before the layer's copies. "
               "From the instrumented prefill's spans: {clock}")
OVERLAP_CLOCK = "CUDA event pairs around each phase and each copy (one timeline)"
OVERLAP_CLOCK_SIM = ("the sim's modelled stream clock (copies at the link's rate, compute at its NumPy "
                     "time): the schedule's shape, not device times")


def format_overlap(by_layer: dict, sim: bool) -> str:
    """Per layer, summed over the prompt's chunks or windows: copy ms, the part not covered by
    compute, compute waiting for copies; a line for all layers; how it was measured. by_layer:
    {layer: strata_prefill.fast.trace.Overlap} (empty: nothing was copied, one line says so)."""
    head = "overlap of the copy and compute streams, per layer"
    if not by_layer:
        return f"{head}: nothing copied (every routed expert resident)"
    lines = [head, f"{'layer':<8} {'copy ms':>10} {'not covered ms':>15} {'compute waiting ms':>19} "
                   f"{'link idle ms':>13}"]
    total = None
    for layer in sorted(by_layer):
        o = by_layer[layer]
        total = o if total is None else total + o
        lines.append(f"{layer:<8} {o.copy * 1e3:>10.2f} {o.uncovered * 1e3:>15.2f} {o.waiting * 1e3:>19.2f} "
                     f"{o.idle * 1e3:>13.2f}")
    share = 100 * total.uncovered / total.copy if total.copy > 0 else 0.0
    lines.append(f"{'all':<8} {total.copy * 1e3:>10.2f} {total.uncovered * 1e3:>15.2f} {total.waiting * 1e3:>19.2f} "
                 f"{total.idle * 1e3:>13.2f}  ({share:.0f}% of the copy time not covered)")
    lines.append(OVERLAP_HOW.format(clock=OVERLAP_CLOCK_SIM if sim else OVERLAP_CLOCK))
    return "\n".join(lines)
