"""Whole prefill on the GPU, all experts resident: tokens/s and the share of time per phase.

    python3 -m bench.bench_prefill_cuda --pack strata8.gguf --tokens 2048,8192,32768

Per size: one untimed warm-up, then `--reps` prefills of fresh prompts (one chunk each),
timed on the host around `prefill` (it returns host logits, so the device work is done); the
median is reported. Then one more prefill with phase timing on (CUDA events around each
phase) gives the shares.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

from strata_prefill.fast import make_fast_engine
from strata_prefill.fast.phases import format_phase_table
from strata_prefill.formats.pack import Pack
from strata_prefill.session import Session


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pack", required=True)
    p.add_argument("--tokens", default="2048,8192,32768")
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args(argv)
    pack = Pack.open(args.pack)
    cfg = pack.config
    t0 = time.perf_counter()
    eng = make_fast_engine(pack, "cuda")
    print(f"loaded {cfg.n_layer} layers x {cfg.n_expert} experts to VRAM in {time.perf_counter() - t0:.1f} s")
    rng = np.random.default_rng(0)
    rows = []
    for n in (int(t) for t in args.tokens.split(",")):
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


if __name__ == "__main__":
    sys.exit(main())
