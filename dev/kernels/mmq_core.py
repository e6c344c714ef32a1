#!/usr/bin/env python3
"""MMQ's product core for a sub-scaled type, on int8 tensor cores (v1: production's IQ2_XS
epilogue), on fp16 tensor cores (v2: the sub-scaled integers summed by the mma) and on Hopper's
asynchronous warpgroup instructions (v3, v4: v1's arithmetic, products by wgmma, with two
accumulator buffers at 1 CTA an SM or one at 2; sm_90 only), side
by side: each checked byte for byte against the NumPy definition
(strata_prefill.contract.mmq.mmq_prepared), then all timed on the same launches.

    python3 -m dev.kernels.mmq_core [--rows 1024,8192] [--reps 7]

Kernels: dev/kernels/mmq_core.cu (its comment says what the core leaves out: the decode, edge
tiles). Inputs are IQ2_XS-like: weight codes +-8, +-25, +-43 (the grid's values), a sub-scale
2s + 1 (1..31) per 16 values, a positive float scale per 32-value block for the weights and the
activations, activation codes -127..127.
check: random shapes of whole tiles, and one of every code, sub-scale and activation at its
largest (the widest integer sums), each element's bytes against the definition.
timer: the strata gate/up shape (N = 1,280: gate and up, K = 2,560) at --rows activation rows;
after one untimed launch each, --reps rounds with the forms interleaved (the order reversed
every other round), CUDA events around each launch; medians in ms, TOP/s (2 x the
multiply-adds of the int8 products), and every form's output compared with v1's byte for byte.
v3 and v4 run where the device is sm_90 (the file is then built for sm_90a); elsewhere they are
left out with a line saying so.

Needs a CUDA GPU and PyCUDA (exit 2 with one line saying why where there is none). Exit 1 on
any differing byte.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import numpy as np

from gguf import GGMLQuantizationType as QT

from bench.ab_harness import first_difference
from dev.kernels.harness import cuda_or_exit, finish, progress, versions_table
from strata_prefill.fast.cuda import kernel_paths, runtime
from strata_prefill.contract import mmq, q8_1

HERE = os.path.dirname(os.path.abspath(__file__))

F32 = np.float32
FILE = os.path.join(HERE, "mmq_core.cu")
VERSIONS = ("v1", "v2", "v3", "v4")
#: the versions on Hopper's own instructions: where they run the whole file is built for
#: kernel_paths.WGMMA_TARGET
WGMMA_VERSIONS = ("v3", "v4")
FORMAT = "PPPPPPii"  # w, u, dw, x, da, out, N, K (the kernels' C signature; tests/test_mmq_core.py)
GEOMETRY = "mmq_core_geometry"  # {BM, BN, threads, each version's shared memory}
GRID_CODES = np.array([8, 25, 43])
TIMER_N, TIMER_K = 1280, 2560


def inputs(rng, N: int, K: int, R: int, widest: bool = False) -> dict:
    """Random IQ2_XS-like operands (see the module's docstring); widest: every code, sub-scale
    and activation at its largest magnitude."""
    if widest:
        w = np.full((N, K), 43, np.int8)
        u = np.full((N, K // 16), 31, np.uint8)
        x = np.full((R, K), 127, np.int8)
        x[R // 2:] = -127
    else:
        w = (rng.choice(GRID_CODES, (N, K)) * rng.choice([-1, 1], (N, K))).astype(np.int8)
        u = (2 * rng.integers(0, 16, (N, K // 16)) + 1).astype(np.uint8)
        x = rng.integers(-127, 128, (R, K)).astype(np.int8)
    dw = (np.exp(rng.uniform(-9, -3, (N, K // 32))) * rng.choice([1, 1, 1, -1], (N, K // 32))).astype(F32)
    da = np.exp(rng.uniform(-8, -2, (R, K // 32))).astype(F32)
    return dict(w=w, u=u, dw=dw, x=x, da=da)


def definition(a: dict) -> np.ndarray:
    """out [R, N] float32: strata_prefill.contract.mmq.mmq_prepared on the same operands (the weights as the
    reference prepares an IQ2_XS matrix: codes times their sub-scales per block, dw a float per
    block; the activations as decoded D4 q8_1 rows)."""
    w, u = a["w"].astype(np.int16), a["u"].astype(np.int16)
    N, K = w.shape
    nb = K // 32
    wu = (w.reshape(N, nb, 2, 16) * u.reshape(N, nb, 2, 1)).reshape(N, nb, 32)
    pw = mmq.PreparedWeights(QT.IQ2_XS, np.ascontiguousarray(wu.transpose(1, 0, 2)), a["dw"], None, None)
    R = a["x"].shape[0]
    act = q8_1.Q8Rows(a["x"].reshape(R, nb, 32), a["da"], None, None, q8_1.Layout.D4)
    return mmq.mmq_prepared(pw, act)


def build_target(arch: str) -> tuple[str, tuple[str, ...]]:
    """(the target the file is built for on a device of ``arch``, the versions that run there):
    sm_90a and every version on sm_90, the device's own architecture and all but
    WGMMA_VERSIONS elsewhere."""
    if kernel_paths.runs_on(kernel_paths.WGMMA_TARGET, arch):
        return kernel_paths.WGMMA_TARGET, VERSIONS
    return arch, tuple(v for v in VERSIONS if v not in WGMMA_VERSIONS)


class Cores:
    """The forms that run on this device, compiled once, with their launch geometry."""

    def __init__(self, dev):
        import pycuda.driver as cuda  # noqa: PLC0415

        self.dev = dev
        arch = runtime.device_arch()
        target, self.versions = build_target(arch)
        if self.versions != VERSIONS:
            progress(f"mmq_core: {', '.join(v for v in VERSIONS if v not in self.versions)} left out: "
                     f"{kernel_paths.WGMMA_TARGET} instructions, and this device is {arch}")
        mod = runtime.load_file(FILE, target=target)
        bm, bn, threads, *smems = runtime.module_ints(mod, GEOMETRY, 3 + len(VERSIONS))
        self.tile, self.threads = (bm, bn), threads
        self.funcs = {}
        for v, smem in zip(VERSIONS, smems):
            if v not in self.versions:
                continue
            f = mod.get_function(f"mmq_core_{v}")
            f.set_attribute(cuda.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, smem)
            f.prepare(FORMAT)
            self.funcs[v] = (f, smem)

    def upload(self, a: dict) -> dict:
        N, K = a["w"].shape
        R = a["x"].shape[0]
        bm, bn = self.tile
        if N % bm or R % bn or K % 128:
            raise ValueError(f"whole tiles only: N a multiple of {bm}, R of {bn}, K of 128; got {N}, {R}, {K}")
        d = {k: self.dev.upload(v) for k, v in a.items()}
        d["shape"] = (N, K, R)
        return d

    def run(self, v: str, d: dict, out=None):
        N, K, R = d["shape"]
        f, smem = self.funcs[v]
        if out is None:
            out = self.dev.empty((R, N), F32)
        self.dev.launch(f, None, (N // self.tile[0], R // self.tile[1], 1), (self.threads, 1, 1),
                        *(runtime.ptr(d[k]) for k in ("w", "u", "dw", "x", "da")), runtime.ptr(out), N, K,
                        shared_size=smem)
        return out


CHECK_SHAPES = ((64, 128, 128, False), (192, 384, 256, False), (128, 256, 128, True))  # N, K, R, widest


def check(cores: Cores, seed: int = 0) -> list[str]:
    bad = []
    for i, (N, K, R, widest) in enumerate(CHECK_SHAPES):
        a = inputs(np.random.default_rng(seed + i), N, K, R, widest)
        want = definition(a)
        d = cores.upload(a)
        for v in cores.versions:
            diff = first_difference(cores.dev.download(cores.run(v, d)), want)
            print(f"check {v} N={N} K={K} R={R}{' widest' if widest else ''}: "
                  f"{'same bytes' if diff is None else 'DIFFERS: ' + diff}")
            if diff is not None:
                bad.append(f"{v} N={N} K={K} R={R}: {diff}")
    return bad


def time_rows(cores: Cores, R: int, reps: int, seed: int = 1) -> tuple[dict, str | None]:
    import pycuda.driver as cuda  # noqa: PLC0415

    progress(f"timer: R={R}: drawing the inputs ...")
    d = cores.upload(inputs(np.random.default_rng(seed), TIMER_N, TIMER_K, R))
    versions = cores.versions
    outs = {v: cores.run(v, d) for v in versions}  # the warm-up
    cores.dev.synchronize()
    times = {v: [] for v in versions}
    for r in range(reps):
        for v in versions if r % 2 == 0 else versions[::-1]:
            start, end = cuda.Event(), cuda.Event()
            start.record(cores.dev.stream)
            cores.run(v, d, outs[v])
            end.record(cores.dev.stream)
            end.synchronize()
            times[v].append(start.time_till(end))
    first = cores.dev.download(outs[versions[0]])
    diffs = {v: first_difference(cores.dev.download(outs[v]), first) for v in versions[1:]}
    return {v: statistics.median(t) for v, t in times.items()}, diffs


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default="1024,8192", help="timer activation rows, comma-separated (multiples of 128)")
    p.add_argument("--reps", type=int, default=7)
    args = p.parse_args(argv)
    args.rows = [int(r) for r in args.rows.split(",") if r.strip()]
    if any(r < 128 or r % 128 for r in args.rows) or args.reps < 1:
        p.error("--rows must be positive multiples of 128 and --reps at least 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    cuda_or_exit("dev/kernels/mmq_core.py")
    cores = Cores(runtime.Device())
    bad = check(cores)
    ops = lambda R, ms: 2 * TIMER_N * TIMER_K * R / (ms * 1e-3) / 1e12  # noqa: E731
    versions_table("rows", args.rows, lambda R: time_rows(cores, R, args.reps), bad, cores.versions,
                   rate=("TOP/s", ops))
    return finish(bad)


if __name__ == "__main__":
    sys.exit(main())
