"""What every script of dev/kernels shares: the one-line exit where no CUDA GPU is and progress
lines on stderr, the v1 against v2 timer table, the exit status after the mismatches. The report of the first differing byte is bench/ab_harness.py's
first_difference, the A/B scripts' own."""
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


def v1_v2_table(head: str, sizes: list[int], timed: Callable, bad: list[str],
                rate: tuple[str, Callable[[int, float], float]] | None = None) -> None:
    """Time both versions at each size and print one table row per size: the milliseconds,
    v2/v1, and whether the bytes were the same. timed(size) gives ({"v1": ms, "v2": ms}, the
    first difference or None); a difference is printed and goes to ``bad`` (named by head, the
    size's name). rate: (unit, f(size, ms)), a column of f for each version."""
    rows = []
    for n in sizes:
        ms, diff = timed(n)
        if diff is not None:
            bad.append(f"timer {head}={n}: v2 against v1: {diff}")
            print(f"timer {head}={n}: v2 DIFFERS from v1: {diff}")
        rows.append((n, ms["v1"], ms["v2"], diff is None))
    units = [] if rate is None else [f"{f'{v} {rate[0]}':>9}" for v in ("v1", "v2")]
    print(" ".join([f"\n{head:>8}", f"{'v1 ms':>10}", f"{'v2 ms':>10}", f"{'v2/v1':>7}", *units]) + "  bytes")
    for n, a, b, same in rows:
        rates = [] if rate is None else [f"{rate[1](n, t):>9.1f}" for t in (a, b)]
        print(" ".join([f"{n:>8}", f"{a:>10.3f}", f"{b:>10.3f}", f"{b / a:>7.3f}", *rates])
              + f"  {'same' if same else 'DIFFER'}")


def finish(bad: list[str]) -> int:
    """A script's exit status: 0, or 1 after the mismatches in ``bad`` on stderr."""
    if bad:
        print(f"\n{len(bad)} mismatch(es):\n" + "\n".join(bad), file=sys.stderr)
        return 1
    return 0
