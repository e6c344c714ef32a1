#!/usr/bin/env python3
"""A/B of MMQ tile configurations on the dense products of the `strata` shape, interleaved in
one run: the attention projections and the shared expert, Q8_0 weights, one launch a product
as fast/engine.py launches them (products.mmq_dense).

    python3 bench/bench_dense_mmq_ab_cuda.py [--tokens 1024,8192] [--reps 7]
        [--configs '{"MMQ_WM": 8, ...};...']

Arm "auto" is the default (the automatic configuration, AUTO_CONFIGS); [i] is the i-th
configuration of --configs (mmq.cu defines, the whole set). Per (product, tokens): one untimed
call per arm, then `reps` rounds in alternating order, each timed with CUDA events (medians);
every arm's output is compared byte for byte with auto's (exit 1 if one differs). TOP/s counts
2 * N * K * T.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gguf import GGMLQuantizationType as QT  # noqa: E402

from bench.gpu_timing import interleaved, stream_device  # noqa: E402
from fast.cuda import products, runtime  # noqa: E402
from strata import q8_1, quants  # noqa: E402
from strata.constants import WEIGHT_TAIL_BYTES  # noqa: E402

#: (name, N, K) of the strata shape's dense Q8_0 products: 32 x 128 query dims, 4 x 128 key and
#: value dims, hidden 2560, shared expert width 640
PRODUCTS = (("attn_q", 4096, 2560), ("attn_k/v", 512, 2560), ("attn_output", 2560, 4096),
            ("shexp gate/up", 640, 2560), ("shexp down", 2560, 640))
QTYPE = QT.Q8_0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", default="1024,8192")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--configs", default="", help='tile configurations, JSON, ";"-separated')
    args = ap.parse_args()
    got = stream_device("bench_dense_mmq_ab_cuda")
    if got is None:
        return 0
    cuda, dev, clock = got
    configs = [None] + [json.loads(c) for c in args.configs.split(";") if c.strip()]
    names = ["auto"] + [f"[{i}]" for i in range(len(configs) - 1)]
    print(f"device: {runtime.device_name()}; arms: auto "
          + " ".join(f"[{i}] {json.dumps(c)}" for i, c in enumerate(configs[1:])), flush=True)
    rng = np.random.default_rng(2026)
    rows_out, differ = [], False
    for tokens in (int(t) for t in args.tokens.split(",")):
        acts = {}
        for name, N, K in PRODUCTS:
            if K not in acts:
                x = rng.standard_normal((tokens, K), dtype=np.float32)
                acts[K] = runtime.to_device(q8_1.pack_rows(q8_1.quantize_rows(x, q8_1.layout_for(QTYPE))), "act")
            w = quants.random_blocks(QTYPE, N * K // 32, rng).reshape(-1)
            wd = runtime.to_device(np.concatenate([w, np.zeros(WEIGHT_TAIL_BYTES, np.uint8)]), "weights")
            outs = [runtime.alloc(tokens * N * 4, "out") for _ in configs]
            fns = [(lambda o=o, c=c: products.mmq_dense(dev, QTYPE, wd, N, K, acts[K], tokens, o, config=c))
                   for o, c in zip(outs, configs)]
            times = interleaved(clock, fns, args.reps)
            cuda.Context.synchronize()
            ref = np.empty(tokens * N * 4, np.uint8)
            cuda.memcpy_dtoh(ref, outs[0])
            cells = []
            for i, o in enumerate(outs):
                got = np.empty_like(ref)
                cuda.memcpy_dtoh(got, o)
                same = np.array_equal(got, ref)
                differ |= not same
                ms = statistics.median(times[i]) * 1e3
                cells.append(f"{names[i]} {ms:7.3f} ms {2.0 * N * K * tokens / ms / 1e9:6.1f} TOP/s"
                             + ("" if same else " DIFFER"))
                rows_out.append((tokens, name, names[i], ms))
            print(f"tokens {tokens:6d} {name:14s} " + " | ".join(cells), flush=True)
            for o in outs:
                o.free()
            wd.free()
        for a in acts.values():
            a.free()
    print()
    print(f"{'tokens':>7s} " + "".join(f"{n:>10s}" for n in names) + "   (ms, every product once)")
    for tokens in dict.fromkeys(r[0] for r in rows_out):
        tot = [sum(r[3] for r in rows_out if r[0] == tokens and r[2] == n) for n in names]
        print(f"{tokens:7d} " + "".join(f"{t:10.3f}" for t in tot)
              + ("" if len(tot) < 2 else "   " + " ".join(f"{n} {100 * (t / tot[0] - 1):+.1f}%"
                                                         for n, t in zip(names[1:], tot[1:]))))
    if differ:
        print("bench_dense_mmq_ab_cuda: an arm's bytes DIFFER from auto's")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
