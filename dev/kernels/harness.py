"""What every script of dev/kernels shares: the one-line exit where no CUDA GPU is, progress
lines on stderr, and the report of the first differing float32 element."""
from __future__ import annotations

import sys

import numpy as np


def cuda_or_exit(script: str) -> None:
    """Exit 2 with one line where the CUDA backend cannot run here (script: the script's path
    from the repository root, as the line names it)."""
    from fast.cuda import runtime  # noqa: PLC0415

    ok, why = runtime.cuda_available()
    if not ok:
        print(f"{script} needs a CUDA GPU with PyCUDA: {why}", file=sys.stderr)
        sys.exit(2)


def progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def first_difference(got: np.ndarray, want: np.ndarray) -> str | None:
    """None where the two float32 arrays are the same bytes, else where and how they first differ."""
    g, w = got.reshape(-1).view(np.uint32), want.reshape(-1).view(np.uint32)
    bad = np.flatnonzero(g != w)
    if bad.size == 0:
        return None
    i = int(bad[0])
    at = tuple(int(x) for x in np.unravel_index(i, want.shape))
    return (f"{bad.size} of {w.size} floats differ; first at index {at}: "
            f"{got.reshape(-1)[i]!r} (0x{int(g[i]):08x}) against {want.reshape(-1)[i]!r} (0x{int(w[i]):08x})")
