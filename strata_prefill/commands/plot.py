"""`strata-prefill plot TRACE.json OUT.png [--chunk N]`: one chunk of a trace written by
`strata-prefill run --trace` as a picture: two lanes, the compute stream's spans over the copy
stream's, with the compute stream's idle stretches shaded and its idle time in the title (gaps
where nothing runs, and waits for copies). Between the lanes two strips mark the overlap of
fast/trace.py: where a copy ran with no compute beside it (copy not covered) and where the
compute stream sat at a wait while a copy ran (compute waiting for copies); their totals are in
the title. A trace of layer-major windows names each unit a window, and so does the picture.
matplotlib is the optional extra `plot` (`pip install 'strata-prefill[plot]'`), imported only
here, on its Agg (file) backend.
"""
from __future__ import annotations

import collections
import math
import warnings

from strata_prefill.formats.atomic import atomic_write
from strata_prefill.contract.errors import InputError
from strata_prefill import checks

DEFAULT_MIN_GAP_US = 5.0
LANES = (("compute", 10.0), ("copy", 0.0))  # track, y of its lane
LANE_HEIGHT = 8.0
MAX_LEGEND = 12  # compute span names in the legend (the rest: "other")
# tab20 without its reds (red marks waits): dark shades first, then their light pairs
PALETTE = (0, 2, 4, 8, 10, 12, 16, 18, 1, 3, 5, 9, 11, 13, 17, 19)
COPY_COLOUR, WAIT_COLOUR, OTHER_COLOUR, GAP_COLOUR = "#37474f", "#d62728", "#9e9e9e", "#ffb74d"
UNCOVERED_COLOUR = "#7b1fa2"
# the overlap strips between the lanes: (y, height) of compute waiting, then of copy not covered
WAITING_STRIP, UNCOVERED_STRIP = (9.0, 0.9), (8.1, 0.9)


def add_parser(sub, name: str) -> None:
    p = sub.add_parser(name, help="draw one chunk of a --trace file as a PNG (needs matplotlib)",
                       description="Draw one chunk (or window) of a trace from `strata-prefill run "
                                   "--trace`: the compute and copy streams' spans in two lanes, idle "
                                   "stretches of the compute stream shaded, copy time not covered by "
                                   "compute and compute time waiting for copies marked between the "
                                   "lanes, their totals in the title.")
    p.add_argument("trace", metavar="TRACE.json", type=checks.input_path, help="a trace written by strata-prefill run --trace")
    p.add_argument("out", metavar="OUT.png", type=checks.output_file, help="the PNG to write")
    p.add_argument("--chunk", type=checks.non_negative_int, default=0, metavar="N",
                   help="which chunk of the prompt (default 0); a window's index where the prompt "
                        "ran in layer-major windows (--window)")
    p.add_argument("--min-gap-us", type=float, default=DEFAULT_MIN_GAP_US, metavar="US",
                   help=f"compute-stream gaps longer than this are shaded (default {DEFAULT_MIN_GAP_US:g} us)")
    p.set_defaults(func=main)


def pyplot():
    """matplotlib's pyplot on the Agg backend, or a one-line error naming the extra."""
    try:
        import matplotlib
    except ImportError:
        raise InputError("plot needs matplotlib: pip install 'strata-prefill[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def main(args) -> int:
    from strata_prefill.fast.trace import WAITS, chunk_spans, chunks_of, idle_gaps, read_trace_meta

    if not (args.min_gap_us >= 0 and math.isfinite(args.min_gap_us)):  # inf would mark no gap, silently
        raise InputError(f"--min-gap-us must be a finite number >= 0, got {args.min_gap_us}")
    checks.distinct_files("plot", [("TRACE.json", args.trace, "the trace")], [("OUT.png", args.out)])
    spans, meta = read_trace_meta(args.trace)
    lanes = chunk_spans(spans, args.chunk)
    if not lanes["compute"]:
        have = chunks_of(spans)
        raise InputError(f"{args.trace}: no compute spans in chunk {args.chunk} "
                         f"(chunks in the trace: {', '.join(map(str, have)) or 'none'})")
    # the chunk starts with its first compute operation: a copy-side wait enqueued with the
    # chunk may have begun long before (the copy stream idle since the last chunk's copies)
    t0 = lanes["compute"][0].start
    t1 = max(s.end for lane in lanes.values() for s in lane)
    gaps = idle_gaps(lanes["compute"], args.min_gap_us * 1e-6)
    waited = sum(s.dur for s in lanes["compute"] if s.name in WAITS)
    gap_s = sum(g for _, g in gaps)
    marks = overlap_marks(lanes)
    label = unit_label(meta, args.chunk)
    uncovered, waiting = (sum(b - a for a, b in marks[k]) for k in ("uncovered", "waiting"))
    copy_s = sum(b - a for a, b in marks["copy"])
    draw(pyplot(), lanes, gaps, t0, t1, args.out,
         f"{label}: compute stream idle {(gap_s + waited) * 1e3:.3f} ms of {(t1 - t0) * 1e3:.3f} ms "
         f"({100 * (gap_s + waited) / max(t1 - t0, 1e-12):.1f}%): {len(gaps)} gaps over "
         f"{args.min_gap_us:g} us, {gap_s * 1e3:.3f} ms; waits for copies {waited * 1e3:.3f} ms\n"
         f"copy {copy_s * 1e3:.3f} ms, not covered by compute {uncovered * 1e3:.3f} ms; "
         f"compute waiting for copies {waiting * 1e3:.3f} ms", marks, unit=label.split()[0])
    print(f"plot      {args.out} ({label}: {len(lanes['compute'])} compute spans, "
          f"{len(lanes['copy'])} copy spans, {len(gaps)} idle gaps, copy not covered by compute "
          f"{uncovered * 1e3:.3f} ms, compute waiting for copies {waiting * 1e3:.3f} ms)")
    return 0


def unit_label(meta: dict, index: int) -> str:
    """What unit `index` of the trace is ("window 0 (chunks 0-3)"), from its otherData; a trace
    without it (an older one): "chunk N"."""
    names = meta.get("units")
    if isinstance(names, list) and 0 <= index < len(names):
        return str(names[index])
    return f"chunk {index}"


def overlap_marks(lanes: dict) -> dict:
    """The [start, end) stretches the strips mark, over the whole unit (strata_prefill.fast.trace.stretches):
    copy (the copy stream copying), uncovered (copying with no compute work beside it),
    waiting (the compute stream at a wait for a copy while a copy ran)."""
    from strata_prefill.fast.trace import stretches

    return stretches([s for lane in lanes.values() for s in lane])


def draw(plt, lanes: dict, gaps: list, t0: float, t1: float, out, title: str, marks: dict | None = None,
         unit: str = "chunk") -> None:
    """The two lanes (ms from the unit's start: a chunk or a window), the shaded gaps, the
    overlap strips (marks: overlap_marks), a legend of compute names."""
    from strata_prefill.fast.trace import WAITS

    ms = lambda t: (max(t, t0) - t0) * 1e3  # noqa: E731 - the one conversion every bar takes
    fig, ax = plt.subplots(figsize=(14, 4.2), dpi=120)
    by_time = collections.Counter()
    for s in lanes["compute"]:
        by_time[s.name] += s.dur
    named = [n for n, _ in by_time.most_common(MAX_LEGEND)]
    cmap = plt.get_cmap("tab20")
    colour = {n: cmap(PALETTE[i % len(PALETTE)]) for i, n in enumerate(n for n in named if n not in WAITS)}
    colour.update({w: WAIT_COLOUR for w in WAITS}, copy=COPY_COLOUR)
    y_of = dict(LANES)
    groups = collections.defaultdict(list)
    for track, lane in lanes.items():
        for s in lane:
            name = s.name if s.name in colour and (track == "compute" or s.name in WAITS + ("copy",)) else "other"
            start, end = ms(s.start), ms(s.end)  # clipped to the chunk's start
            groups[(track, name)].append((start, max(end - start, 1e-6)))
    for (track, name), bars in sorted(groups.items()):
        ax.broken_barh(bars, (y_of[track], LANE_HEIGHT), facecolors=colour.get(name, OTHER_COLOUR),
                       edgecolor="none", alpha=0.45 if name in WAITS else 1.0, label=name)
    for start, length in gaps:  # idle on the compute lane: shaded over the lane
        ax.axvspan(ms(start), ms(start + length), ymin=0.5, ymax=1.0, color=GAP_COLOUR, alpha=0.45, lw=0)
    if gaps:
        ax.plot([], [], color=GAP_COLOUR, alpha=0.45, lw=8, label="idle gap")
    for key, (y, h), colour_, text in (("waiting", WAITING_STRIP, WAIT_COLOUR, "compute waiting for copies"),
                                       ("uncovered", UNCOVERED_STRIP, UNCOVERED_COLOUR, "copy not covered by compute")):
        bars = [(ms(a), max(ms(b) - ms(a), 1e-6)) for a, b in (marks or {}).get(key, [])]
        if bars:
            ax.broken_barh(bars, (y, h), facecolors=colour_, edgecolor="none", label=text)
    ax.set_ylim(-1, 2 * LANE_HEIGHT + 4)
    ax.set_yticks([y + LANE_HEIGHT / 2 for _, y in LANES], [t for t, _ in LANES])
    ax.set_xlim(0, max(ms(t1), 1e-6))
    ax.set_xlabel(f"ms from the {unit}'s first operation")
    ax.set_title(title, fontsize=10)
    handles, labels = ax.get_legend_handles_labels()
    seen = dict(zip(labels, handles))  # one entry a name
    ax.legend(seen.values(), seen.keys(), loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8,
              frameon=False)
    with warnings.catch_warnings():  # a name of characters the font lacks draws as boxes, silently
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .* missing from font", category=UserWarning)
        fig.tight_layout()
        with atomic_write(out) as f:  # never a half PNG at OUT
            fig.savefig(f, format="png")
    plt.close(fig)
