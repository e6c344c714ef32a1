"""Both backends implement every step of fast/backend.py's protocol with its signature: the same
parameter names, kinds (positional or keyword-only) and defaults. Importing the cuda backend's
module needs neither PyCUDA nor a GPU."""
import inspect

import pytest

from strata_prefill.fast.backend import Backend
from strata_prefill.fast.cuda.backend import CudaBackend
from strata_prefill.fast.sim import SimBackend

STEPS = sorted(name for name, member in vars(Backend).items()
               if callable(member) and not name.startswith("_"))


def _shape(fn):
    """(name, kind, default) of each parameter after self (staticmethods have no self)."""
    params = list(inspect.signature(fn).parameters.values())
    if params and params[0].name == "self":
        params = params[1:]
    return [(p.name, p.kind, p.default) for p in params]


def test_the_protocol_lists_the_walks_steps():
    for step in ("copy_experts", "wait", "record", "gather", "mmq_group_gate_up", "mmq_group_down",
                 "quantize_scatter", "quantize_gather", "routing_tables", "load"):
        assert step in STEPS


@pytest.mark.parametrize("backend", [SimBackend, CudaBackend], ids=["sim", "cuda"])
@pytest.mark.parametrize("step", STEPS)
def test_backend_implements_step_with_the_protocols_signature(backend, step):
    impl = inspect.getattr_static(backend, step, None)
    assert impl is not None, f"{backend.__name__} lacks {step}"
    if isinstance(impl, (staticmethod, classmethod)):
        impl = impl.__func__
    assert _shape(impl) == _shape(getattr(Backend, step)), (
        f"{backend.__name__}.{step}{inspect.signature(impl)} differs from the protocol's "
        f"{inspect.signature(getattr(Backend, step))}")
