"""The draws the attention layout tests check a kernel's lsum tree on (tests/test_attention_*_layout.py):
one key block's P values, which p = exp2c(s - m) spreads over many binades, ties and zeros
included."""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from strata_prefill.contract.constants import KEY_BLOCK

F32 = np.float32

#: a block's P values in [0, 1], subnormals included
block_p = arrays(np.float32, KEY_BLOCK, elements=st.floats(0.0, 1.0, width=32, allow_subnormal=True))
#: a seeded generator, for block_p_over_magnitudes
generators = st.integers(0, 2**32 - 1).map(lambda s: np.random.default_rng(s))


def block_p_over_magnitudes(rng: np.random.Generator) -> np.ndarray:
    """A block's P values over every binade from 2^-126 to 1, eight of them zero."""
    p = (rng.random(KEY_BLOCK) * np.exp2(rng.integers(-126, 1, KEY_BLOCK).astype(np.float64))).astype(F32)
    p[rng.integers(0, KEY_BLOCK, 8)] = 0.0
    return p
