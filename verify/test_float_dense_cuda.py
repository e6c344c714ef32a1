"""fast/cuda/kernels/float_dense.cu against strata_prefill.contract.dense.float_matmul, byte for byte: F32, F16
and BF16 weights, several token counts, output rows and row widths (K not a multiple of 32
among them), strided input and output rows. The output buffer is poisoned before each launch
and compared whole; at the router sizes the GPU suite times (rows with `check`), a spread of
tokens is compared with the definition and every output must be written. Every case is a row
of verify/cases.py (`KERNEL_CASES`); the slow expectations come from the reference cache
(verify/kernel_refs.py). Without a GPU (or without PyCUDA) every test skips with the backend's
one-line reason.
"""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from strata_prefill.fast.cuda.runtime import cuda_available
from strata_prefill.contract import dense
from strata_prefill.verify.device_checks import POISON
from strata_prefill.verify.cases import kernel_rows, params, sample_index
from strata_prefill.verify.kernel_inputs import normal
from strata_prefill.verify.kernel_refs import kept, worth_keeping

_OK, _WHY = cuda_available()
pytestmark = pytest.mark.skipif(not _OK, reason=_WHY)



def _weights(rng, qtype: QT, N: int, K: int) -> np.ndarray:
    """Raw rows uint8 [N, row_bytes] of random values, with a spread of magnitudes."""
    v = rng.standard_normal((N, K), dtype=np.float32) * np.float32(0.05)
    v *= np.exp2(rng.integers(-6, 7, (N, 1))).astype(np.float32)
    if qtype == QT.F32:
        return v.view(np.uint8).reshape(N, -1)
    if qtype == QT.F16:
        return v.astype("<f2").view(np.uint8).reshape(N, -1)
    return (v.view("<u4") >> np.uint32(16)).astype("<u2").view(np.uint8).reshape(N, -1)


@pytest.mark.parametrize("case", params(kernel_rows("float_dense")))
def test_float_dense_bytes(case):
    import pycuda.driver as cuda
    from pycuda import gpuarray

    from strata_prefill.fast.cuda import dense as cuda_dense, runtime

    runtime.context()

    qtype, variant = QT[case.weight_type], case.form
    T, N, K = case.shape["T"], case.shape["N"], case.shape["K"]
    rng = np.random.default_rng(T * 1000 + N * 10 + K)
    raw = _weights(rng, qtype, N, K)
    x = normal(rng, (T, K))
    sel = sample_index(T, case.check)

    def definition():
        return {"want": dense.float_matmul(dense.decode_float(qtype, raw), x if case.check is None else x[sel])}

    key = dict(type=qtype.name, T=T, N=N, K=K, check=case.check)
    want = (kept("kernel-float-dense", key, definition, (_weights, normal)) if worth_keeping(case) else definition())["want"]

    w_d = gpuarray.to_gpu(np.ascontiguousarray(raw).reshape(-1))
    x_d = gpuarray.to_gpu(x)
    out = gpuarray.empty((T, N), np.float32)
    cuda.memset_d8(out.gpudata, POISON, out.nbytes)
    cuda_dense.float_dense(runtime.Device(), qtype, w_d, N, K, x_d, T, out, variant=variant)
    got = out.get()
    if case.check is not None:  # a spread of tokens against the definition; every output written
        left = np.argwhere(got.view(np.uint32) == np.uint32(0xA5A5A5A5))
        assert left.size == 0, f"{qtype.name} {variant} T={T} N={N} K={K}: {len(left)} outputs never written; " \
                               f"first (t, n) {left[:1].tolist()}"
        got = got[sel]
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), \
        f"{qtype.name} {variant} T={T} N={N} K={K}: first differing (t, n) {np.argwhere(got != want)[:1].tolist()}"


@pytest.mark.parametrize("case", params(kernel_rows("float_dense_strided")))
def test_float_dense_strided_rows(case):
    """x rows read at a stride ldx > K, outputs written at ldo > N; the rest is untouched."""
    import pycuda.driver as cuda
    from pycuda import gpuarray

    from strata_prefill.fast.cuda import dense as cuda_dense, runtime

    runtime.context()

    qtype, variant = QT[case.weight_type], case.form
    rng = np.random.default_rng(7)
    T, N, K, ldx, ldo = (case.shape[k] for k in ("T", "N", "K", "ldx", "ldo"))
    raw = _weights(rng, qtype, N, K)
    xw = rng.standard_normal((T, ldx), dtype=np.float32)
    want = dense.float_matmul(dense.decode_float(qtype, raw), np.ascontiguousarray(xw[:, :K]))
    out = gpuarray.empty((T, ldo), np.float32)
    cuda.memset_d8(out.gpudata, POISON, out.nbytes)
    cuda_dense.float_dense(runtime.Device(), qtype, gpuarray.to_gpu(raw.reshape(-1)), N, K, gpuarray.to_gpu(xw), T, out,
                           ldx=ldx, ldo=ldo, variant=variant)
    got = out.get()
    assert np.array_equal(got[:, :N].view(np.uint8), want.view(np.uint8))
    assert (got[:, N:].view(np.uint8) == POISON).all()


@pytest.mark.parametrize("case", params(kernel_rows("float_dense_geometry")))
def test_tile_geometry_matches_the_host(case):
    """fast/cuda/dense.py's tiled-form geometry (rows, tokens, threads per CTA) is the kernel's."""
    from strata_prefill.fast.cuda import dense as cuda_dense, runtime

    runtime.context()
    mod = runtime.load_module("float_dense", dict(cuda_dense.TILE_CONFIG))
    assert runtime.module_ints(mod, "float_dense_tile_geometry", 3) == cuda_dense._TILE
