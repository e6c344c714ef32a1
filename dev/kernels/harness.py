"""What every script of dev/kernels shares: the one-line exit where no CUDA GPU is and progress
lines on stderr, the versions' timer table, the exit status after the mismatches. The report of
the first differing byte is bench/ab_harness.py's first_difference, the A/B scripts' own."""
from __future__ import annotations

import sys
from typing import Callable


def cuda_or_exit(script: str) -> None:
    """Exit 2 with one line where the CUDA backend cannot run here (script: the script's path
    from the repository root, as the line names it)."""
    from strata_prefill.fast.cuda import runtime  # noqa: PLC0415

    ok, why = runtime.cuda_available()
    if not ok:
        print(f"{script} needs a CUDA GPU with PyCUDA: {why}", file=sys.stderr)
        sys.exit(2)


def progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def versions_table(head: str, sizes: list[int], timed: Callable, bad: list[str], versions: tuple[str, ...],
                   rate: tuple[str, Callable[[int, float], float]] | None = None) -> None:
    """Time every version at each size and print one table row per size: each version's
    milliseconds, each later version's time over the first's, and whether their bytes were the
    same as the first's. timed(size) gives ({version: ms}, {later version: its first difference
    from the first, or None}); a difference is printed and goes to ``bad`` (named by head, the
    size's name). rate: (unit, f(size, ms)), a column of f for each version."""
    base, later = versions[0], versions[1:]
    rows = []
    for n in sizes:
        ms, diffs = timed(n)
        for v in later:
            if diffs[v] is not None:
                bad.append(f"timer {head}={n}: {v} against {base}: {diffs[v]}")
                print(f"timer {head}={n}: {v} DIFFERS from {base}: {diffs[v]}")
        rows.append((n, ms, all(diffs[v] is None for v in later)))
    cols = ([f"{f'{v} ms':>10}" for v in versions] + [f"{f'{v}/{base}':>7}" for v in later]
            + ([] if rate is None else [f"{f'{v} {rate[0]}':>9}" for v in versions]))
    print(" ".join([f"\n{head:>8}", *cols]) + "  bytes")
    for n, ms, same in rows:
        cells = ([f"{ms[v]:>10.3f}" for v in versions] + [f"{ms[v] / ms[base]:>7.3f}" for v in later]
                 + ([] if rate is None else [f"{rate[1](n, ms[v]):>9.1f}" for v in versions]))
        print(" ".join([f"{n:>8}", *cells]) + f"  {'same' if same else 'DIFFER'}")


def finish(bad: list[str]) -> int:
    """A script's exit status: 0, or 1 after the mismatches in ``bad`` on stderr."""
    if bad:
        print(f"\n{len(bad)} mismatch(es):\n" + "\n".join(bad), file=sys.stderr)
        return 1
    return 0
