"""The weight types of llama-quantize's default mixes beyond the first six: the legacy 32-value
types Q4_0, Q5_0 and Q5_1 and the K-quants Q4_K, Q5_K, Q6_K and Q3_K. Each is one registered
:class:`strata_prefill.contract.qformats.QuantFormat` (this module is imported by contract/qformats.py, after its
own formats, so the registry's order is theirs and then these).

Every one decodes to the MMQ contract's integer form (docs/numerics.md section 3) with the
epilogues that already exist: the legacy types without a min are PLAIN with signed codes
(``q - 8``, ``q - 16``), Q5_1 is MIN as Q4_1, Q4_K and Q5_K are DMIN as Q2_K (6-bit scales and
mins per 32 values, both sub-scales of a block equal), Q6_K and Q3_K are PLAIN with signed
sub-scales per 16 values. For every type ``gguf.quants.dequantize`` computes exactly the
contract's float expression from these integers, so the two agree bit for bit.

Each has a CUDA decode too (``mmq_kernel``: fast/cuda/kernels/mmq.cu's ``decode_unit``), on the
epilogue form its integers take, so the cuda backend multiplies them as the reference does.

Block layouts (little endian, "half" IEEE binary16), from ggml-common.h's block structs:

- Q4_0, 18 B: d half, qs u8[16]; value i < 16 is the low nibble of qs[i], 16 + i the high one.
- Q5_0, 22 B: d half, qh u32 (bit i: bit 4 of value i), qs u8[16] as Q4_0's.
- Q5_1, 24 B: d half, m half, qh u32, qs u8[16] as Q5_0's.
- Q4_K, 144 B: d half, dmin half, scales u8[12] (eight 6-bit scales and mins), qs u8[128]; the
  64 values 64j .. 64j+63 are the low nibbles then the high nibbles of qs[32j .. 32j+31].
- Q5_K, 176 B: Q4_K's fields, then qh u8[32] between scales and qs: bit s of qh[i] is bit 4 of
  value 32s + i.
- Q6_K, 210 B: ql u8[128], qh u8[64], scales i8[16] (one per 16 values), d half; value
  128h + 64k + i (i < 64) has low bits nibble k of ql[64h + i], value 128h + 32s + i has high
  bits 2s..2s+1 of qh[32h + i]; the code is that 6-bit number minus 32.
- Q3_K, 110 B: hmask u8[32], qs u8[64], scales u8[12] (sixteen 6-bit scales, minus 32), d half;
  value 128h + 32j + i has low bits 2j..2j+1 of qs[32h + i], and 4 is subtracted where bit s of
  hmask[i] (value 32s + i) is clear.
"""
from __future__ import annotations

import numpy as np

from strata_prefill.contract.q8_1 import Layout
from strata_prefill.contract.qformat_base import QT, Epilogue, QuantFormat, _half, _put_half, _u32

_BYTE_SHIFTS = np.arange(8, dtype=np.uint8)


def _spread(u, c, k: float = 0.0, v=(1.0,)) -> float:
    """Standard deviation of ``u * c - k * v`` for u, c, v independent and uniform over the
    values given: a random block's values at main scale 1 (QuantFormat.unit_std)."""
    u, c, v = (np.asarray(a, np.float64) for a in (u, c, v))
    m1 = u.mean() * c.mean() - k * v.mean()
    m2 = (u**2).mean() * (c**2).mean() - 2 * k * u.mean() * c.mean() * v.mean() + k * k * (v**2).mean()
    return float(np.sqrt(m2 - m1 * m1))


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """uint8 [N, 32] from qs [N, 16]: the low nibbles, then the high nibbles."""
    return np.concatenate([qs & np.uint8(15), qs >> np.uint8(4)], axis=1)


def _bit4(qh: np.ndarray) -> np.ndarray:
    """uint8 [N, 32] of 0 or 16: bit i of the little-endian u32 qh [N, 4], moved to bit 4."""
    bits = (_u32(qh) >> np.arange(32, dtype=np.uint32)) & np.uint32(1)  # [N, 32]
    return (bits.astype(np.uint8) << np.uint8(4))


def _unit_subs(n: int) -> np.ndarray:
    return np.ones((n, 1, 2), np.int16)


def _k_scale_min(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The eight 6-bit scales and mins, uint8 [N, 8] each, of Q4_K's and Q5_K's scales
    u8[N, 12]: sub-block j < 4 takes the low 6 bits of bytes j (scale) and 4 + j (min); j >= 4
    the nibbles of byte 4 + j with bits 6..7 of bytes j - 4 (scale) and j (min) above them."""
    d, m, md = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    low6 = np.uint8(63)
    sc = np.concatenate([d & low6, (md & np.uint8(15)) | ((d >> np.uint8(2)) & np.uint8(48))], axis=1)
    mn = np.concatenate([m & low6, (md >> np.uint8(4)) | ((m >> np.uint8(2)) & np.uint8(48))], axis=1)
    return sc, mn


def _k_codes(qs: np.ndarray) -> np.ndarray:
    """uint8 [N, 8, 32] of 0..15 from Q4_K's qs [N, 128]: 32-block 2j the low nibbles of
    qs[32j .. 32j+31], 2j + 1 their high nibbles."""
    n = qs.shape[0]
    q = qs.reshape(n, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    return (q & np.uint8(15)).reshape(n, 8, 32)


def _both_halves(x: np.ndarray) -> np.ndarray:
    """int16 [N, 8, 2]: one sub-scale per 32 values [N, 8], the same for both halves."""
    return np.repeat(x.astype(np.int16)[:, :, None], 2, axis=2)


# --------------------------------------------------------------------------- legacy (32 values)


class _SignedLegacy(QuantFormat):
    """Q4_0 and Q5_0: a half d, then 32 unsigned codes q of `bits` bits; code c = q - OFFSET
    (OFFSET = 2^(bits - 1)), value dw * c (PLAIN, one unit sub-scale)."""

    half_fields = {"d": 0}
    unit_sub = True
    OFFSET = 8

    @classmethod
    def _unsigned(cls, blk: np.ndarray) -> np.ndarray:
        """uint8 [N, 32]: the codes before the offset."""
        raise NotImplementedError

    @classmethod
    def decode_blocks(cls, blk):
        n = blk.shape[0]
        codes = (cls._unsigned(blk).view(np.int8) - np.int8(cls.OFFSET)).reshape(n, 1, 32)
        return codes, _unit_subs(n), _half(blk, 0), None, None

    @classmethod
    def unit_std(cls):
        return _spread((1,), np.arange(-cls.OFFSET, cls.OFFSET))


class Q4_0(_SignedLegacy, qtype=QT.Q4_0):
    """32 values, 18 B: d: half, qs: uint8[16]; code c = nibble - 8 (-8..7), value dw * c."""

    mmq_kernel = "mmq_q4_0"

    @classmethod
    def _unsigned(cls, blk):
        return _nibbles(blk[:, 2:18])


class Q5_0(_SignedLegacy, qtype=QT.Q5_0):
    """32 values, 22 B: d: half, qh: u32, qs: uint8[16]; code c = (nibble | bit << 4) - 16
    (-16..15), value dw * c."""

    mmq_kernel = "mmq_q5_0"
    OFFSET = 16

    @classmethod
    def _unsigned(cls, blk):
        return _nibbles(blk[:, 6:22]) | _bit4(blk[:, 2:6])


class Q5_1(QuantFormat, qtype=QT.Q5_1):
    """32 values, 24 B: d: half, m: half, qh: u32, qs: uint8[16]; code c = nibble | bit << 4
    (0..31), value dw * c + mw (Q4_1's epilogue)."""

    mmq_kernel = "mmq_q5_1"

    half_fields = {"d": 0, "m": 2}
    epilogue = Epilogue.MIN
    unit_sub = True
    q8_1_layout = Layout.DS4

    @classmethod
    def decode_blocks(cls, blk):
        n = blk.shape[0]
        codes = (_nibbles(blk[:, 8:24]) | _bit4(blk[:, 4:8])).view(np.int8).reshape(n, 1, 32)
        return codes, _unit_subs(n), _half(blk, 0), _half(blk, 2), None

    @classmethod
    def unit_std(cls):
        return _spread((1,), np.arange(32))

    @classmethod
    def set_scales(cls, blk, d):
        _put_half(blk, 0, d)
        _put_half(blk, 2, d * np.float32(-15.5))  # m centres the codes 0..31


# --------------------------------------------------------------------------- K-quants (256 values)


def _dmin_form(blk, codes, sc, mn):
    """A Q4_K or Q5_K block's DMIN form: codes, sub-scales u, d and dmin repeated per 32-value
    block, min sub-scales v."""
    return (codes, _both_halves(sc), np.repeat(_half(blk, 0), 8), np.repeat(_half(blk, 2), 8),
            _both_halves(mn))


def _put_d_dmin(blk, d, mean_uc: float):
    """d, and dmin = d * mean_uc: the mean of u*c, so that the min term is of the value's size
    (E[u*c] = mean_uc E[v])."""
    _put_half(blk, 0, d)
    _put_half(blk, 2, d * np.float32(mean_uc))


class _KMin(QuantFormat):
    """Q4_K and Q5_K: d and dmin halves, then per 32 values a 6-bit scale u and min v (both
    halves of the block); codes 0..CODES-1, value (dw * u) * c - mw * v with dw = d and mw =
    dmin (Q2_K's epilogue)."""

    half_fields = {"d": 0, "dmin": 2}
    epilogue = Epilogue.DMIN
    CODES = 16

    @classmethod
    def unit_std(cls):
        return _spread(np.arange(64), np.arange(cls.CODES), (cls.CODES - 1) / 2, np.arange(64))

    @classmethod
    def set_scales(cls, blk, d):
        _put_d_dmin(blk, d, (cls.CODES - 1) / 2)  # dmin: E[u*c] = (CODES-1)/2 E[v]


class Q4_K(_KMin, qtype=QT.Q4_K):
    """256 values, 144 B: d: half, dmin: half, scales: uint8[12], qs: uint8[128]; codes 0..15."""

    mmq_kernel = "mmq_q4_k"
    embed_kernel = "embed_q4_k"

    @classmethod
    def decode_blocks(cls, blk):
        sc, mn = _k_scale_min(blk[:, 4:16])
        codes = _k_codes(blk[:, 16:144]).view(np.int8)
        return _dmin_form(blk, codes, sc, mn)


class Q5_K(_KMin, qtype=QT.Q5_K):
    """256 values, 176 B: Q4_K's fields with qh: uint8[32] before qs, bit s of qh[i] bit 4 of
    value 32s + i; codes 0..31."""

    mmq_kernel = "mmq_q5_k"
    embed_kernel = "embed_q5_k"

    CODES = 32

    @classmethod
    def decode_blocks(cls, blk):
        n = blk.shape[0]
        sc, mn = _k_scale_min(blk[:, 4:16])
        hi = (blk[:, None, 16:48] >> _BYTE_SHIFTS.reshape(1, 8, 1)) & np.uint8(1)  # [N, 8, 32]
        codes = (_k_codes(blk[:, 48:176]) | (hi << np.uint8(4))).view(np.int8).reshape(n, 8, 32)
        return _dmin_form(blk, codes, sc, mn)


class Q6_K(QuantFormat, qtype=QT.Q6_K):
    """256 values, 210 B: ql: uint8[128], qh: uint8[64], scales: int8[16], d: half; codes
    -32..31, a signed 8-bit sub-scale u per 16 values, value (dw * u) * c with dw = d."""

    sub_per_16 = True
    mmq_kernel = "mmq_q6_k"
    embed_kernel = "embed_q6_k"

    half_fields = {"d": 208}

    @classmethod
    def decode_blocks(cls, blk):
        n = blk.shape[0]
        lo = (blk[:, 0:128].reshape(n, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)) & np.uint8(15)
        hi = (blk[:, 128:192].reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & np.uint8(3)
        q = lo.reshape(n, 8, 32) | (hi.reshape(n, 8, 32) << np.uint8(4))
        codes = q.view(np.int8) - np.int8(32)
        sub = blk[:, 192:208].view(np.int8).astype(np.int16).reshape(n, 8, 2)
        return codes, sub, np.repeat(_half(blk, 208), 8), None, None

    @classmethod
    def unit_std(cls):
        return _spread(np.arange(-128, 128), np.arange(-32, 32))


class Q3_K(QuantFormat, qtype=QT.Q3_K):
    """256 values, 110 B: hmask: uint8[32], qs: uint8[64], scales: uint8[12], d: half; codes
    -4..3, a 6-bit sub-scale minus 32 (-32..31) per 16 values, value (dw * u) * c with dw = d."""

    sub_per_16 = True
    mmq_kernel = "mmq_q3_k"

    half_fields = {"d": 108}

    @classmethod
    def decode_blocks(cls, blk):
        n = blk.shape[0]
        lo = (blk[:, 32:96].reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & np.uint8(3)
        hm = (blk[:, None, 0:32] >> _BYTE_SHIFTS.reshape(1, 8, 1)) & np.uint8(1)  # [N, 8, 32]
        # 4 is subtracted where the mask bit is clear
        codes = lo.reshape(n, 8, 32).view(np.int8) - np.int8(4) * (np.int8(1) - hm.view(np.int8))
        s = blk[:, 96:108]
        low = (s[:, None, 0:8] >> np.array([0, 4], np.uint8).reshape(1, 2, 1)) & np.uint8(15)  # [N, 2, 8]
        high = (s[:, None, 8:12] >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 4, 1)) & np.uint8(3)  # [N, 4, 4]
        u = (low.reshape(n, 16) | (high.reshape(n, 16) << np.uint8(4))).astype(np.int16) - np.int16(32)
        return codes, u.reshape(n, 8, 2), np.repeat(_half(blk, 108), 8), None, None

    @classmethod
    def unit_std(cls):
        return _spread(np.arange(-32, 32), np.arange(-4, 4))
