"""pytest-benchmark, GPU: causal prefill attention over the KV cache
(fast/cuda/attention.py, kernels/attention_pair.cu) on the strata heads.

    pytest bench/test_bench_attention_cuda.py

The timed "attention" rows of verify/cases.py: 32 query heads, 4 KV heads, head_dim 128; one
layer's cache written with 4K or 32K random keys and values (untimed), then every position
attends to the ones before it (the default kernel). TOP/s counts the two products over the
causal triangle, 4 * heads * head_dim * T * (T + 1) / 2 (the row's flops); GB/s the row's
bytes (q, the output, each key's K and V once).
"""
import pytest

from strata_prefill.verify.cases import kernel_rows

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("case", kernel_rows("attention", timed=True), ids=lambda c: c.id)
def test_attention(gpu_benchmark, attention_case, cuda_device, case):
    s = case.shape
    assert s["start"] == 0 and s["positions"] == range(0, len(s["positions"])), "a prefill from position 0"
    tokens = len(s["positions"])
    attend, ops = attention_case(tokens, s)
    assert ops == case.flops
    gpu_benchmark(attend, stream=cuda_device.stream, counters=cuda_device.counters, rounds=5, case=case,
                  tokens=tokens, heads=s["n_head"], kv_heads=s["n_kv"], head_dim=s["hd"])
