"""pytest-benchmark, GPU: the MoE input's q8_1 quantize, gather vs scatter (fast/cuda/products.py).

    pytest bench/test_bench_q8_1_cuda.py

The timed "quantize" rows of verify/cases.py: 2K, 8K and 32K tokens of the strata n_embd, each
routed to TOP_K = 10 experts (random routing, verify/kernel_inputs.py), into a buffer of
tokens x 10 rows in the layout the IQ2_XS gate/up kernel reads. Gather quantizes every row
from its token (10 times per token); scatter quantizes each token once and writes its 10 rows.
`bytes` is the least traffic either needs (the row's: the float input and the routing table
read once, the buffer written once); GB/s is of that.
"""
import numpy as np
import pytest

from strata_prefill.fast.cuda import products
from bench.gpu_shapes import Routing
from strata_prefill.contract import q8_1
from strata_prefill.verify.cases import kernel_rows

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("case", kernel_rows("quantize", timed=True), ids=lambda c: c.id)
@pytest.mark.parametrize("how", ["gather", "scatter"])
def test_quantize(gpu_benchmark, cuda_device, how, case):
    tokens, K, top_k = case.shape["T"], case.shape["K"], case.shape["k"]
    dev, r = cuda_device, Routing(tokens)
    assert (r.rows, r.ids.shape[1]) == (tokens * top_k, top_k), "the row's routing is the strata one"
    layout = q8_1.Layout[case.config]
    x = dev.upload(np.random.default_rng(tokens).standard_normal((tokens, K), dtype=np.float32))
    out_bytes = q8_1.buffer_nbytes(r.rows, K)
    out = dev.empty((out_bytes,), np.uint8)
    if how == "gather":
        src = dev.upload(r.src)

        def run():
            products.quantize_gather(dev, x, src, n_rows=r.rows, K=K, layout=layout, out=out)
    else:
        slot = dev.upload(r.slot)

        def run():
            products.quantize_scatter(dev, x, slot, T=tokens, K_used=top_k, K=K, layout=layout, out=out)

    gpu_benchmark(run, stream=dev.stream, counters=dev.counters, rounds=10, case=case, tokens=tokens, rows=r.rows,
                  K=K, layout=layout.name, how=how)
