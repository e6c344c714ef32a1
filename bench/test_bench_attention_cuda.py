"""pytest-benchmark, GPU: causal prefill attention over the int8 KV cache
(fast/cuda/attention.py, kernels/attention_mma.cu) on the strata heads.

    pytest bench/test_bench_attention_cuda.py

32 query heads, 4 KV heads, head_dim 128; one layer's cache written with 4K or 32K random
keys and values (untimed), then every position attends to the ones before it. TOP/s counts
the two products over the causal triangle: 4 * heads * head_dim * T * (T + 1) / 2.
"""
import pytest

from gpu_shapes import STRATA

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("tokens", [4096, 32768])
def test_attention(gpu_benchmark, attention_case, cuda_device, tokens):
    attend, ops = attention_case(tokens)
    gpu_benchmark(attend, stream=cuda_device.stream, counters=cuda_device.counters, rounds=5, ops=ops,
                  tokens=tokens, heads=STRATA.n_head, kv_heads=STRATA.n_head_kv, head_dim=STRATA.head_dim)
