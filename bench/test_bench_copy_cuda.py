"""pytest-benchmark, GPU: the copy stream, page-locked host memory to device (as
fast/cuda/tiers.py streams experts).

    pytest bench/test_bench_copy_cuda.py

16 strata IQ2_XS expert blobs (2.7 MB each) a round on a non-blocking stream, copied as runs
of 1, 2, 4 or COALESCE_MAX adjacent blobs (--copy-coalesce merges adjacent copies up to that),
an event recorded after each run as the walk does. GB/s is of the bytes copied.
"""
import collections

import numpy as np
import pytest

from strata_prefill.fast.cuda import runtime
from strata_prefill.fast.cuda.tiers import NON_BLOCKING
from bench.gpu_shapes import blob_bytes
from strata_prefill.fast.tuning import COALESCE_MAX
from strata_prefill.contract.constants import MMQ_GROUP

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("run_len", sorted({1, 2, 4, COALESCE_MAX}))
def test_copy_stream(gpu_benchmark, cuda_device, run_len):
    cuda = runtime._driver()
    gu, d = blob_bytes()
    blob, n = 2 * gu + d, MMQ_GROUP
    host = cuda.pagelocked_empty(n * blob, np.uint8)
    host[:] = np.random.default_rng(run_len).integers(1, 256, n * blob, dtype=np.uint8)
    dst = runtime.alloc(n * blob, "copy destination")
    stream = cuda.Stream(flags=NON_BLOCKING)
    counters = collections.Counter()

    def run():
        for i in range(0, n, run_len):
            m = min(run_len, n - i)
            cuda.memcpy_htod_async(int(dst) + i * blob, host[i * blob:(i + m) * blob], stream)
            cuda.Event(cuda.event_flags.DISABLE_TIMING).record(stream)
            counters["copies"] += 1
            counters["copy_bytes"] += m * blob
            counters["events"] += 1

    gpu_benchmark(run, stream=stream, counters=counters, rounds=20, nbytes=n * blob, experts=n,
                  run_experts=run_len, blob_bytes=blob)
