"""strata_prefill.contract.mmq.block_sum, the products' sum over blocks: byte for byte the written loop
``out = 0; for b: out = out + t[b]`` (ascending, from +0), for every shape, including the one
where NumPy's own reduction would sum pairwise (a single output element) and -0 inputs."""
import numpy as np
from hypothesis import given, settings, strategies as st

from strata_prefill.contract.mmq import block_sum

F32 = np.float32


def _loop(t):
    out = np.zeros(t.shape[1:], F32)
    for b in range(t.shape[0]):
        out = out + t[b]
    return out


@settings(max_examples=60, deadline=None)
@given(nb=st.integers(1, 200), r=st.integers(1, 5), n=st.integers(1, 40), seed=st.integers(0, 2**32 - 1),
       neg_zero=st.booleans())
def test_block_sum_is_the_loop(nb, r, n, seed, neg_zero):
    rng = np.random.default_rng(seed)
    # magnitudes over forty binades, so that any other order of additions rounds differently
    t = (rng.standard_normal((nb, r, n)) * np.exp2(rng.integers(-20, 20, (nb, r, n)))).astype(F32)
    if neg_zero:
        t[:, 0, 0] = F32(-0.0)
    want = _loop(t)
    got = block_sum(t.copy())
    assert got.tobytes() == want.tobytes()


def test_a_pairwise_sum_would_differ_here():
    # the case block_sum guards: one output element over many blocks, where np.add.reduce sums
    # pairwise; if this stops differing the guard is still right, the test only shows it matters
    rng = np.random.default_rng(3)
    t = (rng.standard_normal((128, 1, 1)) * np.exp2(rng.integers(-20, 20, (128, 1, 1)))).astype(F32)
    assert block_sum(t.copy()).tobytes() == _loop(t).tobytes()
    assert np.add.reduce(t.reshape(-1)).tobytes() != _loop(t).tobytes()
