"""dev/gpu_timeline.py's arithmetic on a made-up trace: the time before the first GPU operation,
busy and idle time (overlapping operations counted once), the gaps and what is on either side,
the GPU time by kernel and how far ahead the host launched. No GPU, no torch."""
from __future__ import annotations

import pytest

from dev import gpu_timeline, host_profile
from strata_prefill.contract.errors import InputError


def _x(name, cat, ts, dur, corr=None):
    e = {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur}
    if corr is not None:
        e["args"] = {"correlation": corr}
    return e


EVENTS = [
    _x("PyTorch Profiler (0)", "Trace", 1000.0, 900.0),
    _x("cuLaunchKernel", "cuda_driver", 1010.0, 5.0, corr=1),
    _x("cuLaunchKernel", "cuda_driver", 1020.0, 5.0, corr=2),
    _x("cuLaunchKernel", "cuda_driver", 1030.0, 5.0, corr=3),
    _x("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy", 1100.0, 50.0, corr=1),  # 100 us after the start
    _x("mmq_q4_k", "kernel", 1160.0, 200.0, corr=2),   # 10 us idle before it
    _x("mmq_q4_k", "kernel", 1300.0, 100.0, corr=3),   # overlaps the one before: 40 us more busy
    _x("rmsnorm_rows", "kernel", 1430.0, 20.0),        # 30 us idle before it; no launch call seen
    {"ph": "M", "name": "thread_name"},                # metadata: ignored
]


def test_the_summary_counts_overlap_once_and_names_each_gap():
    tl = gpu_timeline.summarize(EVENTS, start=1000.0, wall=900.0)
    assert tl.before_first == 100.0
    assert tl.span == 1450.0 - 1100.0
    assert tl.busy == 50.0 + 200.0 + 40.0 + 20.0
    assert tl.idle == tl.span - tl.busy == 40.0
    assert tl.gaps == [(10.0, "Memcpy HtoD (Pageable -> Device)", "mmq_q4_k"), (30.0, "mmq_q4_k", "rmsnorm_rows")]
    assert tl.by_kernel["mmq_q4_k"] == (300.0, 2) and tl.by_kernel["rmsnorm_rows"] == (20.0, 1)
    assert tl.lead == sorted([1100.0 - 1015.0, 1160.0 - 1025.0, 1300.0 - 1035.0])
    text = gpu_timeline.report(tl)
    assert "first GPU operation after 0.1 ms" in text and "idle 0.0 ms in 2 gaps" in text
    assert "mmq_q4_k -> rmsnorm_rows" in text and "within 20 us: 0 of 3" in text


def test_a_trace_without_gpu_operations_is_refused():
    with pytest.raises(ValueError, match="no GPU operation"):
        gpu_timeline.summarize([e for e in EVENTS if e.get("cat") not in gpu_timeline.GPU_CATEGORIES], 0.0, 1.0)


def test_switches_come_in_pairs_from_the_table():
    assert host_profile.switches_of(["--device-plan", "0", "--device-embed", "1"]) == {
        "device_plan": "0", "device_embed": "1"}
    with pytest.raises(InputError, match="pairs"):
        host_profile.switches_of(["--device-plan"])
    with pytest.raises(InputError, match="unknown switch --no-such"):
        host_profile.switches_of(["--no-such", "1"])
