#!/usr/bin/env python3
"""A/B of combine.cu's two forms, interleaved in one run, on the `strata` shape (top-10, hidden
2560, a shared expert): "element" (combine_rows, a thread an element) and "row"
(combine_rows_vec, a CTA a token, float4).

    python3 -m bench.bench_combine_ab_cuda [--tokens 1024,8192,32768] [--reps 9]

Each length is a "combine" row of verify/cases.py (kernel_case: its bytes are the K expert rows,
the shared row, x and the output, per token, and the weights and slots). bench/ab_harness.py
runs the arms: one untimed call per form, then `reps` rounds in alternating order, each timed
with CUDA events; medians. Each form's output must be the NumPy definition (strata_prefill.contract.moe.combine)
on a spread of tokens and the first form's bytes elsewhere (exit 1 if not). A Markdown table
prints last.
"""
from __future__ import annotations

import sys

import numpy as np

from bench.ab_harness import Arm, Definition, markdown, measure, parser, start
from strata_prefill.fast.cuda import elementwise
from strata_prefill.contract import moe
from strata_prefill.verify.cases import kernel_case, sample_index

K, D = 10, 2560
FORMS = ("element", "row")
CHECKED_TOKENS = 64  # tokens of each length compared with the NumPy definition


def main() -> int:
    started = start("bench_combine_ab_cuda", parser(__doc__, "1024,8192,32768", 9), f"; K={K}, D={D}, shared expert")
    if started is None:
        return 0
    args, (cuda, dev, clock) = started
    rng = np.random.default_rng(7)
    from pycuda import gpuarray

    results = []
    for T in (int(t) for t in args.tokens.split(",")):
        case = kernel_case("combine", f"T{T}-K{K}-D{D}-shared", dict(T=T, K=K, D=D, E=512, shared=True))
        h = dict(x=rng.standard_normal((T, D), dtype=np.float32), w=rng.random((T, K), dtype=np.float32),
                 slot=rng.permutation(T * K).astype(np.int32), y=rng.standard_normal((T * K, D), dtype=np.float32),
                 g=rng.random(T, dtype=np.float32), ysh=rng.standard_normal((T, D), dtype=np.float32))
        d = {k: gpuarray.to_gpu(v) for k, v in h.items()}
        outs = [gpuarray.empty((T, D), np.float32) for _ in FORMS]

        def arm(form, out):
            return Arm(form, lambda: elementwise.combine(dev, d["x"], d["w"], d["slot"], d["y"], (d["g"], d["ysh"]),
                                                         out=out, form=form), out.get)

        def definition():
            sel = sample_index(T, CHECKED_TOKENS)
            slot = h["slot"].reshape(T, K)[sel].reshape(-1)
            return Definition(sel, moe.combine(h["x"][sel], h["w"][sel], slot, h["y"], (h["g"][sel], h["ysh"][sel])))

        res = measure(clock, case, [arm(f, o) for f, o in zip(FORMS, outs)], args.reps, definition)
        results.append(res)
        ms = res.median_ms
        print(f"tokens {T:6d}  element {ms[0]:7.3f} ms ({case.bytes / ms[0] / 1e6:5.0f} GB/s)  row {ms[1]:7.3f} ms "
              f"({case.bytes / ms[1] / 1e6:5.0f} GB/s)  change {100 * (ms[1] / ms[0] - 1):+.1f}%  bytes "
              f"{'the definition' if res.same else 'DIFFER'}", flush=True)
        cuda.Context.synchronize()
        d = outs = None  # this length's device buffers go before the next length's
    print()
    print(markdown(results, args.reps))
    return 0 if all(r.same for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
