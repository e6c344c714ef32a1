"""The cuda backend's stress mode (``STRATA_PREFILL_STRESS=SEED``): seeded spins that make copies
land late and the two streams interleave in orders normal timing never shows.

On the real GPU a missing event wait rarely gives a wrong byte: a copy of one expert takes
microseconds and the host enqueues slowly, so a gather that forgot to wait for its copy, or a
copy that forgot to wait for its slot's release, finds the right bytes anyway. The sim checks
the walk's schedule (fast/sim_streams.py) but not the cuda backend's own host-side
synchronisation (the routing counts read back into page-locked memory, fast/cuda/backend.py).
With the variable set to an integer seed, the backend enqueues a spin (kernels/spin.cu: one
thread busy-waiting clock64() cycles)

  - before each copy: on the copy stream after the copy's waits (so a copy lands that much
    later than its slot's release allowed: fast/cuda/tiers.py), and on the compute stream
    before the routing counts' copy to the host;
  - before a seeded random share of the compute stream's launches (runtime.Device.launch);

each lasting a seeded random time (by default 0-200 us, a quarter of the launches). Each spin
counts as ``stress_spins`` in the backend's counters. The bytes must not change: every order
the spins force is one the events allow, so a run that differs under it has a race
(verify/test_stress_cuda.py plants some and shows each turns into wrong bytes). Off (unset or
empty), nothing is enqueued: the hooks cost one attribute test.

``enabled(seed, ...)`` sets a configuration (other durations and shares too: the planted-race
tests' long spins) for the backends made inside it, over the variable; ``enabled(None)`` turns
the mode off there. The schedule of spins is a pure function of the configuration
(:class:`Schedule`, :func:`plan`); the order the device then runs things in is not.
"""
from __future__ import annotations

import contextlib
import os
import random
from dataclasses import dataclass

from strata_prefill.contract.errors import InputError

from strata_prefill.fast.cuda import runtime

__all__ = ["ENV", "Config", "Schedule", "Stress", "plan", "current", "enabled"]

ENV = "STRATA_PREFILL_STRESS"


@dataclass(frozen=True)
class Config:
    """A stress mode: its seed, the range of a copy's spin and of a compute spin (microseconds,
    uniform), and the share of compute launches a spin goes before."""

    seed: int
    copy_us: tuple[float, float] = (0.0, 200.0)
    compute_us: tuple[float, float] = (0.0, 200.0)
    compute_share: float = 0.25

    def __post_init__(self):
        for what, (lo, hi) in (("copy_us", self.copy_us), ("compute_us", self.compute_us)):
            if not 0 <= lo <= hi:
                raise InputError(f"stress {what} must be a range 0 <= lo <= hi, got {(lo, hi)}")
        if not 0 <= self.compute_share <= 1:
            raise InputError(f"stress compute_share must be in [0, 1], got {self.compute_share}")


class Schedule:
    """The seeded spins, in the order they are asked for: one random sequence for copies and
    one for compute launches, so the number of launches never shifts the copies' spins."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self._copy = random.Random(2 * int(cfg.seed))
        self._compute = random.Random(2 * int(cfg.seed) + 1)

    def copy_us(self) -> float:
        """The spin before the next copy (microseconds; 0: none)."""
        return self._copy.uniform(*self.cfg.copy_us)

    def compute_us(self) -> float:
        """The spin before the next compute launch (0: none)."""
        if self._compute.random() >= self.cfg.compute_share:
            return 0.0
        return self._compute.uniform(*self.cfg.compute_us)


def plan(cfg: Config, copies: int, launches: int) -> tuple[list[float], list[float]]:
    """The spins (microseconds) the first ``copies`` copies and ``launches`` compute launches of
    a backend in this configuration get."""
    s = Schedule(cfg)
    return [s.copy_us() for _ in range(copies)], [s.compute_us() for _ in range(launches)]


class Stress:
    """One backend's spins: ``before_copy(stream)`` and ``before_launch(stream)`` enqueue the
    schedule's next spin on that stream and count it in ``counters["stress_spins"]``.
    ``launch(stream, cycles)`` enqueues one spin (None: the spin kernel, loaded on first use);
    ``clock_khz`` turns microseconds into cycles (None: the device's clock rate)."""

    def __init__(self, cfg: Config, counters, launch=None, clock_khz: int | None = None):
        self.cfg = cfg
        self.schedule = Schedule(cfg)
        self.counters = counters
        self._launch = launch
        self._khz = clock_khz

    def prepare(self) -> "Stress":
        """Load the spin kernel and read the clock rate now (the backend calls it when it is
        made), so that no module load or attribute query happens in the middle of a run."""
        if self._launch is None:
            self._launch = _spin_kernel()
        self.cycles(0.0)
        return self

    def cycles(self, us: float) -> int:
        if self._khz is None:
            self._khz = runtime.clock_rate_khz()
        return int(round(us * self._khz / 1000.0))

    def spin(self, stream, us: float) -> None:
        n = self.cycles(us) if us > 0 else 0
        if n <= 0:
            return
        if self._launch is None:
            self._launch = _spin_kernel()
        self._launch(stream, n)
        self.counters["stress_spins"] += 1

    def before_copy(self, stream) -> None:
        self.spin(stream, self.schedule.copy_us())

    def before_launch(self, stream) -> None:
        self.spin(stream, self.schedule.compute_us())


def _spin_kernel():
    """(stream, cycles) -> None: kernels/spin.cu on one thread, queued on the stream by
    runtime.enqueue, not Device.launch: a spin is no launch of the walk's, and never spins itself."""
    f = runtime.function("spin", "spin", "q")

    def launch(stream, cycles: int) -> None:
        runtime.enqueue(f, (1, 1, 1), (1, 1, 1), stream, int(cycles))

    return launch


_override: list = []  # the configurations enabled() set, innermost last


def _from_env() -> Config | None:
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return None
    try:
        seed = int(raw)
    except ValueError:
        raise InputError(f"{ENV} must be an integer seed, got {raw!r}") from None
    return Config(seed)


def current() -> Config | None:
    """The stress mode a backend made now runs under: the innermost enabled()'s, else the
    variable's (a bad value: a one-line InputError), else None."""
    if _override:
        return _override[-1]
    return _from_env()


@contextlib.contextmanager
def enabled(seed: int | None = 0, **options):
    """Backends made inside run the stress mode with ``seed`` and Config's ``options``
    (copy_us, compute_us, compute_share); seed None: off, whatever the variable says. Yields
    the Config (or None)."""
    cfg = None if seed is None else Config(int(seed), **options)
    _override.append(cfg)
    try:
        yield cfg
    finally:
        _override.pop()
