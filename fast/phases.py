"""Phase timing (STRATA_PREFILL_TIMING=1): time spent per phase of the walk.

A backend's `phase(name)` is a context manager around the launches of one phase. With timing
off it does nothing. With it on, the cuda backend records a CUDA event pair around the phase
on its stream and sums the elapsed times when asked (`phase_table()`); the sim backend sums
host time. Launch counts are always kept; timing costs two events a phase and is off by
default.
"""
from __future__ import annotations

import collections
import contextlib
import os
import time


def timing_enabled(value=None) -> bool:
    if value is not None:
        return bool(int(value))
    return os.environ.get("STRATA_PREFILL_TIMING", "0") == "1"


class HostPhases:
    """Host wall time per phase (for the sim backend)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.seconds: collections.Counter = collections.Counter()

    @contextlib.contextmanager
    def phase(self, name: str):
        if not self.enabled:
            yield
            return
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - t0

    def table(self) -> dict:
        return dict(self.seconds)

    def reset(self) -> None:
        self.seconds.clear()


def format_phase_table(seconds: dict) -> str:
    total = sum(seconds.values()) or 1.0
    lines = [f"{'phase':<20} {'ms':>10} {'share':>7}"]
    for name, s in sorted(seconds.items(), key=lambda kv: -kv[1]):
        lines.append(f"{name:<20} {s * 1e3:>10.2f} {100 * s / total:>6.1f}%")
    lines.append(f"{'total':<20} {total * 1e3:>10.2f}")
    return "\n".join(lines)
