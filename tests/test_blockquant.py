"""strata_prefill.contract.blockquant.quantize_blocks: both scale rules against a literal scalar loop, and its
defined cases (all-zero, an inverse that overflows, NaN, infinity) block by block, at the
default code bound 127 and at attention's 255 and 511 (the INVERSE rule's QMAX); and the RoPE
table's growth (strata_prefill.contract.numerics.RopeTable)."""
import math

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import quants as gq
from hypothesis import given, settings
from hypothesis import strategies as st

from strata_prefill.contract import numerics
from strata_prefill.contract.blockquant import INVERSE, SCALE, quantize_blocks
from strata_prefill.contract.constants import ROPE_MIN_ROWS

F32 = np.float32
SETTINGS = settings(max_examples=60, deadline=None)


def c_roundf(v: float) -> float:
    """C roundf of a float32 value (|v| + 0.5 is exact in float64)."""
    return math.copysign(math.floor(abs(v) + 0.5), v)


def c_rint(v: float) -> float:
    """Round half to even of a float32 value (Python's round is half to even, and exact)."""
    return float(round(v))


def scalar_block(vals, rule, qmax=127, half_to_even=False):
    """One finite, non-zero block, literally: (codes, d)."""
    amax = F32(0.0)
    for v in vals:
        amax = max(amax, F32(abs(v)))
    if rule == INVERSE:
        m = F32(qmax) / amax
        d = F32(1.0) / m
    else:
        d = amax / F32(127.0)
        m = F32(1.0) / d
    rnd = c_rint if half_to_even else c_roundf
    return [int(rnd(float(F32(v) * m))) for v in vals], d


def random_blocks(seed, n_blocks, block, spread):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n_blocks, block)).astype(F32)
    x *= (F32(10.0) ** rng.uniform(-spread, spread, (n_blocks, 1))).astype(F32)
    return x


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), n_blocks=st.integers(1, 4), block=st.sampled_from([32, 64]),
       spread=st.floats(0, 6), rule=st.sampled_from([INVERSE, SCALE]))
def test_matches_scalar_loop(seed, n_blocks, block, spread, rule):
    x = random_blocks(seed, n_blocks, block, spread)
    q, d = quantize_blocks(x.reshape(-1), block, rule)
    for b in range(n_blocks):
        codes, db = scalar_block(x[b].tolist(), rule)
        assert q[b * block:(b + 1) * block].tolist() == codes
        assert d[b].tobytes() == F32(db).tobytes()


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), n_blocks=st.integers(1, 4), block=st.sampled_from([32, 64, 128]),
       spread=st.floats(0, 6), qmax=st.sampled_from([127, 255, 511]), half_to_even=st.booleans())
def test_code_bound_and_rounding(seed, n_blocks, block, spread, qmax, half_to_even):
    """The INVERSE rule at another code bound (Q's 255, K's 511) and with rint codes (P's):
    the scalar loop's codes and scales, |code| <= qmax with the bound reached in every block,
    and a code type that holds them (int8 at 127, int16 above)."""
    x = random_blocks(seed, n_blocks, block, spread)
    q, d = quantize_blocks(x, block, qmax=qmax, half_to_even=half_to_even)
    assert q.dtype == (np.int8 if qmax == 127 else np.int16)
    assert np.abs(q.astype(np.int32)).max(axis=-1).tolist() == [qmax] * n_blocks
    for b in range(n_blocks):
        codes, db = scalar_block(x[b].tolist(), INVERSE, qmax, half_to_even)
        assert q[b].tolist() == codes
        assert d[b].tobytes() == F32(db).tobytes()


def test_rint_codes_round_halves_to_even():
    """amax 127 makes m = 1: the codes are the values rounded, halves to even with rint and
    away from zero with roundf."""
    x = np.array([127.0, 0.5, 1.5, 2.5, -0.5, -2.5, 3.25, -127.0], F32)
    assert quantize_blocks(x, 8, half_to_even=True)[0].tolist() == [127, 0, 2, 2, 0, -2, 3, -127]
    assert quantize_blocks(x, 8)[0].tolist() == [127, 1, 2, 3, -1, -3, 3, -127]


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), n_blocks=st.integers(1, 4), spread=st.floats(0, 6))
def test_scale_rule_is_gguf_q8_0(seed, n_blocks, spread):
    x = random_blocks(seed, n_blocks, 32, spread)
    q, d = quantize_blocks(x, 32, SCALE)
    ours = np.concatenate([d.astype("<f2").view(np.uint8), q.view(np.uint8)], axis=1)
    assert ours.tobytes() == gq.quantize(x, QT.Q8_0).tobytes()


# One kind of special block, written into a random position among ordinary blocks:
# (values of the block, the scale it must store).
_TINY = F32(1e-38)  # amax below 127 / FLT_MAX: 127 / amax overflows to inf


def _special(kind, block, rng, rule):
    v = np.zeros(block, F32)
    if kind == "zero":
        return v, F32(0.0)
    if kind == "negzero":
        return -v, F32(0.0)
    if kind == "nan":
        v[:] = rng.standard_normal(block).astype(F32)
        v[rng.integers(block)] = np.nan
        return v, F32(0.0)
    if kind == "tiny":
        v[:] = rng.uniform(-1, 1, block).astype(F32) * _TINY
        # SCALE: d = amax/127 is subnormal and 1/d overflows as well
        return v, F32(0.0)
    assert kind == "inf"
    v[:] = rng.standard_normal(block).astype(F32)
    v[rng.integers(block)] = rng.choice([np.inf, -np.inf])
    return v, F32(np.inf)  # m = 127/inf = 0 (or 1/inf): d = +inf, every code 0


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), n_blocks=st.integers(1, 4), block=st.sampled_from([32, 64]),
       kind=st.sampled_from(["zero", "negzero", "nan", "tiny", "inf"]),
       rule_qmax=st.sampled_from([(INVERSE, 127), (SCALE, 127), (INVERSE, 255), (INVERSE, 511)]))
def test_defined_cases(seed, n_blocks, block, kind, rule_qmax):
    rule, qmax = rule_qmax
    rng = np.random.default_rng(seed)
    x = random_blocks(seed, n_blocks, block, 3)
    where = int(rng.integers(n_blocks))
    x[where], want_d = _special(kind, block, rng, rule)
    with np.errstate(all="raise"):  # the helper must not warn or raise on these
        q, d = quantize_blocks(x.reshape(1, -1), block, rule, qmax=qmax)
    q, d = q.reshape(n_blocks, block), d.reshape(n_blocks)
    assert not q[where].any()
    assert d[where].tobytes() == want_d.tobytes()
    for b in range(n_blocks):  # the other blocks are untouched by their neighbour
        if b != where:
            qb, db = quantize_blocks(x[b], block, rule, qmax=qmax)
            assert q[b].tobytes() == qb.tobytes() and d[b].tobytes() == db.tobytes()


def test_refuses_bad_input():
    import pytest

    with pytest.raises(TypeError):
        quantize_blocks(np.ones(32), 32)
    with pytest.raises(ValueError):
        quantize_blocks(np.ones(40, F32), 32)
    with pytest.raises(ValueError):
        quantize_blocks(np.ones(32, F32), 32, "rint")
    for bad in (0, -5, 2.5, True, 40000):
        with pytest.raises(ValueError, match="code bound"):
            quantize_blocks(np.ones(32, F32), 32, qmax=bad)
    with pytest.raises(ValueError, match="code bound"):
        quantize_blocks(np.ones(32, F32), 32, SCALE, qmax=255)


# --------------------------------------------------------------------------- RopeTable


def test_rope_table_grows_by_doubling():
    built = []

    def build(n_pos, head_dim, base):
        built.append(n_pos)
        return numerics.rope_table(n_pos, head_dim, base)

    t = numerics.RopeTable(16, 1e6, build)
    cos, sin = t.covering(3)
    assert built == [ROPE_MIN_ROWS] and cos.shape == (ROPE_MIN_ROWS, 8)
    assert t.covering(ROPE_MIN_ROWS)[0] is cos and built == [ROPE_MIN_ROWS]
    t.covering(ROPE_MIN_ROWS + 1)
    assert built == [ROPE_MIN_ROWS, 2 * ROPE_MIN_ROWS]
    cos2, sin2 = t.covering(5 * ROPE_MIN_ROWS)
    assert built[-1] == 5 * ROPE_MIN_ROWS and t.rows == 5 * ROPE_MIN_ROWS
    # growing never changes an entry
    assert cos2[:ROPE_MIN_ROWS].tobytes() == cos.tobytes()
    assert sin2[:ROPE_MIN_ROWS].tobytes() == sin.tobytes()
