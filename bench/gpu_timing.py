"""CUDA-event clocks for the GPU benchmarks (why events, and how pytest-benchmark is made to use
them: bench/conftest.py).

A clock's start() waits for the device to be idle and records an event on its stream; stop()
records a second event on the same stream, waits for it and returns the seconds between the
two as the GPU measured them. `EventTimer` turns a clock into the zero-argument timer
pytest-benchmark calls once before and once after each round; `measure` runs a function the
same way outside pytest-benchmark (the torch side of bench/test_bench_torch_side_cuda.py).
"""
from __future__ import annotations

import statistics

#: the counters of strata_prefill.fast.cuda.runtime.Device / the backends worth reporting per call
COUNTED = ("launches", "gathers", "waits", "events", "copies", "copy_bytes")


class PycudaClock:
    """Events on a pycuda stream (None: the legacy default stream)."""

    def __init__(self, stream=None):
        import pycuda.driver as cuda

        self.cuda, self.stream, self._start = cuda, stream, None

    def start(self) -> None:
        self.cuda.Context.synchronize()  # setup's uploads and earlier rounds are done
        self._start = self.cuda.Event()
        self._start.record(self.stream)

    def stop(self) -> float:
        end = self.cuda.Event()
        end.record(self.stream)
        end.synchronize()
        return self._start.time_till(end) / 1e3


class TorchClock:
    """Events on torch's current CUDA stream."""

    def __init__(self):
        import torch

        self.torch, self._start = torch, None

    def start(self) -> None:
        self.torch.cuda.synchronize()
        self._start = self.torch.cuda.Event(enable_timing=True)
        self._start.record()

    def stop(self) -> float:
        end = self.torch.cuda.Event(enable_timing=True)
        end.record()
        end.synchronize()
        return self._start.elapsed_time(end) / 1e3


class EventTimer:
    """pytest-benchmark's timer backed by a clock: it is called in pairs around each round and
    uses the difference, so the first call of a pair starts the clock and returns 0.0 and the
    second returns the GPU's elapsed seconds. (A timer returning seconds since one fixed base
    event would lose precision: event times are single-precision milliseconds.)"""

    __name__ = "cuda_events"  # what pytest-benchmark saves as the timer's name

    def __init__(self, clock):
        self.clock, self._running = clock, False

    def __call__(self) -> float:
        if not self._running:
            self._running = True
            self.clock.start()
            return 0.0
        self._running = False
        return self.clock.stop()


def measure(clock, fn, rounds: int, warmup_rounds: int) -> float:
    """Median seconds of fn() over `rounds` after `warmup_rounds` untimed calls."""
    for _ in range(warmup_rounds):
        fn()
    times = []
    for _ in range(rounds):
        clock.start()
        fn()
        times.append(clock.stop())
    return statistics.median(times)


def interleaved(clock, fns: list, reps: int) -> list:
    """Seconds of each fn() per rep, the arms interleaved: one untimed call of each first, then
    `reps` rounds in alternating order (0 1 .. n-1, then n-1 .. 0, ...), each call timed alone
    on `clock`. Returns times[arm][rep]."""
    for fn in fns:
        fn()
    times = [[] for _ in fns]
    for rep in range(reps):
        order = list(range(len(fns)))
        for i in (order if rep % 2 == 0 else order[::-1]):
            clock.start()
            fns[i]()
            times[i].append(clock.stop())
    return times


def per_call(counters, before: dict, calls: int) -> dict:
    """Every COUNTED counter's growth since `before`, per call (an int where it divides evenly;
    zeros kept, so a run that waited on nothing says so)."""
    out = {}
    for k in COUNTED:
        d = counters.get(k, 0) - before.get(k, 0)
        out[k] = d // calls if d % calls == 0 else round(d / calls, 2)
    return out


def unavailable(script: str) -> bool:
    """True, after one line saying why, where the CUDA backend cannot run (a GPU bench script
    then exits 0: no GPU is not a failure)."""
    from strata_prefill.fast.cuda import runtime

    ok, why = runtime.cuda_available()
    if not ok:
        print(f"{script}: CUDA backend unavailable: {why}")
    return not ok


def stream_device(script: str):
    """(pycuda driver, a runtime.Device on a stream of its own, a PycudaClock on that stream) for
    a GPU bench script, or None after printing why the CUDA backend is unavailable (the script
    then exits 0: no GPU is not a failure)."""
    from strata_prefill.fast.cuda import runtime

    if unavailable(script):
        return None
    cuda = runtime._driver()
    runtime.context()
    dev = runtime.Device(stream=cuda.Stream())
    return cuda, dev, PycudaClock(dev.stream)
