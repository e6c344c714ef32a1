#!/usr/bin/env python3
"""A layer's routed-expert products, gathered in groups against read in place (the in_place
switch), on the `strata` MoE shape, with the weight-read floor beside them.

    python3 -m bench.bench_in_place_cuda [--tokens 256,1024,2048,8192] [--reps 7]
        [--configs '{"MMQ_BN": 32, ...};...'] [--skew S] [--out DIR]

512 experts of one layer lie in one device buffer as the expert cache holds them: blobs of
[gate | up | down], IQ2_XS gate/up (640 x 2560) and Q8_0 down (2560 x 640), 2.69 MB each.
Tokens pick 10 experts each, uniformly, or with --skew S weighted (rank + 1)^-S (a
skewed routing, as a randomly initialised router gives in deeper layers: a configuration that
wins on uniform routing can lose there). Arms, interleaved (gpu_timing.interleaved), each call
timed with CUDA events on the stream the launches go to and launched from Python as the walk
launches them (so the host's launch cost is in the time):

  gather     per group of 16 routed experts: one gather (gather_group.cu) into the group
             buffers, one gate/up launch (both matrices), one down launch (32 groups a layer)
  in place   one tile-list gate/up launch and one tile-list down launch for all experts
             (mmq.cu's tile-list form, reading the cache), the automatic configuration
  gate/up    the in-place arm's gate/up launch alone (its floor: the gate and up bytes)
  down       the in-place arm's down launch alone (its floor: the down bytes)
  [i]        in place with the tile configuration --configs gives as [i]

Each length is a "moe_experts" row (strata_prefill.verify.cases.kernel_case: gate and up of every routed
expert, then its down; its FLOPs and bytes), and bench/ab_harness.py runs the arms (an untimed
call each, then the reps interleaved). Every arm's gate, up and down outputs (those it writes)
must be the NumPy definition (strata_prefill.contract.mmq.mmq) on the rows of a spread of routed experts and the
gather arm's bytes elsewhere (exit 1 if not). The
floor is the bytes of the routed experts' matrices read once at the device's memory bandwidth,
measured here as a device-to-device copy of 1 GB (bytes read + written over its time). SwiGLU and the quantize of
H are left out: the same launch in both arms (the down input is a fixed q8_1 buffer).
Prints its table and then the harness's Markdown table last; with --out, writes the numbers
as JSON there.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import numpy as np

from gguf import GGMLQuantizationType as QT

from bench.ab_harness import Arm, Definition, markdown, measure
from strata_prefill.fast.cuda import products, runtime
from bench.gpu_timing import stream_device
from strata_prefill.contract import mmq, q8_1, quants
from strata_prefill.contract.constants import GROUP_TAIL_BYTES, MMQ_GROUP
from strata_prefill.verify.cases import kernel_case, sample_index

N_EXPERT, TOP_K, N_EMBD, N_FF = 512, 10, 2560, 640
GU, DOWN = QT.IQ2_XS, QT.Q8_0
CHECKED_EXPERTS = 4  # routed experts of each length whose rows are compared with the NumPy definition


def log(*a):
    print(*a, flush=True)


def copy_bandwidth(cuda, nbytes: int = 1 << 30) -> float:
    """GB/s of bytes read plus written by a device-to-device copy (median of 5)."""
    a, b = runtime.alloc(nbytes, "bandwidth src"), runtime.alloc(nbytes, "bandwidth dst")
    cuda.memcpy_dtod(b, a, nbytes)
    times = []
    for _ in range(5):
        e0, e1 = cuda.Event(), cuda.Event()
        e0.record()
        cuda.memcpy_dtod(b, a, nbytes)
        e1.record()
        e1.synchronize()
        times.append(e1.time_since(e0) / 1e3)
    a.free()
    b.free()
    return 2 * nbytes / statistics.median(times) / 1e9


def route(rng, tokens: int, skew: float) -> np.ndarray:
    """int [tokens, TOP_K]: each token's distinct experts, drawn without replacement with weights
    (rank + 1)^-skew over a random order of the experts (weighted sampling by the largest
    log(u) / w keys; skew 0 is uniform)."""
    w = (np.arange(N_EXPERT, dtype=np.float64) + 1.0) ** -float(skew)
    w = w[rng.permutation(N_EXPERT)]
    keys = np.log(rng.random((tokens, N_EXPERT))) / w
    return np.argpartition(-keys, TOP_K, axis=1)[:, :TOP_K]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", default="256,1024,2048,8192")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--configs", default="", help='extra tile configurations, JSON, ";"-separated')
    ap.add_argument("--skew", type=float, default=0.0,
                    help="routing skew S: each token's 10 distinct experts drawn with weights (rank + 1)^-S over "
                         "a random order of the experts (0: uniform, the default; about 1 to 1.5 gives the few "
                         "experts with thousands of rows and the many with a handful that a randomly initialised "
                         "router produces in deeper layers)")
    ap.add_argument("--out", default=os.environ.get("OUT", ""))
    args = ap.parse_args()

    got = stream_device("bench_in_place_cuda")
    if got is None:
        return 0
    cuda, dev, clock = got
    log(f"device: {runtime.device_name()} ({runtime.arch()}, {runtime.multiprocessor_count()} SMs)")
    bw = copy_bandwidth(cuda)
    log(f"device copy: {bw:.0f} GB/s read + written")

    rng = np.random.default_rng(2026)
    gu_b = N_FF * quants.row_bytes(GU, N_EMBD)
    d_b = N_EMBD * quants.row_bytes(DOWN, N_FF)
    blob = 2 * gu_b + d_b
    host = np.empty(N_EXPERT * blob + GROUP_TAIL_BYTES, np.uint8)
    for e in range(N_EXPERT):
        host[e * blob:e * blob + 2 * gu_b] = quants.random_blocks(GU, 2 * N_FF * N_EMBD // 256, rng).reshape(-1)
        host[e * blob + 2 * gu_b:(e + 1) * blob] = quants.random_blocks(DOWN, N_EMBD * N_FF // 32, rng).reshape(-1)
    host[N_EXPERT * blob:] = 0
    cache = runtime.to_device(host, "expert cache")  # host stays: the definition's weights
    gbuf_n, dbuf_n = products.group_buffer_bytes(MMQ_GROUP, gu_b, d_b, GROUP_TAIL_BYTES)
    gu_buf, d_buf = runtime.alloc(gbuf_n, "group gate/up"), runtime.alloc(dbuf_n, "group down")
    configs = [json.loads(c) for c in args.configs.split(";") if c.strip()]
    log(f"expert cache: {N_EXPERT} blobs of {blob / 1e6:.2f} MB; configs: "
        + ("  ".join(f"[{i}] {json.dumps(c)}" for i, c in enumerate(configs)) or "none extra"))

    results, harness = [], []
    for tokens in (int(t) for t in args.tokens.split(",")):
        ids = route(rng, tokens, args.skew)
        cnt = np.bincount(ids.reshape(-1), minlength=N_EXPERT)
        routed = cnt[cnt > 0]
        log(f"tokens {tokens}: skew {args.skew:g}, {len(routed)} experts routed, rows an expert p10 / p50 / p90 / max "
            f"{np.percentile(routed, 10):.0f} / {np.percentile(routed, 50):.0f} / {np.percentile(routed, 90):.0f} / "
            f"{routed.max()}")
        off = np.concatenate([[0], np.cumsum(cnt)[:-1]])
        rows = tokens * TOP_K
        order = np.nonzero(cnt)[0]
        bounds = np.stack([off[order], off[order] + cnt[order]], axis=1).astype(np.int32)
        groups = [order[i:i + MMQ_GROUP] for i in range(0, len(order), MMQ_GROUP)]
        gbounds = [bounds[i:i + MMQ_GROUP] for i in range(0, len(order), MMQ_GROUP)]
        gb_dev = runtime.to_device(np.concatenate(gbounds).reshape(-1), "group bounds")
        in_rows = q8_1.quantize_rows(rng.standard_normal((rows, N_EMBD), dtype=np.float32), q8_1.layout_for(GU))
        dn_rows = q8_1.quantize_rows(rng.standard_normal((rows, N_FF), dtype=np.float32), q8_1.layout_for(DOWN))
        a_in, a_dn = q8_1.pack_rows(in_rows), q8_1.pack_rows(dn_rows)
        ad_in, ad_dn = runtime.to_device(a_in, "moe input"), runtime.to_device(a_dn, "down input")
        mean = rows / len(order)

        def outputs():
            return [runtime.alloc(rows * n * 4, "out") for n in (N_FF, N_FF, N_EMBD)]

        def gather_arm(o):
            def run():
                at = 0
                for g, members in enumerate(groups):
                    n = len(members)
                    products.gather_native_group(dev, [int(cache) + int(e) * blob for e in members], gu_bytes=gu_b,
                                                 d_bytes=d_b, tail_bytes=GROUP_TAIL_BYTES, gu_buf=gu_buf, d_buf=d_buf)
                    bd = int(gb_dev) + at * 8
                    n_r = int(gbounds[g][-1, 1] - gbounds[g][0, 0])
                    products.mmq_group(dev, GU, gu_buf, w_stride=2 * gu_b, N=N_FF, K=N_EMBD, act=ad_in, R_total=rows,
                                       bounds=bd, n_exp=n, out=o[0], rows=n_r, pair=(gu_b, o[1]))
                    products.mmq_group(dev, DOWN, d_buf, w_stride=d_b, N=N_EMBD, K=N_FF, act=ad_dn, R_total=rows,
                                       bounds=bd, n_exp=n, out=o[2], rows=n_r)
                    at += n
            return run

        def in_place_arm(o, cfg, which=("gate/up", "down")):
            c = products.tile_config(mean) if cfg is None else cfg
            t = products.row_tiles(bounds, order.astype(np.int64) * blob, products.tile_rows_for(c))
            td = runtime.to_device(t, "tiles")

            def run():
                if "gate/up" in which:
                    products.mmq_tiles(dev, GU, cache, N=N_FF, K=N_EMBD, act=ad_in, R_total=rows, tiles=td,
                                       n_tiles=len(t), out=o[0], tile_rows_mean=mean, config=cfg, pair=(gu_b, o[1]))
                if "down" in which:
                    products.mmq_tiles(dev, DOWN, int(cache) + 2 * gu_b, N=N_EMBD, K=N_FF, act=ad_dn, R_total=rows,
                                       tiles=td, n_tiles=len(t), out=o[2], tile_rows_mean=mean, config=cfg)
            run.keep = td
            return run

        names = ["gather", "in place", "gate/up", "down"] + [f"[{i}]" for i in range(len(configs))]
        outs = [outputs() for _ in names]
        fns = [gather_arm(outs[0]), in_place_arm(outs[1], None), in_place_arm(outs[2], None, ("gate/up",)),
               in_place_arm(outs[3], None, ("down",))] + [in_place_arm(outs[4 + i], c) for i, c in enumerate(configs)]
        part = {"gate/up": [0, 1], "down": [2]}  # the outputs a partial arm writes
        counts = []
        for fn in fns:  # launches per call, and the first call compiles
            before = dev.counters["launches"]
            fn()
            counts.append(dev.counters["launches"] - before)
        case = kernel_case("moe_experts", f"T{tokens}-skew{args.skew:g}",
                           dict(tokens=tokens, rows=rows, experts=int(len(order)), D=N_EMBD, F=N_FF, down_type=DOWN.name),
                           weight_type=GU.name)

        def output(o, name):
            got = {}
            for j, (what, n) in enumerate((("gate", N_FF), ("up", N_FF), ("down", N_EMBD))):
                if j in part.get(name, [0, 1, 2]):
                    h = np.empty((rows, n), np.float32)
                    cuda.memcpy_dtoh(h, o[j])
                    got[what] = h
            return got

        def definition():
            """strata_prefill.contract.mmq.mmq of the rows of CHECKED_EXPERTS routed experts, from the host's blobs."""
            picked = order[sample_index(len(order), CHECKED_EXPERTS)]
            sel = np.concatenate([np.arange(off[e], off[e] + cnt[e]) for e in picked])
            want = {"gate": [], "up": [], "down": []}
            for e in picked:
                r0, r1 = int(off[e]), int(off[e] + cnt[e])
                dec_in = q8_1.decode_rows(in_rows[r0:r1], r1 - r0, q8_1.layout_for(GU))
                dec_dn = q8_1.decode_rows(dn_rows[r0:r1], r1 - r0, q8_1.layout_for(DOWN))
                base = int(e) * blob
                want["gate"].append(mmq.mmq(GU, host[base:base + gu_b].reshape(N_FF, -1), dec_in))
                want["up"].append(mmq.mmq(GU, host[base + gu_b:base + 2 * gu_b].reshape(N_FF, -1), dec_in))
                want["down"].append(mmq.mmq(DOWN, host[base + 2 * gu_b:base + blob].reshape(N_EMBD, -1), dec_dn))
            return {k: Definition(sel, np.concatenate(v).astype(np.float32)) for k, v in want.items()}

        res = measure(clock, case, [Arm(n, fn, lambda o=o, n=n: output(o, n)) for n, fn, o in zip(names, fns, outs)],
                      args.reps, definition)
        harness.append(res)
        times = [[t / 1e3 for t in ts] for ts in res.ms]
        same = [d is None for d in res.differs[1:]]
        if res.differs[0]:
            same = [False] * len(same)
            log(f"tokens {tokens}: the gather arm is not the definition: {res.differs[0]}")
        matrix_bytes = {"gate/up": 2 * gu_b, "down": d_b}
        for i, name in enumerate(names):
            ms = statistics.median(times[i]) * 1e3
            floor_ms = len(order) * matrix_bytes.get(name, blob) / (bw * 1e9) * 1e3
            r = {"tokens": tokens, "skew": args.skew, "rows_per_expert": mean, "experts": int(len(order)), "arm": name,
                 "config": None if i < 4 else configs[i - 4], "ms": ms, "launches": counts[i],
                 "floor_ms": floor_ms, "vs_floor": ms / floor_ms, "same_bytes": True if i == 0 else same[i - 1]}
            results.append(r)
            log(f"tokens {tokens:6d} {name:9s} {ms:8.3f} ms  {counts[i]:3d} launches  {ms / floor_ms:5.1f}x floor"
                f"  bytes {'identical' if r['same_bytes'] else 'DIFFER'}")
        for o in outs:
            for d in o:
                d.free()
        for d in (gb_dev, ad_in, ad_dn):
            d.free()

    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "bench_in_place_cuda.json"), "w") as f:
            json.dump({"copy_GBps": bw, "configs": configs, "results": results}, f, indent=1)
    log("")
    log(f"{'tokens':>7s}{'rows/exp':>9s}{'arm':>10s}{'ms':>9s}{'launches':>9s}{'floor ms':>9s}{'x floor':>8s}"
        f"{'vs gather':>10s}  bytes")
    base = {}
    for r in results:
        if r["arm"] == "gather":
            base[r["tokens"]] = r["ms"]
        ch = 100.0 * (r["ms"] / base[r["tokens"]] - 1.0) if r["arm"] not in ("gate/up", "down") else float("nan")
        log(f"{r['tokens']:7d}{r['rows_per_expert']:9.1f}{r['arm']:>10s}{r['ms']:9.3f}{r['launches']:9d}"
            f"{r['floor_ms']:9.3f}{r['vs_floor']:8.1f}{ch:+9.1f}%  {'same' if r['same_bytes'] else 'DIFFER'}")
    log("")
    log(markdown(harness, args.reps))
    return 0 if all(r["same_bytes"] for r in results) and all(r.same for r in harness) else 1


if __name__ == "__main__":
    sys.exit(main())
