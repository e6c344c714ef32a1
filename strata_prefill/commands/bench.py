"""`strata-prefill bench`: two arms of the fast path, A/B, interleaved on fresh prompts.

    strata-prefill bench --pack P --a group-gather=0 --b default --tokens 1024,8192

Each arm is its own engine on the same pack, its switches given as arguments (strata_prefill/
arms.py). Per prompt length: one untimed warm-up prefill per arm, then `--reps` fresh seeded
prompts, each run by both arms (A B, then B A, alternating), each prefill on a fresh KV cache.
A prefill is timed with CUDA events on the compute stream (cuda) or host perf_counter (sim).
The switches promise not to change a bit, so the arms' first-token logits are compared byte
for byte: a difference is reported (and the exit status is 1), never a reason to stop.

Output: a Markdown table of medians and per-prefill counts on stdout (and in `--markdown`),
a line saying whether the logits were the same bytes, and JSON with the setup and every rep
(`--json`; default: beside `--markdown` with the suffix .json, else bench-DATE.json here).
With `--phases` each prefill is also traced (fast/trace.py), and the tables add the phase
medians and the overlap of the two streams: per prompt length and per layer, the copy time not
covered by compute and the compute time waiting for copies (fast/trace.py: overlap_by_layer).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from strata_prefill.formats import atomic, nonfinite
from strata_prefill.contract.errors import InputError
from strata_prefill import arms, checks

# a prefill's overlap figures (fast/trace.py: Overlap), as the JSON and the tables name them
OVERLAP_FIGURES = ("copy", "uncovered", "waiting")
# what a prefill adds to the engine's counters (fast/sim.py, fast/cuda/backend.py and tiers.py)
COUNTED = ("launches", "gathers", "waits", "events", "copies", "copy_bytes")
TIMERS = {"cuda": "CUDA events on the compute stream", "sim": "host perf_counter"}


def add_parser(sub, name: str) -> None:
    p = sub.add_parser(name, help="A/B two sets of fast-path switches on fresh prompts",
                       description="A/B the fast path: two arms of switches, interleaved on fresh "
                                   "prompts, medians, counts, and whether the logits match.")
    p.add_argument("--pack", type=checks.input_path,
                   help="GGUF pack (default: run's tiny pack, made on first use and cached)")
    p.add_argument("--backend", choices=["cuda", "sim"], default="cuda",
                   help="cuda (PyCUDA, default) or sim (NumPy kernels, host timing)")
    p.add_argument("--a", required=True, metavar="SPEC",
                   help="arm A: 'default' or NAME=VALUE,... (NAME: a switch's environment variable, "
                        f"keyword or run flag: {arms.switch_names()})")
    p.add_argument("--b", required=True, metavar="SPEC", help="arm B, as --a")
    p.add_argument("--tokens", type=token_counts, default="1024,8192", metavar="N,N,...",
                   help="prompt lengths (default 1024,8192)")
    p.add_argument("--reps", type=checks.positive_int, default=5, help="prompts per length (default 5)")
    p.add_argument("--prefill", type=checks.chunk_size, default="auto", metavar="auto|N",
                   help="chunk size (auto = 8192)")
    p.add_argument("--seed", type=checks.seed, default=0, help="seed of the prompts (default 0)")
    p.add_argument("--markdown", type=checks.output_file, metavar="FILE", help="also write the table here")
    p.add_argument("--json", type=checks.output_file, metavar="FILE",
                   help="every rep's times and counts (default: --markdown's name with .json, "
                        "else bench-YYYYmmdd-HHMMSS.json in the current folder)")
    p.add_argument("--phases", action="store_true",
                   help="also time each phase and trace both streams (both arms): tables of the phase "
                        "medians and, per layer, of the copy time not covered by compute and the compute "
                        "time waiting for copies (the events inflate the times)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress (default: a bar naming the length, rep and arm where stderr "
                        "is a terminal, else a line every 10 s)")
    p.set_defaults(func=main)


def token_counts(text: str) -> list[int]:
    """'1024,8192' -> [1024, 8192]: token counts (checks.token_count), each once (a length given
    twice would be benched twice and its rows reported as two lengths)."""
    words = [w for w in text.replace(" ", ",").split(",") if w]
    if not words:
        raise argparse.ArgumentTypeError("needs at least one prompt length")
    counts = []
    for w in words:
        n = checks.token_count(w)
        if n in counts:
            raise argparse.ArgumentTypeError(f"prompt length {n} is given twice")
        counts.append(n)
    return counts


def check_lengths(tokens: list[int], config, where: str = "the pack") -> None:
    """Every prompt length within the pack's context (from its header, before any prefill)."""
    longest = max(tokens)
    if longest > config.context_length:
        raise InputError(f"--tokens: {longest} tokens exceed {where}'s context length "
                         f"({config.context_length:,})")


def arm_name(keyword: str) -> str:
    """A switch as an arm spec names it in a message (its run flag's name)."""
    return keyword.replace("_", "-")


def refuse_idle_arm(keywords: dict, args, config, where: str) -> None:
    """An arm's switches (and the switch variables set) that would do nothing on this pack and
    backend, refused (strata_prefill.fast.options.refuse_idle), and its window against every prompt length."""
    from strata_prefill.fast import options
    from strata_prefill.session import parse_chunk

    options.refuse_idle(keywords, options.facts_of("fast", args.backend, keywords.get("expert_cache"), config,
                                                   arm_name), label=arm_name, where=where)
    window = options.resolve(keywords).window
    if window != options.AUTO:
        for n in args.tokens:
            try:
                options.window_taken(window, parse_chunk(args.prefill), n)
            except InputError as exc:
                raise InputError(f"{where}{str(exc).removeprefix('--')} (--tokens {n})") from None


def default_json(markdown: Path | None, now: datetime) -> Path:
    if markdown is not None:
        path = markdown.with_suffix(".json")
        return path if path != markdown else markdown.with_name(markdown.name + ".json")
    return Path(f"bench-{now:%Y%m%d-%H%M%S}.json")


def first_difference(a: np.ndarray, b: np.ndarray) -> int | None:
    """The first element index where a and b differ in their bytes (-1: their shapes or dtypes
    differ), or None when they are the same bytes."""
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return -1
    if a.tobytes() == b.tobytes():
        return None
    bytes_a = a.reshape(-1).view(np.uint8).reshape(a.size, a.itemsize)
    bytes_b = b.reshape(-1).view(np.uint8).reshape(b.size, b.itemsize)
    return int(np.flatnonzero((bytes_a != bytes_b).any(axis=1))[0])


def timed_prefill(engine, ids: np.ndarray, chunk) -> tuple[float, np.ndarray, dict, dict]:
    """Seconds, first-token logits, counts and phase seconds of one prefill on a fresh KV cache,
    timed on the backend's phase clock (fast/phases.py): CUDA events on the compute stream, host
    perf_counter on the sim (prefill returns host logits: every step has run)."""
    from strata_prefill.session import Session

    be = engine.be
    be.reset_cache()
    be.phase_table()  # drop what an earlier prefill recorded
    before = dict(engine.counters)
    session = Session(engine, chunk=chunk, progress=False)
    start = be.phases.mark()
    logits = session.prefill(ids)
    seconds = be.phases.seconds(start, be.phases.mark())
    counts = {k: int(engine.counters.get(k, 0) - before.get(k, 0)) for k in COUNTED}
    return seconds, logits, counts, be.phase_table()


def overlap_ms(by_layer: dict) -> dict:
    """A prefill's overlap (fast/trace.py: {layer: Overlap}) as ms for the JSON and the tables:
    the sums over its layers, and each layer's."""
    from strata_prefill.fast.trace import summed

    ms = lambda o: {"copy": 1e3 * o.copy, "uncovered": 1e3 * o.uncovered, "waiting": 1e3 * o.waiting,  # noqa: E731
                    "link_idle": 1e3 * o.idle}
    return {**ms(summed(by_layer)), "layers": {str(l): ms(o) for l, o in sorted(by_layer.items())}}


def traced_prefill(engine, ids: np.ndarray, chunk, trace: bool) -> tuple:
    """timed_prefill, and with trace the overlap of its two streams (overlap_ms; else None)."""
    from strata_prefill.fast.trace import overlap_by_layer

    if not trace:
        return (*timed_prefill(engine, ids, chunk), None)
    engine.be.trace_begin()
    try:
        got = timed_prefill(engine, ids, chunk)  # reads its phase table before the trace ends
    finally:
        spans = engine.be.trace_end()
    return (*got, overlap_ms(overlap_by_layer(spans)))


def run_bench(engines: dict, sizes, reps: int, chunk, seed: int, n_vocab: int,
              progress: bool | None = False, trace: bool = False) -> list[dict]:
    """Every length's reps: per rep the order, each arm's ms, counts and phases (and with trace
    its overlap_ms), and where the logits first differ (None: the same bytes). progress: a bar
    naming the length, rep and arm of each prefill (None: on a terminal, else a line every 10 s;
    formats/progress.py)."""
    from strata_prefill.formats.progress import Progress

    with Progress(len(sizes) * len(engines) * (reps + 1), "bench", "prefill", progress) as bar:
        return _run_bench(engines, sizes, reps, chunk, seed, n_vocab, bar, trace)


def _run_bench(engines: dict, sizes, reps: int, chunk, seed: int, n_vocab: int, bar, trace: bool = False) -> list[dict]:
    rng = np.random.default_rng(seed)
    results = []
    for n in sizes:
        warm = rng.integers(0, n_vocab, n, dtype=np.int32)
        for arm, engine in engines.items():  # module loads, first allocations at this size
            bar.at(f"{n:,} tokens, warm-up, arm {arm}")
            timed_prefill(engine, warm, chunk)
            bar.step()
        rows = []
        for rep in range(reps):
            ids = rng.integers(0, n_vocab, n, dtype=np.int32)
            order = "AB" if rep % 2 == 0 else "BA"
            row, logits = {"rep": rep + 1, "order": order}, {}
            for arm in order:
                bar.at(f"{n:,} tokens, rep {rep + 1}/{reps}, arm {arm}")
                seconds, logits[arm], counts, phases, overlap = traced_prefill(engines[arm], ids, chunk, trace)
                bar.step()
                row[arm] = {"ms": 1e3 * seconds, **counts,
                            **({"phases_ms": {k: 1e3 * v for k, v in phases.items()}} if phases else {}),
                            **({"overlap_ms": overlap} if overlap is not None else {})}
            found = {arm: nonfinite.in_logits(logits[arm]) for arm in order}
            bad = {arm: {"index": f.index[0], "value": repr(f.value), "count": f.count} for arm, f in found.items() if f}
            if bad:  # two arms' equal NaNs are no agreement (formats/nonfinite.py)
                row["nonfinite"] = bad
            diff = first_difference(logits["A"], logits["B"])
            row["logits_identical"] = diff is None
            if diff is not None:
                row["first_difference"] = {"index": diff}
                if diff >= 0:
                    row["first_difference"].update(A=float(logits["A"][diff]), B=float(logits["B"][diff]))
            rows.append(row)
        result = {"tokens": n, "reps": rows, "median": {arm: medians(rows, arm) for arm in "AB"}}
        results.append(result)
        a, b = result["median"]["A"]["ms"], result["median"]["B"]["ms"]
        bar.write(f"bench: {n} tokens: A {a:.2f} ms, B {b:.2f} ms ({change(a, b)})")
    return results


def medians(rows: list[dict], arm: str) -> dict:
    """The median time and phase times, and the low median of each count (a count that occurred)."""
    out = {"ms": statistics.median(r[arm]["ms"] for r in rows)}
    out.update({k: statistics.median_low(r[arm][k] for r in rows) for k in COUNTED})
    names = sorted({k for r in rows for k in r[arm].get("phases_ms", {})})
    if names:
        out["phases_ms"] = {k: statistics.median(r[arm].get("phases_ms", {}).get(k, 0.0) for r in rows)
                            for k in names}
    laps = [r[arm]["overlap_ms"] for r in rows if "overlap_ms" in r[arm]]
    if laps:
        med = lambda get: statistics.median(get(o) for o in laps)  # noqa: E731
        layers = sorted({l for o in laps for l in o["layers"]}, key=int)
        out["overlap_ms"] = {**{k: med(lambda o, k=k: o[k]) for k in OVERLAP_FIGURES},
                             "layers": {l: {k: med(lambda o, l=l, k=k: o["layers"].get(l, {}).get(k, 0.0))
                                            for k in OVERLAP_FIGURES} for l in layers}}
    return out


def change(a: float, b: float) -> str:
    return f"{100 * (b - a) / a:+.1f}%" if a > 0 else "-"


def settings_line(a: dict, b: dict) -> str:
    """The resolved settings in which the arms' engines differ (the environment reaches both)."""
    differ = [f"{k} {a[k]}/{b[k]}" for k in a if a[k] != b[k]]
    return "settings A/B: " + (", ".join(differ) if differ else "the same in both arms")


def format_table(results: list[dict], spec_a: str, spec_b: str, backend: str, reps: int, settings: str) -> str:
    lines = [f"A: {spec_a}; B: {spec_b}; {settings}",
             f"{backend}, {TIMERS[backend]}, medians of {reps} reps; counts per prefill (low median)", "",
             "| prompt tokens | arm A ms | arm B ms | change | launches A/B | waits A/B | events A/B | bytes A/B |",
             "|---|---|---|---|---|---|---|---|"]
    for res in results:
        a, b = res["median"]["A"], res["median"]["B"]
        pair = {k: f"{a[k]:,} / {b[k]:,}" for k in ("launches", "waits", "events", "copy_bytes")}
        lines.append(f"| {res['tokens']:,} | {a['ms']:.2f} | {b['ms']:.2f} | {change(a['ms'], b['ms'])} | "
                     f"{pair['launches']} | {pair['waits']} | {pair['events']} | {pair['copy_bytes']} |")
    lines += phase_lines(results)
    lines += overlap_lines(results, backend)
    return "\n".join(lines)


def phase_lines(results: list[dict]) -> list[str]:
    """The phase medians (A / B): the device phases, whose times add up, then the host phases
    (fast/phases.py HOST_PHASES, marked "(host)"), which overlap them on the GPU, and the host
    phases' sum as a share of the prefill's time (none where no prefill was timed by phase)."""
    from strata_prefill.fast.phases import HOST_PHASES

    names = sorted({k for res in results for arm in "AB" for k in res["median"][arm].get("phases_ms", {})})
    if not names:
        return []
    device = [k for k in names if k not in HOST_PHASES]
    host = [k for k in names if k in HOST_PHASES]
    heads = device + [f"{k} (host)" for k in host] + ["host share of the prefill"]
    lines = ["", "phase medians, ms, A / B (device phases, then host phases: host time that overlaps them "
                 "on the GPU; the host share is their sum over the prefill's time):", "",
             "| prompt tokens | " + " | ".join(heads) + " |", "|---|" + "---|" * len(heads)]
    for res in results:
        ma, mb = res["median"]["A"], res["median"]["B"]
        pa, pb = ma.get("phases_ms", {}), mb.get("phases_ms", {})
        share = lambda m, p: f"{100 * sum(p.get(k, 0.0) for k in host) / m['ms']:.0f}%" if m["ms"] > 0 else "-"  # noqa: E731
        lines.append(f"| {res['tokens']:,} | "
                     + " | ".join(f"{pa.get(k, 0.0):.2f} / {pb.get(k, 0.0):.2f}" for k in device + host)
                     + f" | {share(ma, pa)} / {share(mb, pb)} |")
    return lines


def overlap_lines(results: list[dict], backend: str = "cuda") -> list[str]:
    """The overlap tables (medians, A / B): per prompt length, then per length and layer (none
    where no prefill was traced; the sim's are its modelled stream clock's)."""
    if not any("overlap_ms" in res["median"][arm] for res in results for arm in "AB"):
        return []
    pair = lambda a, b, k: f"{a.get(k, 0.0):.2f} / {b.get(k, 0.0):.2f}"  # noqa: E731
    clock = "the sim's modelled stream clock" if backend == "sim" else "CUDA events of the traced prefill"
    lines = ["", "overlap medians, ms, A / B (not covered: copy time with no compute beside it; waiting: the "
             f"compute stream at a wait while a copy ran; {clock}):", "",
             "| prompt tokens | copy | not covered | waiting |", "|---|---|---|---|"]
    for res in results:
        a, b = (res["median"][arm].get("overlap_ms", {}) for arm in "AB")
        lines.append(f"| {res['tokens']:,} | " + " | ".join(pair(a, b, k) for k in OVERLAP_FIGURES) + " |")
    lines += ["", "| prompt tokens | layer | copy | not covered | waiting |", "|---|---|---|---|---|"]
    for res in results:
        a, b = (res["median"][arm].get("overlap_ms", {}).get("layers", {}) for arm in "AB")
        for layer in sorted(set(a) | set(b), key=int):
            la, lb = a.get(layer, {}), b.get(layer, {})
            lines.append(f"| {res['tokens']:,} | {layer} | " + " | ".join(pair(la, lb, k) for k in OVERLAP_FIGURES)
                         + " |")
    return lines


def logits_line(results: list[dict]) -> tuple[bool, str]:
    """Whether every prompt pair gave the same, finite logits bytes, and the line that says so."""
    pairs = [(res["tokens"], row) for res in results for row in res["reps"]]
    bad = [(n, row) for n, row in pairs if row.get("nonfinite")]
    if bad:
        n, row = bad[0]
        arm, f = sorted(row["nonfinite"].items())[0]
        return False, (f"logits NOT FINITE in {len(bad)} of {len(pairs)} prompt pairs, first at {n:,} tokens "
                       f"rep {row['rep']}, arm {arm}: {f['count']:,} NaN or Inf values, the first at token id "
                       f"{f['index']:,} ({f['value']}); `strata-prefill run` with --dump-dir names the layer and op")
    differ = [(n, row) for n, row in pairs if not row["logits_identical"]]
    if not differ:
        return True, f"logits: identical bytes in all {len(pairs)} prompt pairs"
    n, row = differ[0]
    d = row["first_difference"]
    where = ("shapes or dtypes differ" if d["index"] < 0
             else f"first differing index {d['index']:,}: A {d['A']!r}, B {d['B']!r}")
    return False, (f"logits DIFFER in {len(differ)} of {len(pairs)} prompt pairs, first at {n:,} tokens "
                   f"rep {row['rep']} ({where})")


def main(args) -> int:
    from strata_prefill.fast import make_fast_engine
    from strata_prefill.formats.pack import Pack
    from strata_prefill.formats.config import PRESETS
    from strata_prefill.commands.run import DEFAULT_PRESET, DUMP_ENV, default_pack, default_pack_path

    keywords = {"A": arms.parse_arm(args.a, "--a"), "B": arms.parse_arm(args.b, "--b")}
    checks.environment_values("bench")
    arms.environment_aliases()
    for var in DUMP_ENV.values():  # a Session would grow the dump in a temp and drop it
        if os.environ.get(var):
            raise InputError(f"{var} names a dump of a run: bench writes none (unset it)")
    now = datetime.now(timezone.utc)
    json_path, json_label = args.json, "--json"
    if json_path is None:
        json_label = "--json (by default)"
        try:
            json_path = checks.output_file(str(default_json(args.markdown, now)))
        except argparse.ArgumentTypeError as exc:
            raise InputError(f"--json: {exc}") from None
    checks.distinct_files(
        "bench", [("--pack" if args.pack else "the default pack",
                   Path(args.pack) if args.pack else default_pack_path(), "the pack")],
        [(json_label, json_path), ("--markdown", args.markdown)])
    if not args.pack:  # the default pack's shape is its preset's: checked before it is made
        check_lengths(args.tokens, PRESETS[DEFAULT_PRESET], "the default pack")
    pack_path = Path(args.pack) if args.pack else default_pack()
    pack = Pack.open(pack_path, progress=False if args.no_progress else None)
    cfg = pack.config
    check_lengths(args.tokens, cfg)
    for arm, kw in keywords.items():  # the switch table's one rule, as `run` has it for flags and variables
        refuse_idle_arm(kw, args, cfg, where=f"--{arm.lower()}: ")
    engines = {arm: make_fast_engine(pack, args.backend, **kw) for arm, kw in keywords.items()}
    for engine in engines.values():
        engine.be.timing = args.phases
    results = run_bench(engines, args.tokens, args.reps, args.prefill, args.seed, cfg.n_vocab,
                        progress=False if args.no_progress else None, trace=args.phases)

    specs = {arm: arms.describe(kw) for arm, kw in keywords.items()}
    settings = {arm: arms.engine_settings(engines[arm]) for arm in "AB"}
    table = format_table(results, specs["A"], specs["B"], args.backend, args.reps,
                         settings_line(settings["A"], settings["B"]))
    same, line = logits_line(results)
    setup = {"pack": str(pack_path.resolve()), "backend": args.backend, "timer": TIMERS[args.backend],
             "date": now.isoformat(timespec="seconds"), "reps": args.reps, "seed": args.seed,
             "prefill": args.prefill, "tokens": args.tokens,
             "arms": {arm: {"spec": specs[arm], "keywords": keywords[arm],
                            "settings": settings[arm]} for arm in "AB"}}
    if args.backend == "cuda":
        from strata_prefill.fast.cuda.runtime import device_name

        setup["gpu"] = device_name()
    reps = [row for res in results for row in res["reps"]]
    atomic.write_text(json_path, json.dumps({"setup": setup, "logits_identical": all(r["logits_identical"] for r in reps),
                                             "logits_finite": not any(r.get("nonfinite") for r in reps),
                                             "lengths": results}, indent=1) + "\n")
    if args.markdown is not None:
        atomic.write_text(args.markdown, f"{table}\n\n{line}\n")
    print(table)
    print()
    print(line)
    print(f"json: {json_path}")
    return 0 if same else 1
