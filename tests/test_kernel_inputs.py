"""verify/kernel_inputs.py's fast normal draws: the same values for the same seed, the shape
and dtype asked, rows that differ, and small arrays drawn value by value."""
import numpy as np
import pytest

from strata_prefill.verify.kernel_inputs import POOL, normal


@pytest.mark.parametrize("shape", [(3, 5), (POOL // 64 + 7, 128), (2049, 4, 64)])
def test_normal_is_seeded_shaped_and_random(shape):
    a = normal(np.random.default_rng(11), shape)
    b = normal(np.random.default_rng(11), shape)
    assert a.shape == shape and a.dtype == np.float32 and a.flags["C_CONTIGUOUS"]
    assert np.array_equal(a, b)
    assert not np.array_equal(a, normal(np.random.default_rng(12), shape))
    flat = a.reshape(shape[0], -1)
    assert np.isfinite(flat).all() and (flat != 0).any(axis=1).all()
    assert abs(float(flat.mean())) < 0.1 and 0.9 < float(flat.std()) < 1.1
    # no two rows alike (a window at the same offset twice is possible, but not for most rows)
    assert len({r.tobytes() for r in flat}) > 0.99 * shape[0]


def test_small_arrays_are_drawn_value_by_value():
    assert np.array_equal(normal(np.random.default_rng(3), (40, 9)),
                          np.random.default_rng(3).standard_normal((40, 9), dtype=np.float32))
