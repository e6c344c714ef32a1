"""pytest-benchmark, GPU: the grouped MMQ products of one MoE layer, per weight type
(fast/cuda/products.py mmq_group, kernels/mmq.cu).

    pytest bench/test_bench_mmq_cuda.py

The timed "mmq_layer" rows of verify/cases.py (verify/test_kernels_cuda.py::test_mmq_layer
checks the same launches), as the walk launches them on the strata shape: 2K, 8K and 32K
tokens routed top-10 over 512 experts (verify/kernel_inputs.py), one launch per group of 16
consecutive experts: gate/up (both matrices in one launch, 640 x 2560 each, every type with an
MMQ kernel) and down (2560 x 640, the 32-value types a pack falls back to there). Group weight
buffers hold random valid blocks and rotate over enough buffers to exceed L2; the q8_1
activations are random rows quantized in the type's layout. TOP/s = the row's flops (2 * rows
* N * K * matrices) / median; GB/s its bytes (every routed expert's weights, the q8_1 rows and
the outputs once). The automatic tile configuration (products.AUTO_CONFIGS) is used;
bench/bench_mmq_cuda.py sweeps others.
"""
import numpy as np
import pytest

from strata_prefill.fast.cuda import products, runtime
from bench.gpu_shapes import N_GROUPS, Routing
from gguf import GGMLQuantizationType as QT
from strata_prefill.contract import q8_1, quants
from strata_prefill.contract.constants import GROUP_TAIL_BYTES, MMQ_GROUP
from strata_prefill.verify.cases import kernel_rows

pytestmark = pytest.mark.gpu

L2_SPAN = 240_000_000  # bytes of weights a layer's launches cycle through (the H200's L2 is 60 MB)


@pytest.fixture(scope="module")
def group_weights():
    """group_weights(tname, N, K, mats) -> (device buffers, matrix bytes), made once per module."""
    cache = {}

    def get(tname, N, K, mats):
        if (tname, N, K, mats) not in cache:
            qt = QT[tname]
            vals, _ = quants.block_size(qt)
            mat = quants.row_bytes(qt, K) * N
            n_buf = max(2, min(8, -(-L2_SPAN // (MMQ_GROUP * mats * mat))))
            rng = np.random.default_rng(int(qt))
            bufs = []
            for _ in range(n_buf):
                blocks = quants.random_blocks(qt, MMQ_GROUP * mats * N * K // vals, rng).reshape(-1)
                tail = np.zeros(GROUP_TAIL_BYTES, np.uint8)
                bufs.append(runtime.to_device(np.concatenate([blocks, tail]), f"{tname} group weights"))
            cache[(tname, N, K, mats)] = bufs, mat
        return cache[(tname, N, K, mats)]

    return get


@pytest.mark.parametrize("case", kernel_rows("mmq_layer", timed=True), ids=lambda c: c.id)
def test_mmq_layer(gpu_benchmark, cuda_device, group_weights, case):
    s, tname = case.shape, case.weight_type
    tokens, N, K, mats = s["tokens"], s["N"], s["K"], s["mats"]
    dev, r, qt = cuda_device, Routing(tokens), QT[tname]
    bufs, mat = group_weights(tname, N, K, mats)
    x = dev.upload(np.random.default_rng(tokens).standard_normal((tokens, K), dtype=np.float32))
    act = dev.empty((q8_1.buffer_nbytes(r.rows, K),), np.uint8)
    products.quantize_gather(dev, x, dev.upload(r.src), n_rows=r.rows, K=K, layout=q8_1.layout_for(qt), out=act)
    bounds = dev.upload(r.bounds.reshape(-1))
    outs = [dev.empty((r.rows, N), np.float32) for _ in range(mats)]

    def layer():
        for g in range(N_GROUPS):
            w = int(bufs[g % len(bufs)])
            b = int(bounds.gpudata) + g * MMQ_GROUP * 8
            pair = (mat, outs[1]) if mats == 2 else None  # up sits after gate in each expert's slot
            products.mmq_group(dev, qt, w, w_stride=mats * mat, N=N, K=K, act=act, R_total=r.rows, bounds=b,
                               n_exp=MMQ_GROUP, out=outs[0], rows=int(r.group_rows[g]), pair=pair)

    assert case.flops == 2 * r.rows * N * K * mats
    gpu_benchmark(layer, stream=dev.stream, counters=dev.counters, rounds=5, case=case, tokens=tokens, rows=r.rows,
                  N=N, K=K, matrices=mats, type=tname, proj="gate_up" if mats == 2 else "down",
                  weight_buffers=len(bufs))
