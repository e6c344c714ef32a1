"""The fused exponential of the kernels (strata_numerics.cuh, strata_exp_form<1>) emulated in NumPy and
held to the definition, strata_prefill.contract.numerics.exp, bit for bit. Two steps change form:
- r = x - n * LN2_HI as one fused multiply-add: exact value rounded once. Emulated in float64,
  where x - n * LN2_HI is exact (24-bit x, 22-bit product, close exponents), then rounded to
  float32 once;
- p * 2^n as an integer add to p's bits: bits(p) + (bits(tn) << 23) modulo 2^32, with
  tn = x * LOG2E + MAGIC_F (whose bits are MAGIC_I + n).
The GPU checks the two device forms against each other on every float (verify/
test_kernels_cuda.py::test_exp_fused_every_float); this file shows, without a GPU, that the
fused form is the definition: on a stride through [-87, 88], around each edge, and on
hypothesis' floats."""
import re
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from strata_prefill.fast.cuda.runtime import KERNEL_DIR
from strata_prefill.contract import numerics as nx

_HEADER = (Path(KERNEL_DIR) / "strata_numerics.cuh").read_text()
MAGIC_F = np.float32(float(re.search(r"#define MAGIC_F ([0-9.]+)f", _HEADER).group(1)))


def fused_exp(x: np.ndarray) -> np.ndarray:
    """strata_exp_form<1> of strata_numerics.cuh, in NumPy."""
    x = np.asarray(x, np.float32)
    tn = (x * nx.EXP_LOG2E) + MAGIC_F
    n = tn - MAGIC_F
    r = (x.astype(np.float64) - n.astype(np.float64) * np.float64(nx.EXP_LN2_HI)).astype(np.float32)
    r = r - n * nx.EXP_LN2_LO
    p = np.full_like(r, nx.EXP_POLY[0])
    for c in nx.EXP_POLY[1:]:
        p = p * r
        p = p + c
    bits = (p.view(np.uint32).astype(np.uint64) + (tn.view(np.uint32).astype(np.uint64) << np.uint64(23))) % (1 << 32)
    y = bits.astype(np.uint32).view(np.float32)
    y = np.where(x < nx.EXP_LO, np.float32(0.0), y)
    y = np.where(x > nx.EXP_HI, np.float32(np.inf), y)
    return np.where(np.isnan(x), x, y).astype(np.float32)


def same(x: np.ndarray):
    with np.errstate(over="ignore", invalid="ignore"):
        got, want = fused_exp(x), nx.exp(x)
    bad = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
    assert bad.size == 0, f"{bad.size} differ, first x = {x[bad[:3]]!r}: {got[bad[:3]]!r} vs {want[bad[:3]]!r}"


def test_ln2_hi_times_every_n_is_exact():
    n = np.arange(-130, 131).astype(np.float32)
    assert np.array_equal((n * nx.EXP_LN2_HI).astype(np.float64), n.astype(np.float64) * np.float64(nx.EXP_LN2_HI))


def test_a_stride_through_the_range():
    lo, hi = np.float32(-87.0).view(np.uint32), np.float32(88.0).view(np.uint32)
    neg = np.arange(0x80000000, lo + 1, 61, dtype=np.uint64).astype(np.uint32).view(np.float32)  # -0 .. -87
    pos = np.arange(0, hi + 1, 61, dtype=np.uint64).astype(np.uint32).view(np.float32)  # 0 .. 88
    same(neg)
    same(pos)


def test_every_float_around_the_edges():
    for edge in (-87.0, -86.99, -86.5, 88.0, 87.5, 0.0, -0.3465736, 0.3465736):
        b = np.float32(edge).view(np.int32).astype(np.int64)
        around = np.arange(b - 20000, b + 20000)
        around = around[(around >= 0) & (around < 1 << 31)].astype(np.uint32).view(np.float32)
        same(around)
        same(-around)


def test_specials():
    same(np.array([np.nan, -np.nan, np.inf, -np.inf, 1e30, -1e30, 3.4e38, -3.4e38, 1e-45, -1e-45], np.float32))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True), min_size=1, max_size=64))
def test_any_floats(xs):
    same(np.array(xs, np.float32))


def test_the_plain_form_would_not_need_these_steps():
    """Not vacuous: rounding the product n * LN2_LO before the subtraction matters (so only the
    exact LN2_HI step may be fused), shown on the stride."""
    x = np.arange(0x80000000, np.float32(-87.0).view(np.uint32) + 1, 997, dtype=np.uint64).astype(np.uint32).view(np.float32)
    n = np.rint(x * nx.EXP_LOG2E)
    r = x - n * nx.EXP_LN2_HI
    plain = r - n * nx.EXP_LN2_LO
    fused_lo = (r.astype(np.float64) - n.astype(np.float64) * np.float64(nx.EXP_LN2_LO)).astype(np.float32)
    assert np.any(plain.view(np.uint32) != fused_lo.view(np.uint32))
