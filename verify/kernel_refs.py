"""The kernel tests' NumPy expectations that are slow to compute (attention over a thousand
keys, the strata-sized products), kept in the reference cache (strata_prefill/refcache.py:
`STRATA_PREFILL_REFERENCE_CACHE=DIR` moves it, `=off` turns it off).

The cache adds the digest of contract/, formats/ and reference/ to every key; `kept` adds the source of the
test's own input builders (the functions that draw the random inputs), so an edit there misses
too. The rest of the key (shape, seed, types, scale, positions) the caller gives.
"""
from __future__ import annotations

import hashlib
import inspect
from typing import Callable

import numpy as np

from strata_prefill.verify.cases import key_of

#: expectations cheaper than this many of a row's FLOPs are computed, not kept (about half a
#: second of NumPy on one core: reading them back would save nothing)
KEEP_FLOPS = 500_000_000


def _builders_digest(builders) -> str:
    h = hashlib.sha256()
    for fn in builders:
        h.update(inspect.getsource(fn).encode())
    return h.hexdigest()


def kept(kind: str, key: dict, compute: Callable[[], dict[str, np.ndarray]], builders=()) -> dict[str, np.ndarray]:
    """compute()'s arrays, from the reference cache where they are kept (`kind` names the
    test family, "kernel-attention", ...; `builders` are the functions that make the inputs)."""
    from strata_prefill.refcache import cached_arrays

    full = {"key": key_of(key), "builders": _builders_digest(builders)}
    return cached_arrays(kind, full, compute)


def worth_keeping(case) -> bool:
    """A row whose NumPy side is slow enough to keep: many FLOPs, or a benchmarked size."""
    return case.flops >= KEEP_FLOPS or case.check is not None
