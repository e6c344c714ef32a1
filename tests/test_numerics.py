"""Pins the primitives of docs/numerics.md section 1 (contract/numerics.py).

Independent checks are scalar Python loops over np.float32 scalars (each operation one
float32 rounding) following the contract's text, and float64 where accuracy is the point.
"""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strata_prefill.contract import numerics as nm

F32 = np.float32
FMAX = float(np.finfo(np.float32).max)


def bits(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float32).view(np.uint32)


def same_bits(a, b) -> bool:
    a = np.asarray(a)
    b = np.asarray(b)
    assert a.dtype == np.float32 and b.dtype == np.float32, (a.dtype, b.dtype)
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def rand_f32(rng, shape, spread=8):
    """Random float32 values of mixed signs and magnitudes (never all zeros)."""
    m = rng.standard_normal(shape)
    e = rng.integers(-spread, spread + 1, size=shape)
    return (m * np.exp2(e)).astype(np.float32)


f32s = st.floats(width=32, allow_nan=False, allow_infinity=False)


# --------------------------------------------------------------------------- dtype hygiene


def test_float64_arrays_are_refused():
    with pytest.raises(TypeError):
        nm.exp(np.zeros(3))
    with pytest.raises(TypeError):
        nm.lane_sum(np.ones(4, dtype=np.float64))
    # python scalars and lists are fine
    assert nm.roundf(2.5).dtype == np.float32
    assert nm.exp([0.0, 1.0]).dtype == np.float32


@pytest.mark.parametrize(
    "fn",
    [nm.roundf, nm.rint, nm.exp, nm.sigmoid, nm.silu, nm.softmax, nm.lane_sum],
)
def test_outputs_are_float32(fn):
    rng = np.random.default_rng(1)
    x = rand_f32(rng, (3, 37), spread=3)
    assert fn(x).dtype == np.float32


def test_constants_are_float32():
    for c in (nm.EXP_LOG2E, nm.EXP_LN2_HI, nm.EXP_LN2_LO, nm.EXP_HI, nm.EXP_LO, *nm.EXP_POLY):
        assert type(c) is np.float32
    # LN2_HI has few enough significant bits that n * LN2_HI is exact for |n| < 512
    m, _ = math.frexp(float(nm.EXP_LN2_HI))
    assert (m * 2**15).is_integer()
    assert float(nm.EXP_LN2_LO) == float(F32(math.log(2) - float(nm.EXP_LN2_HI)))


# --------------------------------------------------------------------------- roundf / rint


def roundf_ref(v: float) -> float:
    """C roundf for a float32 value: |v| + 0.5 is exact in float64 for any float32."""
    if math.isnan(v) or math.isinf(v):
        return v
    return math.copysign(math.floor(abs(v) + 0.5), v)


def test_roundf_edge_cases():
    cases = [  # (input, C roundf); a list, since 0.0 and -0.0 are equal dict keys
        (0.5, 1.0), (-0.5, -1.0), (1.5, 2.0), (-1.5, -2.0), (2.5, 3.0), (-2.5, -3.0),
        (0.49999997, 0.0), (-0.49999997, -0.0), (0.0, 0.0), (-0.0, -0.0), (-0.3, -0.0),
        (0.3, 0.0), (126.5, 127.0), (-126.5, -127.0), (127.49999, 127.0),
        (8388607.5, 8388608.0), (8388609.0, 8388609.0), (2.0**24 + 2, 2.0**24 + 2),
        (-(2.0**30), -(2.0**30)), (FMAX, FMAX), (1e-45, 0.0), (-1e-45, -0.0),
        (1.1754942e-38, 0.0),
    ]
    x = np.array([c[0] for c in cases], dtype=np.float32)
    want = np.array([c[1] for c in cases], dtype=np.float32)
    assert F32(0.49999997) < F32(0.5)
    assert same_bits(nm.roundf(x), want)
    assert np.isnan(nm.roundf(np.float32(np.nan)))
    assert same_bits(nm.roundf(np.array([np.inf, -np.inf], np.float32)),
                     np.array([np.inf, -np.inf], np.float32))


@settings(max_examples=300, deadline=None)
@given(st.lists(f32s, min_size=1, max_size=64))
def test_roundf_matches_c(vals):
    x = np.array(vals, dtype=np.float32)
    want = np.array([roundf_ref(float(v)) for v in x], dtype=np.float32)
    assert same_bits(nm.roundf(x), want)


def test_roundf_dense_near_halves():
    # every float32 within a few ulp of k + 0.5 for small k, where floor(x + 0.5) breaks
    base = np.arange(-130, 130, dtype=np.float32) + F32(0.5)
    offs = np.arange(-4, 5, dtype=np.int32)
    x = (base.view(np.int32)[:, None] + offs[None, :]).view(np.float32).ravel()
    want = np.array([roundf_ref(float(v)) for v in x], dtype=np.float32)
    assert same_bits(nm.roundf(x), want)


def test_rint_half_even():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49999997, 2.0**23 + 1, -0.0], np.float32)
    want = np.array([0.0, 2.0, 2.0, -0.0, -2.0, -2.0, 0.0, 2.0**23 + 1, -0.0], np.float32)
    assert same_bits(nm.rint(x), want)


# --------------------------------------------------------------------------- exp


def exp_ref(v: np.float32) -> np.float32:
    """The contract's exp, one np.float32 scalar operation per line."""
    x = F32(v)
    if x != x:
        return x
    if x > F32(88.0):
        return F32(np.inf)
    if x < F32(-87.0):
        return F32(0.0)
    n = F32(np.rint(x * F32(1.44269504)))
    r = x - n * F32(0.693145752)
    r = r - n * F32(1.42860677e-06)
    p = F32(1.98412698e-04)
    p = p * r + F32(1.38888889e-03)
    p = p * r + F32(8.33333333e-03)
    p = p * r + F32(4.16666667e-02)
    p = p * r + F32(1.66666667e-01)
    p = p * r + F32(0.5)
    p = p * r + F32(1.0)
    p = p * r + F32(1.0)
    scale = np.array([(int(n) + 127) << 23], dtype=np.int32).view(np.float32)[0]
    return p * scale


def ulp_error(y32: np.ndarray, x32: np.ndarray) -> np.ndarray:
    ref = np.exp(x32.astype(np.float64))
    ulp = np.spacing(ref.astype(np.float32)).astype(np.float64)
    return np.abs(y32.astype(np.float64) - ref) / ulp


# Pinned accuracy of the contract's exp against float64 over [-87, 88]: the maximum over
# every float32 in that range (all 2.2e9 of them, checked once offline) is 1.2206 ulp, at
# x = 59.265224. The tests sweep densely and check that point; this bound guards it.
EXP_MAX_ULP = 1.25
EXP_WORST_X = 59.265224


def test_exp_special_values():
    x = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 88.0, 88.00001, 1e30, -87.0, -87.00001,
                  -1e30, FMAX, -FMAX], dtype=np.float32)
    y = nm.exp(x)
    assert y[0] == F32(1.0) and y[1] == F32(1.0)
    assert np.isnan(y[2])
    assert y[3] == np.inf and y[4] == 0.0
    assert np.isfinite(y[5]) and y[5] > F32(1e38)
    assert y[6] == np.inf and y[7] == np.inf and y[11] == np.inf
    assert y[8] > 0 and y[8] >= np.finfo(np.float32).tiny  # never subnormal
    assert y[9] == 0.0 and y[10] == 0.0 and y[12] == 0.0
    assert not np.signbit(y[[4, 9, 10, 12]]).any()


def test_exp_never_subnormal():
    x = np.linspace(-87, -80, 100_001, dtype=np.float32)
    y = nm.exp(x)
    assert (y >= np.finfo(np.float32).tiny).all()


def test_exp_accuracy_dense_sweep():
    x = np.linspace(-87.0, 88.0, 2_000_001, dtype=np.float64).astype(np.float32)
    err = ulp_error(nm.exp(x), x)
    assert err.max() <= EXP_MAX_ULP, (err.max(), x[err.argmax()])
    assert err.mean() < 0.35


def test_exp_worst_point():
    x = np.array([EXP_WORST_X], dtype=np.float32)
    err = float(ulp_error(nm.exp(x), x)[0])
    assert 1.2 < err <= EXP_MAX_ULP


def test_exp_accuracy_random_and_near_zero():
    rng = np.random.default_rng(7)
    x = rng.uniform(-87.0, 88.0, 1_000_000).astype(np.float32)
    x = np.concatenate([x, rand_f32(rng, 200_000, spread=20).clip(-87, 88),
                        np.linspace(-1, 1, 200_001, dtype=np.float32)])
    err = ulp_error(nm.exp(x), x)
    assert err.max() <= EXP_MAX_ULP, (err.max(), x[err.argmax()])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(width=32, min_value=-100, max_value=100), min_size=1, max_size=32))
def test_exp_matches_scalar_contract(vals):
    x = np.array(vals, dtype=np.float32)
    want = np.array([exp_ref(v) for v in x], dtype=np.float32)
    assert same_bits(nm.exp(x), want)


def test_exp_bits_match_scalar_contract_dense():
    rng = np.random.default_rng(11)
    x = np.concatenate([rng.uniform(-87.5, 88.5, 3000), [88.0, -87.0, 0.0, 1e-40, -1e-40]])
    x = x.astype(np.float32)
    want = np.array([exp_ref(v) for v in x], dtype=np.float32)
    assert same_bits(nm.exp(x), want)


# --------------------------------------------------------------------------- sigmoid / silu


def test_sigmoid_silu_extremes():
    x = np.array([-FMAX, -1e30, -100.0, -88.5, -88.0, -87.5, 0.0, 87.5, 88.0, 100.0, 1e30, FMAX],
                 dtype=np.float32)
    s = nm.sigmoid(x)
    assert not np.isnan(s).any()
    assert s[0] == 0.0 and s[1] == 0.0 and s[-1] == 1.0 and s[-2] == 1.0
    assert s[6] == F32(0.5)
    assert ((s >= 0) & (s <= 1)).all()
    y = nm.silu(x)
    assert not np.isnan(y).any()
    assert y[0] == 0.0 and y[1] == 0.0 and y[6] == 0.0
    assert y[-1] == F32(FMAX) and y[-2] == F32(1e30)
    assert same_bits(nm.sigmoid(np.array([np.inf, -np.inf], np.float32)),
                     np.array([1.0, 0.0], np.float32))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(width=32, min_value=-200, max_value=200), min_size=1, max_size=32))
def test_sigmoid_silu_formulas(vals):
    x = np.array(vals, dtype=np.float32)
    sig = np.array([F32(1.0) / (F32(1.0) + exp_ref(-v)) for v in x], dtype=np.float32)
    slu = np.array([v / (F32(1.0) + exp_ref(-v)) for v in x], dtype=np.float32)
    assert same_bits(nm.sigmoid(x), sig)
    assert same_bits(nm.silu(x), slu)


def test_softmax_formula_and_axis():
    rng = np.random.default_rng(3)
    v = rand_f32(rng, (5, 77), spread=4)
    p = nm.softmax(v)
    for row, prow in zip(v, p):
        m = row.max()
        e = np.array([exp_ref(t - m) for t in row], dtype=np.float32)
        s = lane_sum_ref(list(e))
        want = np.array([t / s for t in e], dtype=np.float32)
        assert same_bits(prow, want)
    assert same_bits(nm.softmax(v.T.copy(), axis=0), p.T)
    assert abs(float(p.sum(axis=-1, dtype=np.float64).max()) - 1.0) < 1e-5


# --------------------------------------------------------------------------- reductions


def lane_sum_ref(vals) -> np.float32:
    """Literal contract: 32 lanes, each a sequential strided sum from 0.0f, then the tree."""
    n = len(vals)
    p = []
    for lane in range(32):
        acc = F32(0.0)
        for i in range(lane, n, 32):
            acc = acc + F32(vals[i])
        p.append(acc)
    while len(p) > 1:
        h = len(p) // 2
        p = [p[i] + p[i + h] for i in range(h)]
    return F32(p[0])


def tree_sum_ref(vals) -> np.float32:
    p = [F32(v) for v in vals]
    while len(p) > 1:
        h = len(p) // 2
        p = [p[i] + p[i + h] for i in range(h)]
    return p[0]


def test_lane_sum_lengths():
    rng = np.random.default_rng(5)
    for n in [1, 2, 5, 31, 32, 33, 63, 64, 65, 100, 127, 129, 640, 1000, 2047, 2560]:
        v = rand_f32(rng, n, spread=12)
        assert same_bits(nm.lane_sum(v), np.array(lane_sum_ref(list(v)), dtype=np.float32)), n


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 400), st.integers(0, 2**32 - 1))
def test_lane_sum_random(n, seed):
    rng = np.random.default_rng(seed)
    v = rand_f32(rng, (3, n), spread=10)
    got = nm.lane_sum(v)
    want = np.array([lane_sum_ref(list(r)) for r in v], dtype=np.float32)
    assert same_bits(got, want)
    # other axis, other batch shapes
    assert same_bits(nm.lane_sum(v.T.copy(), axis=0), want)
    assert same_bits(nm.lane_sum(v[None, :, :]), want[None])


def test_lane_sum_is_not_plain_sequential():
    # the order matters and is the lane order, not left to right
    v = np.zeros(64, dtype=np.float32)
    v[0], v[32], v[1] = 1.0, 2.0**24, -(2.0**24)
    # lanes: lane0 = (0 + 1) + 2^24 = 2^24 (1 lost), lane1 = -2^24: total 0
    assert nm.lane_sum(v) == 0.0
    seq = F32(0.0)
    for t in v:
        seq = seq + t
    assert seq == F32(1.0)


def test_lane_sum_signed_zero_and_specials():
    assert same_bits(nm.lane_sum(np.array([-0.0, -0.0], np.float32)), np.float32(0.0))
    assert nm.lane_sum(np.array([1.0, np.inf], np.float32)) == np.inf
    assert np.isnan(nm.lane_sum(np.array([1.0, np.nan], np.float32)))


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 11), st.integers(0, 2**32 - 1))
def test_tree_sum(logn, seed):
    rng = np.random.default_rng(seed)
    v = rand_f32(rng, (2, 2**logn), spread=10)
    want = np.array([tree_sum_ref(list(r)) for r in v], dtype=np.float32)
    assert same_bits(nm.tree_sum(v), want)
    assert same_bits(nm.tree_sum(v.T.copy(), axis=0), want)


def test_tree_sum_rejects_non_power_of_two():
    with pytest.raises(ValueError):
        nm.tree_sum(np.ones(6, np.float32))


def test_lane_sum_of_32_is_tree_sum():
    rng = np.random.default_rng(9)
    v = rand_f32(rng, (10, 32))
    assert same_bits(nm.lane_sum(v), nm.tree_sum(v))


# --------------------------------------------------------------------------- RMSNorm


def rmsnorm_ref(x, w, eps):
    n = len(x)
    ss = lane_sum_ref([F32(a) * F32(a) for a in x])
    mean = ss / F32(n)
    r = F32(1.0) / np.sqrt(mean + F32(eps))
    assert type(r) is np.float32
    return np.array([(F32(a) * r) * F32(b) for a, b in zip(x, w)], dtype=np.float32)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 300), st.integers(1, 4), st.sampled_from([1e-6, 1e-5, 1e-12]),
       st.integers(0, 2**32 - 1))
def test_rmsnorm_matches_scalar(n, rows, eps, seed):
    rng = np.random.default_rng(seed)
    x = rand_f32(rng, (rows, n), spread=6)
    w = rand_f32(rng, n, spread=2)
    got = nm.rmsnorm(x, w, eps)
    want = np.stack([rmsnorm_ref(r, w, eps) for r in x])
    assert same_bits(got, want)


def test_rmsnorm_batched_shapes():
    rng = np.random.default_rng(2)
    x = rand_f32(rng, (2, 3, 128))
    w = rand_f32(rng, 128, spread=1)
    got = nm.rmsnorm(x, w, 1e-6)
    assert got.shape == x.shape and got.dtype == np.float32
    assert same_bits(got[1, 2], nm.rmsnorm(x[1, 2][None], w, 1e-6)[0])


# --------------------------------------------------------------------------- half


def half_ref_bits(v: float) -> int:
    """RNE via Python's binary16 packing (round half to even, OverflowError past 65504)."""
    try:
        return struct.unpack("<H", struct.pack("<e", v))[0]
    except OverflowError:
        return 0x7C00 if v > 0 else 0xFC00


def test_half_ties_round_to_even():
    one = 1.0
    x = np.array([
        one + 2**-11,            # tie between 1 and 1+2^-10 -> 1 (even)
        one + 3 * 2**-11,        # tie between 1+2^-10 and 1+2^-9 -> 1+2^-9 (even)
        one + 2**-11 + 2**-20,   # just above the tie -> up
        -(one + 2**-11),
        2**-25,                  # half the smallest subnormal -> 0 (even)
        3 * 2**-25,              # tie between 1 and 2 subnormal units -> 2
        65504.0, 65519.99, 65520.0, 1e6, -1e6,   # 65520 is the overflow tie -> inf
        -0.0, 5.960464477539063e-08,
    ], dtype=np.float32)
    h = nm.to_half(x)
    assert h.dtype == np.float16
    want = np.array([half_ref_bits(float(v)) for v in x], dtype=np.uint16)
    assert np.array_equal(h.view(np.uint16), want)
    assert h[0] == 1.0 and h[1] == np.float16(1 + 2**-9)
    assert h[4] == 0.0 and h[5].view(np.uint16) == 2
    assert h[6] == 65504 and h[7] == 65504 and np.isinf(h[8]) and np.isinf(h[9])
    assert h[11].view(np.uint16) == 0x8000


@settings(max_examples=200, deadline=None)
@given(st.lists(f32s, min_size=1, max_size=64))
def test_half_matches_struct(vals):
    x = np.array(vals, dtype=np.float32)
    want = np.array([half_ref_bits(float(v)) for v in x], dtype=np.uint16)
    assert np.array_equal(nm.to_half(x).view(np.uint16), want)


def test_from_half_exact_all_patterns():
    b = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    f = nm.from_half(b)
    assert f.dtype == np.float32
    fin = np.isfinite(f)
    # round trip every finite pattern, and float64 agrees exactly
    assert np.array_equal(nm.to_half(f[fin]).view(np.uint16), b[fin])
    assert np.array_equal(f[fin].astype(np.float64), b[fin].view(np.float16).astype(np.float64))


# --------------------------------------------------------------------------- RoPE


def test_rope_table_vs_float64():
    n_pos, hd, base = 300, 128, 1_000_000.0
    cos, sin = nm.rope_table(n_pos, hd, base)
    assert cos.shape == (n_pos, hd // 2) and cos.dtype == np.float32 and sin.dtype == np.float32
    for p in [0, 1, 2, 17, 299]:
        for i in [0, 1, 5, 31, 63]:
            theta = p * base ** (-2.0 * i / hd)
            assert cos[p, i] == F32(math.cos(theta)) and sin[p, i] == F32(math.sin(theta))
    assert (cos[0] == 1).all() and (sin[0] == 0).all()


def rope_ref(vec, c_row, s_row):
    hd = len(vec)
    h = hd // 2
    y = np.empty(hd, dtype=np.float32)
    for i in range(h):
        xi, xj, c, s = F32(vec[i]), F32(vec[i + h]), F32(c_row[i]), F32(s_row[i])
        y[i] = xi * c - xj * s
        y[i + h] = xi * s + xj * c
    return y


def test_rope_rotation_order_by_hand():
    # hd = 4: pairs (0, 2) and (1, 3); a quarter turn on pair 0 only
    cos = np.array([[0.0, 1.0]], dtype=np.float32)
    sin = np.array([[1.0, 0.0]], dtype=np.float32)
    x = np.array([[[1.0, 2.0, 3.0, 4.0]]], dtype=np.float32)  # [T=1, H=1, 4]
    y = nm.rope_neox(x, np.array([0]), cos, sin)
    # y0 = x0*c - x2*s = -3; y2 = x0*s + x2*c = 1; pair 1 unchanged
    assert np.array_equal(y[0, 0], np.array([-3.0, 2.0, 1.0, 4.0], np.float32))


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 12), st.integers(1, 4), st.sampled_from([2, 8, 64, 128]),
       st.integers(0, 2**32 - 1))
def test_rope_matches_scalar(T, H, hd, seed):
    rng = np.random.default_rng(seed)
    cos, sin = nm.rope_table(64, hd, 10000.0)
    pos = rng.integers(0, 64, T)
    x = rand_f32(rng, (2, T, H, hd), spread=3)
    y = nm.rope_neox(x, pos, cos, sin)
    assert y.dtype == np.float32 and y.shape == x.shape
    for b in range(2):
        for t in range(T):
            for h in range(H):
                want = rope_ref(x[b, t, h], cos[pos[t]], sin[pos[t]])
                assert same_bits(y[b, t, h], want)
    # the unbatched form gives the same bits
    assert same_bits(nm.rope_neox(x[1], pos, cos, sin), y[1])
