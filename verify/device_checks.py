"""Checks the kernel tests make on device buffers without copying them whole to the host.

An output is poisoned (every byte POISON) before a launch; a word still equal to the poison
word afterwards was never written. At the sizes the GPU suites time an output runs to a
gigabyte or more, and copying it to the host to look for poison costs more than the test's
kernels: fast/cuda/kernels/find_word.cu looks where it lies, and only the rows a test compares
with its NumPy definition come back (`rows`).
"""
from __future__ import annotations

import numpy as np

POISON = 0xA5
POISON_WORD = int.from_bytes(bytes([POISON]) * 4, "little")


def unwritten_words_host(a: np.ndarray, v: int = POISON_WORD) -> tuple[int, int]:
    """The definition: (how many 32-bit words of `a` equal v, the index of the first; or n)."""
    words = np.ascontiguousarray(a).reshape(-1).view("<u4")
    hits = np.flatnonzero(words == np.uint32(v))
    return int(hits.size), int(hits[0]) if hits.size else int(words.size)


def unwritten_words(buf, nbytes: int, v: int = POISON_WORD) -> tuple[int, int]:
    """find_word.cu on the device buffer `buf` of `nbytes` (a multiple of 4): as
    unwritten_words_host on its bytes."""
    from strata_prefill.fast.cuda import runtime

    assert nbytes % 4 == 0, nbytes
    n = nbytes // 4
    f = runtime.function("find_word", "find_word", "PQIP")
    out = runtime.to_device(np.array([0, n], np.uint64), "find_word result")
    if n:
        blocks = int(min((n + 255) // 256, 8 * 132))
        f.prepared_call((blocks, 1, 1), (256, 1, 1), int(buf), np.uint64(n), np.uint32(v), int(out))
    got = np.empty(2, np.uint64)
    import pycuda.driver as cuda

    cuda.Context.synchronize()
    cuda.memcpy_dtoh(got, out)
    out.free()
    return int(got[0]), int(got[1])


def rows(buf, row_bytes: int, r0: int, r1: int) -> np.ndarray:
    """Rows r0..r1 of a device buffer of rows of `row_bytes`, as bytes on the host."""
    import pycuda.driver as cuda

    h = np.empty((r1 - r0) * row_bytes, np.uint8)
    if h.size:
        cuda.Context.synchronize()
        cuda.memcpy_dtoh(h, int(buf) + r0 * row_bytes)
    return h
