#!/usr/bin/env python3
"""A/B of MMQ tile configurations on the dense products of a model shape, interleaved in one
run: the attention projections and the shared expert (where the shape has one), one launch a
product as fast/engine.py launches them (products.mmq_dense).

    python3 -m bench.bench_dense_mmq_ab_cuda [--tokens 1024,8192] [--reps 7]
        [--shape strata] [--qtype Q8_0] [--configs '{"MMQ_WM": 8, ...};...']

--shape is a make-pack preset (formats/config.py PRESETS; default strata, 32 x 128 query dims,
4 x 128 key and value dims, hidden 2560, shared expert width 640); --qtype the weights' type
(default Q8_0; Q4_K for the projections of a Q4_K_M file).

Each (product, tokens) is an "mmq_dense" row of verify/cases.py (kernel_case: 2 * N * K * T
operations; the weights, the q8_1 rows and the outputs once). Arm "auto" is the default (the
automatic configuration, AUTO_CONFIGS); [i] is the i-th configuration of --configs (mmq.cu
defines, the whole set). bench/ab_harness.py runs them: one untimed call per arm, then `reps`
rounds in alternating order, each timed with CUDA events (medians); every arm's output must be
the NumPy definition (strata_prefill.contract.mmq.mmq) on a spread of rows and auto's bytes elsewhere (exit 1 if
one differs). The sum over the products per arm, then a Markdown table, print last.
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from bench.ab_harness import Arm, Definition, markdown, measure
from strata_prefill.fast.cuda import products, runtime
from bench.gpu_timing import stream_device
from strata_prefill.contract import mmq, q8_1, qformats, quants
from strata_prefill.formats.config import PRESETS
from strata_prefill.contract.constants import WEIGHT_TAIL_BYTES
from strata_prefill.verify.cases import kernel_case, sample_index

CHECKED_ROWS = 16  # rows of each product compared with the NumPy definition


def products_of(cfg) -> list[tuple[str, int, int]]:
    """(name, N, K) of a model shape's dense products: the attention projections, and the shared
    expert's where it has one."""
    out = [("attn_q", cfg.n_q, cfg.n_embd), ("attn_k/v", cfg.n_head_kv * cfg.head_dim, cfg.n_embd),
           ("attn_output", cfg.n_embd, cfg.n_q)]
    if cfg.n_ff_shexp:
        out += [("shexp gate/up", cfg.n_ff_shexp, cfg.n_embd), ("shexp down", cfg.n_embd, cfg.n_ff_shexp)]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", default="1024,8192")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--configs", default="", help='tile configurations, JSON, ";"-separated')
    ap.add_argument("--shape", default="strata", choices=sorted(PRESETS), help="a make-pack preset (default strata)")
    ap.add_argument("--qtype", default="Q8_0", help="the weights' type (default Q8_0)")
    args = ap.parse_args()
    fmt = {f.qtype.name: f for f in qformats.with_mmq_kernel()}.get(args.qtype.upper())
    if fmt is None:
        ap.error(f"--qtype {args.qtype}: not a type with an MMQ kernel ({', '.join(f.qtype.name for f in qformats.with_mmq_kernel())})")
    QTYPE = fmt.qtype
    lengths = [t.strip() for t in args.tokens.split(",")]
    if not all(t.isdigit() and int(t) > 0 for t in lengths):
        ap.error(f"--tokens must be positive integers, comma-separated, got {args.tokens!r}")
    PRODUCTS = products_of(PRESETS[args.shape])
    bad = [f"{name} ({K} values a row)" for name, _, K in PRODUCTS if K % fmt.block_values]
    if bad:
        ap.error(f"--shape {args.shape}: rows not whole {QTYPE.name} blocks: {', '.join(bad)}")
    got = stream_device("bench_dense_mmq_ab_cuda")
    if got is None:
        return 0
    cuda, dev, clock = got
    configs = [None] + [json.loads(c) for c in args.configs.split(";") if c.strip()]
    names = ["auto"] + [f"[{i}]" for i in range(len(configs) - 1)]
    print(f"device: {runtime.device_name()}; {args.shape}, {QTYPE.name}; arms: auto "
          + " ".join(f"[{i}] {json.dumps(c)}" for i, c in enumerate(configs[1:])), flush=True)
    rng = np.random.default_rng(2026)
    layout = q8_1.layout_for(QTYPE)
    results = []
    for tokens in map(int, lengths):
        acts = {}
        for name, N, K in PRODUCTS:
            if K not in acts:
                rows_ = q8_1.quantize_rows(rng.standard_normal((tokens, K), dtype=np.float32), layout)
                acts[K] = (rows_, runtime.to_device(q8_1.pack_rows(rows_), "act"))
            act_rows, act = acts[K]
            w = quants.random_blocks(QTYPE, N * K // fmt.block_values, rng).reshape(N, -1)
            wd = runtime.to_device(np.concatenate([w.reshape(-1), np.zeros(WEIGHT_TAIL_BYTES, np.uint8)]), "weights")
            outs = [runtime.alloc(tokens * N * 4, "out") for _ in configs]
            case = kernel_case("mmq_dense", f"{name.replace(' ', '_')}-T{tokens}-{N}x{K}", dict(N=N, K=K, R=tokens),
                               weight_type=QTYPE.name)

            def output(o, N=N):
                h = np.empty((tokens, N), np.float32)
                cuda.memcpy_dtoh(h, o)
                return h

            def definition(act_rows=act_rows, w=w):
                sel = sample_index(tokens, CHECKED_ROWS)
                return Definition(sel, mmq.mmq(QTYPE, w, q8_1.decode_rows(act_rows[sel], len(sel), layout)))

            arms = [Arm(n, (lambda o=o, c=c: products.mmq_dense(dev, QTYPE, wd, N=N, K=K, act=act, R=tokens, out=o,
                                                                config=c)),
                        (lambda o=o: output(o))) for n, o, c in zip(names, outs, configs)]
            res = measure(clock, case, arms, args.reps, definition)
            results.append(res)
            print(f"tokens {tokens:6d} {name:14s} " + " | ".join(
                f"{n} {ms:7.3f} ms {case.flops / ms / 1e9:6.1f} TOP/s" for n, ms in zip(names, res.median_ms))
                + ("" if res.same else " DIFFER"), flush=True)
            for o in outs:
                o.free()
            wd.free()
        for _, a in acts.values():
            a.free()
    print()
    print(f"{'tokens':>7s} " + "".join(f"{n:>10s}" for n in names) + "   (ms, every product once)")
    for tokens in dict.fromkeys(r.case.shape["R"] for r in results):
        tot = [sum(r.median_ms[i] for r in results if r.case.shape["R"] == tokens) for i in range(len(names))]
        print(f"{tokens:7d} " + "".join(f"{t:10.3f}" for t in tot)
              + ("" if len(tot) < 2 else "   " + " ".join(f"{n} {100 * (t / tot[0] - 1):+.1f}%"
                                                         for n, t in zip(names[1:], tot[1:]))))
    print()
    print(markdown(results, args.reps))
    if not all(r.same for r in results):
        print("bench_dense_mmq_ab_cuda: an arm's bytes are not the definition's")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
