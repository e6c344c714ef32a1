"""fast/cuda/kernels/find_word.cu against its NumPy definition (verify/device_checks.py): the
count and the first index of the words equal to a value, on random buffers with the value
planted at random places (none, one at either end, many), sizes that are not a multiple of a
block or of the grid's stride."""
from __future__ import annotations

import numpy as np
import pytest

from strata_prefill.fast.cuda.runtime import cuda_available
from strata_prefill.verify.device_checks import POISON_WORD, unwritten_words, unwritten_words_host

_OK, _WHY = cuda_available()
pytestmark = pytest.mark.skipif(not _OK, reason=_WHY)


@pytest.mark.parametrize("n, planted", [(0, ()), (1, (0,)), (7, ()), (1000, (999,)), (257, (0, 256)),
                                        (3_000_001, "many"), (5_000_000, (4_999_999,))])
def test_find_word_is_its_definition(n, planted):
    from strata_prefill.fast.cuda import runtime

    rng = np.random.default_rng(n)
    a = rng.integers(0, 2**32, n, dtype=np.uint32)
    a[a == POISON_WORD] ^= 1  # only the planted words are the value
    at = rng.choice(n, 500, replace=False) if planted == "many" else np.array(planted, np.int64)
    a[at] = POISON_WORD
    want = unwritten_words_host(a)
    assert want[0] == len(at) and want[1] == (int(at.min()) if len(at) else n)
    buf = runtime.to_device(a, "find_word input") if n else runtime.alloc(4, "find_word input")
    assert unwritten_words(buf, a.nbytes) == want
