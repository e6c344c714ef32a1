"""The MMQ kernels' one fused multiply-add (strata_numerics.cuh `scaled_magic`, mmq.cu
MMQ_SUBFMA): u * (float)S from the mma bits MAGIC_I + S in one rounding gives the bits of the
definition's u * (float)S, for the integer sub-scales u and block sums S the weight types
produce. Emulated here: the fused operation's exact value in float64 (every operand and the
result need at most 31 significant bits), rounded once to float32. Zeros compare after + 0.0:
with u = 0 (a Q2_K sub-scale can be 0) the fused form gives +0 where u * S gives -0 for S < 0,
and the epilogue's next step, acc + (dw * da) * V, erases that sign (acc starts at +0 and
x + (+-0) is x, or +0 when x is +0) before any byte is stored."""
import re
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from strata_prefill.fast.cuda.runtime import KERNEL_DIR

# the kernels' magic-number constants, read from their one home
_HEADER = (Path(KERNEL_DIR) / "strata_numerics.cuh").read_text()
MAGIC_I = int(re.search(r"#define MAGIC_I (0x[0-9A-Fa-f]+)", _HEADER).group(1), 16)
MAGIC_F = np.float32(float(re.search(r"#define MAGIC_F ([0-9.]+)f", _HEADER).group(1)))


def fused(u: np.ndarray, s: np.ndarray) -> np.ndarray:
    """float32 fma(u, float_bits(MAGIC_I + s), -u * MAGIC_F), as the GPU computes it."""
    d = (np.int64(MAGIC_I) + s.astype(np.int64)).astype(np.int32).view(np.float32)
    nu = (u * -MAGIC_F).astype(np.float32)  # exact: 3u * 2^22
    assert np.array_equal(nu.astype(np.float64), u.astype(np.float64) * -np.float64(MAGIC_F))
    return (u.astype(np.float64) * d.astype(np.float64) + nu.astype(np.float64)).astype(np.float32)


def test_the_magic_float_is_the_magic_bits():
    assert np.array_equal(np.array([MAGIC_I], np.int32).view(np.float32), [MAGIC_F])


def definition(u: np.ndarray, s: np.ndarray) -> np.ndarray:
    return u.astype(np.float32) * s.astype(np.float32)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    z = np.float32(0.0)
    return np.array_equal((a + z).view(np.uint32), (b + z).view(np.uint32))


# |S| of one k16 / k32 block sum and the largest sub-scale of each type (mmq.cu sub_sum)
BOUNDS = {"IQ2_XS": (16 * 127 * 43, 31), "IQ3_XXS": (32 * 127 * 62, 31), "Q2_K": (16 * 127 * 3, 15)}


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(BOUNDS)), st.integers(0, 2**31 - 1))
def test_fused_sub_scale_is_the_definitions_bits(tname, seed):
    smax, umax = BOUNDS[tname]
    rng = np.random.default_rng(seed)
    u = rng.integers(0, umax + 1, 4096).astype(np.float32)
    s = rng.integers(-smax, smax + 1, 4096)
    s[:4] = (smax, -smax, 0, 1)
    u[:4] = umax
    assert same_bits(fused(u, s), definition(u, s))


def test_every_extreme_product():
    """Every sub-scale 0..31 against the ends and a dense band of the IQ3_XXS range (the
    largest), where u * S is close to 2^23: the identity holds to the bit."""
    smax = BOUNDS["IQ3_XXS"][0]
    s = np.concatenate([np.arange(-smax, -smax + 2000), np.arange(-1000, 1000), np.arange(smax - 2000, smax + 1)])
    for u in range(32):
        uu = np.full(s.shape, u, np.float32)
        assert same_bits(fused(uu, s), definition(uu, s))


def test_a_float_scale_could_not_use_it():
    """The emulation is not vacuous, and says why Q8_0's epilogue keeps its conversion: with a
    float scale (dw * da) in place of the integer u, -scale * MAGIC_F is itself rounded and the
    fused form differs from scale * (float)S."""
    rng = np.random.default_rng(5)
    scale = (rng.random(4096, dtype=np.float32) * np.float32(1e-3)).astype(np.float32)
    s = rng.integers(-500_000, 500_000, 4096)
    d = (np.int64(MAGIC_I) + s).astype(np.int32).view(np.float32)
    nm = (scale * -MAGIC_F).astype(np.float32)
    got = (scale.astype(np.float64) * d.astype(np.float64) + nm.astype(np.float64)).astype(np.float32)
    assert not same_bits(got, scale * s.astype(np.float32))
