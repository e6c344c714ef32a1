"""Whole prefill on the GPU, all experts resident: tokens/s and the share of time per phase.

    python3 -m bench.bench_prefill_cuda --pack strata8.gguf --tokens 2048,8192,32768

Per size: one untimed warm-up, then `--reps` prefills of fresh prompts (one chunk each),
timed on the host around `prefill` (it returns host logits, so the device work is done); the
median is reported. Then one more prefill with phase timing on (CUDA events around each
phase) gives the shares.

    python3 -m bench.bench_prefill_cuda --pack p.gguf --tokens 2048 --ab 'STRATA_MMQ_DEFINES={"MMQ_MIX_AT": 1}'

--ab NAME=VALUE (repeatable; NAME one of the variables read at each MMQ launch,
fast/cuda/products.py LAUNCH_VARIABLES) adds an A/B on the same engine instead: arm A as the
environment is, arm B with the assignments, in interleaved rounds (A B, then B A) on the same
fresh prompt, each prefill timed on the host; the medians, B/A, and a check that both arms'
logits are the same bytes (a tiling changes speed only). With --differ arm B computes other bytes
by construction (a price probe: a scratch form that is not the contract's, built under a define
of its own): the rounds whose logits differ are counted and the timing goes on.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time

import numpy as np

from strata_prefill.contract.errors import InputError
from strata_prefill.fast import make_fast_engine
from strata_prefill.fast.cuda import products
from strata_prefill.fast.phases import format_phase_table
from strata_prefill.formats.pack import Pack
from strata_prefill.session import Session


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pack", required=True)
    p.add_argument("--tokens", default="2048,8192,32768")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--ab", action="append", default=[], metavar="NAME=VALUE",
                   help="arm B's environment assignment (repeatable): an A/B instead of the phase table")
    p.add_argument("--differ", action="store_true",
                   help="with --ab: arm B's bytes differ by construction (a price probe); count the rounds "
                        "whose logits differ and keep timing, where an A/B stops at the first")
    args = p.parse_args(argv)
    try:
        arm_b = ab_assignments(args.ab)
        sizes = [int(t) for t in args.tokens.split(",")]
    except (InputError, ValueError) as e:
        p.error(str(e))
    if args.reps < 1 or any(n < 1 for n in sizes):
        p.error("--reps and every --tokens length must be at least 1")
    if args.differ and not arm_b:
        p.error("--differ goes with --ab")
    pack = Pack.open(args.pack)
    cfg = pack.config
    t0 = time.perf_counter()
    eng = make_fast_engine(pack, "cuda")
    print(f"loaded {cfg.n_layer} layers x {cfg.n_expert} experts to VRAM in {time.perf_counter() - t0:.1f} s")
    rng = np.random.default_rng(0)
    if arm_b:
        return ab(eng, cfg, sizes, args.reps, arm_b, rng, differ=args.differ)
    rows = []
    for n in sizes:
        Session(eng, progress=False).prefill(rng.integers(0, cfg.n_vocab, n))  # warm-up
        times = []
        for _ in range(args.reps):
            eng.be.reset_cache()
            ids = rng.integers(0, cfg.n_vocab, n)
            t = time.perf_counter()
            Session(eng, progress=False).prefill(ids)
            times.append(time.perf_counter() - t)
        eng.be.timing = True
        eng.be.phase_table()
        t = time.perf_counter()
        Session(eng, progress=False).prefill(rng.integers(0, cfg.n_vocab, n))
        timed = time.perf_counter() - t  # the timed prefill's wall time: what its host phases are a share of
        phases = eng.be.phase_table()
        eng.be.timing = False
        med = statistics.median(times)
        rows.append((n, med, phases))
        print(f"\n{n} tokens: {med * 1e3:.1f} ms median of {args.reps}, {n / med:,.0f} tokens/s")
        print(format_phase_table(phases, timed))
    print(f"\nwhole prefill, {cfg.n_layer} layers, {cfg.n_expert} experts top-{cfg.n_expert_used}, "
          f"{pack.config.expert_gu_type.name} experts, all resident")
    print(f"{'tokens':>7} {'ms':>9} {'tokens/s':>10}  shares")
    for n, med, ph in rows:
        total = sum(ph.values()) or 1
        top = ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in sorted(ph.items(), key=lambda kv: -kv[1])[:5])
        print(f"{n:>7} {med * 1e3:>9.1f} {n / med:>10,.0f}  {top}")
    return 0


def ab_assignments(items: list[str]) -> dict[str, str]:
    """--ab's NAME=VALUE items as {NAME: VALUE}, each a variable read at each MMQ launch with a
    value its reader takes; a one-line InputError otherwise (before the pack is loaded)."""
    from strata_prefill import variables

    out = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or name not in products.LAUNCH_VARIABLES:
            raise InputError(f"--ab takes NAME=VALUE with NAME one of {', '.join(products.LAUNCH_VARIABLES)}, "
                             f"got {item!r}")
        out[name] = value
    with _environment(out):
        for name in out:
            variables.value_of(name)
    return out


@contextlib.contextmanager
def _environment(assignments: dict):
    """The environment with `assignments` set, as it was again afterwards."""
    saved = {k: os.environ.get(k) for k in assignments}
    os.environ.update(assignments)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def ab(eng, cfg, sizes, reps: int, arm_b: dict, rng, differ: bool = False) -> int:
    """The interleaved A/B of --ab: per size one untimed prefill of each arm (it also compiles
    arm B's kernels), then `reps` rounds on a fresh prompt each, A B in even rounds and B A in
    odd ones; a mismatch of the two arms' logits is an error (exit 1), unless `differ` (--differ:
    arm B's bytes differ by construction), which counts the rounds that differ and goes on."""
    def run(arm: str, ids) -> tuple[float, np.ndarray]:
        with _environment(arm_b if arm == "B" else {}):
            eng.be.reset_cache()
            t = time.perf_counter()
            logits = Session(eng, progress=False).prefill(ids)
            return time.perf_counter() - t, np.asarray(logits)

    print("arm B: " + " ".join(f"{k}={v}" for k, v in arm_b.items()), flush=True)
    print(f"{'tokens':>7} {'A ms':>9} {'B ms':>9} {'B/A':>6}  A tokens/s  B tokens/s")
    for n in sizes:
        warm = rng.integers(0, cfg.n_vocab, n)
        run("A", warm), run("B", warm)
        times = {"A": [], "B": []}
        differing = 0
        for r in range(reps):
            ids = rng.integers(0, cfg.n_vocab, n)
            got = {}
            for arm in ("AB" if r % 2 == 0 else "BA"):
                dt, got[arm] = run(arm, ids)
                times[arm].append(dt)
            if got["A"].tobytes() != got["B"].tobytes():
                if not differ:
                    print(f"{n} tokens, round {r}: the arms' logits differ", file=sys.stderr)
                    return 1
                differing += 1
        a, b = statistics.median(times["A"]), statistics.median(times["B"])
        print(f"{n:>7} {a * 1e3:>9.1f} {b * 1e3:>9.1f} {b / a:>6.3f}  {n / a:>10,.0f}  {n / b:>10,.0f}"
              + (f"  logits differ in {differing} of {reps} rounds (--differ)" if differ else ""), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
