"""The one harness of the kernel A/B scripts (bench/bench_*_ab_cuda.py): arms interleaved, CUDA-event
timing after a warm-up, medians, each arm's output bytes against the NumPy definition of its
row, and a Markdown table last.

A script describes rows (strata_prefill.verify.cases.kernel_case: the op and shape of one launch, its FLOPs and
bytes counted as the table of cases counts them) and, per row, its arms (`Arm`: a name, a call
that launches, and a way to read its output back). `measure` runs them through
gpu_timing.interleaved (one untimed call of each arm, which also compiles; then `reps` rounds,
A B .. in even rounds and .. B A in odd ones, each call alone between two events on the clock's
stream) and compares each arm's output with the row's definition: `Definition.rows`, the NumPy
definition of a spread of output rows (the rest of the output must equal the first arm's: at
the sizes an A/B runs, the definition of every row would take minutes). `markdown` is the table.
"""
from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from bench.gpu_timing import interleaved, stream_device


def parser(doc: str, tokens: str, reps: int) -> argparse.ArgumentParser:
    """The command line of an A/B script: its docstring's first paragraph as the
    description, --tokens (comma-separated lengths, default `tokens`) and --reps (default
    `reps`); a script adds its own flags to it."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--tokens", default=tokens)
    ap.add_argument("--reps", type=int, default=reps)
    return ap


def start(script: str, ap: argparse.ArgumentParser, detail: str = ""):
    """An A/B script's parsed arguments and (driver, Device, clock) on a stream of its own, after
    printing the device line (`detail` appended); None where the CUDA backend is unavailable
    (gpu_timing.stream_device printed why; the script then exits 0)."""
    args = ap.parse_args()
    got = stream_device(script)
    if got is None:
        return None
    from strata_prefill.fast.cuda import runtime

    print(f"device: {runtime.device_name()} ({runtime.arch()}){detail}", flush=True)
    return args, got


@dataclass
class Arm:
    """One way of running a row: `run()` launches it; `output()` (after the launches are done)
    its output as a host array, or a dict of named outputs (an arm that runs part of a row
    gives the part it writes), None where the arm's output is not compared."""

    name: str
    run: Callable[[], object]
    output: Callable[[], np.ndarray] | None = None


@dataclass
class Definition:
    """What an arm's output must be: rows `sel` (the first axis) equal `want_rows` byte for
    byte, and every other row the first arm's bytes (named outputs: a dict of Definitions)."""

    sel: np.ndarray
    want_rows: np.ndarray


@dataclass
class Result:
    case: object  # the row (strata_prefill.verify.cases.KernelCase)
    arms: list[str]
    ms: list[list[float]]  # per arm, per rep
    differs: list[str | None] = field(default_factory=list)  # per arm: None, or the first byte that differs

    @property
    def median_ms(self) -> list[float]:
        return [statistics.median(t) for t in self.ms]

    @property
    def same(self) -> bool:
        return not any(self.differs)


def first_difference(got: np.ndarray, want: np.ndarray) -> str | None:
    """None where the two arrays hold the same bytes, else how many bytes differ and the first
    (its row of the first axis and both bytes), and where the two share a dtype, the element it
    falls in (its index in ``want``'s shape and both values with their bytes). The one
    byte-for-byte report of the A/B scripts here and of dev/kernels."""
    g = np.ascontiguousarray(got).reshape(-1).view(np.uint8)
    w = np.ascontiguousarray(want).reshape(-1).view(np.uint8)
    if g.size != w.size:
        return f"{g.size} bytes against {w.size}"
    bad = np.flatnonzero(g != w)
    if bad.size == 0:
        return None
    i = int(bad[0])
    row_bytes = max(1, w.size // max(1, np.shape(want)[0] if np.ndim(want) else 1))
    out = f"{bad.size} bytes differ; first at byte {i} (row {i // row_bytes}): got 0x{int(g[i]):02x} want 0x{int(w[i]):02x}"
    if np.ndim(want) and np.asarray(got).dtype == np.asarray(want).dtype:
        size = np.asarray(want).dtype.itemsize
        e = i // size
        at = tuple(int(x) for x in np.unravel_index(e, np.shape(want)))
        ge, we = np.ascontiguousarray(got).reshape(-1)[e], np.ascontiguousarray(want).reshape(-1)[e]
        out += (f"; element {at}: {ge.item()!r} (0x{bytes(g[e * size:(e + 1) * size][::-1]).hex()}) against "
                f"{we.item()!r} (0x{bytes(w[e * size:(e + 1) * size][::-1]).hex()})")
    return out


def check(got, first, definition) -> str | None:
    """An arm's output against the definition's rows, and (where it is not the first arm's)
    whole against the first arm's. Named outputs (dicts): each the arm gives, against the
    definition and the first arm's output of that name."""
    if isinstance(got, dict):
        misses = [f"{name}: {miss}" for name, g in got.items()
                  if (miss := check(g, None if first is None else first.get(name),
                                    None if definition is None else definition.get(name)))]
        return "; ".join(misses) or None
    if definition is not None:
        miss = first_difference(got[definition.sel], definition.want_rows)
        if miss:
            return f"against the definition (rows {definition.sel[:4].tolist()}..): {miss}"
    if first is not None:
        miss = first_difference(got, first)
        if miss:
            return f"against the first arm: {miss}"
    return None


def measure(clock, case, arms: list[Arm], reps: int, definition: Definition | None = None) -> Result:
    """Time `arms` interleaved on `clock` (`reps` rounds after one untimed call each) and
    compare their outputs (see the module docstring). `definition` may be a callable, called
    once after the timing (the NumPy side is then not timed against the GPU's warm-up)."""
    times = interleaved(clock, [a.run for a in arms], reps)
    if callable(definition):
        definition = definition()
    res = Result(case, [a.name for a in arms], [[1e3 * t for t in ts] for ts in times])
    first = None
    for a in arms:
        if a.output is None:
            res.differs.append(None)
            continue
        got = a.output()
        res.differs.append(check(got, first, definition))
        if first is None:
            first = got
    return res


def rate(case, ms: float) -> str:
    """TOP/s from the row's FLOPs, else GB/s from its bytes, at `ms` a launch."""
    if case.flops:
        return f"{case.flops / (ms * 1e-3) / 1e12:.1f} TOP/s"
    return f"{case.bytes / (ms * 1e-3) / 1e9:.0f} GB/s"


def markdown(results: list[Result], reps: int) -> str:
    """One line a row: each arm's median ms and rate, the change of the last arm against the
    first, whether every arm's bytes were the definition's."""
    n = max(len(r.arms) for r in results)
    names = results[0].arms
    lines = [f"{reps} interleaved reps, medians (CUDA events); arms: " + ", ".join(f"{i}: {a}" for i, a in enumerate(names)),
             "| row | " + " | ".join(f"arm {i} ms" for i in range(n)) + " | last vs 0 | rate per arm | bytes |",
             "|---|" + "---|" * (n + 3)]
    for r in results:
        med = r.median_ms
        change = 100.0 * (med[-1] / med[0] - 1.0)
        verdict = "definition" if r.same else "DIFFER: " + "; ".join(f"{a}: {d}" for a, d in zip(r.arms, r.differs) if d)
        lines.append(f"| {r.case.name} | " + " | ".join(f"{m:.3f}" for m in med) + f" | {change:+.1f}% | "
                     + " / ".join(rate(r.case, m) for m in med) + f" | {verdict} |")
    return "\n".join(lines)
