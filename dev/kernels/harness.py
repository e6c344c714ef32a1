"""What every script of dev/kernels shares: the one-line exit where no CUDA GPU is and progress
lines on stderr, the exit status after the mismatches. The report of the first differing byte is bench/ab_harness.py's
first_difference, the A/B scripts' own."""
from __future__ import annotations

import sys


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


def finish(bad: list[str]) -> int:
    """A script's exit status: 0, or 1 after the mismatches in ``bad`` on stderr."""
    if bad:
        print(f"\n{len(bad)} mismatch(es):\n" + "\n".join(bad), file=sys.stderr)
        return 1
    return 0
