"""The two primitives of attention contract v2 (docs/numerics.md section 1, "fma" and "exp2c"):

- strata_prefill.contract.numerics.fma against an exact oracle: a*b + c as a Fraction, rounded
  once to the nearest float32 (ties to even, subnormals, overflow to inf) by this file's own
  code, on hypothesis' float32 triples and on constructed hard cases (a sum that float64 rounds
  onto a float32 midpoint, massive cancellation, subnormal results, products past float32's
  range that c brings back);
- strata_prefill.contract.numerics.exp2c against float64 2**x, its defined values (exp2c(0) = 1,
  the clamp of -inf and NaN), monotony, results never subnormal, and its last step (the
  exponent bits added to p's) equal to p * 2**n in float64 for every n it meets.
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strata_prefill.contract import numerics as nm

F32 = np.float32
FLT_MAX = Fraction(float(np.finfo(F32).max))
TWO = Fraction(2)


def round_f32(v: Fraction) -> float:
    """The float32 nearest v, ties to even; inf past the largest float32's rounding range."""
    if v == 0:
        return 0.0
    sign, m = (-1 if v < 0 else 1), abs(v)
    e = m.numerator.bit_length() - m.denominator.bit_length()  # 2^e <= m < 2^(e+2)
    if m < TWO ** e:
        e -= 1
    elif m >= TWO ** (e + 1):
        e += 1
    quantum = TWO ** (max(e, -126) - 23)  # below 2^-126 the subnormals' fixed step 2^-149
    n = m / quantum
    whole = n.numerator // n.denominator
    rest = n - whole
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and whole % 2):
        whole += 1
    r = whole * quantum
    if r > FLT_MAX:
        return sign * math.inf
    return sign * float(r)


def fma_oracle(a, b, c) -> float:
    """IEEE fused multiply-add of three float32 values, rounded once, from exact rationals."""
    a, b, c = float(a), float(b), float(c)
    if not all(math.isfinite(v) for v in (a, b, c)):
        prod_nan = (math.isinf(a) and b == 0) or (math.isinf(b) and a == 0)
        if math.isnan(a) or math.isnan(b) or math.isnan(c) or prod_nan:
            return math.nan
        prod = math.inf * math.copysign(1, a) * math.copysign(1, b) if (math.isinf(a) or math.isinf(b)) else None
        if prod is not None and math.isinf(c) and math.copysign(1, c) != math.copysign(1, prod):
            return math.nan
        return prod if prod is not None else c
    exact = Fraction(a) * Fraction(b) + Fraction(c)
    if exact == 0:  # IEEE: +0 unless both addends are zeros of the negative sign
        prod_neg = (math.copysign(1, a) * math.copysign(1, b)) < 0
        if a * b == 0 and c == 0 and prod_neg and math.copysign(1, c) < 0:
            return -0.0
        return 0.0
    return round_f32(exact)


def same_value(got, want: float) -> bool:
    got = np.float32(got)
    if math.isnan(want):
        return bool(np.isnan(got))
    return np.float32(want).tobytes() == got.tobytes()


def naive(a, b, c) -> np.float32:
    """a*b + c rounded to float64 first, then to float32: double rounding."""
    return F32(np.float64(a) * np.float64(b) + np.float64(c))


f32_any = st.floats(width=32)
f32_finite = st.floats(width=32, allow_nan=False, allow_infinity=False)


@settings(max_examples=400, deadline=None)
@given(a=f32_any, b=f32_any, c=f32_any)
def test_fma_any_floats(a, b, c):
    a, b, c = F32(a), F32(b), F32(c)
    with np.errstate(all="ignore"):
        got = nm.fma(a, b, c)
    assert got.dtype == F32 and got.shape == ()
    assert same_value(got, fma_oracle(a, b, c)), (a, b, c, got)


@settings(max_examples=300, deadline=None)
@given(a=f32_finite, b=f32_finite, tweak=st.integers(-3, 3), scale=st.integers(-30, 0))
def test_fma_near_cancellation(a, b, tweak, scale):
    """c about -a*b: the few bits left after the cancellation decide the result."""
    a, b = F32(a), F32(b)
    with np.errstate(all="ignore"):
        c = -F32(np.float64(a) * np.float64(b))
        if np.isfinite(c) and c != 0:
            c = F32(c + F32(tweak) * np.spacing(c) * F32(2.0 ** scale))
    if not np.isfinite(c):
        return
    with np.errstate(all="ignore"):
        assert same_value(nm.fma(a, b, c), fma_oracle(a, b, c)), (a, b, c)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 300))
def test_fma_arrays_broadcast(seed, n):
    """Arrays, broadcast against a column and a scalar, element for element the oracle's."""
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal((n, 1)) * np.exp2(rng.integers(-40, 40, (n, 1)))).astype(F32)
    b = (rng.standard_normal((n, 3)) * np.exp2(rng.integers(-40, 40, (n, 3)))).astype(F32)
    c = F32(rng.standard_normal())
    got = nm.fma(a, b, c)
    assert got.shape == (n, 3) and got.dtype == F32
    for i in range(n):
        for j in range(3):
            assert same_value(got[i, j], fma_oracle(a[i, 0], b[i, j], c))


def _hard_cases():
    e = 2.0 ** -23
    m1, m2 = 2**23 + 2896, 2**23 - 2895  # m1 * m2 = 2^46 + 4688: a*b = 2^-24 (1 + 4688 2^-46)
    return {
        # 1 + 2^-24 + 2^-57.8: float64 rounds onto the midpoint 1 + 2^-24, and ties to even
        # then gives 1; the true result is above the midpoint: 1 + 2^-23
        "tie_after_product_up": (F32(m1 * 2.0 ** -23), F32(m2 * 2.0 ** -47), F32(1.0)),
        # (1 + 2^-23) + 2^-24 (1 - 2^-46): float64 rounds up onto the midpoint, ties to even
        # gives 1 + 2^-22; the true result is below it: 1 + 2^-23
        "tie_after_product_down": (F32(1 + e), F32((1 - e) * 2.0 ** -24), F32(1 + e)),
        # an exact tie: 1 + 2^-24 is a midpoint, ties to even keeps 1
        "exact_tie": (F32(2.0 ** -12), F32(2.0 ** -12), F32(1.0)),
        # (1 + 2^-23)^2 - (1 + 2^-22) = 2^-46: everything cancels but the product's low bits
        "cancellation": (F32(1 + e), F32(1 + e), F32(-(1 + 2 * e))),
        "cancellation_to_zero": (F32(3.0), F32(-5.0), F32(15.0)),
        # subnormal results: 3 * 2^-150 is a midpoint of the subnormal grid (ties to even:
        # 2^-148); with c = -2^-149, 2^-150 ties to 0; a product just above one rounds up
        "subnormal_tie": (F32(3 * 2.0 ** -75), F32(2.0 ** -75), F32(0.0)),
        "subnormal_tie_to_zero": (F32(3 * 2.0 ** -75), F32(2.0 ** -75), F32(-(2.0 ** -149))),
        "subnormal_above_tie": (F32(3 * 2.0 ** -75 * (1 + e)), F32(2.0 ** -75), F32(2.0 ** -149)),
        "subnormal_sum": (F32(1.5 * 2.0 ** -70), F32(2.0 ** -70), F32(-(2.0 ** -140))),
        # products past float32's range, brought back by c, or not
        "big_product_cancelled": (F32(2.0 ** 64), F32(2.0 ** 64), F32(-1.5 * 2.0 ** 127)),
        "big_product_to_max": (F32(2.0 ** 64), F32(2.0 ** 64), F32(-(2.0 ** 104))),
        "big_product_tie_to_inf": (F32(2.0 ** 64), F32(2.0 ** 64), F32(-(2.0 ** 103))),
        "overflow": (F32(2.0 ** 100), F32(2.0 ** 100), F32(-3.0e38)),
        "inf_times_zero": (F32(np.inf), F32(0.0), F32(1.0)),
        "inf_minus_inf": (F32(np.inf), F32(2.0), F32(-np.inf)),
        "negative_zeros": (F32(-0.0), F32(5.0), F32(-0.0)),
    }


@pytest.mark.parametrize("name", list(_hard_cases()))
def test_fma_hard_cases(name):
    a, b, c = _hard_cases()[name]
    with np.errstate(all="ignore"):
        got = nm.fma(a, b, c)
    assert same_value(got, fma_oracle(a, b, c)), (name, got, fma_oracle(a, b, c))


@pytest.mark.parametrize("name", ["tie_after_product_up", "tie_after_product_down"])
def test_the_double_rounding_cases_are_hard(name):
    """Rounding a*b + c to float64 and then to float32 gets these wrong: they test the
    round-to-odd step."""
    a, b, c = _hard_cases()[name]
    assert not same_value(naive(a, b, c), fma_oracle(a, b, c))


def test_fma_refuses_float64():
    with pytest.raises(TypeError):
        nm.fma(np.ones(3), F32(1), F32(1))


# --------------------------------------------------------------------------- exp2c


def dense_stride(step: int = 211) -> np.ndarray:
    """Every step-th float32 from -0.0 down to -125 (by bit pattern), and -125 itself."""
    lo = int(np.array([-125.0], F32).view(np.uint32)[0])
    bits = np.arange(0x80000000, lo + 1, step, dtype=np.uint64).astype(np.uint32)
    return np.append(bits.view(F32), F32(-125.0))


def test_exp2c_constants_are_the_printed_float32s():
    assert [float(c) for c in nm.EXP2C_POLY] == [0.009582842700183392, 0.055906426161527634,
                                                0.24024099111557007, 0.6931241750717163, 1.0]
    assert all(c.dtype == F32 for c in nm.EXP2C_POLY)
    assert nm.LOG2E == F32(1 / math.log(2)) and nm.LOG2E.dtype == F32


def test_exp2c_tracks_float64_on_a_dense_stride():
    x = dense_stride()
    y = nm.exp2c(x)
    assert y.dtype == F32
    rel = np.abs(y.astype(np.float64) / np.exp2(x.astype(np.float64)) - 1)
    assert rel.max() < 3e-6
    # monotone non-decreasing: x descends along the stride, so y must not rise
    assert (np.diff(y.astype(np.float64)) <= 0).all()
    assert (y >= F32(2.0 ** -126)).all()  # never subnormal


@settings(max_examples=300, deadline=None)
@given(x=st.floats(min_value=-125.0, max_value=0.0, width=32))
def test_exp2c_any_floats(x):
    y = nm.exp2c(F32(x))
    assert abs(float(y) / 2.0 ** float(x) - 1) < 3e-6
    assert float(y) >= 2.0 ** -126


def test_exp2c_defined_values():
    assert nm.exp2c(F32(0.0)).tobytes() == F32(1.0).tobytes()
    assert nm.exp2c(F32(-0.0)).tobytes() == F32(1.0).tobytes()
    floor = F32(2.0 ** -125)
    got = nm.exp2c(np.array([-np.inf, np.nan, -125.0, -126.0, -1e30], F32))
    assert got.tobytes() == np.full(5, floor).tobytes()
    n = np.arange(-125, 1)
    assert nm.exp2c(n.astype(F32)).tobytes() == np.exp2(n).astype(F32).tobytes()  # p(0) = 1


def test_exp2c_bit_step_is_the_power_of_two():
    """For every n in [-125, 0] and random f in [-0.5, 0.5]: exp2c(n + f) is the polynomial p(f)
    (fma steps as written) times 2^n, the product computed in float64 (exact)."""
    rng = np.random.default_rng(5)
    for n in range(-125, 1):
        x = (F32(n) + rng.uniform(-0.5, 0.5, 64).astype(F32)).astype(F32)
        x = x[(x <= 0) & (x >= F32(-125.0))]  # the domain, above the clamp
        ns = (x + nm.EXP2C_MAGIC) - nm.EXP2C_MAGIC  # rint(x): n, or n +- 1 at the halves
        f = x - ns
        p = nm.fma(nm.EXP2C_POLY[0], f, nm.EXP2C_POLY[1])
        for c in nm.EXP2C_POLY[2:]:
            p = nm.fma(p, f, c)
        want = (p.astype(np.float64) * np.exp2(ns.astype(np.float64))).astype(F32)
        assert nm.exp2c(x).tobytes() == want.tobytes()
        assert ((p >= F32(0.7)) & (p <= F32(1.42))).all()
