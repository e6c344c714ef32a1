#!/usr/bin/env python3
"""The device's timeline of one prefill: every kernel and copy of the process (PyCUDA's too, from
CUPTI's activity records through torch.profiler), against the host's clock.

    python3 -m dev.gpu_timeline --pack P.gguf [--tokens 2048] [--trace FILE.json] [switches]

It says what the phase tables cannot: how long the prefill ran before its first GPU operation
(host work the device waits through, such as a host-side embedding), how busy the GPU was from
its first operation to its last and where it idled between them (the kernels on either side of
each gap), the GPU time by kernel, and how far ahead of the device the host launched (from a
launch call's return to its kernel's start: a few microseconds means the device waits for the
host). dev/kernel_times.py times each launch alone under Nsight Compute; this keeps the overlap
and the gaps of a real run. One warm-up prefill, then one of a fresh prompt under the profiler
(which slows the host a little). Switches go in as `--keyword value` pairs (fast/options.py).
--trace also writes the profiler's Chrome trace. Needs torch (the GPU machine has it); exit 2
where torch or the pack is missing, before any work.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
API_CATEGORIES = ("cuda_driver", "cuda_runtime")


@dataclass
class Timeline:
    """One prefill's timeline; times in microseconds."""
    wall: float                 # the prefill, on the host
    before_first: float         # from the prefill's start to the GPU's first operation
    span: float                 # the GPU's first operation's start to its last one's end
    busy: float                 # the union of the GPU operations in the span
    gaps: list = field(default_factory=list)        # (idle us, operation before, operation after)
    by_kernel: dict = field(default_factory=dict)   # name -> (us, count)
    lead: list = field(default_factory=list)        # launch call's end to its operation's start, us

    @property
    def idle(self) -> float:
        return self.span - self.busy


def summarize(events: list, start: float, wall: float) -> Timeline:
    """A Timeline of Chrome-trace events (complete "X" events with ts and dur in microseconds;
    the GPU's in GPU_CATEGORIES, the launch calls in API_CATEGORIES, tied by args.correlation),
    `start` the prefill's start on the trace's clock, `wall` its duration."""
    xs = [e for e in events if e.get("ph") == "X"]
    gpu = sorted((e for e in xs if e.get("cat") in GPU_CATEGORIES), key=lambda e: e["ts"])
    if not gpu:
        raise ValueError("the trace holds no GPU operation (did CUPTI record the process?)")
    calls = {e["args"]["correlation"]: e for e in xs
             if e.get("cat") in API_CATEGORIES and "correlation" in e.get("args", {})}
    first, busy, end, gaps = gpu[0]["ts"], 0.0, gpu[0]["ts"], []
    by_kernel = collections.defaultdict(lambda: [0.0, 0])
    for i, e in enumerate(gpu):
        s, f = e["ts"], e["ts"] + e["dur"]
        if s > end:
            gaps.append((s - end, gpu[i - 1]["name"], e["name"]))
        busy += max(0.0, f - max(s, end))
        end = max(end, f)
        by_kernel[e["name"]][0] += e["dur"]
        by_kernel[e["name"]][1] += 1
    lead = []
    for e in gpu:
        call = calls.get(e.get("args", {}).get("correlation"))
        if call is not None:
            lead.append(e["ts"] - (call["ts"] + call["dur"]))
    return Timeline(wall=wall, before_first=first - start, span=end - first, busy=busy, gaps=gaps,
                    by_kernel={k: (v[0], v[1]) for k, v in by_kernel.items()}, lead=sorted(lead))


def report(tl: Timeline, top: int = 15) -> str:
    ms = 1e-3
    out = [f"wall {tl.wall * ms:.1f} ms; first GPU operation after {tl.before_first * ms:.1f} ms; "
           f"first to last {tl.span * ms:.1f} ms, busy {tl.busy * ms:.1f} ms, idle {tl.idle * ms:.1f} ms "
           f"in {len(tl.gaps)} gaps"]
    if tl.lead:
        n = len(tl.lead)
        out.append(f"launch call to start: median {tl.lead[n // 2] * ms:.2f} ms, tenth percentile "
                   f"{tl.lead[n // 10] * ms:.2f} ms; within 20 us: {sum(1 for v in tl.lead if v < 20)} of {n}")
    pairs = collections.defaultdict(lambda: [0.0, 0])
    for g, a, b in tl.gaps:
        pairs[(a, b)][0] += g
        pairs[(a, b)][1] += 1
    out.append(f"idle by the operations around it (top {top}):")
    for (a, b), (g, n) in sorted(pairs.items(), key=lambda kv: -kv[1][0])[:top]:
        out.append(f"  {g * ms:8.2f} ms {n:5d}x  {a[:40]} -> {b[:40]}")
    out.append(f"GPU time by kernel (top {top}):")
    for name, (us, n) in sorted(tl.by_kernel.items(), key=lambda kv: -kv[1][0])[:top]:
        out.append(f"  {us * ms:8.2f} ms {n:5d}x  {name[:70]}")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pack", required=True)
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--trace", help="also write the profiler's Chrome trace here")
    p.add_argument("--top", type=int, default=15)
    args, rest = p.parse_known_args(argv)
    import numpy as np  # noqa: PLC0415

    from dev.host_profile import switches_of  # noqa: PLC0415 - the same `--keyword value` pairs
    from strata_prefill.contract.errors import StrataError  # noqa: PLC0415
    from strata_prefill.fast import make_fast_engine  # noqa: PLC0415
    from strata_prefill.formats.pack import Pack  # noqa: PLC0415
    from strata_prefill.session import Session  # noqa: PLC0415

    try:
        kw = switches_of(rest)
        pack = Pack.open(args.pack)
    except (StrataError, OSError) as e:
        print(f"gpu_timeline: {e}", file=sys.stderr)
        return 2
    try:
        import torch  # noqa: PLC0415
        from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415
    except ImportError as e:
        print(f"gpu_timeline: torch is needed (its profiler reads CUPTI): {e}", file=sys.stderr)
        return 2
    eng = make_fast_engine(pack, "cuda", **kw)
    torch.zeros(1, device="cuda")  # torch's own context first, outside the profiled prefill
    rng = np.random.default_rng(0)
    Session(eng, progress=False).prefill(rng.integers(0, pack.config.n_vocab, args.tokens))  # warm-up
    ids = rng.integers(0, pack.config.n_vocab, args.tokens)
    eng.be.reset_cache()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t = time.perf_counter()
        Session(eng, progress=False).prefill(ids)
        wall = time.perf_counter() - t
    if args.trace:
        prof.export_chrome_trace(args.trace)
        with open(args.trace) as f:
            events = json.load(f)["traceEvents"]
    else:  # read back and removed: no file left behind
        with tempfile.TemporaryDirectory() as tmp:
            prof.export_chrome_trace(os.path.join(tmp, "trace.json"))
            with open(os.path.join(tmp, "trace.json")) as f:
                events = json.load(f)["traceEvents"]
    # the profiler's own span opens the trace: the prefill started right after it
    start = min(e["ts"] for e in events if e.get("ph") == "X")
    print(f"{args.tokens} tokens, {pack.config.n_layer} layers")
    print(report(summarize(events, start, wall * 1e6), args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
