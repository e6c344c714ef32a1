"""fast/cuda/kernels/float_rows.cu against strata_prefill.contract.moe.gather_rows and strata_prefill.contract.moe.scatter_rows,
byte for byte: the MoE input of float gate/up experts (the normed rows in the expert-sorted
order, never quantized) over random routings, gathered by src or scattered by slot. The output
is poisoned before each launch and compared whole, so a row never written shows. Every case is
a row of verify/cases.py (`KERNEL_CASES`, op "float_rows"). Without a GPU (or without PyCUDA)
every test skips with the backend's one-line reason.
"""
from __future__ import annotations

import numpy as np
import pytest

from strata_prefill.fast.cuda.runtime import cuda_available
from strata_prefill.contract.moe import gather_rows, scatter_rows
from strata_prefill.contract.routing import routing_tables
from strata_prefill.verify.device_checks import POISON
from strata_prefill.verify.cases import kernel_rows, params

_OK, _WHY = cuda_available()
pytestmark = pytest.mark.skipif(not _OK, reason=_WHY)



def routing(rng, T: int, E: int, k: int) -> np.ndarray:
    """ids int32 [T, k]: k distinct experts a token."""
    return np.stack([rng.permutation(E)[:k] for _ in range(T)]).astype(np.int32).reshape(T, k)


@pytest.mark.parametrize("case", params(kernel_rows("float_rows")))
def test_float_rows_bytes(case):
    import pycuda.driver as cuda
    from pycuda import gpuarray

    from strata_prefill.fast.cuda import float_rows, runtime

    runtime.context()
    T, K, E, k = (case.shape[n] for n in ("T", "K", "E", "k"))
    rng = np.random.default_rng(T * 1000 + K + E)
    # any finite bits: a copy keeps every one (signed zeros and subnormals among them)
    x = rng.integers(0, 2**32, (T, K), dtype=np.uint64).astype(np.uint32)
    x[(x & 0x7F800000) == 0x7F800000] &= 0xBFFFFFFF
    x = x.view(np.float32)
    tab = routing_tables(routing(rng, T, E, k), E)
    want = gather_rows(x, tab.src)
    assert np.array_equal(want.view(np.uint32), scatter_rows(x, tab.slot, k).view(np.uint32))

    dev = runtime.Device()
    x_d = gpuarray.to_gpu(x)
    out = gpuarray.empty((T * k, K), np.float32)
    cuda.memset_d8(out.gpudata, POISON, out.nbytes)
    if case.form == "gather":
        float_rows.gather_rows(dev, x_d, gpuarray.to_gpu(tab.src.astype(np.int32)), T * k, out=out)
    else:
        float_rows.scatter_rows(dev, x_d, gpuarray.to_gpu(tab.slot.astype(np.int32)), k, out=out)
    got = out.get()
    bad = np.argwhere(got.view(np.uint32) != want.view(np.uint32))
    assert bad.size == 0, f"{case.id}: first differing (row, value) {bad[:1].tolist()}"
    assert dev.counters[f"{case.form}_rows"] == 1
