"""pytest-benchmark, GPU: building a group's weight buffers from 16 experts' blobs, in one launch
(gather_native_group) or one launch per expert (gather_native_one, the opt-out path).

    pytest bench/test_bench_gather_cuda.py

Blobs of a strata IQ2_XS pack's experts ([gate | up | down], 2.7 MB), read from SETS sets of
16 in turn so a round's sources did not just pass through L2. `bytes` is the bytes copied
(device memory traffic is twice that: each is read and written).
"""
import itertools

import pytest

from fast.cuda import products, runtime
from gpu_shapes import blob_bytes
from strata.constants import GROUP_TAIL_BYTES, MMQ_GROUP

pytestmark = pytest.mark.gpu

SETS = 4


@pytest.mark.parametrize("mode", ["one_launch", "per_expert"])
def test_group_gather(gpu_benchmark, cuda_device, mode):
    dev = cuda_device
    gu, d = blob_bytes()
    blob = 2 * gu + d
    src = runtime.alloc(SETS * MMQ_GROUP * blob, "gather sources")
    runtime._driver().memset_d8(src, 0x5A, SETS * MMQ_GROUP * blob)
    gu_n, d_n = products.group_buffer_bytes(MMQ_GROUP, gu, d, GROUP_TAIL_BYTES)
    gu_buf, d_buf = runtime.alloc(gu_n, "gate/up group buffer"), runtime.alloc(d_n, "down group buffer")
    turn = itertools.count()

    def run():
        s = next(turn) % SETS
        addrs = [int(src) + (s * MMQ_GROUP + q) * blob for q in range(MMQ_GROUP)]
        if mode == "one_launch":
            products.gather_native_group(dev, addrs, gu, d, GROUP_TAIL_BYTES, gu_buf, d_buf)
        else:
            for q, a in enumerate(addrs):
                tail = GROUP_TAIL_BYTES if q == MMQ_GROUP - 1 else 0
                products.gather_native_one(dev, a, q, gu, d, gu_buf, d_buf, tail_bytes=tail)

    gpu_benchmark(run, stream=dev.stream, counters=dev.counters, rounds=20, nbytes=MMQ_GROUP * blob,
                  experts=MMQ_GROUP, blob_bytes=blob, mode=mode)
