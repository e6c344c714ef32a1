"""Stream timelines (`strata-prefill run --trace FILE`): the operations of the compute and copy
streams as spans, written as Chrome trace JSON (chrome://tracing, ui.perfetto.dev) and read back
by `strata-prefill plot`. It knows no backend: the cuda backend turns CUDA event pairs into spans
(fast/cuda/backend.py), the sim a modelled clock over its simulated streams (fast/sim_streams.py).

The file: {"traceEvents": [...], "displayTimeUnit": "ms"}; one process, one thread per track
("compute" tid 1, "copy" tid 2, named by thread_name metadata events), an "X" (complete) event
per span with ts and dur in microseconds from the prefill's start, and args (chunk, layer,
experts, bytes, ...).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from strata import atomic
from strata.errors import InputError

TRACKS = ("compute", "copy")
PID = 1


@dataclass
class Span:
    track: str
    name: str
    start: float  # seconds from the trace's start
    dur: float  # seconds
    args: dict = field(default_factory=dict)

    @property
    def end(self) -> float:
        return self.start + self.dur


def chrome_json(spans: list[Span], process: str = "strata-prefill") -> dict:
    """The Chrome trace of spans: metadata naming the tracks, then "X" events in time order."""
    events = [{"ph": "M", "pid": PID, "tid": 0, "name": "process_name", "args": {"name": process}}]
    for tid, track in enumerate(TRACKS, start=1):
        events.append({"ph": "M", "pid": PID, "tid": tid, "name": "thread_name", "args": {"name": track}})
    for s in sorted(spans, key=lambda s: (TRACKS.index(s.track), s.start)):
        events.append({"ph": "X", "pid": PID, "tid": TRACKS.index(s.track) + 1, "name": s.name,
                       "ts": round(s.start * 1e6, 3), "dur": round(s.dur * 1e6, 3), "args": dict(s.args)})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_trace(path, spans: list[Span], process: str = "strata-prefill") -> None:
    """The trace JSON, written whole (strata/atomic.py: never a half file at the path)."""
    atomic.write_text(path, json.dumps(chrome_json(spans, process)))


def read_trace(path) -> list[Span]:
    """The spans of a trace this project wrote (tracks named by thread_name events); one-line
    InputError for a file that is not one."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: not a JSON trace ({exc})") from None
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(events, list):
        raise InputError(f"{path}: not a Chrome trace (no traceEvents list)")
    names = {(e.get("pid"), e.get("tid")): e.get("args", {}).get("name") for e in events
             if isinstance(e, dict) and e.get("ph") == "M" and e.get("name") == "thread_name"}
    if not set(TRACKS) <= set(names.values()):
        raise InputError(f"{path}: the trace names no 'compute' and 'copy' tracks "
                         "(written by strata-prefill run --trace?)")
    spans = []
    for e in events:
        if isinstance(e, dict) and e.get("ph") == "X" and names.get((e.get("pid"), e.get("tid"))) in TRACKS:
            try:
                spans.append(Span(names[(e["pid"], e["tid"])], str(e["name"]), float(e["ts"]) / 1e6,
                                  float(e["dur"]) / 1e6, dict(e.get("args") or {})))
            except (KeyError, TypeError, ValueError):
                raise InputError(f"{path}: a trace event without a name, ts or dur: {e}") from None
    return spans


def chunks_of(spans: list[Span]) -> list[int]:
    """The chunk indices the spans name, ascending."""
    return sorted({int(s.args["chunk"]) for s in spans if "chunk" in s.args})


def chunk_spans(spans: list[Span], chunk: int) -> dict[str, list[Span]]:
    """{track: its spans of chunk `chunk`, by start}."""
    return {t: sorted((s for s in spans if s.track == t and s.args.get("chunk") == chunk), key=lambda s: s.start)
            for t in TRACKS}


def idle_gaps(lane: list[Span], min_gap: float) -> list[tuple[float, float]]:
    """(start, length) of each stretch longer than min_gap seconds between consecutive spans of
    one lane (sorted by start) where none of them runs."""
    gaps, busy_until = [], None
    for s in lane:
        if busy_until is not None and s.start - busy_until > min_gap:
            gaps.append((busy_until, s.start - busy_until))
        busy_until = s.end if busy_until is None else max(busy_until, s.end)
    return gaps
