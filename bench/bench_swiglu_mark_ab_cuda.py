#!/usr/bin/env python3
"""A/B of the SwiGLU + quantize of H with and without the run's NaN/Inf watch (swiglu_q8_1.cu's
swiglu_q8_1 against swiglu_q8_1_mark), interleaved in one run, on a layer's routed rows: what
marking the gate and up rows costs inside the kernel that reads them anyway.

    python3 -m bench.bench_swiglu_mark_ab_cuda [--tokens 2048,8192,32768] [--reps 15] [--n 640] [--k 10]

Each length is a "swiglu_quantize" row of verify/cases.py (kernel_case: gate and up read, H's
q8_1 rows written) over tokens * k rows of n values (default the `strata` shape: n_ff 640,
top-10), in the layout of an IQ2_XS down product. bench/ab_harness.py runs the arms: one
untimed call each, then `reps` rounds in alternating order, each timed with CUDA events;
medians. The marked arm's bytes must be the plain arm's (the plain kernel is checked against its
NumPy definition by verify/), and its mark must have found nothing in finite inputs (exit 1 if
not). A Markdown table prints last.
"""
from __future__ import annotations

import sys

import numpy as np
from gguf import GGMLQuantizationType as QT

from bench.ab_harness import Arm, markdown, measure, parser, start
from strata_prefill.contract import q8_1
from strata_prefill.fast.cuda import products
from strata_prefill.verify.cases import kernel_case

NOTHING = np.iinfo(np.uint64).max  # the watch's value before a run marks anything
CODES = (5, 6)  # the gate's and up's codes (any two: the inputs are finite)


def main() -> int:
    ap = parser(__doc__, "2048,8192,32768", 15)
    ap.add_argument("--n", type=int, default=640, help="values a row (n_ff of the experts; default 640)")
    ap.add_argument("--k", type=int, default=10, help="experts a token (default 10)")
    started = start("bench_swiglu_mark_ab_cuda", ap)
    if started is None:
        return 0
    args, (cuda, dev, clock) = started
    from pycuda import gpuarray

    rng = np.random.default_rng(11)
    layout = q8_1.layout_for(QT.IQ2_XS)
    results, clean = [], True
    for T in (int(t) for t in args.tokens.split(",")):
        R, n = T * args.k, args.n
        case = kernel_case("swiglu_quantize", f"T{T}-k{args.k}-n{n}", dict(n=n, R=R, r0=0, r1=R, row0=0, R_total=R))
        g = gpuarray.to_gpu(rng.standard_normal((R, n), dtype=np.float32))
        u = gpuarray.to_gpu(rng.standard_normal((R, n), dtype=np.float32))
        outs = [gpuarray.empty(q8_1.buffer_nbytes(R, n), np.uint8) for _ in range(2)]
        first = gpuarray.to_gpu(np.array([NOTHING], np.uint64))

        def arm(name, out, mark):
            return Arm(name, lambda: products.swiglu_quantize(dev, g, u, r0=0, r1=R, layout=layout, out=out, row0=0,
                                                              R_total=R, mark=mark), out.get)

        res = measure(clock, case, [arm("plain", outs[0], None), arm("mark", outs[1], (first, *CODES))], args.reps)
        results.append(res)
        found = int(first.get()[0])
        clean &= res.same and found == NOTHING
        ms = res.median_ms
        print(f"tokens {T:6d}  plain {ms[0]:7.3f} ms ({case.bytes / ms[0] / 1e6:5.0f} GB/s)  mark {ms[1]:7.3f} ms "
              f"({case.bytes / ms[1] / 1e6:5.0f} GB/s)  change {100 * (ms[1] / ms[0] - 1):+.1f}%  bytes "
              f"{'the same' if res.same else 'DIFFER'}  watch {'clear' if found == NOTHING else found}", flush=True)
        cuda.Context.synchronize()
        g = u = outs = first = None  # this length's device buffers go before the next length's
    print()
    print(markdown(results, args.reps))
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
