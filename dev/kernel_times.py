#!/usr/bin/env python3
"""Where a prefill's device time goes, kernel by kernel: one prefill per prompt length under
Nsight Compute (durations only), summed by kernel name and by kernel, grid and block.

    python3 -m dev.kernel_times --pack P.gguf [--tokens 2048,8192] [--out DIR] [--ncu PATH] [switches]
    python3 -m dev.kernel_times --csv FILE.csv           # sum a list ncu already wrote

The phase tables (`run --timing`) say which phase a prefill waits on; this says which launches
inside it. A phase such as "attention" holds several products (the four projections besides the
attention kernel), and one kernel name serves several products (mmq_q4_k multiplies the dense
projections and the experts alike): the grid tells them apart. Each length is one child process,
`ncu --profile-from-start off --metrics gpu__time_duration.sum --print-units base --csv`, over a
warm-up prefill outside the profiled range and one prefill of a fresh prompt inside it
(cuProfilerStart / cuProfilerStop); ncu replays each kernel, so the figures are each launch's
own duration, without the overlap or the gaps of a real run (their sum is less than the
prefill's time). Switches go in as `--keyword value` pairs (fast/options.py). Written per length
under --out: the raw list (kernels_N.csv) and the sums (kernels_N.json); the tables print.
Exit 2 where ncu or the pack is missing, before any work.
"""
from __future__ import annotations

import argparse
import collections
import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

METRIC = "gpu__time_duration.sum"
NCU_PLACES = ("/usr/local/cuda/bin/ncu",)  # where CUDA's toolkit puts it when PATH does not


def find_ncu(given: str | None = None) -> str | None:
    """The ncu executable: `given`, else the one on PATH, else CUDA's usual place; None: none."""
    if given:
        return given if Path(given).is_file() else None
    return shutil.which("ncu") or next((p for p in NCU_PLACES if Path(p).is_file()), None)


def read_durations(lines) -> list[dict]:
    """Each profiled launch of an ncu --csv list (lines of text: ncu's own ==PROF== lines and
    the program's output are skipped): {"kernel", "grid", "block", "us"}."""
    rows = csv.DictReader(l for l in lines if l.startswith('"'))
    # ncu names the unit in words by default and as a symbol under --print-units base
    scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6,
             "ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}
    out = []
    for r in rows:
        if r.get("Metric Name") != METRIC:
            continue
        unit = r.get("Metric Unit", "nsecond")
        if unit not in scale:
            raise ValueError(f"{METRIC} in an unknown unit {unit!r}")
        value = float(r["Metric Value"].replace(",", ""))
        out.append({"kernel": r["Kernel Name"].split("(")[0].strip(), "grid": r["Grid Size"],
                    "block": r["Block Size"], "us": value * scale[unit]})
    return out


def summarize(launches: list[dict]) -> dict:
    """The launches' sums: by kernel name and by (name, grid, block), each [(key, us, count)]
    from the largest sum down, and the total."""
    by_name, by_launch = collections.defaultdict(lambda: [0.0, 0]), collections.defaultdict(lambda: [0.0, 0])
    for l in launches:
        for table, key in ((by_name, l["kernel"]), (by_launch, (l["kernel"], l["grid"], l["block"]))):
            table[key][0] += l["us"]
            table[key][1] += 1
    order = lambda t: [(k, us, n) for k, (us, n) in sorted(t.items(), key=lambda kv: -kv[1][0])]  # noqa: E731
    return {"total_us": sum(l["us"] for l in launches), "launches": len(launches),
            "by_name": order(by_name), "by_launch": order(by_launch)}


def format_summary(s: dict, top: int = 25) -> str:
    total = s["total_us"] or 1.0
    lines = [f"{s['launches']} launches, {s['total_us'] / 1e3:.2f} ms of kernel time (each launch alone)",
             f"{'ms':>9} {'share':>6} {'launches':>8}  kernel"]
    lines += [f"{us / 1e3:>9.3f} {100 * us / total:>5.1f}% {n:>8}  {k}" for k, us, n in s["by_name"][:top]]
    lines += ["", f"{'ms':>9} {'share':>6} {'launches':>8} {'us each':>9}  kernel, grid, block"]
    lines += [f"{us / 1e3:>9.3f} {100 * us / total:>5.1f}% {n:>8} {us / n:>9.1f}  {k} grid {g} block {b}"
              for (k, g, b), us, n in s["by_launch"][:top]]
    return "\n".join(lines)


def child(pack_path: str, n_tok: int, switches: dict) -> int:
    """The profiled process: a warm-up prefill, then one prefill between cuProfilerStart and
    cuProfilerStop."""
    import ctypes

    import numpy as np

    from strata_prefill.fast import make_fast_engine
    from strata_prefill.formats.pack import Pack
    from strata_prefill.session import Session

    pack = Pack.open(pack_path)
    eng = make_fast_engine(pack, "cuda", **switches)
    rng = np.random.default_rng(0)
    Session(eng, progress=False).prefill(rng.integers(0, pack.config.n_vocab, n_tok).astype(np.int32))
    eng.be.reset_cache()
    driver = ctypes.CDLL("libcuda.so.1")
    driver.cuProfilerStart()
    Session(eng, progress=False).prefill(rng.integers(0, pack.config.n_vocab, n_tok).astype(np.int32))
    driver.cuProfilerStop()
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pack")
    p.add_argument("--tokens", default="2048", help="prompt lengths, comma-separated (default 2048)")
    p.add_argument("--out", default="kernel-times", help="folder for the lists and sums (default kernel-times)")
    p.add_argument("--ncu", help="the ncu executable (default: PATH, then /usr/local/cuda/bin)")
    p.add_argument("--csv", help="only sum this ncu --csv list")
    p.add_argument("--top", type=int, default=25, help="rows a table (default 25)")
    p.add_argument("--child", nargs=2, metavar=("PACK", "TOKENS"), help=argparse.SUPPRESS)
    args, rest = p.parse_known_args(argv)
    if len(rest) % 2:
        p.error(f"switches come as --keyword value pairs, got {rest}")
    switches = {flag.removeprefix("--").replace("-", "_"): v for flag, v in zip(rest[::2], rest[1::2])}
    if args.child:
        return child(args.child[0], int(args.child[1]), switches)
    if args.csv:
        if not Path(args.csv).is_file():
            print(f"kernel_times: no file {args.csv}", file=sys.stderr)
            return 2
        try:
            launches = read_durations(Path(args.csv).read_text().splitlines())
        except ValueError as e:
            print(f"kernel_times: {args.csv}: {e}", file=sys.stderr)
            return 2
        print(format_summary(summarize(launches), args.top))
        return 0
    from strata_prefill.fast.options import BY_KEYWORD

    bad = [k for k in switches if k not in BY_KEYWORD]
    tokens = [t for t in args.tokens.split(",") if t]
    ncu = find_ncu(args.ncu)
    problems = ([f"unknown switch --{k.replace('_', '-')}" for k in bad]
                + ([] if args.pack and Path(args.pack).is_file() else [f"no pack at {args.pack!r} (--pack)"])
                + ([] if all(t.isdigit() and int(t) > 0 for t in tokens) and tokens else
                   [f"--tokens must be positive integers, got {args.tokens!r}"])
                + ([] if ncu else [f"no ncu ({args.ncu or 'not on PATH nor in ' + ', '.join(NCU_PLACES)})"]))
    if problems:
        print("kernel_times: " + "; ".join(problems), file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for n in (int(t) for t in tokens):
        listing = out / f"kernels_{n}.csv"
        print(f"kernel_times: {n} tokens under ncu (each kernel replayed: a minute or more) ...", flush=True)
        cmd = [ncu, "--profile-from-start", "off", "--metrics", METRIC, "--print-units", "base", "--csv",
               sys.executable, "-m", "dev.kernel_times", "--child", args.pack, str(n)]
        cmd += [x for k, v in switches.items() for x in (f"--{k}", str(v))]
        with open(listing, "w") as f:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.PIPE, text=True, env=os.environ.copy())
        if rc.returncode != 0:
            print(f"kernel_times: ncu exited {rc.returncode} at {n} tokens: {rc.stderr.strip()[-500:]}",
                  file=sys.stderr)
            return 1
        try:
            s = summarize(read_durations(listing.read_text().splitlines()))
        except ValueError as e:
            print(f"kernel_times: {listing}: {e}", file=sys.stderr)
            return 1
        (out / f"kernels_{n}.json").write_text(json.dumps({"tokens": n, "pack": args.pack, "switches": switches,
                                                           **s}, indent=1))
        print(f"\n{n} tokens: " + format_summary(s, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
