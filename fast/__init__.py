"""The fast prefill. `make_fast_engine` builds it on a backend: `cuda` (PyCUDA, the default)
or `sim` (the same walk with NumPy kernels, for machines with no GPU), or says in one line
why it cannot run."""
from __future__ import annotations

from strata_prefill.contract.errors import DeviceError, InputError, PackError

BACKENDS = ("cuda", "sim")


def make_backend(name: str = "cuda", **sim_options):
    """The backend `name`; sim_options (schedule_seed, policy) reach the sim's scheduler."""
    if name == "sim":
        from strata_prefill.fast.sim import SimBackend

        return SimBackend(**sim_options)
    if name != "cuda":
        raise InputError(f"unknown backend {name!r} (backends: {', '.join(BACKENDS)})")
    try:
        from strata_prefill.fast.cuda.runtime import cuda_available
    except ImportError:
        raise DeviceError("the fast path's cuda backend is not part of this install") from None
    ok, reason = cuda_available()
    if not ok:
        raise DeviceError(f"the fast path's cuda backend cannot run here: {reason} "
                          "(--backend sim runs the same walk in NumPy)")
    from strata_prefill.fast.cuda.backend import CudaBackend

    return CudaBackend()


def make_fast_engine(pack, backend: str = "cuda", sim_options: dict | None = None, **engine_options):
    """A FastEngine on `backend`; engine_options are FastEngine's switches. A pack the CUDA
    kernels cannot run (contract/limits.py, or a matrix whose type has no CUDA MMQ kernel) is
    refused before the backend is made."""
    from strata_prefill.fast.engine import FastEngine

    if backend == "cuda" and (problems := pack.config.cuda_problems() + pack.cuda_type_problems()):
        raise PackError(f"{pack.path}: the cuda backend cannot run this pack: " + "; ".join(problems)
                        + " (--backend sim or --impl reference can)")

    return FastEngine(pack, make_backend(backend, **(sim_options or {})), **engine_options)
