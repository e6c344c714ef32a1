"""int8 block quantization: the one NumPy loop behind q8_1 buffers, the int8 KV cache and
attention blocks, and the loader's Q8_0 conversion (docs/numerics.md, section 2).

Per block of ``block`` values along the last axis, ``amax = max|x|``, then one of two scale
rules:

- :data:`INVERSE` (q8_1, the KV cache, attention): ``m = 127.0f / amax``, ``d = 1.0f / m``.
- :data:`SCALE` (Q8_0, as ggml's ``quantize_row_q8_0`` and ``gguf.quants``):
  ``d = amax / 127.0f``, ``m = 1.0f / d``.

then ``q_i = (int8) roundf(x_i * m)`` and the block stores ``d``. The INVERSE rule also takes
another code bound ``QMAX`` in place of 127 (``m = QMAX / amax``, codes ``|q| <= QMAX``, int16
where they do not fit int8): attention's per-row Q (255) and K (511). The defined edge cases:

- a block whose multiplier ``m`` is not finite stores scale 0 and codes 0: an all-zero block
  (either sign), a block whose ``amax`` is so small that the inverse overflows (below about
  3.7e-37 for INVERSE at 127), and a block holding a NaN (``amax`` is NaN);
- an infinite value makes ``amax`` infinite and ``m`` 0: ``d`` is then ``+inf`` (INVERSE,
  ``1/0``; SCALE, ``inf/127``) and every code 0 (``inf * 0`` is NaN, and a non-finite product
  gives code 0, as ``to_i8`` does in the kernels' header).

The kernels that write these blocks check the zero case first and compute the rest as
written; the two agree on every finite input.
"""
from __future__ import annotations

import numpy as np

from strata_prefill.contract.numerics import rint, roundf

__all__ = ["INVERSE", "SCALE", "QMAX", "quantize_blocks"]

INVERSE = "inverse"  #: m = 127 / amax, d = 1 / m
SCALE = "scale"  #: d = amax / 127, m = 1 / d

QMAX = 127  #: the default code bound: int8 codes
_QMAX_LIMIT = 32767  # codes above it do not fit int16
_127 = np.float32(127.0)
_ONE = np.float32(1.0)
_ZERO = np.float32(0.0)


def quantize_blocks(x: np.ndarray, block: int, rule: str = INVERSE, qmax: int = QMAX,
                    half_to_even: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Quantize float32 ``x [..., n]`` in blocks of ``block`` values along the last axis.

    Returns (codes [..., n], d float32 [..., n / block]). ``rule`` is :data:`INVERSE`
    or :data:`SCALE` (module docstring); every operation is one float32 rounding. ``qmax``
    (INVERSE only) is the code bound in place of 127: ``m = qmax / amax``, ``|q| <= qmax``
    (attention's Q at 255 and K at 511, docs/numerics.md section 5). Codes are int8 for a
    bound of 127 at most, int16 above. ``half_to_even``: codes by ``rint`` instead of
    ``roundf`` (attention's folded P codes, section 5), the rest unchanged.
    """
    x = np.asarray(x)
    if x.dtype != np.float32:
        raise TypeError(f"quantize_blocks expects float32 data, got {x.dtype}")
    if isinstance(qmax, bool) or int(qmax) != qmax or not 1 <= int(qmax) <= _QMAX_LIMIT:
        raise ValueError(f"quantize_blocks: code bound must be a whole number in 1..{_QMAX_LIMIT}, got {qmax!r}")
    if rule != INVERSE and qmax != QMAX:
        raise ValueError(f"quantize_blocks: a code bound other than {QMAX} is for the {INVERSE} rule only")
    bound = np.float32(qmax)
    rnd = rint if half_to_even else roundf
    n = x.shape[-1]
    if block < 1 or n % block:
        raise ValueError(f"a row of {n} values is not a whole number of {block}-value blocks")
    xb = x.reshape(*x.shape[:-1], n // block, block)
    amax = np.max(np.abs(xb), axis=-1)
    with np.errstate(divide="ignore", over="ignore", under="ignore", invalid="ignore"):
        if rule == INVERSE:
            m = bound / amax
            d = _ONE / m
        elif rule == SCALE:
            d = amax / _127
            m = _ONE / d
        else:
            raise ValueError(f"unknown scale rule {rule!r}")
        ok = np.isfinite(m)
        if ok.all() and np.isfinite(amax).all():
            # every block finite: |x * m| <= amax * m, about 127, so every product is finite
            # and kept; the same values as the general form below, fewer passes
            q = rnd(xb * m[..., None])
        else:
            prod = xb * np.where(ok, m, _ZERO)[..., None]
            keep = ok[..., None] & np.isfinite(prod)
            q = np.where(keep, rnd(np.where(keep, prod, _ZERO)), _ZERO)
    d = np.where(ok, d, _ZERO)
    assert q.dtype == np.float32 and d.dtype == np.float32
    return q.astype(np.int8 if qmax <= QMAX else np.int16).reshape(x.shape), d
