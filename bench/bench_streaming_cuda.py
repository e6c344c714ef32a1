"""Expert streaming on the GPU: arms interleaved on fresh prompts, against the all-resident run.

    python3 bench/bench_streaming_cuda.py --pack strata8.gguf --tokens 254,1030,3866,8179,30118

Arms (each its own engine on the same pack): `resident` (every expert in the expert cache),
and with a cache of `--cache-share` of the experts: `group` (defaults: one wait, gather and
event per group, scatter quantize), `per-expert` (STRATA_PREFILL_GROUP_GATHER=0), `gather-q`
(STRATA_QUANT_GATHER=1) and `coalesce` (STRATA_PREFILL_COPY_COALESCE=1). Every rep draws a fresh
prompt and runs every arm on it, the order rotating each rep; each prefill is timed with CUDA
events on the compute stream after an untimed warm-up per arm and size, and every arm's
first-token logits must equal the resident arm's bytes. The copy stream's busy time comes from
an event pair around each of its copies. Prints a Markdown table and writes JSON beside it.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fast import make_fast_engine  # noqa: E402
from strata.pack import Pack  # noqa: E402
from strata.session import Session  # noqa: E402

LINK_GBS = 55.3  # pinned host-to-device copies measured on the H200 machine
COUNTED = ("launches", "gathers", "waits", "events", "copies", "copy_bytes", "copy_waits")
ARMS = {
    "group": {},
    "per-expert": {"group_gather": 0},
    "gather-q": {"quant_gather": 1},
    "coalesce": {"copy_coalesce": 1},
}


def timed_prefill(eng, ids) -> tuple[float, np.ndarray, dict, tuple]:
    import pycuda.driver as cuda

    be = eng.be
    be.reset_cache()
    be.copy_busy()  # drop earlier spans
    before = dict(eng.counters)
    start, end = cuda.Event(), cuda.Event()
    start.record(be.dev.stream)
    logits = Session(eng, progress=False).prefill(ids)
    end.record(be.dev.stream)
    end.synchronize()
    counts = {k: eng.counters.get(k, 0) - before.get(k, 0) for k in COUNTED}
    return start.time_till(end) / 1e3, logits, counts, be.copy_busy()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pack", required=True)
    p.add_argument("--tokens", default="254,1030,3866,8179,30118")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--cache-share", type=float, default=1 / 3, help="share of experts resident (default 1/3)")
    p.add_argument("--arms", default=",".join(ARMS), help=f"streamed arms (of {', '.join(ARMS)})")
    p.add_argument("--out", default="streaming.json", help="JSON results")
    args = p.parse_args(argv)
    pack = Pack.open(args.pack)
    cfg = pack.config
    n_all = cfg.n_layer * cfg.n_expert
    cache = int(round(args.cache_share * n_all))
    engines = {"resident": make_fast_engine(pack, "cuda", expert_cache=n_all)}
    for name in args.arms.split(","):
        engines[name] = make_fast_engine(pack, "cuda", expert_cache=cache, **ARMS[name])
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
        counts = {}
        for rep in range(args.reps):
            ids = rng.integers(0, cfg.n_vocab, n)
            order = names[rep % len(names):] + names[:rep % len(names)]
            logits = {}
            for a in order:
                dt, logits[a], counts[a], (secs, nbytes) = timed_prefill(engines[a], ids)
                times[a].append(dt)
                busy[a].append((secs, nbytes))
            for a in names[1:]:
                if logits[a].tobytes() != logits["resident"].tobytes():
                    raise SystemExit(f"arm {a} differs from the resident run at {n} tokens (rep {rep})")
        row = {"tokens": n, "cache": cache, "experts": n_all, "arms": {}}
        for a in names:
            med = statistics.median(times[a])
            secs = statistics.median(s for s, _ in busy[a])
            nbytes = counts[a]["copy_bytes"]
            row["arms"][a] = {"ms": 1e3 * med, **counts[a], "copy_busy_ms": 1e3 * secs,
                              "copy_gbs": nbytes / secs / 1e9 if secs else 0.0,
                              "copy_busy_share": secs / med if med else 0.0}
        res_s = row["arms"]["resident"]["ms"] / 1e3
        for a in names[1:]:
            arm = row["arms"][a]
            floor = max(res_s, arm["copy_bytes"] / (LINK_GBS * 1e9))
            arm["vs_floor"] = arm["ms"] / 1e3 / floor
        results.append(row)
        print(f"  {n} tokens: " + ", ".join(f"{a} {row['arms'][a]['ms']:.1f} ms" for a in names), flush=True)
    Path(args.out).write_text(json.dumps(results, indent=1))
    print(f"\n{cfg.n_layer} layers x {cfg.n_expert} experts (top-{cfg.n_expert_used}), cache {cache} of {n_all}, "
          f"medians of {args.reps} interleaved reps, CUDA events; floor = max(resident, bytes / {LINK_GBS} GB/s)\n")
    print("| prompt tokens | arm | ms | vs resident | vs floor | gathers | waits | events | copies | GB copied "
          "| copy busy | copy GB/s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for row in results:
        res = row["arms"]["resident"]["ms"]
        for a, v in row["arms"].items():
            vf = f"{v['vs_floor']:.2f}x" if "vs_floor" in v else "-"
            print(f"| {row['tokens']} | {a} | {v['ms']:.1f} | {v['ms'] / res:.2f}x | {vf} | {v['gathers']} | "
                  f"{v['waits']} | {v['events']} | {v['copies']} | {v['copy_bytes'] / 1e9:.2f} | "
                  f"{100 * v['copy_busy_share']:.0f}% | {v['copy_gbs']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
