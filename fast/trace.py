"""Stream timelines (`strata-prefill run --trace FILE`): the operations of the compute and copy
streams as spans, written as Chrome trace JSON (chrome://tracing, ui.perfetto.dev) and read back
by `strata-prefill plot`. It knows no backend: the cuda backend turns CUDA event pairs into spans
(fast/cuda/backend.py), the sim a modelled clock over its simulated streams (fast/sim_streams.py).

The file: {"traceEvents": [...], "displayTimeUnit": "ms"}; one process, one thread per track
("compute" tid 1, "copy" tid 2, named by thread_name metadata events), an "X" (complete) event
per span with ts and dur in microseconds from the prefill's start, and args (chunk, layer,
experts, bytes, ...); "otherData" says what a chunk index names (a chunk, or a layer-major
window of several chunks: `units`).

Overlap (`overlap_by_layer`, printed by `run --timing` and `bench --phases`, drawn by `plot`):
interval arithmetic on half-open [start, end) spans. Per layer, four figures:

  copy        the time the copy stream spent copying the layer's experts (the union of its
              copy spans; a copy that carries several layers' experts counts to its first)
  not covered the part of it during which the compute stream did no work (neither a compute
              span nor anything else ran there: the copy was not hidden behind compute)
  waiting     the time the compute stream sat at the layer's waits for copies while a copy ran:
              the wait spans, less any compute work, clipped to the copy stream's busy time (so
              the few microseconds a wait's own event pair takes when its copy had long landed
              do not count)
  link idle   the time the copy stream had nothing to copy right before the layer's copies: for
              each of its copy spans, from the end of the copy before it (any layer's, of the
              spans given: one unit's) to its start; the unit's first copy counts none. Where it
              gathers, a layer's copies were queued after the link ran dry
"""
from __future__ import annotations

import bisect
import collections
import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from strata_prefill.formats import atomic
from strata_prefill.contract.errors import InputError

TRACKS = ("compute", "copy")
PID = 1
WAIT_COPY = "wait copy"  # a compute-stream span stalled on a copy (the walk's phase of that name)
WAITS = (WAIT_COPY, "wait release")  # spans that are a stream stalled on the other, not its work


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


def chrome_json(spans: list[Span], process: str = "strata-prefill", meta: dict | None = None) -> dict:
    """The Chrome trace of spans: metadata naming the tracks, then "X" events in time order;
    meta (what the chunk indices are: `units`) goes in otherData."""
    events = [{"ph": "M", "pid": PID, "tid": 0, "name": "process_name", "args": {"name": process}}]
    for tid, track in enumerate(TRACKS, start=1):
        events.append({"ph": "M", "pid": PID, "tid": tid, "name": "thread_name", "args": {"name": track}})
    for s in sorted(spans, key=lambda s: (TRACKS.index(s.track), s.start)):
        events.append({"ph": "X", "pid": PID, "tid": TRACKS.index(s.track) + 1, "name": s.name,
                       "ts": round(s.start * 1e6, 3), "dur": round(s.dur * 1e6, 3), "args": dict(s.args)})
    doc = {"traceEvents": events, "displayTimeUnit": "ms"}
    if meta:
        doc["otherData"] = dict(meta)
    return doc


def write_trace(path, spans: list[Span], process: str = "strata-prefill", meta: dict | None = None) -> None:
    """The trace JSON, written whole (formats/atomic.py: never a half file at the path)."""
    atomic.write_text(path, json.dumps(chrome_json(spans, process, meta)))


def read_trace(path) -> list[Span]:
    """The spans of a trace this project wrote (tracks named by thread_name events); one-line
    InputError for a file that is not one."""
    return read_trace_meta(path)[0]


def read_trace_meta(path) -> tuple[list[Span], dict]:
    """(the spans, the otherData metadata: {} in a trace that has none), as read_trace. Every
    field a reader here takes is checked against what `write_trace` writes, and the first that
    is not is a one-line InputError naming the event: the phases M and X; integer pids and
    tids; a thread_name event naming each track once; an X event on a track, with a string
    name, finite ts and dur >= 0 in microseconds, and args holding an integer chunk >= 0;
    otherData an object whose units, where present, are a list of names (non-blank) for every chunk
    the spans name. Other args and otherData keys are not read."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{path}: a folder, not a trace file") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # ValueError: JSONDecodeError, 4,300 digits
        raise InputError(f"{path}: not a JSON trace ({' '.join(str(exc).split())[:200]})") from None
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(events, list):
        raise InputError(f"{path}: not a Chrome trace (no traceEvents list)")
    unit = doc.get("displayTimeUnit", "ms")
    if unit not in ("ms", "ns"):  # the Chrome format's two; ts and dur are microseconds either way
        raise InputError(f"{path}: displayTimeUnit must be \"ms\" or \"ns\", got {_short(unit)}")
    names: dict[tuple[int, int], str] = {}
    for i, e in enumerate(events):
        _event_head(path, i, e)
        if e["ph"] == "M" and e["name"] in ("thread_name", "process_name"):
            args = e.get("args")
            if not isinstance(args, dict) or not isinstance(args.get("name"), str):
                raise InputError(f"{path}: event {i} ({e['name']}): args must be an object with a string "
                                 f"name, got {_short(args)}")
            if e["name"] == "thread_name" and args["name"] in TRACKS:
                if args["name"] in names.values():
                    raise InputError(f"{path}: event {i}: a second thread named {args['name']!r}")
                names[(e["pid"], e["tid"])] = args["name"]
    if not set(TRACKS) <= set(names.values()):
        raise InputError(f"{path}: the trace names no 'compute' and 'copy' tracks "
                         "(written by strata-prefill run --trace?)")
    spans = [_span(path, i, e, names) for i, e in enumerate(events) if e["ph"] == "X"]
    meta = doc.get("otherData", {})
    if not isinstance(meta, dict):
        raise InputError(f"{path}: otherData must be an object, got {_short(meta)}")
    units = meta.get("units")
    if units is not None:
        if not isinstance(units, list) or not all(isinstance(u, str) and u.strip() for u in units):
            raise InputError(f"{path}: otherData.units must be a list of names (non-blank strings), "
                             f"got {_short(units)}")
        past = [s.args["chunk"] for s in spans if s.args["chunk"] >= len(units)]
        if past:
            raise InputError(f"{path}: a span names chunk {max(past)}, but otherData.units names "
                             f"{len(units)} unit(s)")
    return spans, meta


def _short(value) -> str:
    """A JSON value as a message shows it: its repr, cut."""
    text = repr(value)
    return text if len(text) <= 60 else text[:60] + "..."


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _event_head(path: Path, i: int, e) -> None:
    """An event's phase, name, pid and tid, as write_trace writes them."""
    if not isinstance(e, dict):
        raise InputError(f"{path}: event {i} is not an object: {_short(e)}")
    if e.get("ph") not in ("M", "X"):
        raise InputError(f"{path}: event {i}: phase {_short(e.get('ph'))} is not one a trace of "
                         "`run --trace` holds (M, X)")
    for key in ("pid", "tid"):
        if not _whole(e.get(key)):
            raise InputError(f"{path}: event {i}: {key} must be an integer, got {_short(e.get(key))}")
    if not isinstance(e.get("name"), str):
        raise InputError(f"{path}: event {i}: name must be a string, got {_short(e.get('name'))}")


def _span(path: Path, i: int, e: dict, names: dict) -> Span:
    """The Span of X event `e`, its fields checked (read_trace_meta)."""
    track = names.get((e["pid"], e["tid"]))
    if track is None:
        raise InputError(f"{path}: event {i}: pid {e['pid']} tid {e['tid']} is no track the trace names "
                         f"({', '.join(TRACKS)})")
    ts, dur = (_microseconds(path, i, e, key) for key in ("ts", "dur"))
    if not math.isfinite(ts + dur):
        raise InputError(f"{path}: event {i}: ts + dur overflows ({ts:g} + {dur:g} us)")
    args = e.get("args")
    if not isinstance(args, dict):
        raise InputError(f"{path}: event {i}: args must be an object, got {_short(args)}")
    if not (_whole(args.get("chunk")) and args["chunk"] >= 0):
        raise InputError(f"{path}: event {i}: args.chunk must be an integer >= 0, got {_short(args.get('chunk'))}")
    return Span(track, e["name"], ts / 1e6, dur / 1e6, dict(args))


def _microseconds(path: Path, i: int, e: dict, key: str) -> float:
    """Event i's ts or dur: a finite number >= 0 (an integer of 400 digits is not one)."""
    v = e.get(key)
    try:
        us = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan
    except OverflowError:
        us = math.inf
    if not (math.isfinite(us) and us >= 0):
        raise InputError(f"{path}: event {i}: {key} must be a finite number >= 0 (microseconds), "
                         f"got {_short(v)}")
    return us


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


# ---- overlap: interval arithmetic on [start, end) lists ----------------------------------------
def merge(intervals) -> list[tuple[float, float]]:
    """The union of [start, end) intervals as disjoint ones, ascending; empty ones dropped."""
    out: list[list[float]] = []
    for a, b in sorted((float(a), float(b)) for a, b in intervals if b > a):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def total(intervals) -> float:
    """The length of the union of the intervals."""
    return sum(b - a for a, b in merge(intervals))


def intersect(x, y) -> list[tuple[float, float]]:
    """The union of x intersected with the union of y."""
    x, y = merge(x), merge(y)
    out, i, j = [], 0, 0
    while i < len(x) and j < len(y):
        a, b = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if b > a:
            out.append((a, b))
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(x, y) -> list[tuple[float, float]]:
    """The union of x less the union of y."""
    out = []
    y = merge(y)
    for a, b in merge(x):
        for c, d in y:
            if d <= a or c >= b:
                continue
            if c > a:
                out.append((a, c))
            a = max(a, d)
            if a >= b:
                break
        if b > a:
            out.append((a, b))
    return out


@dataclass(frozen=True)
class Overlap:
    """Seconds of one layer (or a sum of layers): see the module docstring."""

    copy: float = 0.0
    uncovered: float = 0.0
    waiting: float = 0.0
    idle: float = 0.0

    def __add__(self, other: "Overlap") -> "Overlap":
        return Overlap(self.copy + other.copy, self.uncovered + other.uncovered, self.waiting + other.waiting,
                       self.idle + other.idle)


def layer_overlap(copies, waits, work, all_copies=None, idle=None) -> Overlap:
    """One layer's figures from [start, end) lists: copies, the layer's copy spans; waits, the
    compute stream's spans at the layer's waits for copies; work, every compute span that is
    work (any layer's: a copy is covered by whatever compute runs beside it); all_copies, every
    copy span (any layer's: a wait ends when its copy lands, whichever layer that copy is
    counted to, and the link idles before a copy until the copy before it, of any layer, ends;
    default: copies); idle, the link's idle seconds where the caller has them (overlap_by_layer
    counts them unit by unit), else from copies against all_copies."""
    every = copies if all_copies is None else all_copies
    if idle is None:
        idle = total(link_idle(copies, every))
    return Overlap(copy=total(copies), uncovered=total(uncovered(copies, work)),
                   waiting=total(waiting(waits, work, every)), idle=idle)


def link_idle(copies, all_copies) -> list[tuple[float, float]]:
    """The stretches the copy stream idled right before each of `copies`: from the latest end of
    the `all_copies` that started before the copy to its start, where that end comes first (none
    before the first copy, none where another copy was still running)."""
    return merge([g for g in idle_before(copies, all_copies) if g is not None])


def idle_before(copies, all_copies) -> list[tuple[float, float] | None]:
    """link_idle's stretch for each of `copies`, in their order (None: the link was not idle
    right before it), all_copies sorted once for them all."""
    spans = sorted(all_copies)
    starts = [a for a, _ in spans]
    reach = list(itertools.accumulate((b for _, b in spans), max))  # the latest end of spans[:i + 1]
    out = []
    for a, _ in copies:
        i = bisect.bisect_left(starts, a)
        out.append((reach[i - 1], a) if i and reach[i - 1] < a else None)
    return out


def uncovered(copies, work) -> list[tuple[float, float]]:
    """The stretches of copies with no compute work beside them."""
    return subtract(copies, work)


def waiting(waits, work, copies) -> list[tuple[float, float]]:
    """The stretches of the compute stream's waits for copies with no work of its own and a copy
    running."""
    return intersect(subtract(waits, work), copies)


def stretches(spans: list[Span]) -> dict[str, list[tuple[float, float]]]:
    """The overlap's stretches over spans of any layers (what plot marks): copy, uncovered and
    waiting, each a merged [start, end) list."""
    work = [(s.start, s.end) for s in spans if s.track == "compute" and s.name not in WAITS]
    copies = [(s.start, s.end) for s in spans if s.track == "copy" and s.name not in WAITS]
    waits = [(s.start, s.end) for s in spans if s.track == "compute" and s.name == WAIT_COPY]
    return {"copy": merge(copies), "uncovered": uncovered(copies, work), "waiting": waiting(waits, work, copies)}


def span_layer(span: Span) -> int | None:
    """The layer a span counts to: its layer arg, else (a cuda copy) its first expert's layer."""
    if "layer" in span.args:
        return int(span.args["layer"])
    experts = span.args.get("experts")
    if isinstance(experts, list) and experts and isinstance(experts[0], (list, tuple)):
        return int(experts[0][0])
    return None


def overlap_by_layer(spans: list[Span], chunk: int | None = None) -> dict[int, Overlap]:
    """{layer: Overlap} of the spans (of chunk `chunk` only, when given), for every layer that
    copied or waited; its compute work is every compute span not a wait."""
    if chunk is not None:
        spans = [s for s in spans if s.args.get("chunk") == chunk]
    iv = lambda ss: [(s.start, s.end) for s in ss]  # noqa: E731 - spans to intervals
    work = iv(s for s in spans if s.track == "compute" and s.name not in WAITS)
    copies = [s for s in spans if s.track == "copy" and s.name not in WAITS]
    waits = [s for s in spans if s.track == "compute" and s.name == WAIT_COPY]
    by_layer = {"copy": collections.defaultdict(list), "wait": collections.defaultdict(list)}
    for kind, ss in (("copy", copies), ("wait", waits)):
        for s in ss:
            if (l := span_layer(s)) is not None:
                by_layer[kind][l].append((s.start, s.end))
    # the link's idle time within each unit (a unit's first copy waits for no copy before it):
    # each copy's stretch against its unit's copies, merged layer by layer
    by_unit = collections.defaultdict(list)
    for s in copies:
        by_unit[s.args.get("chunk")].append(s)
    idle = collections.defaultdict(float)
    for unit in by_unit.values():
        stretches = collections.defaultdict(list)
        intervals = iv(unit)
        for s, gap in zip(unit, idle_before(intervals, intervals)):
            if gap is not None:
                stretches[span_layer(s)].append(gap)
        for l, gaps in stretches.items():
            idle[l] += total(merge(gaps))
    every = iv(copies)
    return {l: layer_overlap(by_layer["copy"][l], by_layer["wait"][l], work, every, idle=idle[l])
            for l in sorted(by_layer["copy"].keys() | by_layer["wait"].keys())}


def summed(by_layer: dict[int, Overlap]) -> Overlap:
    return sum(by_layer.values(), Overlap())


def units(n_tok: int, chunk: int, window: int) -> list[str]:
    """The name of each unit a prompt of n_tok tokens ran in, by index (the chunk index of the
    phase tables and of a trace's spans): "chunk i" without windows, "window i (chunks a-b)"
    for layer-major windows of `window` tokens in chunks of `chunk`."""
    n_chunks = -(-int(n_tok) // int(chunk))
    if window <= chunk:
        return [f"chunk {i}" for i in range(n_chunks)]
    per = int(window) // int(chunk)
    out = []
    for i in range(-(-n_chunks // per)):
        a, b = i * per, min((i + 1) * per, n_chunks) - 1
        out.append(f"window {i} (chunk {a})" if a == b else f"window {i} (chunks {a}-{b})")
    return out
