"""The PyCUDA prefill. `make_fast_engine` builds it, or says in one line why it cannot run."""
from __future__ import annotations

from strata.errors import DeviceError


def make_fast_engine(pack, group_gather=None, quant_gather=None):
    try:
        from fast.cuda.runtime import cuda_available
    except ImportError:  # the runtime module is not there: no CUDA support built in
        raise DeviceError("the fast path needs PyCUDA and an NVIDIA GPU (pip install '.[cuda]')") from None
    ok, reason = cuda_available()
    if not ok:
        raise DeviceError(f"the fast path cannot run here: {reason}")
    try:
        from fast.engine import FastEngine
    except ImportError:
        raise DeviceError("the fast path's engine is not built yet in this version") from None
    return FastEngine(pack, group_gather=group_gather, quant_gather=quant_gather)
