#!/usr/bin/env python3
"""The prefill attention kernel's versions, side by side: each checked byte for byte against the
NumPy definition (strata_prefill.contract.attention.attend), then both timed on the same launches.

    python3 -m dev.kernels.attention [--tokens 4096,32768] [--reps 5] [--check-tokens 1000]

Version 1: dev/kernels/attention_v1_mma.cu (one warp per 16-query group), launched from here.
Version 2: production's fast/cuda/kernels/attention_pair.cu (each group split between two
warps), through strata_prefill.fast.cuda.attention.attend(..., variant="pair").

check: a few random shapes (GQA 32/4 heads at head_dim 128, the `strata` preset's; MQA 8/1 at
head_dim 64), each a prefill from position 0 of --check-tokens tokens and a chunk at an offset
that is no whole key block; every byte of each version's float32 output must be the NumPy
definition's (the first differing element is printed otherwise).
timer: per --tokens T, a causal prefill of T tokens over T keys on the strata heads; after one
untimed call each, --reps rounds with the two versions interleaved (the order alternating),
each launch timed by CUDA events; medians in ms. The NumPy reference is too slow at these sizes,
so there the two versions' outputs are compared byte for byte with each other.

Needs a CUDA GPU and PyCUDA (exit 2 with one line saying why where there is none). Exit 1 on
any differing byte. Kernels compile on first use and say so on stderr (fast/cuda/runtime.py),
as do the slow steps.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from dataclasses import dataclass

import numpy as np

from bench.ab_harness import first_difference
from dev.kernels.harness import cuda_or_exit, finish, progress, v1_v2_table
from strata_prefill.fast.cuda import attention as cu_att, runtime, signatures
from strata_prefill.contract import attention
from strata_prefill.formats.config import PRESETS
from strata_prefill.contract.constants import KEY_BLOCK
from strata_prefill.verify.kernel_inputs import normal  # fast random draws at 32K

HERE = os.path.dirname(os.path.abspath(__file__))

F32 = np.float32

#: version 1's kernel file, how it is built and launched: the one place these are written (the
#: CPU test checks V1_FORMAT against the file's C signatures)
V1_FILE = os.path.join(HERE, "attention_v1_mma.cu")
V1_DEFINES = {"MMA_WARPS": 8}  # production's configuration while version 1 was production's
V1_FORMAT = "PqPiiPPPPPifPq"
V1_GEOMETRY = "attend_mma_geometry"  # {warps, queries} of a CTA
HEAD_DIMS = (64, 128)

#: the strata preset's attention heads (formats/config.py): query heads, KV heads, head_dim
STRATA_HEADS = (PRESETS["strata"].n_head, PRESETS["strata"].n_head_kv, PRESETS["strata"].head_dim)


def v1_kernel(hd: int) -> str:
    return f"attend_mma_hd{hd}"


def v1_kernels(defines: dict | None = None) -> dict:
    """Version 1's kernels (strata_prefill.fast.cuda.signatures.Kernel by name), read from its file without a
    compiler, its headers from fast/cuda/kernels."""
    with open(V1_FILE, encoding="utf-8") as f:
        text = f.read()
    return signatures.parse_source(text, os.path.basename(V1_FILE), V1_DEFINES if defines is None else defines,
                                   include_dir=runtime.KERNEL_DIR)


def check_v1_format(hd: int, fmt: str = V1_FORMAT) -> None:
    """ValueError unless ``fmt`` is the C signature of version 1's kernel for ``hd``: a format
    unlike the signature packs the launch's arguments at wrong offsets, silently."""
    found = v1_kernels()
    name = v1_kernel(hd)
    if name not in found:
        raise ValueError(f"{os.path.basename(V1_FILE)} has no kernel {name} (it has: {', '.join(sorted(found))})")
    signatures.check_kernel(found[name], fmt, os.path.basename(V1_FILE))


# ---------------------------------------------------------------------------------- launches

@dataclass
class DeviceCache:
    """One layer's int8 KV cache on the device (strata_prefill.fast.cuda.attention's layout), with the
    transposed V blocks version 2 reads, as production's cache holds them."""
    k_codes: object
    k_scale: object
    v_codes: object
    v_scale: object
    v_t: object

    def arrays(self) -> tuple:
        return self.k_codes, self.k_scale, self.v_codes, self.v_scale


_v1_funcs: dict = {}


def _v1_function(hd: int):
    """(prepared version 1 kernel for hd, warps, queries per CTA), compiled once."""
    got = _v1_funcs.get(hd)
    if got is None:
        check_v1_format(hd)
        mod = runtime.load_file(V1_FILE, V1_DEFINES)
        warps, tile = runtime.module_ints(mod, V1_GEOMETRY, 2)
        f = mod.get_function(v1_kernel(hd))
        f.prepare(V1_FORMAT)
        got = _v1_funcs[hd] = (f, warps, tile)
    return got


def attend_v1(dev, q, pos, cache: DeviceCache, out) -> None:
    """Version 1 of q float32 [T, H, hd] at positions pos (int32 GPUArray [T]) into out."""
    T, H, hd = (int(s) for s in q.shape)
    n_kv, cap = (int(s) for s in cache.k_codes.shape[:2])
    f, warps, tile = _v1_function(hd)
    kq = F32(attention.kq_scale(hd))
    # v_t is version 2's: 0 here
    dev.launch(f, "attention_v1", (-(-T // tile), H, 1), (32 * warps, 1, 1), runtime.ptr(q), H * hd,
               runtime.ptr(pos), T, H // n_kv, *(runtime.ptr(a) for a in cache.arrays()), 0, cap, kq,
               runtime.ptr(out), H * hd)


def attend_v2(dev, q, pos, cache: DeviceCache, out) -> None:
    """Version 2 (production's pair kernel) of the same."""
    cu_att.attend(dev, q, pos, *cache.arrays(), out=out, variant="pair", v_t=cache.v_t)


VERSIONS = (("v1", attend_v1), ("v2", attend_v2))


def poisoned(dev, shape, byte: int):
    """An output filled with ``byte``: each version gets its own, so an element a kernel never
    writes differs between them (and from the definition)."""
    import pycuda.driver as cuda  # noqa: PLC0415

    out = dev.empty(shape, F32)
    cuda.memset_d8_async(runtime.ptr(out), byte, out.nbytes, dev.stream)
    return out


POISON = {"v1": 0xA5, "v2": 0x5A}


def run(dev, name: str, q, pos, cache: DeviceCache):
    """One launch of version ``name`` into a new poisoned output (not waited for)."""
    out = poisoned(dev, q.shape, POISON[name])
    dict(VERSIONS)[name](dev, q, pos, cache, out)
    return out


# ---------------------------------------------------------------------------------- inputs

def randn(rng, shape, lo: float, hi: float) -> np.ndarray:
    """Normal float32 values with a random power-of-e scale per leading row (ranges the
    quantization's scales must follow; never all zeros)."""
    x = normal(rng, shape)
    x *= np.exp(rng.uniform(lo, hi, size=shape[:1] + (1,) * (len(shape) - 1))).astype(F32)
    return x


def kv_inputs(rng, T: int, n_kv: int, hd: int) -> tuple[np.ndarray, np.ndarray]:
    """Random k, v float32 [T, n_kv, hd]."""
    return randn(rng, (T, n_kv, hd), -2.0, 2.0), randn(rng, (T, n_kv, hd), -2.0, 2.0)


def upload_cache(dev, kv: attention.KVCache) -> DeviceCache:
    """The NumPy cache's layer 0 on the device as it is (the check tests attention alone, not
    the device's kv_write), with its transposed V blocks."""
    arrays = [dev.upload(a[0]) for a in (kv.k_codes, kv.k_scale, kv.v_codes, kv.v_scale)]
    v_t = cu_att.v_transpose(dev, arrays[2], kv.capacity)
    return DeviceCache(*arrays, v_t)


# ---------------------------------------------------------------------------------- check

@dataclass(frozen=True)
class Case:
    name: str
    n_head: int
    n_kv: int
    hd: int
    start: int  # keys written before the chunk (its first position)
    tokens: int


def check_cases(tokens: int) -> list[Case]:
    """Prefills from 0 and chunks at an offset that is no whole key block, on the strata heads
    (GQA) and an MQA shape at head_dim 64."""
    n = max(int(tokens), 1)
    off = n + KEY_BLOCK // 2 + 5  # mid-block: the chunk's first block is partly old keys
    chunk = max(n // 2, 1)
    H, KV, HD = STRATA_HEADS
    return [
        Case(f"GQA {H}/{KV} hd{HD} prefill", H, KV, HD, 0, n),
        Case(f"GQA {H}/{KV} hd{HD} chunk", H, KV, HD, off, chunk),
        Case("MQA 8/1 hd64 prefill", 8, 1, 64, 0, n),
        Case("MQA 8/1 hd64 chunk", 8, 1, 64, off, chunk),
    ]


def case_inputs(case: Case, seed: int):
    """(NumPy cache, q, positions) of a case: earlier keys 0 .. start-1, then the chunk's."""
    rng = np.random.default_rng(seed)
    kv = attention.KVCache(1, case.n_kv, case.hd, capacity=KEY_BLOCK)
    if case.start:
        k, v = kv_inputs(rng, case.start, case.n_kv, case.hd)
        kv.write(0, np.arange(case.start, dtype=np.int32), k, v)
    positions = np.arange(case.start, case.start + case.tokens, dtype=np.int32)
    k, v = kv_inputs(rng, case.tokens, case.n_kv, case.hd)
    kv.write(0, positions, k, v)
    q = randn(rng, (case.tokens, case.n_head, case.hd), -1.0, 1.0)
    return kv, q, positions


def check_case(dev, case: Case, seed: int) -> list[str]:
    """Each version's output of the case against the NumPy definition; one line per version
    whose bytes differ."""
    kv, q, positions = case_inputs(case, seed)
    progress(f"check: {case.name}, {case.tokens} tokens at {case.start}: the NumPy definition ...")
    want = attention.attend(kv, 0, q, positions)
    cache, q_dev, pos_dev = upload_cache(dev, kv), dev.upload(q), dev.upload(positions)
    bad = []
    for name, _ in VERSIONS:
        got = dev.download(run(dev, name, q_dev, pos_dev, cache))
        diff = first_difference(got, want)
        print(f"check {name} {case.name:<22} T={case.tokens:<5} from {case.start:<5} "
              f"{'same bytes' if diff is None else 'DIFFERS: ' + diff}")
        if diff is not None:
            bad.append(f"{name} {case.name}: {diff}")
    return bad


def check(tokens: int = 1000, seed: int = 0, dev=None) -> list[str]:
    """Both versions on every check case (:func:`check_cases`) of ``tokens`` tokens; the
    mismatches (empty: every byte equal). ``dev``: a strata_prefill.fast.cuda.runtime.Device (a new one if None)."""
    dev = runtime.Device() if dev is None else dev
    bad = []
    for i, case in enumerate(check_cases(tokens)):
        bad += check_case(dev, case, seed + i)
    return bad


# ---------------------------------------------------------------------------------- timer

def prefill_inputs(dev, T: int, seed: int):
    """(q GPUArray, positions GPUArray, DeviceCache) of a causal prefill of T tokens on the
    strata heads, the cache written on the device as production writes it (kv_write)."""
    H, KV, HD = STRATA_HEADS
    rng = np.random.default_rng(seed)
    progress(f"timer: T={T}: drawing and writing the inputs ...")
    positions = np.arange(T, dtype=np.int32)
    kvc = cu_att.DeviceKVCache(dev, 1, KV, HD, capacity=T)
    k, v = kv_inputs(rng, T, KV, HD)
    kvc.write(0, positions, dev.upload(k), dev.upload(v))
    q = dev.upload(randn(rng, (T, H, HD), -1.0, 1.0))
    cache = DeviceCache(*kvc.layer(0), kvc.v_t[0])
    return q, dev.upload(positions), cache


def timed(dev, name: str, q, pos, cache) -> tuple[float, object]:
    """(ms by CUDA events around one launch of version ``name``, its output)."""
    import pycuda.driver as cuda  # noqa: PLC0415

    # the poison fill goes before the start event: not timed, and it keeps the stream busy while
    # the host gets to the launch, so the events time the kernel rather than the host's Python
    out = poisoned(dev, q.shape, POISON[name])
    start, end = cuda.Event(), cuda.Event()
    start.record(dev.stream)
    dict(VERSIONS)[name](dev, q, pos, cache, out)
    end.record(dev.stream)
    end.synchronize()
    return start.time_till(end), out


def time_prefill(dev, T: int, reps: int, seed: int = 1) -> tuple[dict, str | None]:
    """({version: median ms}, None or how the versions' outputs differ) of a T-token prefill."""
    q, pos, cache = prefill_inputs(dev, T, seed)
    names = [n for n, _ in VERSIONS]
    outs = {n: run(dev, n, q, pos, cache) for n in names}  # the warm-up (and first compiles)
    dev.synchronize()
    times: dict = {n: [] for n in names}
    progress(f"timer: T={T}: {reps} rounds ...")
    for r in range(reps):
        for n in names if r % 2 == 0 else names[::-1]:
            ms, outs[n] = timed(dev, n, q, pos, cache)
            times[n].append(ms)
    diff = first_difference(dev.download(outs["v2"]), dev.download(outs["v1"]))
    return {n: statistics.median(t) for n, t in times.items()}, diff


# ---------------------------------------------------------------------------------- main

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", default="4096,32768", help="timer prefill lengths, comma-separated")
    p.add_argument("--reps", type=int, default=5, help="timed rounds per length")
    p.add_argument("--check-tokens", type=int, default=1000, help="tokens of each check case (0: no check)")
    args = p.parse_args(argv)
    args.tokens = [int(t) for t in args.tokens.split(",") if t.strip()]
    if any(t < 1 for t in args.tokens) or args.reps < 1:
        p.error("--tokens must be positive lengths and --reps at least 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    cuda_or_exit("dev/kernels/attention.py")
    dev = runtime.Device()
    bad = check(args.check_tokens, dev=dev) if args.check_tokens > 0 else []
    v1_v2_table("tokens", args.tokens, lambda T: time_prefill(dev, T, args.reps), bad)
    return finish(bad)


if __name__ == "__main__":
    sys.exit(main())
