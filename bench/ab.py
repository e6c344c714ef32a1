"""A/B driver: two arms of the fast path, interleaved on fresh prompts.

    python bench/ab.py --pack strata8.gguf --a group_gather=0 --b group_gather=1 \
        --tokens 2048,8192,32768 --reps 5

Each rep draws a fresh prompt and runs arm A then arm B on it (the order alternates every
rep: A B, B A, ...), each on a fresh KV cache, timing the prefill alone after one untimed
warm-up per arm. Both arms must produce the same first-token logits, bit for bit (the
switches are promised not to change a bit); a difference stops the run. The table gives
medians, the change B vs A, and the per-prefill counters (launches, gathers, waits,
events) of each arm.
"""
from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fast import make_fast_engine  # noqa: E402
from strata.pack import Pack  # noqa: E402
from strata.session import Session  # noqa: E402

COUNTED = ("launches", "gather_group", "gather_one", "q8_1_scatter", "q8_1_gather", "waits", "events")


def parse_arm(text: str) -> dict:
    """'group_gather=0,quant_gather=1' -> {'group_gather': 0, 'quant_gather': 1}"""
    out = {}
    for part in filter(None, text.split(",")):
        k, _, v = part.partition("=")
        if k not in ("group_gather", "quant_gather", "group_size"):
            raise SystemExit(f"unknown switch {k!r} (group_gather, quant_gather, group_size)")
        out[k] = int(v)
    return out


def one_prefill(engine, ids, chunk) -> tuple[float, np.ndarray, dict]:
    """Seconds, first-token logits, and the counters (and, with phase timing on, the
    seconds of each phase as `phase:<name>`) of one prefill on a fresh KV cache."""
    engine.be.reset_cache()
    engine.be.phase_table()  # drop what an earlier run recorded
    before = dict(engine.counters)
    s = Session(engine, chunk=chunk, progress=False)
    t0 = time.perf_counter()
    logits = s.prefill(ids)  # returns host logits: the device work has finished
    dt = time.perf_counter() - t0
    delta = {k: engine.counters.get(k, 0) - before.get(k, 0) for k in COUNTED}
    delta.update({f"phase:{k}": v for k, v in engine.be.phase_table().items()})
    return dt, logits, delta


def run_ab(pack, backend, arm_a, arm_b, sizes, reps, chunk, seed=0, out=print, phases=False):
    eng = {"A": make_fast_engine(pack, backend, **arm_a), "B": make_fast_engine(pack, backend, **arm_b)}
    for e in eng.values():
        e.be.timing = phases  # CUDA events around each phase, both arms alike
    rng = np.random.default_rng(seed)
    rows = []
    for n in sizes:
        times = {"A": [], "B": []}
        counts = {}
        phase_s = {"A": collections.defaultdict(list), "B": collections.defaultdict(list)}
        for arm in ("A", "B"):  # warm-up: module loads, first allocations
            one_prefill(eng[arm], rng.integers(0, pack.config.n_vocab, min(n, 256)), chunk)
        for rep in range(reps):
            ids = rng.integers(0, pack.config.n_vocab, n)
            order = ("A", "B") if rep % 2 == 0 else ("B", "A")
            logits = {}
            for arm in order:
                dt, logits[arm], counts[arm] = one_prefill(eng[arm], ids, chunk)
                times[arm].append(dt)
                for k, v in counts[arm].items():
                    if k.startswith("phase:"):
                        phase_s[arm][k[6:]].append(v)
            if logits["A"].tobytes() != logits["B"].tobytes():
                raise SystemExit(f"arms differ in their first-token logits at {n} tokens (rep {rep})")
        ma, mb = statistics.median(times["A"]), statistics.median(times["B"])
        rows.append((n, ma, mb, counts["A"], counts["B"],
                     {arm: {k: statistics.median(v) for k, v in phase_s[arm].items()} for arm in phase_s}))
        out(f"  {n} tokens: A {ma * 1e3:.1f} ms, B {mb * 1e3:.1f} ms")
    return rows


def format_table(rows, arm_a, arm_b) -> str:
    lines = [f"arm A: {arm_a or 'defaults'}    arm B: {arm_b or 'defaults'}    (medians; counts per prefill)",
             f"{'prompt tokens':>13} {'arm A ms':>10} {'arm B ms':>10} {'change':>8}  "
             f"{'launches A/B':>15} {'gathers A/B':>13} {'quantize A/B':>13} {'waits A/B':>10} {'events A/B':>10}"]
    for n, ma, mb, ca, cb, _ in rows:
        ga = ca["gather_group"] + ca["gather_one"]
        gb = cb["gather_group"] + cb["gather_one"]
        qa = ca["q8_1_scatter"] + ca["q8_1_gather"]
        qb = cb["q8_1_scatter"] + cb["q8_1_gather"]
        lines.append(f"{n:>13} {ma * 1e3:>10.2f} {mb * 1e3:>10.2f} {100 * (mb - ma) / ma:>+7.1f}%  "
                     f"{ca['launches']:>7}/{cb['launches']:<7} {ga:>6}/{gb:<6} {qa:>6}/{qb:<6} "
                     f"{ca['waits']:>4}/{cb['waits']:<5} {ca['events']:>4}/{cb['events']:<5}")
    if any(ph["A"] for *_, ph in rows):
        names = sorted({k for *_, ph in rows for k in ph["A"]})
        lines.append("phase medians, ms (CUDA events on cuda, host time on sim), A / B:")
        lines.append(f"{'prompt tokens':>13} " + " ".join(f"{k:>22}" for k in names))
        for n, *_, ph in rows:
            cells = [f"{1e3 * ph['A'].get(k, 0):>10.2f}/{1e3 * ph['B'].get(k, 0):<11.2f}" for k in names]
            lines.append(f"{n:>13} " + " ".join(cells))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pack", required=True)
    p.add_argument("--backend", default="cuda", choices=["cuda", "sim"])
    p.add_argument("--a", default="group_gather=0", help="arm A switches, e.g. group_gather=0")
    p.add_argument("--b", default="group_gather=1", help="arm B switches")
    p.add_argument("--tokens", default="2048,8192")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--prefill", default="auto", help="chunk size")
    p.add_argument("--phases", action="store_true",
                   help="also time each phase with CUDA events (both arms) and print their medians")
    args = p.parse_args(argv)
    pack = Pack.open(args.pack)
    sizes = [int(t) for t in args.tokens.split(",")]
    rows = run_ab(pack, args.backend, parse_arm(args.a), parse_arm(args.b), sizes, args.reps, args.prefill,
                  phases=args.phases)
    print(format_table(rows, args.a, args.b))
    return 0


if __name__ == "__main__":
    sys.exit(main())
