#!/usr/bin/env python3
"""A/B of the prefill attention kernels and their configurations (the kernel files' defines),
interleaved in one run, on the strata heads.

    python3 -m bench.bench_attention_ab_cuda [--tokens 4096,8192,32768] [--reps 5]
        [--arms '{"variant": "pair"};{"variant": "wgmma"}'] [--sass DIR]

An arm is a JSON object of the kernel file's defines (over its ATTEND_TILE_CONFIGS table); its
key "variant" (strata_prefill.fast.cuda.attention.ATTEND_VARIANTS; "pair", the default) picks the kernel.

One layer's KV cache (32 query heads, 4 KV heads, head_dim 128) holds `tokens` random
keys and values; every position attends to the ones before it (the prefill kernel, one
launch): an "attention" row of verify/cases.py (kernel_case; the GPU suite times it at 4K and
32K). bench/ab_harness.py runs the arms: per length one untimed call per arm, then `reps`
rounds in alternating order (A B, B A, ...), each timed with CUDA events on the device's
stream; medians. Every arm's output must be the NumPy definition (strata_prefill.contract.attention.attend over
the cache the device wrote) for a spread of queries and the first arm's bytes elsewhere (exit
1 otherwise): a configuration changes speed, never a bit. "pairs/ns" counts (query, key) pairs
of the causal triangle times heads; TOP/s the row's flops. A Markdown table prints last.

--sass DIR: also compile each arm with nvcc and write `cuobjdump -sass` of attend_<variant>_hd128
and its opcode histogram there (where the two tools exist), the static instruction mix
behind the times.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np

from bench.ab_harness import Arm, Definition, markdown, measure
from strata_prefill.fast.cuda import attention as cu_att
from strata_prefill.fast.cuda import kernel_cache, runtime
from bench.gpu_timing import stream_device
from strata_prefill.contract import attention
from strata_prefill.contract.constants import KEY_BLOCK
from strata_prefill.verify.cases import kernel_case, sample_index

H, HKV, HD = 32, 4, 128
CHECKED_QUERIES = 8  # queries of each length compared with the NumPy definition
DEFAULT_ARMS = '{"variant": "pair"};{"variant": "wgmma"};{"variant": "wgmma", "WG_GROUPS": 2}'


def sass_histogram(defines: dict, out_dir: str, tag: str, kernel: str = "attend_pair_hd128") -> dict | None:
    """Opcode counts of `kernel` (attend_<variant>_hd<HD>, of kernels/attention_<variant>.cu)
    compiled with `defines` (None without nvcc/cuobjdump)."""
    nvcc, dump = shutil.which("nvcc"), shutil.which("cuobjdump")
    if not nvcc or not dump:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        module = "attention_" + kernel.split("_")[1]  # attend_pair_hd128 -> attention_pair
        src = os.path.join(tmp, f"{module}.cu")
        with open(src, "w", encoding="utf-8") as f:
            f.write(runtime.kernel_source(module))
        cubin = os.path.join(tmp, "a.cubin")
        cmd = [nvcc, "-cubin", f"-arch={kernel_cache.target(module, runtime.arch())}", *runtime.NVCC_OPTIONS,
               *[f"-D{k}={v}" for k, v in defines.items()], src, "-o", cubin]
        subprocess.run(cmd, check=True, capture_output=True)
        text = subprocess.run([dump, "-sass", "-fun", kernel, cubin], check=True,
                              capture_output=True, text=True).stdout
    with open(os.path.join(out_dir, f"{kernel}.{tag}.sass"), "w", encoding="utf-8") as f:
        f.write(text)
    ops = collections.Counter()
    for line in text.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)", line)
        if m:
            ops[m.group(1)] += 1
    return dict(ops.most_common())


def numpy_cache(kv, tokens: int) -> attention.KVCache:
    """The NumPy cache holding the bytes the device cache's layer 0 holds."""
    cap = -(-tokens // KEY_BLOCK) * KEY_BLOCK
    ref = attention.KVCache(1, HKV, HD, capacity=cap)
    for name in ("k_codes", "k_scale", "v_codes", "v_scale"):
        dev_arr = getattr(kv, name)[0].get()
        n = min(cap, dev_arr.shape[1])
        getattr(ref, name)[0][:, :n] = dev_arr[:, :n]
    return ref


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", default="4096,8192,32768")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--arms", default=DEFAULT_ARMS, help="';'-separated JSON objects of defines")
    ap.add_argument("--sass", default=None, help="directory for the SASS dumps and histograms")
    ap.add_argument("--json", default=None, help="write every timing here")
    args = ap.parse_args()
    arms = [json.loads(a) for a in args.arms.split(";")]
    variants = [a.get("variant", "pair") for a in arms]                     # the kernel of each arm
    defines = [{k: v for k, v in a.items() if k != "variant"} for a in arms]  # and its defines
    got = stream_device("bench_attention_ab_cuda")
    if got is None:
        return 0
    _cuda, dev, clock = got
    print(f"device: {runtime.device_name()} ({runtime.arch()}, {runtime.multiprocessor_count()} SMs)", flush=True)
    runs = [cu_att.variant_runs_here(v) for v in variants]
    for a, ok in zip(arms, runs):
        if not ok:
            print(f"left out: arm {json.dumps(a)}, whose kernel does not run on {runtime.arch()}", flush=True)
    arms, variants, defines = ([x for x, ok in zip(xs, runs) if ok] for xs in (arms, variants, defines))
    if not arms:
        print("no arm runs on this card", file=sys.stderr)
        return 1
    result = {"arms": arms, "lengths": []}
    if args.sass:
        os.makedirs(args.sass, exist_ok=True)
        result["sass"] = [sass_histogram(defines[i], args.sass, f"arm{i}", f"attend_{variants[i]}_hd128")
                          for i in range(len(arms))]
    failed = False
    rows, results = [], []
    for tokens in [int(t) for t in args.tokens.split(",")]:
        case = kernel_case("attention", f"prefill-{tokens}-gqa8-hd128",
                           dict(n_head=H, n_kv=HKV, hd=HD, positions=range(0, tokens), start=0, scale=1.0))
        rng = np.random.default_rng(tokens)
        kv = cu_att.DeviceKVCache(dev, 1, HKV, HD, capacity=tokens)
        positions = np.arange(tokens, dtype=np.int32)
        kv.write(0, positions, dev.upload(rng.standard_normal((tokens, HKV, HD), dtype=np.float32)),
                 dev.upload(rng.standard_normal((tokens, HKV, HD), dtype=np.float32)))
        q_host = rng.standard_normal((tokens, H, HD), dtype=np.float32)
        q = dev.upload(q_host)
        pos_dev = dev.upload(positions)
        outs = [dev.empty((tokens, H, HD), np.float32) for _ in arms]

        def run(i):
            kv.attend(0, q, positions, positions_dev=pos_dev, out=outs[i], variant=variants[i], config=defines[i])

        def definition():
            sel = sample_index(tokens, CHECKED_QUERIES)
            return Definition(sel, attention.attend(numpy_cache(kv, tokens), 0, q_host[sel], positions[sel]))

        res = measure(clock, case, [Arm(f"arm {i}", lambda i=i: run(i), outs[i].get) for i in range(len(arms))],
                      args.reps, definition)
        results.append(res)
        same = [d is None for d in res.differs]
        failed |= not all(same)
        pairs = H * tokens * (tokens + 1) / 2
        med = res.median_ms
        result["lengths"].append({"tokens": tokens, "ms": res.ms, "median_ms": med, "identical": same,
                                  "differs": res.differs})
        rows.append((tokens, med, [pairs / (m * 1e6) for m in med], all(same)))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    if args.sass and result["sass"][0]:
        keys = sorted({k for h in result["sass"] for k in h}, key=lambda k: -max(h.get(k, 0) for h in result["sass"]))
        print("\nSASS opcodes of attend_pair_hd128 (static counts), per arm:")
        print("| opcode | " + " | ".join(f"arm {i}" for i in range(len(arms))) + " |")
        print("|---|" + "---|" * len(arms))
        for k in keys[:24]:
            print(f"| {k} | " + " | ".join(str(h.get(k, 0)) for h in result["sass"]) + " |")
        print("| total | " + " | ".join(str(sum(h.values())) for h in result["sass"]) + " |")
    print("\narms: " + "; ".join(f"{i}: {json.dumps(a)}" for i, a in enumerate(arms)))
    for tokens, med, rate, same in rows:
        print(f"tokens {tokens}: pairs/ns per arm " + " / ".join(f"{r:.1f}" for r in rate)
              + f", bytes {'the definition' if same else 'DIFFER'}")
    print(markdown(results, args.reps))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
