"""pytest-benchmark, GPU: the steps of the router phase one by one (fast/cuda/elementwise.py,
fast/cuda/dense.py) on the strata shape, so a phase table's "router" line can be split.

    pytest bench/test_bench_router_cuda.py

2K, 8K and 32K tokens: the RMSNorm of the residual (n_embd 2560), the router product (512 x
2560 F32 or BF16 weights, both float_dense.cu forms), the softmax and top-10 (router.cu), and the
routing tables (routing_tables.cu) of a random routing.
"""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from fast.cuda import dense, elementwise as ops
from gpu_shapes import N_EMBD, N_EXPERT, TOP_K, Routing
from strata.dense import encode_float

pytestmark = pytest.mark.gpu

TOKENS = [2048, 8192, 32768]


@pytest.mark.parametrize("tokens", TOKENS)
def test_rmsnorm(gpu_benchmark, cuda_device, tokens):
    dev, rng = cuda_device, np.random.default_rng(tokens)
    x = dev.upload(rng.standard_normal((tokens, N_EMBD), dtype=np.float32))
    w = dev.upload(rng.standard_normal(N_EMBD, dtype=np.float32))
    out = dev.empty((tokens, N_EMBD), np.float32)
    gpu_benchmark(lambda: ops.rmsnorm(dev, x, w, 1e-6, out=out), stream=dev.stream, counters=dev.counters,
                  rounds=10, nbytes=2 * tokens * N_EMBD * 4, tokens=tokens)


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("form", ["warp", "tile"])
@pytest.mark.parametrize("wtype", ["F32", "BF16"])  # the strata pack's router is BF16
def test_router_product(gpu_benchmark, cuda_device, tokens, form, wtype):
    dev, rng = cuda_device, np.random.default_rng(tokens)
    x = dev.upload(rng.standard_normal((tokens, N_EMBD), dtype=np.float32))
    wf = rng.standard_normal((N_EXPERT, N_EMBD), dtype=np.float32) * np.float32(0.05)
    w = dev.upload(encode_float(wf, QT[wtype]))
    out = dev.empty((tokens, N_EXPERT), np.float32)
    gpu_benchmark(lambda: dense.float_dense(dev, QT[wtype], w, N_EXPERT, N_EMBD, x, tokens, out, variant=form),
                  stream=dev.stream, counters=dev.counters, rounds=10, ops=2 * tokens * N_EXPERT * N_EMBD,
                  tokens=tokens, form=form, wtype=wtype)


@pytest.mark.parametrize("tokens", TOKENS)
def test_top_k(gpu_benchmark, cuda_device, tokens):
    dev = cuda_device
    logits = dev.upload(np.random.default_rng(tokens).standard_normal((tokens, N_EXPERT), dtype=np.float32))
    gpu_benchmark(lambda: ops.top_k(dev, logits, TOP_K), stream=dev.stream, counters=dev.counters, rounds=10,
                  tokens=tokens, experts=N_EXPERT, k=TOP_K)


@pytest.mark.parametrize("tokens", TOKENS)
def test_routing_tables(gpu_benchmark, cuda_device, tokens):
    dev = cuda_device
    ids = dev.upload(Routing(tokens).ids)
    gpu_benchmark(lambda: ops.routing_tables(dev, ids, N_EXPERT), stream=dev.stream, counters=dev.counters,
                  rounds=10, tokens=tokens, pairs=tokens * TOP_K)
