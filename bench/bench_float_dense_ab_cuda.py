#!/usr/bin/env python3
"""A/B of float_dense.cu's two forms ("warp" and "tile"), interleaved in one run, on the
strata router shape (512 x 2560 weights, BF16 as in the strata pack, and F32) and the shared expert's gate vector (1 x 2560).

    python3 -m bench.bench_float_dense_ab_cuda [--tokens 1024,8192,32768] [--reps 7]

Each (shape, tokens) is a "float_dense" row of verify/cases.py (kernel_case; the GPU suite times
the router rows at 2K, 8K and 32K). bench/ab_harness.py runs the arms: one untimed call per
form, then `reps` rounds in alternating order, each timed with CUDA events; medians. Every
form's output must be the NumPy definition (strata_prefill.contract.dense.float_matmul) on a spread of tokens
and the warp form's bytes elsewhere (exit 1 if not). GFLOP/s counts the row's flops, 2 * N * K
* T (a product and an addition per weight and token). A Markdown table prints last.
"""
from __future__ import annotations

import sys

import numpy as np

from gguf import GGMLQuantizationType as QT

from bench.ab_harness import Arm, Definition, markdown, measure, parser, start
from strata_prefill.fast.cuda import dense
from strata_prefill.contract.dense import decode_float, encode_float, float_matmul
from strata_prefill.verify.cases import kernel_case, sample_index

SHAPES = (("router", 512, 2560, "BF16"), ("router", 512, 2560, "F32"), ("shexp gate", 1, 2560, "F32"))
#: form -> (variant, float_dense.cu defines of the tiled form)
FORMS = {"warp": ("warp", {}), "tile": ("tile", {}), "tile minb1": ("tile", {"FT_MINB": 1})}
CHECKED_TOKENS = 32  # tokens of each row compared with the NumPy definition


def main() -> int:
    started = start("bench_float_dense_ab_cuda", parser(__doc__, "1024,8192,32768", 7))
    if started is None:
        return 0
    args, (_cuda, dev, clock) = started
    rng = np.random.default_rng(3)
    results = []
    for name, N, K, wtype in SHAPES:
        raw = encode_float(rng.standard_normal((N, K), dtype=np.float32) * np.float32(0.05), QT[wtype])
        w = dev.upload(raw)
        for T in [int(t) for t in args.tokens.split(",")]:
            case = kernel_case("float_dense", f"{name.replace(' ', '_')}-T{T}-N{N}-K{K}-{wtype}", dict(T=T, N=N, K=K),
                               weight_type=wtype)
            xh = rng.standard_normal((T, K), dtype=np.float32)
            x = dev.upload(xh)
            outs = {f: dev.empty((T, N), np.float32) for f in FORMS}

            def run(f):
                variant, dense.TILE_CONFIG = FORMS[f]
                dense.float_dense(dev, QT[wtype], w, N, K, x, T, outs[f], variant=variant)

            def definition():
                sel = sample_index(T, CHECKED_TOKENS)
                return Definition(sel, float_matmul(decode_float(QT[wtype], raw), xh[sel]))

            arms = [Arm(f, lambda f=f: run(f), outs[f].get) for f in FORMS]
            results.append(measure(clock, case, arms, args.reps, definition))
    print()
    print(markdown(results, args.reps))
    return 0 if all(r.same for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
