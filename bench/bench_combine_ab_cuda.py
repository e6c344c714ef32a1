#!/usr/bin/env python3
"""A/B of combine.cu's two forms, interleaved in one run, on the `strata` shape (top-10, hidden
2560, a shared expert): "element" (combine_rows, a thread an element) and "row"
(combine_rows_vec, a CTA a token, float4).

    python3 bench/bench_combine_ab_cuda.py [--tokens 1024,8192,32768] [--reps 9]

One untimed call per form, then `reps` rounds in alternating order, each timed with CUDA
events; medians. The two outputs must be the same bytes (exit 1 if not). GB/s counts the bytes
a combine must move: K expert rows, the shared row and x read, out written, per token.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.gpu_timing import interleaved, stream_device  # noqa: E402
from fast.cuda import elementwise, runtime  # noqa: E402

K, D = 10, 2560
FORMS = ("element", "row")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", default="1024,8192,32768")
    ap.add_argument("--reps", type=int, default=9)
    args = ap.parse_args()
    got = stream_device("bench_combine_ab_cuda")
    if got is None:
        return 0
    cuda, dev, clock = got
    rng = np.random.default_rng(7)
    differ = False
    print(f"device: {runtime.device_name()}; K={K}, D={D}, shared expert", flush=True)
    from pycuda import gpuarray

    for T in (int(t) for t in args.tokens.split(",")):
        x = gpuarray.to_gpu(rng.standard_normal((T, D), dtype=np.float32))
        w = gpuarray.to_gpu(rng.random((T, K), dtype=np.float32))
        slot = gpuarray.to_gpu(rng.permutation(T * K).astype(np.int32))
        y = gpuarray.to_gpu(rng.standard_normal((T * K, D), dtype=np.float32))
        shared = (gpuarray.to_gpu(rng.random(T, dtype=np.float32)),
                  gpuarray.to_gpu(rng.standard_normal((T, D), dtype=np.float32)))
        outs = [gpuarray.empty((T, D), np.float32) for _ in FORMS]

        def arm(form, out):
            return lambda: elementwise.combine(dev, x, w, slot, y, shared, out=out, form=form)

        times = interleaved(clock, [arm(f, o) for f, o in zip(FORMS, outs)], args.reps)
        cuda.Context.synchronize()
        got = [o.get() for o in outs]
        same = np.array_equal(got[0].view(np.uint32), got[1].view(np.uint32))
        differ |= not same
        moved = 4.0 * T * D * (K + 3)
        ms = [statistics.median(t) * 1e3 for t in times]
        print(f"tokens {T:6d}  element {ms[0]:7.3f} ms ({moved / ms[0] / 1e6:5.0f} GB/s)  row {ms[1]:7.3f} ms "
              f"({moved / ms[1] / 1e6:5.0f} GB/s)  change {100 * (ms[1] / ms[0] - 1):+.1f}%  bytes "
              f"{'identical' if same else 'DIFFER'}", flush=True)
        del x, w, slot, y, shared, outs
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
