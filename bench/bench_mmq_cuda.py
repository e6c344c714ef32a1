#!/usr/bin/env python3
"""Benchmark of the grouped MMQ kernel (fast/cuda/kernels/mmq.cu) on the `strata` MoE shape.

    python3 -m bench.bench_mmq_cuda [--tokens 1024,8192,32768] [--repeats 7] [--out DIR]

1. The int8 tensor-core peak: a tight loop of independent mma.sync m16n8k32 (and m16n8k16)
   s8 instructions on every SM; ops = 2*M*N*K per instruction.
2. The grouped products as the walk launches them: 512 experts, top-10, rows = tokens*10
   spread over the experts by random routing, one launch per group of 16 consecutive experts
   (32 launches a layer). gate/up: 1280 x 2560 per expert (IQ2_XS, Q8_0); down: 2560 x 640
   (Q8_0, Q4_1: the 32-value types a pack falls back to there). Weights rotate over several
   group buffers (together well over the 60 MB L2). Achieved TOP/s = 2*rows*N*K / time.
   Two times per layer: "queued" (the 32 launches enqueued behind a spin kernel, so the GPU
   runs them back to back: kernel time) and "paced" (launched from Python as a walk does: the
   configurations and tile rows of a case are the arms of bench/ab_harness.py, interleaved).
   CUDA events, one warm-up, median of the repeats.
3. The q8_1 quantizer (gather and scatter, the harness's two arms) on the same routings.

Each layer and each quantize is a row (strata_prefill.verify.cases.kernel_case: "mmq_layer", "quantize"), and
every arm's output must be the NumPy definition on a spread of rows (strata_prefill.contract.mmq.mmq of a few
routed experts' rows, strata_prefill.contract.q8_1.quantize_rows of a few rows) and the first arm's bytes
elsewhere (exit 1 if not). Prints its tables, then the harness's Markdown table; with --out,
writes the full numbers as JSON there.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

from gguf import GGMLQuantizationType as QT

from bench.ab_harness import Arm, Definition, markdown, measure
from strata_prefill.fast.cuda import products, runtime
from bench.gpu_timing import PycudaClock, unavailable
from strata_prefill.contract import mmq, q8_1, quants
from strata_prefill.contract.constants import WEIGHT_TAIL_BYTES
from strata_prefill.verify.cases import kernel_case, sample_index

N_EXPERT, TOP_K, N_EMBD, N_FF, GROUP = 512, 10, 2560, 640, 16
CHECKED_ROWS, CHECKED_EXPERTS = 256, 4  # quantized rows, and experts' product rows, compared with NumPy

PEAK_SRC = r"""
#include <stdint.h>
extern "C" __global__ void peak_k32(int* out, int iters) {
    int acc[8][4];
    for (int i = 0; i < 8; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0;
    const uint32_t t = threadIdx.x * 0x01010101u;
    const uint32_t a0 = t ^ 0x12345678u, a1 = t ^ 0x9abcdef0u, a2 = t + 77u, a3 = t * 3u, b0 = t ^ 0x5a5a5a5au, b1 = t + 0x01020304u;
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int i = 0; i < 8; ++i)
            asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                         : "+r"(acc[i][0]), "+r"(acc[i][1]), "+r"(acc[i][2]), "+r"(acc[i][3])
                         : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
    int s = 0;
    for (int i = 0; i < 8; ++i) s += acc[i][0] ^ acc[i][1] ^ acc[i][2] ^ acc[i][3];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
extern "C" __global__ void peak_k16(int* out, int iters) {
    int acc[8][4];
    for (int i = 0; i < 8; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0;
    const uint32_t t = threadIdx.x * 0x01010101u;
    const uint32_t a0 = t ^ 0x12345678u, a1 = t ^ 0x9abcdef0u, b0 = t ^ 0x5a5a5a5au;
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int i = 0; i < 8; ++i)
            asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
                         : "+r"(acc[i][0]), "+r"(acc[i][1]), "+r"(acc[i][2]), "+r"(acc[i][3])
                         : "r"(a0), "r"(a1), "r"(b0));
    }
    int s = 0;
    for (int i = 0; i < 8; ++i) s += acc[i][0] ^ acc[i][1] ^ acc[i][2] ^ acc[i][3];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
extern "C" __global__ void spin(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}
"""


def log(*a):
    print(*a, flush=True)


class Timer:
    def __init__(self, cuda, mod):
        self.cuda = cuda
        self.spin = mod.get_function("spin")
        self.spin.prepare("Q")

    def time(self, fn, repeats: int, queued: bool, spin_ms: float = 4.0) -> float:
        """Median ms of fn() over repeats, after one warm-up."""
        cuda = self.cuda
        fn()
        cuda.Context.synchronize()
        out = []
        for _ in range(repeats):
            a, b = cuda.Event(), cuda.Event()
            if queued:
                self.spin.prepared_call((1, 1, 1), (1, 1, 1), np.uint64(int(spin_ms * 1e6)))
            a.record()
            fn()
            b.record()
            b.synchronize()
            out.append(b.time_since(a))
        return statistics.median(out)


def measure_peak(cuda, mod, n_sm: int) -> dict:
    res = {}
    buf = runtime.alloc(n_sm * 8 * 256 * 4, "peak out")
    for name, ops in (("peak_k32", 2 * 16 * 8 * 32), ("peak_k16", 2 * 16 * 8 * 16)):
        f = mod.get_function(name)
        f.prepare("Pi")
        iters = 2048
        grid, block = (n_sm * 8, 1, 1), (256, 1, 1)
        f.prepared_call(grid, block, buf, np.int32(iters))
        cuda.Context.synchronize()
        times = []
        for _ in range(5):
            a, b = cuda.Event(), cuda.Event()
            a.record()
            f.prepared_call(grid, block, buf, np.int32(iters))
            b.record()
            b.synchronize()
            times.append(b.time_since(a))
        ms = statistics.median(times)
        n_mma = grid[0] * (block[0] // 32) * iters * 8
        res[name] = {"ms": ms, "tops": n_mma * ops / (ms * 1e-3) / 1e12}
    return res


def routing(tokens: int, rng) -> np.ndarray:
    """cnt[e] for `tokens` tokens each picking TOP_K distinct experts uniformly."""
    keys = rng.random((tokens, N_EXPERT), dtype=np.float32)
    ids = np.argpartition(keys, TOP_K, axis=1)[:, :TOP_K]
    return np.bincount(ids.reshape(-1), minlength=N_EXPERT).astype(np.int64), ids.astype(np.int32)


def tables(ids: np.ndarray):
    flat = ids.reshape(-1)
    by = np.argsort(flat, kind="stable")
    slot = np.empty(flat.size, np.int32)
    slot[by] = np.arange(flat.size, dtype=np.int32)
    src = (by // TOP_K).astype(np.int32)
    return slot, src


def bench(args):
    cuda = runtime._driver()
    runtime.context()
    dev = runtime.Device()  # counters, the default stream, the wrappers' memory pool
    from pycuda.compiler import SourceModule

    n_sm = runtime.multiprocessor_count()
    log(f"device: {runtime.device_name()} ({runtime.arch()}, {n_sm} SMs)")
    mod = SourceModule(PEAK_SRC, options=list(runtime.NVCC_OPTIONS), arch=runtime.arch(), no_extern_c=True)
    timer = Timer(cuda, mod)
    clock = PycudaClock()  # the default stream, the one dev launches on
    peak = measure_peak(cuda, mod, n_sm)
    for k, v in peak.items():
        log(f"{k}: {v['tops']:.1f} TOP/s ({v['ms']:.3f} ms)")
    peak32 = peak["peak_k32"]["tops"]

    rng = np.random.default_rng(12345)
    results = {"peak": peak, "mmq": [], "quant": []}
    token_list = [int(t) for t in args.tokens.split(",")]
    cases = [("gate_up", "IQ2_XS", 2 * N_FF, N_EMBD), ("gate_up", "Q8_0", 2 * N_FF, N_EMBD),
             ("down", "Q8_0", N_EMBD, N_FF), ("down", "Q4_1", N_EMBD, N_FF)]
    if args.cases:
        keep = set(args.cases.split(","))
        cases = [c for c in cases if f"{c[0]}:{c[1]}" in keep]
    configs = [None] + ([json.loads(c) for c in args.configs.split(";")] if args.configs else [])

    # weights: group buffers of 16 experts, rotated; sized so together they exceed L2 well
    wcache = {}

    def weights(tname, N, K):
        """(device group buffers, stride, their host copies: the definition's weights)"""
        key = (tname, N, K)
        if key not in wcache:
            qt = QT[tname]
            vpb, _ = quants.block_size(qt)
            rb = quants.row_bytes(qt, K)
            stride = N * rb
            n_buf = max(2, min(8, -(-240_000_000 // (GROUP * stride))))
            bufs, host = [], []
            for _ in range(n_buf):
                blk = quants.random_blocks(qt, GROUP * N * K // vpb, rng)
                data = np.concatenate([blk.reshape(-1), np.zeros(WEIGHT_TAIL_BYTES, np.uint8)])
                bufs.append(runtime.to_device(data, f"{tname} group weights"))
                host.append(data)
            wcache[key] = (bufs, stride, host)
            log(f"weights {tname} {N}x{K}: {n_buf} group buffers of {GROUP * stride / 1e6:.1f} MB")
        return wcache[key]

    harness = []  # bench/ab_harness.py results: the quantizer's two ways, each case's configurations
    for tokens in token_list:
        cnt, ids = routing(tokens, rng)
        rows = tokens * TOP_K
        off = np.zeros(N_EXPERT + 1, np.int64)
        off[1:] = np.cumsum(cnt)
        groups = []
        gb = np.zeros((N_EXPERT // GROUP, GROUP, 2), np.int32)
        for g in range(N_EXPERT // GROUP):
            e0 = g * GROUP
            gb[g, :, 0] = off[e0:e0 + GROUP]
            gb[g, :, 1] = off[e0 + 1:e0 + GROUP + 1]
            groups.append(int(off[e0 + GROUP] - off[e0]))
        bounds_dev = runtime.to_device(gb.reshape(-1), "bounds")
        slot, src = tables(ids)
        slot_d = runtime.to_device(slot, "slot")
        src_d = runtime.to_device(src, "src")
        log(f"tokens {tokens}: rows {rows}, rows/expert min {cnt.min()} max {cnt.max()} mean {cnt.mean():.1f}")

        acts, xs = {}, {}
        for K in sorted({c[3] for c in cases}):
            for lay in sorted({q8_1.layout_for(QT[c[1]]) for c in cases if c[3] == K}):
                x = rng.standard_normal((tokens, K), dtype=np.float32)
                xd = runtime.to_device(x, "x")
                nbytes = q8_1.buffer_nbytes(rows, K)
                bufs_q = {how: runtime.alloc(nbytes, "q8_1 activations") for how in ("scatter", "gather")}
                case = kernel_case("quantize", f"T{tokens}-K{K}-E{N_EXPERT}-k{TOP_K}-{lay.name}",
                                   dict(T=tokens, K=K, E=N_EXPERT, k=TOP_K), config=lay.name)
                fns = {"scatter": lambda: products.quantize_scatter(dev, xd, slot_d, T=tokens, K_used=TOP_K, K=K,
                                                                    layout=lay, out=bufs_q["scatter"]),
                       "gather": lambda: products.quantize_gather(dev, xd, src_d, n_rows=rows, K=K, layout=lay,
                                                                  out=bufs_q["gather"])}

                def q_output(buf, nbytes=nbytes):
                    h = np.empty(nbytes, np.uint8)
                    cuda.memcpy_dtoh(h, buf)
                    return q8_1.unpack_rows(h, rows)

                def q_definition(x=x, lay=lay):
                    sel = sample_index(rows, CHECKED_ROWS)
                    return Definition(sel, q8_1.quantize_rows(x[src[sel]], lay))

                res = measure(clock, case, [Arm(how, fns[how], lambda b=bufs_q[how]: q_output(b)) for how in fns],
                              args.repeats, q_definition)
                harness.append(res)
                for how, paced in zip(fns, res.median_ms):  # queued: the kernel's own time
                    ms = timer.time(fns[how], args.repeats, queued=True)
                    gbs = (tokens * K * 4 + nbytes) / (ms * 1e-3) / 1e9
                    results["quant"].append({"tokens": tokens, "K": K, "layout": lay.name, "how": how,
                                             "ms": ms, "ms_paced": paced, "GBps_min_traffic": gbs,
                                             "GBps_row": case.bytes / (ms * 1e-3) / 1e9})
                    log(f"  quantize {how:7s} K={K} {lay.name}: {ms:.3f} ms ({gbs:.0f} GB/s of min traffic)")
                acts[(K, lay)] = bufs_q["gather"]  # both hold the same bytes (checked above)
                bufs_q["scatter"].free()
                xs[(K, lay)] = x

        for proj, tname, N, K in cases:
            qt = QT[tname]
            bufs, stride, host_bufs = weights(tname, N, K)
            lay = q8_1.layout_for(qt)
            ad = acts[(K, lay)]
            ops = 2.0 * rows * N * K
            case = kernel_case("mmq_layer", f"{proj}-{tname}-T{tokens}-{N}x{K}",
                               dict(tokens=tokens, N=N, K=K, mats=1, experts=N_EXPERT, top_k=TOP_K),
                               weight_type=tname, form="group")
            arms, outs, settings = [], [], []
            for cfg in configs:
                geo = products.mmq_geometry(cfg)
                for tile_rows in sorted({min(geo["BN"], t) for t in (geo["BN"], 128, 64)}, reverse=True):
                    out = runtime.alloc(rows * N * 4, "mmq out")

                    def layer(out=out, cfg=cfg, tile_rows=tile_rows):
                        for g in range(N_EXPERT // GROUP):
                            products.mmq_group(dev, qt, bufs[g % len(bufs)], w_stride=stride, N=N, K=K, act=ad,
                                               R_total=rows, bounds=int(bounds_dev) + g * GROUP * 8, n_exp=GROUP,
                                               out=out, rows=groups[g], tile_rows=tile_rows, config=cfg)

                    def output(out=out):
                        h = np.empty((rows, N), np.float32)
                        cuda.memcpy_dtoh(h, out)
                        return h

                    arms.append(Arm(f"{json.dumps(cfg) if cfg else 'default'}/{tile_rows}", layer, output))
                    outs.append(out)
                    settings.append((cfg, tile_rows))

            def definition(x=xs[(K, lay)]):
                """strata_prefill.contract.mmq.mmq of the rows of CHECKED_EXPERTS routed experts."""
                routed = np.nonzero(cnt)[0]
                picked = routed[sample_index(len(routed), CHECKED_EXPERTS)]
                sel = np.concatenate([np.arange(off[e], off[e + 1]) for e in picked])
                want = []
                for e in picked:
                    r0, r1 = int(off[e]), int(off[e + 1])
                    dec = q8_1.decode_rows(q8_1.quantize_rows(x[src[r0:r1]], lay), r1 - r0, lay)
                    g, q = divmod(int(e), GROUP)
                    w = host_bufs[g % len(host_bufs)][q * stride:(q + 1) * stride].reshape(N, -1)
                    want.append(mmq.mmq(qt, w, dec))
                return Definition(sel, np.concatenate(want).astype(np.float32))

            res = measure(clock, case, arms, args.repeats, definition)  # paced: launched as the walk does
            harness.append(res)
            for arm, (cfg, tile_rows), t_p, miss in zip(arms, settings, res.median_ms, res.differs):
                t_q = timer.time(arm.run, args.repeats, queued=True, spin_ms=6.0)
                r = {"proj": proj, "type": tname, "tokens": tokens, "rows": rows, "N": N, "K": K,
                     "config": cfg or products.default_config() or "auto", "tile_rows": tile_rows, "ms_queued": t_q,
                     "ms_paced": t_p, "tops": ops / (t_q * 1e-3) / 1e12,
                     "pct_peak": 100.0 * ops / (t_q * 1e-3) / 1e12 / peak32, "bytes": miss or "the definition"}
                results["mmq"].append(r)
                log(f"  {proj:7s} {tname:6s} cfg={cfg or 'default'} tile_rows={tile_rows}: "
                    f"{t_q:.3f} ms queued, {t_p:.3f} ms paced, {r['tops']:.1f} TOP/s "
                    f"({r['pct_peak']:.1f}% of k32 peak), bytes {'the definition' if miss is None else 'DIFFER'}")
            for out in outs:
                out.free()
        for a in acts.values():
            a.free()

    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "bench_mmq_cuda.json"), "w") as f:
            json.dump(results, f, indent=1, default=str)

    # table: best tile_rows per case and config, then best over configs
    log("")
    log(f"int8 mma.sync peak: m16n8k32 {peak32:.0f} TOP/s, m16n8k16 {peak['peak_k16']['tops']:.0f} TOP/s")
    cfgs = []
    for r in results["mmq"]:
        c = json.dumps(r["config"], sort_keys=True) if isinstance(r["config"], dict) else str(r["config"])
        r["cfg_key"] = c
        if c not in cfgs:
            cfgs.append(c)
    if len(cfgs) > 1:
        log("configs: " + "  ".join(f"[{i}] {c}" for i, c in enumerate(cfgs)))
        log(f"{'proj':8s}{'type':8s}{'tokens':>7s}" + "".join(f"{'[%d] TOP/s' % i:>12s}{'%pk':>6s}" for i in range(len(cfgs))))
        by = {}
        for r in results["mmq"]:
            k = (r["proj"], r["type"], r["tokens"], r["cfg_key"])
            if k not in by or r["ms_queued"] < by[k]["ms_queued"]:
                by[k] = r
        for k0 in dict.fromkeys((r["proj"], r["type"], r["tokens"]) for r in results["mmq"]):
            cells = ""
            for c in cfgs:
                r = by.get(k0 + (c,))
                cells += f"{r['tops']:12.1f}{r['pct_peak']:6.1f}" if r else f"{'-':>12s}{'':6s}"
            log(f"{k0[0]:8s}{k0[1]:8s}{k0[2]:7d}{cells}")
        log("")
    log(f"{'proj':8s}{'type':8s}{'tokens':>7s}{'ms q':>9s}{'ms p':>9s}{'TOP/s':>8s}{'%pk':>7s}  tile/config")
    best = {}
    for r in results["mmq"]:
        k = (r["proj"], r["type"], r["tokens"])
        if k not in best or r["ms_queued"] < best[k]["ms_queued"]:
            best[k] = r
    for r in best.values():
        log(f"{r['proj']:8s}{r['type']:8s}{r['tokens']:7d}{r['ms_queued']:9.3f}{r['ms_paced']:9.3f}"
            f"{r['tops']:8.1f}{r['pct_peak']:7.1f}  {r['tile_rows']}/{r['config']}")
    log("")
    log(markdown(harness, args.repeats))
    results["same_bytes"] = all(r.same for r in harness)
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", default="1024,8192,32768")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--cases", default="", help="e.g. gate_up:IQ2_XS,down:Q8_0")
    ap.add_argument("--configs", default="", help='extra tile configs, JSON, ";"-separated, '
                    'e.g. {"MMQ_BN": 64}')
    ap.add_argument("--out", default=os.environ.get("OUT", ""))
    args = ap.parse_args()
    if unavailable("bench_mmq_cuda"):
        return 0
    t0 = time.time()
    results = bench(args)
    log(f"(bench wall time {time.time() - t0:.0f} s)")
    return 0 if results["same_bytes"] else 1


if __name__ == "__main__":
    sys.exit(main())
