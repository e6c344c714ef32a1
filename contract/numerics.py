"""The float primitives of the numerics contract (docs/numerics.md, section 1).

Every function here is the NumPy *definition* of an operation that a CUDA kernel must
reproduce bit for bit. All arithmetic is float32: each ``*``, ``+``, ``-``, ``/`` below is one
IEEE float32 operation, round to nearest even, in the written order. NumPy evaluates a
float32 array op float32 scalar in float32 and rounds once, which is what a CUDA kernel built
with ``--fmad=false`` does, so the two agree as long as no float64 value sneaks into an
intermediate. To make sure of that, every constant is an ``np.float32`` and every input is
checked by :func:`f32`, which refuses float64 arrays instead of silently rounding them.
"""

from __future__ import annotations

import math

import numpy as np

from strata_prefill.contract.constants import ROPE_MIN_ROWS

__all__ = [
    "f32",
    "roundf",
    "rint",
    "exp",
    "fma",
    "exp2c",
    "sigmoid",
    "silu",
    "softmax",
    "lane_sum",
    "tree_sum",
    "rmsnorm",
    "to_half",
    "from_half",
    "rope_table",
    "RopeTable",
    "rope_neox",
    "LANES",
    "EXP_LOG2E",
    "EXP_LN2_HI",
    "EXP_LN2_LO",
    "EXP_POLY",
    "EXP_HI",
    "EXP_LO",
    "LOG2E",
    "EXP2C_POLY",
    "EXP2C_FLOOR",
    "EXP2C_MAGIC",
]

F32 = np.float32

#: lanes of a warp: the number of strided partials of :func:`lane_sum`
LANES = 32

# exp constants (docs/numerics.md, "exp"). LN2_HI = 0x1.62e4p-1 has 15 significant bits, so
# n * LN2_HI is exact for |n| < 512; LN2_LO is float32(ln 2 - LN2_HI).
EXP_LOG2E = F32(1.44269504)
EXP_LN2_HI = F32(0.693145752)
EXP_LN2_LO = F32(1.42860677e-06)
#: Horner coefficients, highest degree first (Taylor: 1/7!, 1/6!, ..., 1/2!, 1, 1)
EXP_POLY = tuple(
    F32(c)
    for c in (
        1.98412698e-04,
        1.38888889e-03,
        8.33333333e-03,
        4.16666667e-02,
        1.66666667e-01,
        0.5,
        1.0,
        1.0,
    )
)
EXP_HI = F32(88.0)
EXP_LO = F32(-87.0)

# exp2c constants (docs/numerics.md, "exp2c"): attention's base-2 exponential.
#: float32(1 / ln 2), rounded once from float64: natural-unit logits to base 2 (a sink)
LOG2E = F32(1.0 / math.log(2.0))
#: C4, C3, C2, C1, 1 (Horner order): a degree-4 fit of 2^f on [-0.5, 0.5] with p(0) = 1
EXP2C_POLY = tuple(F32(c) for c in (0.009582842700183392, 0.055906426161527634, 0.24024099111557007,
                                    0.6931241750717163, 1.0))
#: the clamp: exp2c(x) = exp2c(-125) below it (and for NaN), so 2^n stays a normal float
EXP2C_FLOOR = F32(-125.0)
#: 1.5 * 2^23: x + MAGIC is 12582912 + rint(x), and its low mantissa bits are rint(x)
EXP2C_MAGIC = F32(12582912.0)

# fma's test for a float64 sum that sits on a float32 rounding midpoint
_LOW29 = np.int64((1 << 29) - 1)
_MID29 = np.int64(1 << 28)
_TINY32 = F32(2.0 ** -126)

_ZERO = F32(0.0)
_HALF = F32(0.5)
_ONE = F32(1.0)


def f32(x) -> np.ndarray:
    """``x`` as a float32 array.

    float32 arrays pass through unchanged (no copy); float16 and integer arrays are widened
    (exactly, for integers up to 2^24); Python scalars and lists are converted. A float64 (or
    wider) *array or NumPy scalar* is refused with TypeError: converting it would be a hidden
    rounding, and it is almost always float64 having crept into a computation.
    """
    if isinstance(x, (np.ndarray, np.generic)):
        dt = x.dtype
        if dt == np.float32:
            return np.asarray(x)
        if dt == np.float16 or dt.kind in "iub":
            return np.asarray(x, dtype=np.float32)
        raise TypeError(f"expected float32 data, got {dt}")
    return np.asarray(x, dtype=np.float32)


def _check32(a: np.ndarray) -> np.ndarray:
    # internal guard: every intermediate result must still be float32
    assert a.dtype == np.float32, a.dtype
    return a


# --------------------------------------------------------------------------- rounding


def roundf(x) -> np.ndarray:
    """C ``roundf``: round half away from zero, exact for every float32 (CUDA ``roundf``).

    ``t = trunc(x)``; the result is ``t + copysign(1, x)`` where ``|x - t| >= 0.5``, else
    ``t``. ``x - t`` is exact (it is the fractional part), so 0.49999997 gives 0, not the 1
    that ``floor(x + 0.5)`` would give; for |x| >= 2^23 the fraction is 0 and x is returned.
    Signed zeros follow C: roundf(-0.3) == -0.0. NaN and infinities pass through.
    """
    x = f32(x)
    # Computed as rint (round half to even), which is roundf everywhere but at the exact
    # halves k + 0.5, where rint may round towards zero; there x + copysign(0.5, x) is the
    # exact away-from-zero result. x - rint(x) is exact, so a half is recognised exactly;
    # the same bits as the trunc form above, checked for every float32.
    with np.errstate(invalid="ignore"):
        out = np.rint(x, out=np.empty_like(x))
        d = np.subtract(x, out, out=np.empty_like(x))
        np.abs(d, out=d)
        half = d == _HALF
    if half.any():
        xh = x[half]
        out[half] = xh + np.copysign(_HALF, xh)
    return _check32(np.asarray(out, dtype=np.float32))


def rint(x) -> np.ndarray:
    """Round half to even (CUDA ``rintf``, ``np.rint``)."""
    x = f32(x)
    return _check32(np.rint(x))


# --------------------------------------------------------------------------- exp family


def _pow2(n: np.ndarray) -> np.ndarray:
    """2^n as float32 built from exponent bits, for integer-valued float32 n in [-126, 127]."""
    bits = n.astype(np.int32)
    bits += np.int32(127)
    bits <<= np.int32(23)
    return bits.view(np.float32)


def exp(x) -> np.ndarray:
    """The one exponential of the contract (softmax, sigmoid, SiLU, attention).

    Range reduction ``n = rint(x * log2e)``, ``r = (x - n*LN2_HI) - n*LN2_LO``, a degree-7
    Horner polynomial, then ``p * 2^n`` with 2^n from exponent bits. Every op rounds to
    float32 separately (no FMA). NaN passes through, x > 88 gives +inf, x < -87 gives 0
    (results are never subnormal), exp(0) == 1 exactly.
    """
    x = f32(x)
    shape = x.shape
    x = x.reshape(-1)  # an array even for one value, so that out= works
    nan = np.isnan(x)
    hi = x > EXP_HI
    lo = x < EXP_LO
    special = nan | hi | lo
    # evaluate the polynomial on a safe copy; the special lanes are replaced afterwards.
    # The operations run in place (out=): the same float32 operations, no temporaries.
    xs = np.where(special, _ZERO, x).astype(np.float32, copy=False)
    n = np.multiply(xs, EXP_LOG2E)
    np.rint(n, out=n)
    r = np.multiply(n, EXP_LN2_HI)
    np.subtract(xs, r, out=r)
    t = np.multiply(n, EXP_LN2_LO, out=xs)  # xs is not read again
    np.subtract(r, t, out=r)
    p = np.full_like(r, EXP_POLY[0])
    for c in EXP_POLY[1:]:
        np.multiply(p, r, out=p)
        np.add(p, c, out=p)
    y = np.multiply(p, _pow2(n), out=p)
    if special.any():
        y[lo] = _ZERO
        y[hi] = F32(np.inf)
        y[nan] = x[nan]
    return _check32(y.reshape(shape))


def fma(a, b, c) -> np.ndarray:
    """``a * b + c`` with one rounding to float32 (IEEE fused multiply-add, CUDA
    ``__fmaf_rn``), elementwise with NumPy broadcasting.

    Emulated exactly: ``a * b`` is exact in float64 (24 + 24 bits); ``s = a*b + c`` rounds
    to nearest in float64 and TwoSum gives its exact error ``e``; where ``e != 0`` and ``s``'s
    last mantissa bit is 0, ``s`` steps one float64 ulp toward ``e`` (round to odd); then
    ``s`` rounds once to float32. Round to odd at 53 bits followed by one rounding to 24 bits
    is the correctly rounded result (53 >= 24 + 2), subnormal results and overflow to inf
    included. Where ``a*b + c`` is not finite (an inf or NaN input) the float64 sum is used
    as is: its inf or NaN is IEEE fma's.
    """
    a, b, c = f32(a), f32(b), f32(c)
    shape = np.broadcast_shapes(a.shape, b.shape, c.shape)
    if not shape:  # one value: as an array of one, so that its elements can be indexed
        a, b, c = (v.reshape(1) for v in (a, b, c))
    return _check32(_Fma(a.shape if not shape else shape).run(a, b, c, normal=False).reshape(shape))


class _Fma:
    """fma's work arrays for one shape, reused across the steps of a chain (exp2c's four),
    since a fresh large array costs as much as the arithmetic on it."""

    def __init__(self, shape):
        self.s = np.empty(shape, np.float64)
        self.low = np.empty(shape, np.int64)
        self.mid = np.empty(shape, np.bool_)

    def run(self, a, b, c, normal: bool, out=None) -> np.ndarray:
        """fma of operands holding float32 values (float32 arrays or scalars, or float64
        copies of float32 values) into ``out`` (float32, new if None). ``normal``: the caller
        knows every result is 0 or at least 2^-126 in magnitude, which spares one test."""
        s, bits = self.s, self.s.view(np.int64)
        np.multiply(a, b, out=s, dtype=np.float64)  # exact
        np.add(s, c, out=s)
        if out is None:
            out = np.empty(s.shape, np.float32)
        with np.errstate(invalid="ignore", over="ignore"):
            np.copyto(out, s, casting="same_kind")
            # Rounding s to float32 instead of a*b + c can only differ where s sits on a
            # float32 rounding midpoint (a*b + c may then lie on either side of it; elsewhere
            # s and a*b + c are on the same side of every midpoint): in the normal range, s's
            # low 29 mantissa bits 1000...0; at 2^-126 and below (a subnormal float32's
            # midpoints sit higher in the mantissa) any s. Only those take TwoSum and the
            # round-to-odd step.
            np.bitwise_and(bits, _LOW29, out=self.low)
            np.equal(self.low, _MID29, out=self.mid)
            if not normal:
                self.mid |= np.abs(out) <= _TINY32
            if self.mid.any():
                idx = np.nonzero(self.mid)  # indexes the broadcast views without copying them
                pa, pb, pc = (np.broadcast_to(np.asarray(v), s.shape)[idx].astype(np.float64)
                              for v in (a, b, c))
                pa = pa * pb
                sa = pa + pc
                bb = sa - pa
                e = (pa - (sa - bb)) + (pc - bb)  # TwoSum: the exact error of sa
                sb = sa.view(np.int64)
                fix = (e != 0) & ((sb & 1) == 0) & np.isfinite(sa)
                # the odd neighbour toward e: magnitude up where e has s's sign, else down
                sb = np.where(fix, sb + np.where((sa > 0) == (e > 0), 1, -1), sb)
                out[idx] = sb.view(np.float64).astype(np.float32)
        return out


def exp2c(x) -> np.ndarray:
    """Attention's base-2 exponential (docs/numerics.md, "exp2c"), for x <= 0, -inf or NaN.

    ``x = fmaxf(x, -125)`` (NaN and -inf give -125 too); ``t = x + 1.5*2^23`` (so
    ``t = 12582912 + rint(x)``); ``n = t - 1.5*2^23``; ``f = x - n`` (exact, in [-0.5, 0.5]);
    ``p`` the degree-4 Horner polynomial in fused multiply-adds (:func:`fma`, ending on 1, so
    ``exp2c(0) == 1``); the result's bits are ``bits(p) + (bits(t) << 23)`` in wrapping int32
    arithmetic, which is ``p * 2^n`` exactly (the low 9 bits of bits(t) are n mod 512). The
    result is always a normal float. Positive x is outside the definition.
    """
    x = f32(x)
    shape = x.shape
    x = np.fmax(x.reshape(-1), EXP2C_FLOOR)  # an array even for one value, so that out= works
    t = np.add(x, EXP2C_MAGIC)
    f = np.subtract(t, EXP2C_MAGIC)  # n
    np.subtract(x, f, out=f)  # f = x - n
    f64 = f.astype(np.float64)  # exact, widened once for the four steps
    work = _Fma(x.shape)
    # every partial result of the polynomial lies in [0.05, 1.5]: never subnormal. Two
    # buffers in turn: a step reads its p again where it rounds a midpoint.
    p, q = work.run(EXP2C_POLY[0], f64, EXP2C_POLY[1], normal=True, out=x), f  # x, f not read again
    for c in EXP2C_POLY[2:]:
        p, q = work.run(p, f64, c, normal=True, out=q), p
    # uint32 arithmetic wraps modulo 2^32, exactly as int32 does on the GPU
    y = t.view(np.uint32)
    np.left_shift(y, np.uint32(23), out=y)
    np.add(y, p.view(np.uint32), out=y)
    return _check32(y.view(np.float32).reshape(shape))


def sigmoid(x) -> np.ndarray:
    """``1.0f / (1.0f + exp(-x))``. Finite for every non-NaN input: 0 below -88, 1 above 87ish."""
    x = f32(x)
    return _check32(_ONE / (_ONE + exp(-x)))


def silu(x) -> np.ndarray:
    """``x / (1.0f + exp(-x))``. For x < -88 the denominator is +inf and the result is -0.0
    (x = -inf itself gives NaN, as the formula does on the GPU)."""
    x = f32(x)
    with np.errstate(invalid="ignore"):
        return _check32(x / (_ONE + exp(-x)))


def softmax(v, axis: int = -1) -> np.ndarray:
    """``m = max(v)``; ``e = exp(v - m)``; ``s = lane_sum(e)``; ``p = e / s``, along ``axis``."""
    v = f32(v)
    m = np.max(v, axis=axis, keepdims=True)
    e = exp(v - m)
    s = np.expand_dims(lane_sum(e, axis=axis), axis)
    return _check32(e / s)


# --------------------------------------------------------------------------- reductions


def lane_sum(v, axis: int = -1) -> np.ndarray:
    """Warp-shaped sum along ``axis``: 32 strided partials, then a halving tree.

    Lane l accumulates ``acc = 0.0f; acc = acc + v[i]`` for i = l, l+32, ... < n in order;
    then ``p = p[:16] + p[16:]``, ``p[:8] + p[8:]``, ... down to one value (the GPU's
    xor-shuffle butterfly with offsets 16, 8, 4, 2, 1). Vectorized over the other axes. The
    tail is padded with +0.0, which is bitwise neutral: a lane's acc starts at +0.0 and an
    IEEE sum is never -0.0 unless both operands are, so ``acc + 0.0 == acc`` bit for bit.
    """
    v = np.moveaxis(f32(v), axis, -1)
    n = v.shape[-1]
    steps = -(-n // LANES)
    if steps * LANES != n:
        pad = np.zeros(v.shape[:-1] + (steps * LANES - n,), dtype=np.float32)
        v = np.concatenate([v, pad], axis=-1)
    v = v.reshape(v.shape[:-1] + (steps, LANES))
    acc = np.zeros(v.shape[:-2] + (LANES,), dtype=np.float32)
    for j in range(steps):
        acc = acc + v[..., j, :]
    return _check32(tree_sum(acc, axis=-1))


def tree_sum(v, axis: int = -1) -> np.ndarray:
    """Halving tree along ``axis`` (its length a power of two): ``v = v[:h] + v[h:]``."""
    v = np.moveaxis(f32(v), axis, -1)
    n = v.shape[-1]
    if n < 1 or n & (n - 1):
        raise ValueError(f"tree_sum needs a power-of-two length, got {n}")
    while n > 1:
        h = n // 2
        v = v[..., :h] + v[..., h:]
        n = h
    return _check32(np.asarray(v[..., 0], dtype=np.float32))


# --------------------------------------------------------------------------- RMSNorm


def rmsnorm(x, w, eps) -> np.ndarray:
    """RMSNorm of rows along the last axis.

    ``ss = lane_sum(x_i * x_i)``; ``mean = ss / (float)n``; ``r = 1.0f / sqrtf(mean + eps)``;
    ``y_i = (x_i * r) * w_i``. ``eps`` is rounded to float32 once.
    """
    x = f32(x)
    w = f32(w)
    n = x.shape[-1]
    if w.shape[-1] != n:
        raise ValueError(f"rmsnorm: weight has {w.shape[-1]} values, rows have {n}")
    eps32 = F32(eps)
    ss = lane_sum(x * x, axis=-1)
    mean = ss / F32(n)
    r = _ONE / np.sqrt(mean + eps32)
    return _check32((x * r[..., None]) * w)


# --------------------------------------------------------------------------- half


def to_half(x) -> np.ndarray:
    """float32 -> IEEE binary16, round to nearest even, overflow to inf (``__float2half_rn``)."""
    x = f32(x)
    with np.errstate(over="ignore"):
        return x.astype(np.float16)


def from_half(h) -> np.ndarray:
    """binary16 -> float32, exact. Accepts float16 arrays or uint16 bit patterns."""
    h = np.asarray(h)
    if h.dtype == np.uint16:
        h = h.view(np.float16)
    if h.dtype != np.float16:
        raise TypeError(f"from_half expects float16 or uint16 data, got {h.dtype}")
    return h.astype(np.float32)


# --------------------------------------------------------------------------- RoPE


def rope_table(n_pos: int, head_dim: int, base: float, scaling=None) -> tuple[np.ndarray, np.ndarray]:
    """NEOX RoPE table: float32 ``(cos, sin)``, each [n_pos, head_dim // 2].

    Computed in float64 as ``theta = p * base ** (-2.0 * i / hd)`` (exactly that expression
    and order), then cos and sin rounded to float32 once. The GPU never recomputes it: the
    table is uploaded.

    ``scaling`` (a strata_prefill.formats.config.RopeScaling; None or type ``none`` with attn_factor 1: the
    table above, bit for bit) rescales the angles and the magnitudes as llama.cpp's rope does
    (docs/numerics.md, "RoPE scaling"): ``linear`` divides every angle by the factor; ``yarn``
    blends, per pair, the divided angle and the original one by a ramp between the correction
    dimensions of beta_fast and beta_slow, and multiplies cos and sin by
    ``attn_factor * (1 + 0.1 ln factor)``. Still float64 throughout, rounded once.
    """
    if head_dim % 2:
        raise ValueError(f"rope_table: head_dim must be even, got {head_dim}")
    half = head_dim // 2
    p = np.arange(n_pos, dtype=np.float64)[:, None]
    i = np.arange(half, dtype=np.float64)[None, :]
    theta = p * float(base) ** (-2.0 * i / float(head_dim))
    kind = "none" if scaling is None else scaling.type
    if kind == "none" and (scaling is None or scaling.attn_factor == 1.0):
        # the unscaled table stays the expression above, untouched
        return np.cos(theta).astype(np.float32), np.sin(theta).astype(np.float32)
    mscale = float(scaling.attn_factor)
    if kind == "linear":
        theta = theta / float(scaling.factor)
    elif kind == "yarn":
        factor = float(scaling.factor)
        low, high = _yarn_corr_dims(head_dim, scaling.original_context, float(base),
                                   float(scaling.beta_fast), float(scaling.beta_slow))
        # ramp 1 (the original angle) for the pairs below low: they turn many times within
        # the original context; 0 (the angle divided by factor) above high; linear between
        ramp = 1.0 - np.clip((i - low) / max(0.001, high - low), 0.0, 1.0)
        mix = ramp * float(scaling.ext_factor)
        theta = (theta / factor) * (1.0 - mix) + theta * mix
        if float(scaling.ext_factor) != 0.0:
            mscale *= 1.0 + 0.1 * float(np.log(factor))
    elif kind != "none":
        raise ValueError(f"rope_table: unknown scaling type {kind!r}")
    return ((np.cos(theta) * mscale).astype(np.float32),
            (np.sin(theta) * mscale).astype(np.float32))


def _yarn_corr_dims(head_dim: int, original_context: int, base: float, beta_fast: float,
                   beta_slow: float) -> tuple[float, float]:
    """YaRN's correction range (low, high) over the pair index: the pair that turns
    ``beta`` times within ``original_context`` positions sits at
    ``hd * ln(ctx / (2 pi beta)) / (2 ln base)``; low is that of beta_fast floored (at least
    0), high that of beta_slow ceiled (at most hd - 1), in float64."""
    def dim(beta: float) -> float:
        return float(head_dim * np.log(original_context / (beta * 2.0 * np.pi)) / (2.0 * np.log(base)))
    return max(0.0, float(np.floor(dim(beta_fast)))), min(float(head_dim - 1), float(np.ceil(dim(beta_slow))))


class RopeTable:
    """A :func:`rope_table` that grows on demand, by doubling: ``covering(n)`` returns the
    (cos, sin) of at least positions 0..n-1, rebuilt with ``max(n, 2 * rows, ROPE_MIN_ROWS)``
    rows when it holds fewer than n. An entry depends only on its position, so growing never
    changes one. ``build(n_pos, head_dim, base)`` makes the table (default :func:`rope_table`
    with ``scaling``; a device backend passes one that also uploads it)."""

    def __init__(self, head_dim: int, base: float, build=None, scaling=None):
        if build is None:
            def build(n_pos, hd, b):
                return rope_table(n_pos, hd, b, scaling)
        self.head_dim, self.base, self._build = int(head_dim), base, build
        self._table = None
        self.rows = 0  # positions the current table covers

    def covering(self, n: int):
        """(cos, sin) covering positions 0..n-1 (possibly more)."""
        if self.rows < n:
            size = max(int(n), 2 * self.rows, ROPE_MIN_ROWS)
            self._table = self._build(size, self.head_dim, self.base)
            self.rows = size
        return self._table


def rope_neox(x, positions, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate heads NEOX-style: pairs (i, i + hd/2).

    ``x`` is [..., T, n_heads, hd]; ``positions`` [T] integer indices into the table.
    ``y_i = x_i * c - x_j * s``; ``y_j = x_i * s + x_j * c`` (each product rounded, then the
    sum). Returns a new float32 array.
    """
    x = f32(x)
    cos = f32(cos)
    sin = f32(sin)
    if x.ndim < 3:
        raise ValueError(f"rope_neox: x must be [..., T, n_heads, hd], got shape {x.shape}")
    hd = x.shape[-1]
    half = hd // 2
    if hd % 2 or cos.shape[-1] != half or sin.shape[-1] != half:
        raise ValueError(f"rope_neox: head_dim {hd} does not match table width {cos.shape[-1]}")
    pos = np.asarray(positions)
    if pos.dtype.kind not in "iu":
        raise TypeError(f"rope_neox: positions must be integers, got {pos.dtype}")
    if pos.shape != (x.shape[-3],):
        raise ValueError(f"rope_neox: {pos.shape} positions for {x.shape[-3]} tokens")
    c = cos[pos][:, None, :]  # [T, 1, half]
    s = sin[pos][:, None, :]
    xi = x[..., :half]
    xj = x[..., half:]
    y = np.empty_like(x)
    y[..., :half] = xi * c - xj * s
    y[..., half:] = xi * s + xj * c
    return _check32(y)
