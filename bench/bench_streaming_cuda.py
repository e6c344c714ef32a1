"""Expert streaming on the GPU: arms interleaved on fresh prompts, against the all-resident run.

    python3 -m bench.bench_streaming_cuda --pack strata8.gguf --tokens 254,1030,3866,8179,30118
    python3 -m bench.bench_streaming_cuda --plot streaming.json streaming.png   # needs matplotlib

Arms (each its own engine on the same pack): `resident` (every expert in the expert cache),
and with a cache of `--cache-share` of the experts, switches over the defaults (arm_table):
`default` (streamed experts multiplied in their ring slots, runs of up to 64; coalesced copies;
layer-major windows sized from free memory where experts stream; each layer's walk chosen by
coverage), `threshold` (STRATA_PREFILL_STREAM_MIN=1024: every layer of a unit of 1,024 tokens
or more streams, the rule before coverage), `hide-55` and `hide-220` (STRATA_PREFILL_STREAM_HIDE at half and twice
its default: the rule's one constant), `head-0` (STRATA_PREFILL_STAGE_HEAD=0: a staged layer
copies only its routed experts, after its routing, the walk before heads), `head-24` and
`head-96` (heads of 24 and 96 experts a staged layer instead of auto's model), `head-predict`
and `head-predict-96` (STRATA_PREFILL_HEAD_PREDICT=1: heads of auto's size and of 96 taken from
the layer before's prediction of the routing rather than by id), `gathered`
(STRATA_PREFILL_RING_IN_PLACE=0: gathered into the group buffers, one wait, gather and event a
group), `ring-run-16` (runs of a group's 16), `per-expert` (STRATA_PREFILL_GROUP_GATHER=0),
`gather-q` (STRATA_QUANT_GATHER=1), `one-copy` (STRATA_PREFILL_COPY_COALESCE=0: one copy per
expert), `flush-skip` (gathered, and a group gathered at every ring entry the routing skipped),
`stage-8` (STRATA_PREFILL_STAGE_IN_RING=0: the staged walk through the 8-slot staging ring),
`window-off` (one chunk a window), `window-off-gathered` (both: the defaults before
ring_in_place and windows were) and `window-N` (windows of `--window` tokens; arm_table names them). Every rep draws a fresh prompt and runs
every arm on it, the order rotating each rep; each prefill is timed with CUDA events on the
compute stream after an untimed warm-up per arm and size, and every arm's first-token logits
must equal the resident arm's bytes. The copy stream's busy time comes from an event pair
around each of its copies. Beside each time: the bytes copied per prompt token and the link's
busy share (the copy stream's busy time over the prefill's) and rate (bytes over that busy
time); each streamed arm's walks, layer by layer, and why (strata_prefill.fast.schedule.WalkChoice.line) in the
JSON and the progress lines. Prints a Markdown table (format_table, a pure function of the results, tested on the
CPU by tests/test_bench_streaming_table.py) and writes JSON beside it.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

from strata_prefill.fast import make_fast_engine
from strata_prefill.fast.tuning import STREAM_HIDE_KB, STREAM_MIN
from strata_prefill.formats.pack import Pack
from strata_prefill.session import Session

LINK_GBS = 55.3  # pinned host-to-device copies measured on the H200 machine
COUNTED = ("launches", "gathers", "waits", "events", "copies", "copy_bytes", "copy_waits")
DEFAULT_WINDOW = 16384  # the fixed window arm's tokens: two 8K chunks a window


def arm_table(window: int = DEFAULT_WINDOW) -> dict[str, dict]:
    """The streamed arms by name: FastEngine switches over the defaults (the resident arm is
    apart: every expert in the cache). window: the tokens of the fixed window arm."""
    return {
        "default": {},
        "threshold": {"stream_min": STREAM_MIN},
        "hide-55": {"stream_hide": STREAM_HIDE_KB // 2},
        "hide-220": {"stream_hide": 2 * STREAM_HIDE_KB},
        "head-0": {"stage_head": 0},
        "head-24": {"stage_head": 24},
        "head-96": {"stage_head": 96},
        "head-predict": {"head_predict": 1},
        "head-predict-96": {"head_predict": 1, "stage_head": 96},
        "per-expert": {"group_gather": 0},
        "gather-q": {"quant_gather": 1},
        "one-copy": {"copy_coalesce": 0},
        "gathered": {"ring_in_place": 0},
        "ring-run-16": {"ring_run": 16},
        "flush-skip": {"ring_in_place": 0, "flush_on_skip": 1},
        "stage-8": {"stage_in_ring": 0},
        "window-off": {"window": "off"},
        "window-off-gathered": {"window": "off", "ring_in_place": 0},
        f"window-{window}": {"window": int(window)},
    }


def pick_arms(spec: str, table: dict) -> list[str]:
    """The streamed arms a comma-separated --arms names, in its order; SystemExit naming the
    known ones for an unknown name (the fixed window arm by its window-N name)."""
    names = [a for a in spec.split(",") if a]
    bad = [a for a in names if a not in table]
    if bad or not names:
        raise SystemExit(f"--arms: unknown arm(s) {', '.join(bad) or '(none given)'}; arms: {', '.join(table)}")
    return names


def timed_prefill(eng, ids) -> tuple[float, np.ndarray, dict, tuple, int]:
    """Seconds (CUDA events on the compute stream), first-token logits, counts, (copy busy
    seconds, bytes) and the window the prefill took, on a fresh KV cache."""
    import pycuda.driver as cuda

    be = eng.be
    be.reset_cache()
    be.copy_busy()  # drop earlier spans
    before = dict(eng.counters)
    start, end = cuda.Event(), cuda.Event()
    start.record(be.dev.stream)
    session = Session(eng, progress=False)
    logits = session.prefill(ids)
    end.record(be.dev.stream)
    end.synchronize()
    counts = {k: eng.counters.get(k, 0) - before.get(k, 0) for k in COUNTED}
    return start.time_till(end) / 1e3, logits, counts, be.copy_busy(), session.window_taken


def arm_row(tokens: int, times: list[float], busy: list[tuple[float, int]], counts: dict, window: int,
            resident_s: float | None) -> dict:
    """One arm at one prompt length from its reps: the median ms, its counts, the copy stream's
    busy time (median), the link's busy share of the prefill and its rate while busy, bytes per
    prompt token, the window taken (its tokens, at most the prompt's: without windows a chunk is
    the window); vs_floor against max(resident time, bytes at LINK_GBS) where
    resident_s is given (a streamed arm)."""
    med = statistics.median(times)
    secs = statistics.median(s for s, _ in busy)
    nbytes = counts["copy_bytes"]
    row = {"ms": 1e3 * med, **counts, "window": min(int(window), tokens), "copy_busy_ms": 1e3 * secs,
           "copy_gbs": nbytes / secs / 1e9 if secs else 0.0, "copy_busy_share": secs / med if med else 0.0,
           "bytes_per_token": nbytes / tokens if tokens else 0.0}
    if resident_s is not None:
        row["vs_floor"] = med / max(resident_s, nbytes / (LINK_GBS * 1e9))
    return row


def progress_line(row: dict) -> str:
    """A prompt length's arms in one line: each time with its bytes per token and link busy."""
    return f"  {row['tokens']} tokens: " + ", ".join(
        f"{a} {v['ms']:.1f} ms" + (f" ({v['bytes_per_token'] / 1e6:.2f} MB/token, link busy "
                                   f"{100 * v['copy_busy_share']:.0f}% at {v['copy_gbs']:.1f} GB/s)"
                                   if v["copy_bytes"] else "")
        for a, v in row["arms"].items())


def format_table(results: list[dict], head: str) -> str:
    """The Markdown table of the results (main's rows: tokens and arms, each arm's arm_row):
    per prompt length and arm its time, against the resident arm and the floor, bytes per
    token, link busy share and rate, then the counts; head: the line above it."""
    lines = [head, "",
             "| prompt tokens | arm | window | ms | vs resident | vs floor | MB/token | link busy | link GB/s "
             "| GB copied | gathers | waits | events | copies |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in results:
        res = row["arms"]["resident"]["ms"]
        for a, v in row["arms"].items():
            vf = f"{v['vs_floor']:.2f}x" if "vs_floor" in v else "-"
            busy = f"{100 * v['copy_busy_share']:.0f}%" if v["copy_bytes"] else "-"
            rate = f"{v['copy_gbs']:.1f}" if v["copy_bytes"] else "-"
            lines.append(f"| {row['tokens']:,} | {a} | {v['window']:,} | {v['ms']:.1f} | {v['ms'] / res:.2f}x | {vf} | "
                         f"{v['bytes_per_token'] / 1e6:.3f} | {busy} | {rate} | {v['copy_bytes'] / 1e9:.2f} | "
                         f"{v['gathers']:,} | {v['waits']:,} | {v['events']:,} | {v['copies']:,} |")
    return "\n".join(lines)


def plot(results: list[dict], path: str, head: str = "") -> None:
    """One panel per prompt length: each arm's median time as a bar (one color an arm name),
    labelled with the bytes it copied, and its floor (max(resident, bytes / LINK_GBS)) as a black
    tick across the bar; the PNG written atomically (strata_prefill.formats.atomic). results: main's rows, of one
    run or several; head: the title's first part (default: the rows' cache share)."""
    import io

    import matplotlib  # noqa: PLC0415 - optional ([plot] extra)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    from strata_prefill.formats import atomic  # noqa: PLC0415

    fig, axes = plt.subplots(1, len(results), figsize=(3.2 * len(results), 3.8), squeeze=False)
    palette = ["#4f81bd", "#c0504d", "#9bbb59", "#8064a2", "#f79646", "#4bacc6"]
    names = list(dict.fromkeys(a for row in results for a in row["arms"] if a != "resident"))
    colors = {a: palette[i % len(palette)] for i, a in enumerate(names)} | {"resident": "#a6a6a6"}
    for ax, row in zip(axes[0], results):
        arms = list(row["arms"])
        res = row["arms"]["resident"]["ms"]
        for i, a in enumerate(arms):
            v = row["arms"][a]
            color = colors[a]
            ax.bar(i, v["ms"], color=color, width=0.7)
            gb = v["copy_bytes"] / 1e9
            ax.text(i, v["ms"], f"{v['ms']:.0f} ms\n{gb:.2f} GB" if gb else f"{v['ms']:.0f} ms",
                    ha="center", va="bottom", fontsize=7)
            if a != "resident":
                floor = max(res, v["copy_bytes"] / (LINK_GBS * 1e9) * 1e3)
                ax.plot([i - 0.35, i + 0.35], [floor, floor], color="black", linewidth=1.5)
        ax.set_xticks(range(len(arms)))
        ax.set_xticklabels(arms, rotation=30, ha="right", fontsize=8)
        ax.set_ylim(0, 1.25 * max(v["ms"] for v in row["arms"].values()))
        ax.set_title(f"{row['tokens']:,} tokens", fontsize=9)
        ax.set_ylabel("ms" if ax is axes[0][0] else "")
    if not head and results:
        head = f"cache {results[0]['cache']:,} of {results[0]['experts']:,} experts"
    fig.suptitle((head + "; " if head else "") + f"black: the floor, max(resident, bytes / {LINK_GBS} GB/s)",
                 fontsize=9)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic.write_bytes(path, buf.getvalue())


def _plot_main(p, paths: list[str]) -> int:
    """--plot JSON [JSON ...] PNG: redraw saved results (no GPU); never over one of the inputs."""
    *inputs, png = paths
    if not inputs:
        p.error("--plot needs at least one results JSON and the PNG to write")
    if any(Path(png).resolve() == Path(j).resolve() for j in inputs):
        p.error(f"--plot: {png} is one of the inputs; the picture needs a path of its own")
    results = []
    for j in inputs:
        try:
            rows = json.loads(Path(j).read_text())
        except (OSError, ValueError) as e:
            p.error(f"--plot: cannot read {j}: {e}")
        if not isinstance(rows, list) or not all(isinstance(r, dict) and "arms" in r for r in rows):
            p.error(f"--plot: {j} is not a bench_streaming_cuda.py results file (a list of rows with arms)")
        results += rows
    try:
        plot(results, png)
    except ImportError:
        p.error("--plot needs matplotlib (pip install -e '.[plot]')")
    print(f"wrote {png}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pack", help="GGUF pack (required for a GPU run)")
    p.add_argument("--plot", nargs="+", metavar="PATH",
                   help="JSON [JSON ...] PNG: draw saved results, one panel per prompt length (no GPU)")
    p.add_argument("--tokens", default="254,1030,3866,8179,30118",
                   help="comma-separated prompt lengths (default 254,1030,3866,8179,30118)")
    p.add_argument("--reps", type=int, default=3, help="fresh prompts per length, every arm on each (default 3)")
    p.add_argument("--cache-share", type=float, default=1 / 3, help="share of experts resident (default 1/3)")
    p.add_argument("--window", type=int, default=DEFAULT_WINDOW,
                   help=f"tokens of the fixed window arm, window-N (default {DEFAULT_WINDOW}; whole chunks)")
    p.add_argument("--arms", default=None,
                   help="comma-separated streamed arms (default all: " + ", ".join(arm_table()) + ")")
    p.add_argument("--out", default="streaming.json", help="JSON results")
    args = p.parse_args(argv)
    if args.plot:
        return _plot_main(p, args.plot)
    if not args.pack:
        p.error("--pack is required for a GPU run (or --plot JSON PNG)")
    table = arm_table(args.window)
    chosen = pick_arms(args.arms or ",".join(table), table)
    pack = Pack.open(args.pack)
    cfg = pack.config
    n_all = cfg.n_layer * cfg.n_expert
    cache = int(round(args.cache_share * n_all))
    engines = {"resident": make_fast_engine(pack, "cuda", expert_cache=n_all)}
    for name in chosen:
        engines[name] = make_fast_engine(pack, "cuda", expert_cache=cache, **table[name])
    for eng in engines.values():
        eng.be.copy_timing = True
    names = list(engines)
    rng = np.random.default_rng(0)
    results = []
    for n in (int(t) for t in args.tokens.split(",")):
        for eng in engines.values():  # warm-up at this size
            timed_prefill(eng, rng.integers(0, cfg.n_vocab, n))
        times = {a: [] for a in names}
        busy = {a: [] for a in names}
        counts, windows = {}, {}
        for rep in range(args.reps):
            ids = rng.integers(0, cfg.n_vocab, n)
            order = names[rep % len(names):] + names[:rep % len(names)]
            logits = {}
            for a in order:
                dt, logits[a], counts[a], (secs, nbytes), windows[a] = timed_prefill(engines[a], ids)
                times[a].append(dt)
                busy[a].append((secs, nbytes))
            for a in names[1:]:
                if logits[a].tobytes() != logits["resident"].tobytes():
                    raise SystemExit(f"arm {a} differs from the resident run at {n} tokens (rep {rep})")
        row = {"tokens": n, "cache": cache, "experts": n_all, "arms": {}}
        row["arms"]["resident"] = arm_row(n, times["resident"], busy["resident"], counts["resident"],
                                          windows["resident"], None)
        res_s = row["arms"]["resident"]["ms"] / 1e3
        for a in names[1:]:
            row["arms"][a] = arm_row(n, times[a], busy[a], counts[a], windows[a], res_s)
            row["arms"][a]["walks"] = [c.line() for c in engines[a].walk_choices]  # the last rep's
        results.append(row)
        print(progress_line(row), flush=True)
        for a in names[1:]:
            for line in row["arms"][a]["walks"]:
                print(f"    {a} walk: {line}", flush=True)
    Path(args.out).write_text(json.dumps(results, indent=1))
    print()
    print(format_table(results, f"{cfg.n_layer} layers x {cfg.n_expert} experts (top-{cfg.n_expert_used}), "
                                f"cache {cache} of {n_all}, medians of {args.reps} interleaved reps, CUDA events; "
                                f"floor = max(resident, bytes / {LINK_GBS} GB/s); link busy = the copy stream's "
                                f"busy time over the prefill's, link GB/s = bytes over that busy time"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
