"""The fast prefill. `make_fast_engine` builds it on a backend: `cuda` (PyCUDA, the default)
or `sim` (the same walk with NumPy kernels, for machines with no GPU), or says in one line
why it cannot run."""
from __future__ import annotations

from strata.errors import DeviceError, InputError

BACKENDS = ("cuda", "sim")


def make_backend(name: str = "cuda"):
    if name == "sim":
        from fast.sim import SimBackend

        return SimBackend()
    if name != "cuda":
        raise InputError(f"unknown backend {name!r} (backends: {', '.join(BACKENDS)})")
    try:
        from fast.cuda.runtime import cuda_available
    except ImportError:
        raise DeviceError("the fast path's cuda backend is not part of this install") from None
    ok, reason = cuda_available()
    if not ok:
        raise DeviceError(f"the fast path's cuda backend cannot run here: {reason} "
                          "(--backend sim runs the same walk in NumPy)")
    from fast.cuda.backend import CudaBackend

    return CudaBackend()


def make_fast_engine(pack, backend: str = "cuda", group_gather=None, quant_gather=None, **kw):
    from fast.engine import FastEngine

    return FastEngine(pack, make_backend(backend), group_gather=group_gather, quant_gather=quant_gather, **kw)
