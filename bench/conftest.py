"""Fixtures and hooks of the benchmark suites (`pytest bench/`; the repo's default testpaths
leave bench/ out, so a plain `pytest` never runs them).

GPU suites carry `pytestmark = pytest.mark.gpu`; without a usable GPU every such test is
skipped with "cuda backend unavailable: <reason>" (strata_prefill.fast.cuda.runtime.cuda_available()), and
nothing touches PyCUDA. With one, the GPU's name, SM count and clocks go into the machine info
pytest-benchmark saves (`--benchmark-autosave`) and compares (`--benchmark-compare` warns when
they differ).

How GPU time is measured. pytest-benchmark 5.2 times a round by calling its timer before and
after the function and keeping the difference; pedantic mode does no calibration, runs
`warmup_rounds` untimed rounds first, and calls `setup` outside the timed span. The
`gpu_benchmark` fixture runs pedantic mode with an `EventTimer` (bench/gpu_timing.py) installed
as that timer: the call before a round waits for the device to be idle and records a CUDA event
on the stream the work goes to, the call after records a second event there and waits for it,
and the round's time is the GPU's elapsed time between the two. This is the honest choice over
timing with the host clock around a synchronizing function: no host synchronization latency
is counted, while the host's launch time still is wherever the GPU waits for the next launch
(a walk pays that too). The timer is installed by setting the fixture's `_timer` attribute,
the one place pytest-benchmark reads it from (its --benchmark-timer option is one timer for
the whole session); it is saved under the name "cuda_events". Stats are per call, in seconds.

extra_info of every GPU benchmark: its shape (tokens, rows, chunk, ...), the launches, gathers,
waits, events and copies one call makes (counters of the Device or engine), bytes moved, and
TOP/s or GB/s from the median. A kernel suite times rows of verify/cases.py (`KERNEL_CASES`
marked `timed`: the shapes timed are the shapes `pytest verify/` checks) and passes the row:
its id, shape, weight type, form and configuration go into extra_info, and TOP/s and GB/s come
from the row's own `flops` and `bytes` (one call of the benchmarked function runs the row once).
"""
from __future__ import annotations

import pytest

from bench.gpu_timing import EventTimer, PycudaClock, per_call

_RATIOS = pytest.StashKey[list]()
_cuda = {}


def cuda_state() -> tuple[bool, str]:
    """strata_prefill.fast.cuda.runtime.cuda_available(), asked once."""
    if not _cuda:
        from strata_prefill.fast.cuda.runtime import cuda_available

        _cuda["state"] = cuda_available()
    return _cuda["state"]


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: a benchmark that needs the cuda backend")
    config.stash[_RATIOS] = []


def pytest_collection_modifyitems(config, items):
    gpu_items = [it for it in items if it.get_closest_marker("gpu")]
    if not gpu_items:
        return
    ok, why = cuda_state()
    if not ok:
        skip = pytest.mark.skip(reason=f"cuda backend unavailable: {why}")
        for it in gpu_items:
            it.add_marker(skip)


def pytest_benchmark_update_machine_info(config, machine_info):
    ok, _ = cuda_state()
    if not ok:
        return
    from strata_prefill.fast.cuda import runtime

    cuda = runtime._driver()
    dev = runtime.context().get_device()
    attr = cuda.device_attribute

    def get(name):  # some attributes are deprecated in newer drivers: leave them out then
        try:
            return int(dev.get_attribute(getattr(attr, name)))
        except Exception:  # noqa: BLE001
            return None

    info = {"name": dev.name(), "arch": runtime.arch(), "sm_count": get("MULTIPROCESSOR_COUNT"),
            "clock_rate_khz": get("CLOCK_RATE"), "memory_clock_khz": get("MEMORY_CLOCK_RATE"),
            "memory_bus_bits": get("GLOBAL_MEMORY_BUS_WIDTH"), "total_memory": dev.total_memory(),
            "driver": cuda.get_driver_version()}
    machine_info["gpu"] = {k: v for k, v in info.items() if v is not None}


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    rows = config.stash.get(_RATIOS, [])
    if rows:
        terminalreporter.section("ours vs torch (median seconds; ratio = ours / torch)")
        for name, ours, theirs in rows:
            terminalreporter.write_line(f"{name:60s} ours {ours * 1e3:9.3f} ms  torch {theirs * 1e3:9.3f} ms"
                                        f"  ratio {ours / theirs:6.2f}")


@pytest.fixture(scope="session")
def cuda_device():
    """A strata_prefill.fast.cuda.runtime.Device on its own stream (launch counters, memory pool)."""
    from strata_prefill.fast.cuda import runtime

    runtime.context()
    import pycuda.driver as cuda

    return runtime.Device(stream=cuda.Stream())


@pytest.fixture
def attention_case(cuda_device):
    """attention_case(tokens) -> (attend, ops): one layer's KV cache holding `tokens` random
    keys and values of the strata heads (written now, untimed), and attend() running every
    position's causal attention over it; ops counts the two products over the causal triangle,
    4 * heads * head_dim * T * (T + 1) / 2. shape: a kernel row's shape (its heads; the strata
    heads where None)."""
    import numpy as np

    from strata_prefill.fast.cuda.attention import DeviceKVCache
    from bench.gpu_shapes import STRATA

    dev = cuda_device

    def make(tokens: int, shape=None):
        H, HKV, HD = ((STRATA.n_head, STRATA.n_head_kv, STRATA.head_dim) if shape is None
                      else (shape["n_head"], shape["n_kv"], shape["hd"]))
        rng = np.random.default_rng(tokens)
        kv = DeviceKVCache(dev, 1, HKV, HD, capacity=tokens)
        positions = np.arange(tokens, dtype=np.int32)
        kv.write(0, positions, dev.upload(rng.standard_normal((tokens, HKV, HD), dtype=np.float32)),
                 dev.upload(rng.standard_normal((tokens, HKV, HD), dtype=np.float32)))
        q = dev.upload(rng.standard_normal((tokens, H, HD), dtype=np.float32))
        pos_dev, out = dev.upload(positions), dev.empty((tokens, H, HD), np.float32)

        def attend():
            kv.attend(0, q, positions, positions_dev=pos_dev, out=out)

        return attend, 4 * H * HD * tokens * (tokens + 1) // 2

    return make


def row_info(case) -> dict:
    """What a kernel row puts into extra_info (JSON values: ranges and tuples as lists)."""
    from strata_prefill.verify.cases import key_of

    info = {"row": case.id, "op": case.op, "shape": key_of(case.shape)}
    for name in ("weight_type", "form", "config"):
        if getattr(case, name) is not None:
            info[name] = key_of(getattr(case, name))
    return info


@pytest.fixture
def gpu_benchmark(benchmark):
    """run(fn, stream=..., counters=..., rounds=5, warmup_rounds=1, setup=None, ops=None,
    nbytes=None, case=None, **info) -> median seconds (None under --benchmark-disable): fn timed
    with CUDA events on `stream` in pedantic mode; `counters` (a Counter the work increments)
    gives the per-call launches etc.; ops gives TOP/s, nbytes GB/s; info goes into extra_info.
    case: the kernel row fn runs (verify/cases.py): ops and nbytes are its flops and bytes
    (where it counts them) unless given, and row_info(case) goes into extra_info."""

    def run(fn, *, stream, counters=None, rounds=5, warmup_rounds=1, setup=None, ops=None, nbytes=None,
            case=None, **info):
        if case is not None:
            ops = ops if ops is not None else (case.flops or None)
            nbytes = nbytes if nbytes is not None else (case.bytes or None)
            info = {**row_info(case), **info}
        benchmark._timer = EventTimer(PycudaClock(stream))
        before = dict(counters or {})
        benchmark.pedantic(fn, setup=setup, rounds=rounds, warmup_rounds=warmup_rounds, iterations=1)
        extra = benchmark.extra_info
        extra.update(info)
        if counters is not None:
            extra.update(per_call(counters, before, rounds + warmup_rounds))
        if benchmark.stats is None:
            return None
        median = benchmark.stats.stats.median
        if ops:
            extra["ops"] = ops
            extra["TOP/s"] = ops / median / 1e12
        if nbytes:
            extra["bytes"] = nbytes
            extra["GB/s"] = nbytes / median / 1e9
        return median

    return run


@pytest.fixture
def torch_ratio(request, benchmark):
    """record(ours_s, torch_s, **info): torch's median, the ratio and info into extra_info, and a
    line in the table printed at the end of the run."""

    def record(ours, theirs, **info):
        benchmark.extra_info.update(info)
        benchmark.extra_info["torch_median_s"] = theirs
        if ours is not None:
            benchmark.extra_info["ratio_vs_torch"] = ours / theirs
            request.config.stash[_RATIOS].append((request.node.name, ours, theirs))

    return record
