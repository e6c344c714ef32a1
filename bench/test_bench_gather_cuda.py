"""pytest-benchmark, GPU: building a group's weight buffers from 16 experts' blobs, in one launch
(gather_native_group) or one launch per expert (gather_native_one, the opt-out path).

    pytest bench/test_bench_gather_cuda.py

The timed "gather" row of verify/cases.py: blobs of a strata IQ2_XS pack's experts ([gate | up
| down], 2.7 MB), read from SETS sets of 16 in turn so a round's sources did not just pass
through L2. `copied_bytes` is the bytes copied; `bytes` (GB/s) the row's device memory traffic,
each copied byte read and written, and the zeroed tail.
"""
import itertools

import pytest

from strata_prefill.fast.cuda import products, runtime
from strata_prefill.verify.cases import kernel_rows

pytestmark = pytest.mark.gpu

SETS = 4


@pytest.mark.parametrize("case", kernel_rows("gather", timed=True), ids=lambda c: c.id)
@pytest.mark.parametrize("mode", ["one_launch", "per_expert"])
def test_group_gather(gpu_benchmark, cuda_device, mode, case):
    dev = cuda_device
    n, gu, d, tail = (case.shape[k] for k in ("n", "gu_bytes", "d_bytes", "tail"))
    blob = 2 * gu + d
    src = runtime.alloc(SETS * n * blob, "gather sources")
    runtime._driver().memset_d8(src, 0x5A, SETS * n * blob)
    gu_n, d_n = products.group_buffer_bytes(n, gu, d, tail)
    gu_buf, d_buf = runtime.alloc(gu_n, "gate/up group buffer"), runtime.alloc(d_n, "down group buffer")
    turn = itertools.count()

    def run():
        s = next(turn) % SETS
        addrs = [int(src) + (s * n + q) * blob for q in range(n)]
        if mode == "one_launch":
            products.gather_native_group(dev, addrs, gu_bytes=gu, d_bytes=d, tail_bytes=tail, gu_buf=gu_buf,
                                         d_buf=d_buf)
        else:
            for q, a in enumerate(addrs):
                products.gather_native_one(dev, a, q=q, gu_bytes=gu, d_bytes=d, gu_buf=gu_buf, d_buf=d_buf,
                                           tail_bytes=tail if q == n - 1 else 0)

    gpu_benchmark(run, stream=dev.stream, counters=dev.counters, rounds=20, case=case, copied_bytes=n * blob,
                  experts=n, blob_bytes=blob, mode=mode)
