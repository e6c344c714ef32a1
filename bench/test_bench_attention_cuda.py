"""pytest-benchmark, GPU: causal prefill attention over the int8 KV cache
(fast/cuda/attention.py, kernels/attention_mma.cu) on the strata heads.

    pytest bench/test_bench_attention_cuda.py

32 query heads, 4 KV heads, head_dim 128; one layer's cache written with 4K or 32K random
keys and values (untimed), then every position attends to the ones before it. TOP/s counts
the two products over the causal triangle: 4 * heads * head_dim * T * (T + 1) / 2.
"""
import numpy as np
import pytest

from fast.cuda.attention import DeviceKVCache
from gpu_shapes import STRATA

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("tokens", [4096, 32768])
def test_attention(gpu_benchmark, cuda_device, tokens):
    dev = cuda_device
    H, HKV, HD = STRATA.n_head, STRATA.n_head_kv, STRATA.head_dim
    rng = np.random.default_rng(tokens)
    kv = DeviceKVCache(dev, 1, HKV, HD, capacity=tokens)
    positions = np.arange(tokens, dtype=np.int32)
    kv.write(0, positions, dev.upload(rng.standard_normal((tokens, HKV, HD), dtype=np.float32)),
             dev.upload(rng.standard_normal((tokens, HKV, HD), dtype=np.float32)))
    q = dev.upload(rng.standard_normal((tokens, H, HD), dtype=np.float32))
    pos_dev, out = dev.upload(positions), dev.empty((tokens, H, HD), np.float32)

    def run():
        kv.attend(0, q, positions, positions_dev=pos_dev, out=out)

    gpu_benchmark(run, stream=dev.stream, counters=dev.counters, rounds=5,
                  ops=4 * H * HD * tokens * (tokens + 1) // 2, tokens=tokens, heads=H, kv_heads=HKV, head_dim=HD)
