"""pytest-benchmark, GPU: the MoE input's q8_1 quantize, gather vs scatter (fast/cuda/products.py).

    pytest bench/test_bench_q8_1_cuda.py

2K, 8K and 32K tokens of the strata n_embd, each routed to TOP_K = 10 experts (random
routing, bench/gpu_shapes.py), into a buffer of tokens x 10 rows in the layout the IQ2_XS
gate/up kernel reads. Gather quantizes every row from its token (10 times per token);
scatter quantizes each token once and writes its 10 rows. `bytes` is the least traffic either
needs (the float input read once, the buffer written once); GB/s is of that.
"""
import numpy as np
import pytest

from fast.cuda import products
from gpu_shapes import GU_TYPE, N_EMBD, TOP_K, Routing
from strata import q8_1

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("tokens", [2048, 8192, 32768])
@pytest.mark.parametrize("how", ["gather", "scatter"])
def test_quantize(gpu_benchmark, cuda_device, tokens, how):
    dev, r, K = cuda_device, Routing(tokens), N_EMBD
    layout = q8_1.layout_for(GU_TYPE)
    x = dev.upload(np.random.default_rng(tokens).standard_normal((tokens, K), dtype=np.float32))
    out_bytes = q8_1.buffer_nbytes(r.rows, K)
    out = dev.empty((out_bytes,), np.uint8)
    if how == "gather":
        src = dev.upload(r.src)

        def run():
            products.quantize_gather(dev, x, src, r.rows, K, layout, out)
    else:
        slot = dev.upload(r.slot)

        def run():
            products.quantize_scatter(dev, x, slot, tokens, TOP_K, K, layout, out)

    gpu_benchmark(run, stream=dev.stream, counters=dev.counters, rounds=10, nbytes=tokens * K * 4 + out_bytes,
                  tokens=tokens, rows=r.rows, K=K, layout=layout.name)
