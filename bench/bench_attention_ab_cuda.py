#!/usr/bin/env python3
"""A/B of attention_mma.cu configurations, interleaved in one run, on the strata heads.

    python3 bench/bench_attention_ab_cuda.py [--tokens 4096,8192,32768] [--reps 5]
        [--arms '{"MMA_WARPS": 8, "MMA_EPI": 1};{"MMA_WARPS": 8, "MMA_EPI": 2}'] [--sass DIR]

An arm is a JSON object of attention_mma.cu defines; its key "variant" ("mma", the default, or
"pair") picks the prefill kernel.

One layer's int8 KV cache (32 query heads, 4 KV heads, head_dim 128) holds `tokens` random
keys and values; every position attends to the ones before it (the prefill kernel, one
launch). Per length: one untimed call per arm, then `reps` rounds in alternating order
(A B, B A, ...), each timed with CUDA events on the device's stream; medians. Every arm's
output must equal the first arm's bytes (exit 1 otherwise): a configuration changes speed,
never a bit. "pairs/ns" counts (query, key) pairs of the causal triangle times heads.

--sass DIR: also compile each arm with nvcc and write `cuobjdump -sass` of attend_mma_hd128
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
import statistics
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fast.cuda import attention as cu_att  # noqa: E402
from fast.cuda import runtime  # noqa: E402
from gpu_timing import PycudaClock, interleaved  # noqa: E402

H, HKV, HD = 32, 4, 128
DEFAULT_ARMS = '{"MMA_WARPS": 8, "MMA_EPI": 1};{"MMA_WARPS": 8, "MMA_EPI": 2};{"variant": "pair"}'


def sass_histogram(defines: dict, out_dir: str, tag: str, kernel: str = "attend_mma_hd128") -> dict | None:
    """Opcode counts of `kernel` compiled with `defines` (None without nvcc/cuobjdump)."""
    nvcc, dump = shutil.which("nvcc"), shutil.which("cuobjdump")
    if not nvcc or not dump:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "attention_mma.cu")
        with open(src, "w", encoding="utf-8") as f:
            f.write(runtime.kernel_source("attention_mma"))
        cubin = os.path.join(tmp, "a.cubin")
        cmd = [nvcc, "-cubin", f"-arch={runtime.arch()}", *runtime.NVCC_OPTIONS,
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", default="4096,8192,32768")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--arms", default=DEFAULT_ARMS, help="';'-separated JSON objects of defines")
    ap.add_argument("--sass", default=None, help="directory for the SASS dumps and histograms")
    ap.add_argument("--json", default=None, help="write every timing here")
    args = ap.parse_args()
    arms = [json.loads(a) for a in args.arms.split(";")]
    variants = [a.get("variant", "mma") for a in arms]                      # the kernel of each arm
    defines = [{k: v for k, v in a.items() if k != "variant"} for a in arms]  # and its defines
    runtime.context()
    dev = runtime.Device()
    clock = PycudaClock(dev.stream)
    print(f"device: {runtime.device_name()} ({runtime.arch()}, {runtime.multiprocessor_count()} SMs)", flush=True)
    result = {"arms": arms, "lengths": []}
    if args.sass:
        os.makedirs(args.sass, exist_ok=True)
        result["sass"] = [sass_histogram(defines[i], args.sass, f"arm{i}", f"attend_{variants[i]}_hd128")
                          for i in range(len(arms))]
    failed = False
    rows = []
    for tokens in [int(t) for t in args.tokens.split(",")]:
        rng = np.random.default_rng(tokens)
        kv = cu_att.DeviceKVCache(dev, 1, HKV, HD, capacity=tokens)
        positions = np.arange(tokens, dtype=np.int32)
        kv.write(0, positions, dev.upload(rng.standard_normal((tokens, HKV, HD), dtype=np.float32)),
                 dev.upload(rng.standard_normal((tokens, HKV, HD), dtype=np.float32)))
        q = dev.upload(rng.standard_normal((tokens, H, HD), dtype=np.float32))
        pos_dev = dev.upload(positions)
        outs = [dev.empty((tokens, H, HD), np.float32) for _ in arms]

        def run(i):
            kv.attend(0, q, positions, positions_dev=pos_dev, out=outs[i], variant=variants[i], config=defines[i])

        times = [[1e3 * t for t in ts] for ts in interleaved(clock, [lambda i=i: run(i) for i in range(len(arms))],
                                                          args.reps)]
        first = outs[0].get().view(np.uint32)
        same = [bool(np.array_equal(o.get().view(np.uint32), first)) for o in outs]
        failed |= not all(same)
        pairs = H * tokens * (tokens + 1) / 2
        med = [statistics.median(t) for t in times]
        result["lengths"].append({"tokens": tokens, "ms": times, "median_ms": med, "identical": same})
        rows.append((tokens, med, [pairs / (m * 1e6) for m in med], all(same)))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    if args.sass and result["sass"][0]:
        keys = sorted({k for h in result["sass"] for k in h}, key=lambda k: -max(h.get(k, 0) for h in result["sass"]))
        print("\nSASS opcodes of attend_mma_hd128 (static counts), per arm:")
        print("| opcode | " + " | ".join(f"arm {i}" for i in range(len(arms))) + " |")
        print("|---|" + "---|" * len(arms))
        for k in keys[:24]:
            print(f"| {k} | " + " | ".join(str(h.get(k, 0)) for h in result["sass"]) + " |")
        print("| total | " + " | ".join(str(sum(h.values())) for h in result["sass"]) + " |")
    print("\narms: " + "; ".join(f"{i}: {json.dumps(a)}" for i, a in enumerate(arms)))
    print(f"{args.reps} interleaved reps, medians (CUDA events)")
    head = " | ".join(f"arm {i} ms" for i in range(len(arms)))
    print(f"| tokens | {head} | change (last vs 0) | pairs/ns per arm | identical bytes |")
    print("|---|" + "---|" * (len(arms) + 3))
    for tokens, med, rate, same in rows:
        ch = 100.0 * (med[-1] / med[0] - 1.0)
        print(f"| {tokens} | " + " | ".join(f"{m:.3f}" for m in med) + f" | {ch:+.1f}% | "
              + " / ".join(f"{r:.1f}" for r in rate) + f" | {'yes' if same else 'NO'} |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
