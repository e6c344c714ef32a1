#!/usr/bin/env python3
"""A layer's in-place gate/up products for each weight type, side by side: time per weight byte
against IQ2_XS's, on the `strata` MoE shape.

    python3 -m bench.bench_types_cuda [--tokens 1024,8192] [--reps 7]
        [--types IQ2_XS,IQ4_NL,...] [--out DIR]

For every type (default: every registered type with a CUDA MMQ kernel whose block divides the
rows), 512 experts' gate and up matrices (640 x 2560 each, random valid blocks) lie in one
device buffer as the expert cache holds them, and one tile-list launch multiplies the routed
experts' rows in place (mmq.cu's tile-list form, the automatic configuration): the in-place
arm's gate/up launch of bench/bench_in_place_cuda.py, for each type instead of IQ2_XS alone.
Tokens pick 10 experts each, uniformly; every type sees the same routing and the same
activations. The types are timed interleaved (gpu_timing.interleaved: one untimed call each,
which also compiles, then the reps in alternating order, CUDA events around each call), and
each type's gate and up outputs for the rows of a spread of routed experts must equal the NumPy
definition (strata_prefill.contract.mmq.mmq) byte for byte (exit 1 if not).

Per type: the median time, the bytes of the routed experts' gate and up matrices, the time per
weight byte against IQ2_XS's (1.00 = the same), and TOP/s (2 * rows * 2 * 640 * 2560 / time).
With --out, writes the numbers as JSON there.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import numpy as np

from gguf import GGMLQuantizationType as QT

from bench.ab_harness import first_difference
from strata_prefill.fast.cuda import products, runtime
from bench.gpu_timing import interleaved, stream_device
from strata_prefill.contract import mmq, q8_1, qformats, quants
from strata_prefill.contract.constants import GROUP_TAIL_BYTES
from strata_prefill.verify.cases import sample_index

N_EXPERT, TOP_K, N_EMBD, N_FF = 512, 10, 2560, 640
BASE = QT.IQ2_XS  # the type every other's time per byte is compared with
CHECKED_EXPERTS = 4


def log(*a):
    print(*a, flush=True)


def default_types() -> list[QT]:
    return [f.qtype for f in qformats.with_mmq_kernel() if N_EMBD % f.block_values == 0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", default="1024,8192")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--types", default="", help="comma-separated type names (default: every type with an MMQ kernel)")
    ap.add_argument("--out", default=os.environ.get("OUT", ""))
    args = ap.parse_args()
    try:
        types = [QT[t.strip().upper()] for t in args.types.split(",") if t.strip()] or default_types()
        tokens_list = [int(t) for t in args.tokens.split(",")]
    except (KeyError, ValueError) as e:
        ap.error(f"bad --types or --tokens: {e}")
    for t in types:
        f = qformats.lookup(t)
        if f is None or f.mmq_kernel is None or N_EMBD % f.block_values:
            ap.error(f"{t.name} has no CUDA MMQ kernel or its block does not divide {N_EMBD}")
    if BASE not in types:
        types.insert(0, BASE)
    if args.reps < 1 or any(t < 1 for t in tokens_list):
        ap.error("--reps and every --tokens value must be positive")

    got = stream_device("bench_types_cuda")
    if got is None:
        return 0
    cuda, dev, clock = got
    log(f"device: {runtime.device_name()} ({runtime.arch()}, {runtime.multiprocessor_count()} SMs)")
    rng = np.random.default_rng(2026)
    caches, hosts, mbytes = {}, {}, {}
    for t in types:
        mb = N_FF * quants.row_bytes(t, N_EMBD)  # one matrix
        host = np.empty(N_EXPERT * 2 * mb + GROUP_TAIL_BYTES, np.uint8)
        vals = quants.block_size(t)[0]
        host[:N_EXPERT * 2 * mb] = quants.random_blocks(t, N_EXPERT * 2 * N_FF * N_EMBD // vals, rng).reshape(-1)
        host[N_EXPERT * 2 * mb:] = 0
        caches[t], hosts[t], mbytes[t] = runtime.to_device(host, f"{t.name} experts"), host, mb
        log(f"{t.name}: {N_EXPERT} experts of gate + up, {2 * mb / 1e6:.3f} MB each")

    results, bad = [], 0
    for tokens in tokens_list:
        ids = rng.permuted(np.tile(np.arange(N_EXPERT), (tokens, 1)), axis=1)[:, :TOP_K]
        cnt = np.bincount(ids.reshape(-1), minlength=N_EXPERT)
        off = np.concatenate([[0], np.cumsum(cnt)[:-1]])
        order = np.nonzero(cnt)[0]
        bounds = np.stack([off[order], off[order] + cnt[order]], axis=1).astype(np.int32)
        rows, mean = tokens * TOP_K, tokens * TOP_K / len(order)
        x = rng.standard_normal((rows, N_EMBD), dtype=np.float32)
        acts, fns, outs, keep = {}, [], [], []
        for t in types:
            lay = q8_1.layout_for(t)
            if lay not in acts:
                q = q8_1.quantize_rows(x, lay)
                acts[lay] = (q, runtime.to_device(q8_1.pack_rows(q), "moe input"))
            cfg = products.tile_config(mean)
            tl = products.row_tiles(bounds, order.astype(np.int64) * 2 * mbytes[t], products.tile_rows_for(cfg))
            td = runtime.to_device(tl, "tiles")
            o = [runtime.alloc(rows * N_FF * 4, "gate"), runtime.alloc(rows * N_FF * 4, "up")]

            def run(t=t, td=td, n=len(tl), o=o, a=acts[lay][1]):
                products.mmq_tiles(dev, t, caches[t], N=N_FF, K=N_EMBD, act=a, R_total=rows, tiles=td, n_tiles=n,
                                   out=o[0], tile_rows_mean=mean, config=None, pair=(mbytes[t], o[1]))
            fns.append(run)
            outs.append(o)
            keep.append(td)
        times = interleaved(clock, fns, args.reps)
        picked = order[sample_index(len(order), CHECKED_EXPERTS)]
        sel = np.concatenate([np.arange(off[e], off[e] + cnt[e]) for e in picked])
        base_per_byte = None
        for t, ts, o in zip(types, times, outs):
            mb, host = mbytes[t], hosts[t]
            lay = q8_1.layout_for(t)
            miss = []
            for j, what in enumerate(("gate", "up")):
                h = np.empty((rows, N_FF), np.float32)
                cuda.memcpy_dtoh(h, o[j])
                want = []
                for e in picked:
                    r0, r1 = int(off[e]), int(off[e] + cnt[e])
                    dec = q8_1.decode_rows(acts[lay][0][r0:r1], r1 - r0, lay)
                    w = host[(2 * int(e) + j) * mb:(2 * int(e) + j + 1) * mb].reshape(N_FF, -1)
                    want.append(mmq.mmq(t, w, dec))
                d = first_difference(h[sel], np.concatenate(want).astype(np.float32))
                if d:
                    miss.append(f"{what}: {d}")
            ms = statistics.median(ts) * 1e3
            wbytes = len(order) * 2 * mb
            per_byte = ms / wbytes
            if t == BASE:
                base_per_byte = per_byte
            r = {"tokens": tokens, "type": t.name, "ms": ms, "weight_bytes": wbytes, "experts": int(len(order)),
                 "tops": 2 * rows * 2 * N_FF * N_EMBD / (ms / 1e3) / 1e12, "same_bytes": not miss,
                 "ms_per_GB": per_byte * 1e9}
            results.append(r)
            bad += bool(miss)
            log(f"tokens {tokens:6d} {t.name:8s} {ms:8.3f} ms {r['tops']:6.1f} TOP/s  "
                f"{'bytes identical' if not miss else 'DIFFER: ' + '; '.join(miss)}")
        for r in results:
            if r["tokens"] == tokens:
                r["per_byte_vs_base"] = r["ms_per_GB"] / (base_per_byte * 1e9)
        for o in outs:
            for d in o:
                d.free()
        for _, dq in acts.values():
            dq.free()
        for td in keep:
            td.free()

    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "bench_types_cuda.json"), "w") as f:
            json.dump({"device": runtime.device_name(), "results": results}, f, indent=1)
    log("")
    log(f"| tokens | type | gate/up ms | weight MB | ms per GB | per byte vs {BASE.name} | TOP/s | bytes |")
    log("|---:|---|---:|---:|---:|---:|---:|---|")
    for r in results:
        log(f"| {r['tokens']} | {r['type']} | {r['ms']:.3f} | {r['weight_bytes'] / 1e6:.1f} | {r['ms_per_GB']:.3f} | "
            f"{r['per_byte_vs_base']:.2f}x | {r['tops']:.0f} | {'identical' if r['same_bytes'] else 'DIFFER'} |")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
