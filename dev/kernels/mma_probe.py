#!/usr/bin/env python3
"""Two facts about mma.sync on this GPU that decide whether MMQ's sub-scaled types could use
fp16 tensor cores (docs/performance.md, "MMQ's sub-scales on half-precision tensor cores"):

    python3 -m dev.kernels.mma_probe [--cases 8192] [--iters 4096] [--reps 5]

check: does m16n8k16 with f16 operands and an f32 accumulator give the exact integer when A, B
and C hold integers and the sums stay below 2^24? The cases (dev/kernels/mma_probe.cu
mma_f16_exact, one warp each) are random integers in the ranges an IQ2_XS block would give:
A = a sub-scale times a grid code (|A| <= 31 * 43 = 1,333), B = an activation code (|B| <=
127), C = the first half's sum or more (|C| < 2^24 - 16 * 1,333 * 127); then fixed extremes:
every product at its largest, C just under 2^24 - that, signs alternating so the partial sums
cancel, and odd sums that need every bit of the float's 24. Each D must be NumPy's int64 sum
(`check` prints how many of the elements differ and the first).
rate: cycles one warp's mma of each form occupies its scheduler (mma_rate_*: CHAINS
independent accumulators a warp, 8 warps per scheduler), from CUDA events around the launch
after a warm-up, medians of --reps; beside it the dense rate in TOP/s (2 x the multiply-adds).

Needs a CUDA GPU and PyCUDA (exit 2 with one line saying why where there is none). Exit 1 when
an f16 sum is not exact.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import numpy as np

from dev.kernels.harness import cuda_or_exit
from strata_prefill.fast.cuda import runtime

HERE = os.path.dirname(os.path.abspath(__file__))

FILE = os.path.join(HERE, "mma_probe.cu")
A_MAX, B_MAX = 31 * 43, 127  # an IQ2_XS sub-scale times its largest grid code; a q8_1 code
K = 16
C_MAX = 2 ** 24 - K * A_MAX * B_MAX - 1  # |C| + |A . B| stays below 2^24
#: (kernel, multiply-adds of one mma) of the rate's forms
RATES = (("mma_rate_f16_k16", 16 * 8 * 16), ("mma_rate_s8_k16", 16 * 8 * 16), ("mma_rate_s8_k32", 16 * 8 * 32))
CHAINS = 4  # the file's default
WARPS_PER_SCHEDULER = 8


def exact_cases(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(A int64 [m][16][16], B int64 [m][16][8], C int64 [m][16][8]): n random cases, then the
    fixed extremes of the module's docstring."""
    rng = np.random.default_rng(seed)
    a = rng.integers(-A_MAX, A_MAX + 1, (n, 16, K))
    b = rng.integers(-B_MAX, B_MAX + 1, (n, K, 8))
    c = rng.integers(-C_MAX, C_MAX + 1, (n, 16, 8))
    c[: n // 4] = 0  # a block's first half: the sum alone
    top = np.full((1, 16, K), A_MAX), np.full((1, K, 8), B_MAX)
    alt = np.where((np.arange(K) % 2 == 0)[None, None, :], A_MAX, -A_MAX) * np.ones((1, 16, 1), np.int64)
    fixed = [
        (top[0], top[1], np.zeros((1, 16, 8), np.int64)),  # every product at its largest
        (top[0], top[1], np.full((1, 16, 8), C_MAX)),  # 2^24 - 1: every bit of the significand
        (-top[0], top[1], np.full((1, 16, 8), -C_MAX)),
        (alt, top[1], np.full((1, 16, 8), C_MAX)),  # partial sums cancelling, C large
        (top[0], top[1], np.full((1, 16, 8), C_MAX) - 2 * np.arange(8)[None, None, :]),  # odd sums
    ]
    for fa, fb, fc in fixed:
        a, b, c = np.concatenate([a, fa]), np.concatenate([b, fb]), np.concatenate([c, fc])
    return a, b, c


def check(dev, n: int) -> str | None:
    """None when every D is the exact integer sum, else how many elements differ and the first."""
    a, b, c = exact_cases(n)
    want = (np.einsum("mik,mkj->mij", a, b) + c).astype(np.float64)
    assert np.abs(want).max() < 2 ** 24  # the cases keep their promise
    m = len(a)
    mod = runtime.load_file(FILE)
    f = mod.get_function("mma_f16_exact")
    f.prepare("PPPPi")
    da, db = dev.upload(a.astype(np.float16)), dev.upload(b.astype(np.float16))
    dc, dd = dev.upload(c.astype(np.float32)), dev.empty((m, 16, 8), np.float32)
    dev.launch(f, None, (-(-m // 4), 1, 1), (128, 1, 1), runtime.ptr(da), runtime.ptr(db), runtime.ptr(dc),
               runtime.ptr(dd), m)
    got = dev.download(dd).astype(np.float64)
    bad = np.flatnonzero(got.reshape(-1) != want.reshape(-1))
    if bad.size == 0:
        return None
    i = int(bad[0])
    at = np.unravel_index(i, got.shape)
    return f"{bad.size} of {got.size} sums differ; first at case {at[0]} ({at[1]}, {at[2]}): {got.reshape(-1)[i]:.0f} " \
           f"against {want.reshape(-1)[i]:.0f}"


def rate(dev, iters: int, reps: int) -> list[tuple[str, float, float, float]]:
    """(kernel, median ms, cycles a warp's mma holds its scheduler, TOP/s) per form."""
    import pycuda.driver as cuda  # noqa: PLC0415

    d = cuda.Context.get_device()
    sms = d.get_attribute(cuda.device_attribute.MULTIPROCESSOR_COUNT)
    clock_hz = d.get_attribute(cuda.device_attribute.CLOCK_RATE) * 1e3
    blocks, threads = sms * WARPS_PER_SCHEDULER, 128  # 4 warps a block, one per scheduler
    out = dev.empty((blocks * threads,), np.float32)
    mod = runtime.load_file(FILE, {"CHAINS": CHAINS})
    rows = []
    for name, macs in RATES:
        f = mod.get_function(name)
        f.prepare("iP")
        times = []
        for r in range(reps + 1):
            start, end = cuda.Event(), cuda.Event()
            start.record(dev.stream)
            dev.launch(f, None, (blocks, 1, 1), (threads, 1, 1), iters, runtime.ptr(out))
            end.record(dev.stream)
            end.synchronize()
            if r:  # the first is the warm-up
                times.append(start.time_till(end))
        ms = statistics.median(times)
        warp_mmas = blocks * (threads // 32) * iters * CHAINS
        per_scheduler = warp_mmas / (sms * 4)
        rows.append((name, ms, ms * 1e-3 * clock_hz / per_scheduler, 2 * macs * warp_mmas / (ms * 1e-3) / 1e12))
    return rows


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", type=int, default=8192, help="random cases of the check (one warp each)")
    p.add_argument("--iters", type=int, default=4096, help="rounds of CHAINS mma a warp in the rate")
    p.add_argument("--reps", type=int, default=5, help="timed launches of each rate kernel")
    args = p.parse_args(argv)
    if args.cases < 0 or args.iters < 1 or args.reps < 1:
        p.error("--cases must be >= 0, --iters and --reps at least 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    cuda_or_exit("dev/kernels/mma_probe.py")
    dev = runtime.Device()
    diff = check(dev, args.cases)
    print(f"check f16 m16n8k16, f32 accumulator, integer sums below 2^24: "
          f"{'exact' if diff is None else 'NOT EXACT: ' + diff}")
    print(f"\n{'form':<20} {'ms':>9} {'cycles/mma':>11} {'TOP/s':>8}")
    for name, ms, cycles, tops in rate(dev, args.iters, args.reps):
        print(f"{name:<20} {ms:>9.3f} {cycles:>11.2f} {tops:>8.1f}")
    return 0 if diff is None else 1


if __name__ == "__main__":
    sys.exit(main())
