"""A dropped fast engine is freed by reference counting, where it is dropped: its graph holds no
reference cycle. A cycle waits for the cyclic collector, which runs on whichever thread happens
to allocate (the reference's NumPy pool, a pack's embedding threads); PyCUDA cannot make the
context current there, so a cuda engine's device buffers, streams and events leak with a
"... in out-of-thread context could not be cleaned up" warning."""
from __future__ import annotations

import contextlib
import gc
import sys
import types
import weakref

import numpy as np
import pytest


@contextlib.contextmanager
def _no_cyclic_collector():
    """The cyclic collector held off inside: only reference counting frees anything."""
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@pytest.mark.parametrize("options", [
    {},  # every expert resident: the walk planned on the device (DeviceBatch tiles kept by the backend)
    dict(expert_cache=10, ring=8, stream_min=1),  # streamed through the ring
], ids=["resident", "streamed"])
def test_a_dropped_sim_engine_is_freed_without_the_cyclic_collector(make_test_pack, tmp_path, options):
    from strata_prefill.fast import make_fast_engine
    from strata_prefill.verify.common import run_engine

    pack = make_test_pack("tiny", "Q8_0")
    ids = np.arange(40) % pack.config.n_vocab
    with _no_cyclic_collector():
        eng = make_fast_engine(pack, "sim", **options)
        run_engine(eng, ids, 16, tmp_path, greedy=1, dump_level="layer")
        assert eng.be.counters["launches"] > 0
        if options:
            assert eng.be.counters["copies"] > 0, dict(eng.be.counters)
        else:
            assert eng.be.counters["routed_row_tiles"] > 0, dict(eng.be.counters)
        engine, backend = weakref.ref(eng), weakref.ref(eng.be)
        del eng
        assert engine() is None, "the engine is in a reference cycle"
        assert backend() is None, "the backend is in a reference cycle"


def _stand_in_pycuda(monkeypatch):
    """pycuda.driver, pycuda.gpuarray and pycuda.tools as far as CudaBackend() and its phase
    markers reach, and no context."""
    from strata_prefill.fast.cuda import runtime

    driver = types.ModuleType("pycuda.driver")

    class Stream:
        def __init__(self, flags=0):
            pass

    class Event:
        def __init__(self, flags=None):
            self.recorded = None

        def record(self, stream):
            self.recorded = stream

    driver.Stream, driver.Event = Stream, Event
    gpuarray = types.ModuleType("pycuda.gpuarray")
    tools = types.ModuleType("pycuda.tools")
    tools.DeviceMemoryPool = type("DeviceMemoryPool", (), {})
    pkg = types.ModuleType("pycuda")
    pkg.driver, pkg.gpuarray, pkg.tools = driver, gpuarray, tools
    for name, mod in (("pycuda", pkg), ("pycuda.driver", driver), ("pycuda.gpuarray", gpuarray),
                      ("pycuda.tools", tools)):
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setattr(runtime, "context", lambda: None)
    monkeypatch.setenv("STRATA_PREFILL_KERNEL_CACHE", "off")
    monkeypatch.delenv("STRATA_PREFILL_STRESS", raising=False)
    return Event


def test_a_dropped_cuda_backend_is_freed_without_the_cyclic_collector(monkeypatch):
    """The cuda backend with stand-ins for PyCUDA: timed phases (its clock records events on
    the compute stream) and a RoPE table (built through the backend) leave no cycle."""
    from strata_prefill.fast.cuda import backend as cb

    Event = _stand_in_pycuda(monkeypatch)
    monkeypatch.setattr(cb.CudaBackend, "_make_rope", lambda self, n: (np.zeros(n), np.ones(n)))
    with _no_cyclic_collector():
        be = cb.CudaBackend(timing=1)
        with be.phase("attention", layer=0):
            pass
        (_chunk, name, a, b), = be.phases._spans
        assert isinstance(a, Event) and a.recorded is be.dev.stream and name == "attention"
        be.config = types.SimpleNamespace(head_dim=8, rope_base=1e4)
        cos, _sin = be.rope_table(5)
        assert len(cos) >= 5
        backend = weakref.ref(be)
        del be
        assert backend() is None, "the cuda backend is in a reference cycle"
