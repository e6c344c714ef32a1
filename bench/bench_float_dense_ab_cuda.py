#!/usr/bin/env python3
"""A/B of float_dense.cu's two forms ("warp" and "tile"), interleaved in one run, on the
strata router shape (512 x 2560 weights, BF16 as in the strata pack, and F32) and the shared expert's gate vector (1 x 2560).

    python3 bench/bench_float_dense_ab_cuda.py [--tokens 1024,8192,32768] [--reps 7]

Per (shape, tokens): one untimed call per form, then `reps` rounds in alternating order, each
timed with CUDA events; medians. The forms' outputs must be the same bytes (exit 1 if not).
GFLOP/s counts 2 * N * K * T (a product and an addition per weight and token).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import os

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gguf import GGMLQuantizationType as QT  # noqa: E402

from fast.cuda import dense, runtime  # noqa: E402
from gpu_timing import PycudaClock, interleaved  # noqa: E402
from strata.dense import encode_float  # noqa: E402

SHAPES = (("router", 512, 2560, "BF16"), ("router", 512, 2560, "F32"), ("shexp gate", 1, 2560, "F32"))
#: form -> (variant, float_dense.cu defines of the tiled form)
FORMS = {"warp": ("warp", {}), "tile": ("tile", {}), "tile minb1": ("tile", {"FT_MINB": 1})}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", default="1024,8192,32768")
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    runtime.context()
    dev = runtime.Device()
    clock = PycudaClock(dev.stream)
    print(f"device: {runtime.device_name()} ({runtime.arch()})", flush=True)
    rng = np.random.default_rng(3)
    rows, failed = [], False
    for name, N, K, wtype in SHAPES:
        wf = rng.standard_normal((N, K), dtype=np.float32) * np.float32(0.05)
        w = dev.upload(encode_float(wf, QT[wtype]))
        for T in [int(t) for t in args.tokens.split(",")]:
            x = dev.upload(rng.standard_normal((T, K), dtype=np.float32))
            outs = {f: dev.empty((T, N), np.float32) for f in FORMS}

            def run(f):
                variant, dense.TILE_CONFIG = FORMS[f]
                dense.float_dense(dev, QT[wtype], w, N, K, x, T, outs[f], variant=variant)

            per_arm = interleaved(clock, [lambda f=f: run(f) for f in FORMS], args.reps)
            times = {f: [1e3 * t for t in ts] for f, ts in zip(FORMS, per_arm)}
            first = outs["warp"].get().view(np.uint32)
            same = all(np.array_equal(o.get().view(np.uint32), first) for o in outs.values())
            failed |= not same
            med = {f: statistics.median(times[f]) for f in FORMS}
            rows.append((name, wtype, N, K, T, med, same))
    print(f"\n{args.reps} interleaved reps, medians (CUDA events)")
    print("| shape | weights | N x K | tokens | " + " | ".join(f"{f} ms" for f in FORMS)
          + " | tile vs warp | tile GFLOP/s | identical bytes |")
    print("|---|---|---|---|" + "---|" * len(FORMS) + "---|---|---|")
    for name, wtype, N, K, T, med, same in rows:
        ch = 100.0 * (med["tile"] / med["warp"] - 1.0)
        gf = 2.0 * N * K * T / (med["tile"] * 1e6)
        print(f"| {name} | {wtype} | {N} x {K} | {T} | " + " | ".join(f"{med[f]:.3f}" for f in FORMS)
              + f" | {ch:+.1f}% | {gf:.0f} | {'yes' if same else 'NO'} |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
