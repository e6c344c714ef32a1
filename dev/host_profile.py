"""Where the host's time goes in a prefill: cProfile over a few prefills of one engine, after a
warm-up, printed as the functions that took the most time of their own and with their callees.

    python3 -m dev.host_profile --pack strata8.gguf --tokens 1030 --expert-cache 1365 [--stage-head 0]

A streamed prompt of a few thousand tokens can be bound by the host: the compute stream idles
while the host reads a layer's routing, plans its walk and queues its copies and launches
(`strata-prefill plot` shades those gaps). This says which Python functions that time is in.
Switches go in as `--keyword value` pairs (fast/options.py); every prefill runs on a fresh KV
cache and a fresh prompt of the same length. On the sim backend (`--backend sim`) it profiles
the NumPy kernels too, so its figures say little about the cuda host path.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time

import numpy as np

from strata_prefill.contract.errors import InputError
from strata_prefill.fast import make_fast_engine
from strata_prefill.fast.options import BY_KEYWORD
from strata_prefill.formats.pack import Pack
from strata_prefill.session import Session


def switches_of(rest: list) -> dict:
    """Command-line `--keyword value` pairs of fast/options.py's switches as {keyword: value};
    InputError for a list that is not pairs or a switch that is not in the table."""
    if len(rest) % 2:
        raise InputError(f"switches come as --keyword value pairs, got {rest}")
    switches = {}
    for flag, value in zip(rest[::2], rest[1::2]):
        kw = flag.removeprefix("--").replace("-", "_")
        if kw not in BY_KEYWORD:
            raise InputError(f"unknown switch {flag} (switches: {', '.join(BY_KEYWORD)})")
        switches[kw] = value
    return switches


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pack", required=True)
    p.add_argument("--tokens", type=int, default=1030)
    p.add_argument("--reps", type=int, default=3, help="profiled prefills (default 3)")
    p.add_argument("--backend", default="cuda", choices=("cuda", "sim"))
    p.add_argument("--top", type=int, default=30, help="functions printed per table (default 30)")
    p.add_argument("--out", help="also write the raw profile (pstats) here")
    args, rest = p.parse_known_args(argv)
    try:
        switches = switches_of(rest)
    except InputError as e:
        p.error(str(e))
    pack = Pack.open(args.pack)
    eng = make_fast_engine(pack, args.backend, **switches)
    rng = np.random.default_rng(0)

    def prefill():
        eng.be.reset_cache()
        ids = rng.integers(0, pack.config.n_vocab, args.tokens).astype(np.int32)
        Session(eng, progress=False).prefill(ids)

    prefill()  # warm-up: kernels loaded, buffers allocated
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    for _ in range(args.reps):
        prefill()
    prof.disable()
    wall = (time.perf_counter() - t0) / args.reps
    print(f"{args.tokens} tokens, {args.reps} prefills, {wall * 1e3:.1f} ms each (wall, profiled); "
          f"switches {switches or 'defaults'}")
    stats = pstats.Stats(prof)
    if args.out:
        stats.dump_stats(args.out)
    for key in ("tottime", "cumulative"):
        print(f"\n-- by {key} (seconds over {args.reps} prefills) --")
        stats.sort_stats(key).print_stats(args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
