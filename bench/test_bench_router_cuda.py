"""pytest-benchmark, GPU: the steps of the router phase one by one (fast/cuda/elementwise.py,
fast/cuda/dense.py) on the strata shape, so a phase table's "router" line can be split.

    pytest bench/test_bench_router_cuda.py

The timed rows of verify/cases.py at 2K, 8K and 32K tokens: the RMSNorm of the residual
("rmsnorm", n_embd 2560), the router product ("float_dense", 512 x 2560 F32 or BF16 weights,
both float_dense.cu forms), the softmax and top-10 ("top_k", router.cu), and the routing tables
("routing_tables", routing_tables.cu) of a random routing. TOP/s and GB/s from each row's own
flops and bytes.
"""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from strata_prefill.fast.cuda import dense, elementwise as ops
from bench.gpu_shapes import Routing
from strata_prefill.contract.dense import encode_float
from strata_prefill.verify.cases import kernel_rows

pytestmark = pytest.mark.gpu


def _rows(op):
    return pytest.mark.parametrize("case", kernel_rows(op, timed=True), ids=lambda c: c.id)


@_rows("rmsnorm")
def test_rmsnorm(gpu_benchmark, cuda_device, case):
    tokens, n = case.shape["rows"], case.shape["n"]
    dev, rng = cuda_device, np.random.default_rng(tokens)
    x = dev.upload(rng.standard_normal((tokens, n), dtype=np.float32))
    w = dev.upload(rng.standard_normal(n, dtype=np.float32))
    out = dev.empty((tokens, n), np.float32)
    gpu_benchmark(lambda: ops.rmsnorm(dev, x, w, 1e-6, out=out), stream=dev.stream, counters=dev.counters,
                  rounds=10, case=case, tokens=tokens)


@_rows("float_dense")
def test_router_product(gpu_benchmark, cuda_device, case):
    tokens, N, K = case.shape["T"], case.shape["N"], case.shape["K"]
    wtype, form = case.weight_type, case.form
    dev, rng = cuda_device, np.random.default_rng(tokens)
    x = dev.upload(rng.standard_normal((tokens, K), dtype=np.float32))
    wf = rng.standard_normal((N, K), dtype=np.float32) * np.float32(0.05)
    w = dev.upload(encode_float(wf, QT[wtype]))
    out = dev.empty((tokens, N), np.float32)
    gpu_benchmark(lambda: dense.float_dense(dev, QT[wtype], w, N, K, x, tokens, out, variant=form),
                  stream=dev.stream, counters=dev.counters, rounds=10, case=case, tokens=tokens, form=form,
                  wtype=wtype)


@_rows("top_k")
def test_top_k(gpu_benchmark, cuda_device, case):
    tokens, E, K = case.shape["T"], case.shape["E"], case.shape["K"]
    dev = cuda_device
    logits = dev.upload(np.random.default_rng(tokens).standard_normal((tokens, E), dtype=np.float32))
    gpu_benchmark(lambda: ops.top_k(dev, logits, K), stream=dev.stream, counters=dev.counters, rounds=10,
                  case=case, tokens=tokens, experts=E, k=K)


@_rows("routing_tables")
def test_routing_tables(gpu_benchmark, cuda_device, case):
    tokens, E, K = case.shape["T"], case.shape["E"], case.shape["K"]
    dev, r = cuda_device, Routing(tokens)
    assert r.ids.shape == (tokens, K) and E == int(r.counts.size), "the row's routing is the strata one"
    ids = dev.upload(r.ids)
    gpu_benchmark(lambda: ops.routing_tables(dev, ids, E), stream=dev.stream, counters=dev.counters,
                  rounds=10, case=case, tokens=tokens, pairs=tokens * K)
