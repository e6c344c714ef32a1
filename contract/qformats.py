"""The weight quant formats: one class per supported type, registered by subclassing
(``class Q8_0(QuantFormat, qtype=QT.Q8_0)``, as gguf's own ``gguf/quants.py`` registers its
types). A class holds everything strata and the CUDA path know of its format: block layout,
integer decoding, the MMQ epilogue it needs, the q8_1 layout its kernel reads, its IQ grid,
how to make random valid blocks, and its kernel's name. Adding a type is adding one class;
:mod:`strata_prefill.contract.quants`, :mod:`strata_prefill.contract.q8_1` and :mod:`strata_prefill.contract.mmq` read the registry.

Decoding gives the integer form the MMQ contract works on (docs/numerics.md section 3): per
32-value block, int codes ``c[32]``, integer sub-scales ``u0, u1`` (values 0..15 and 16..31),
a float scale ``dw`` (two, ``dw0, dw1``, one a half, for the HALVES epilogue), and for the min
epilogues a float min ``mw`` (Q2_K also integer min sub-scales ``v0, v1``).

Block layouts are little endian; "half" is IEEE binary16. Values and bytes per block come
from gguf's ``GGML_QUANT_SIZES``.

The IQ grids and the sign table are taken from the gguf package's own data and expanded once
(lazily) to int8 tables; nothing else in strata holds them. The CUDA MMQ kernel reads them
from one table buffer (:func:`table_layout`): the sign masks, then each grid in registration
order (one two types share, once), each in the form its decode reads (:meth:`QuantFormat.table`).
"""
from __future__ import annotations

from typing import ClassVar

import numpy as np

from strata_prefill.contract.q8_1 import Layout
# the base (class, registry, byte helpers, IQ tables) is contract/qformat_base.py; its names are
# this module's too, the registry's one door
from strata_prefill.contract.qformat_base import (  # noqa: F401
    QT,
    Epilogue,
    QuantFormat,
    _half,
    _odd_sub_mean_square,
    _put_half,
    _u16,
    _u32,
    formats,
    lookup,
    sign_table,
    table_layout,
    with_mmq_kernel,
)

# --------------------------------------------------------------------------- #
# The formats


class Q8_0(QuantFormat, qtype=QT.Q8_0):
    """32 values, 34 B: d: half, qs: int8[32]."""

    half_fields = {"d": 0}
    unit_sub = True
    mmq_kernel = "mmq_q8_0"
    embed_kernel = "embed_q8_0"

    @classmethod
    def decode_blocks(cls, blk):
        N = blk.shape[0]
        dw = _half(blk, 0)
        codes = blk[:, 2:34].view(np.int8).reshape(N, 1, 32)
        sub = np.ones((N, 1, 2), np.int16)
        return codes, sub, dw, None, None

    @classmethod
    def unit_std(cls):
        return float(np.sqrt(np.mean(np.arange(-127, 128, dtype=np.float64) ** 2)))

    @classmethod
    def set_scales(cls, blk, d):
        q = blk[:, 2:].view(np.int8)
        np.maximum(q, np.int8(-127), out=q)  # codes in -127..127
        _put_half(blk, 0, d)


class Q4_1(QuantFormat, qtype=QT.Q4_1):
    """32 values, 20 B: d: half, m: half, qs: uint8[16]; value i < 16 is the low nibble of
    qs[i], value 16 + i the high nibble."""

    half_fields = {"d": 0, "m": 2}
    epilogue = Epilogue.MIN
    unit_sub = True
    q8_1_layout = Layout.DS4
    mmq_kernel = "mmq_q4_1"

    @classmethod
    def decode_blocks(cls, blk):
        N = blk.shape[0]
        dw = _half(blk, 0)
        mw = _half(blk, 2)
        qs = blk[:, 4:20]
        codes = np.concatenate([qs & np.uint8(15), qs >> np.uint8(4)], axis=1)
        codes = codes.view(np.int8).reshape(N, 1, 32)
        sub = np.ones((N, 1, 2), np.int16)
        return codes, sub, dw, mw, None

    @classmethod
    def unit_std(cls):
        return float(np.std(np.arange(16, dtype=np.float64)))

    @classmethod
    def set_scales(cls, blk, d):
        _put_half(blk, 0, d)
        _put_half(blk, 2, d * np.float32(-7.5))  # m centres the codes 0..15


class Q2_K(QuantFormat, qtype=QT.Q2_K):
    """256 values, 84 B: scales: uint8[16] (low nibble scale, high nibble min, one per 16
    values), qs: uint8[64], d: half, dmin: half. Value 128*h + 32*j + i is bits 2j..2j+1 of
    qs[32*h + i]."""

    half_fields = {"d": 80, "dmin": 82}
    epilogue = Epilogue.DMIN
    sub_per_16 = True
    q8_1_layout = Layout.D2S6
    mmq_kernel = "mmq_q2_k"
    embed_kernel = "embed_q2_k"

    @classmethod
    def decode_blocks(cls, blk):
        N = blk.shape[0]
        sc = blk[:, 0:16]
        qs = blk[:, 16:80].reshape(N, 2, 1, 32)
        shifts = np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
        codes = ((qs >> shifts) & np.uint8(3)).view(np.int8).reshape(N, 8, 32)
        sub = (sc & np.uint8(15)).astype(np.int16).reshape(N, 8, 2)
        msub = (sc >> np.uint8(4)).astype(np.int16).reshape(N, 8, 2)
        dw = np.repeat(_half(blk, 80), 8)
        mw = np.repeat(_half(blk, 82), 8)
        return codes, sub, dw, mw, msub

    @classmethod
    def unit_std(cls):
        # x = u*c - 1.5*v with u, v uniform 0..15 and c uniform 0..3: mean 0.
        u = np.arange(16, dtype=np.float64)
        eu, eu2, ec, ec2 = u.mean(), (u**2).mean(), 1.5, 3.5
        var = eu2 * ec2 - 2 * 1.5 * eu * ec * eu + 2.25 * eu2
        return float(np.sqrt(var))

    @classmethod
    def set_scales(cls, blk, d):
        _put_half(blk, 80, d)
        _put_half(blk, 82, d * np.float32(1.5))  # dmin: E[u*c] = 1.5 E[v]


_SHIFTS_7 = np.array([0, 7, 14, 21], np.uint32)  # four 7-bit sign indices of an aux word
_BITS_8 = np.arange(8, dtype=np.uint8)


def _odd_ls(ls: np.ndarray) -> np.ndarray:
    """int16 odd sub-scales 2*ls + 1 from the stored scale bits ls."""
    return 2 * ls.astype(np.int16) + 1


def _nibble_pairs(b: np.ndarray) -> np.ndarray:
    """[..., 2]: each byte's low nibble, then its high nibble."""
    return np.stack([b & np.uint8(15), b >> np.uint8(4)], axis=-1)


def _both(u: np.ndarray) -> np.ndarray:
    """[..., 2]: one sub-scale per 32 values, the same for both halves."""
    return np.stack([u, u], axis=-1)


def _aux_signs(aux: np.ndarray) -> np.ndarray:
    """int8 [N, 8, 4, 8]: the sign table's rows at the four 7-bit indices of each aux word [N, 8]."""
    return sign_table()[(aux[:, :, None] >> _SHIFTS_7) & np.uint32(127)]


def _bit_signs(b: np.ndarray) -> np.ndarray:
    """int8 [..., 8] of +-1: -1 where bit i of each byte of b is set."""
    return np.int8(1) - np.int8(2) * ((b[..., None] >> _BITS_8) & np.uint8(1)).view(np.int8)


class _IQFormat(QuantFormat):
    """The IQ types: codes from a grid of int8 entries times signs, odd sub-scales 2*ls+1
    from 4-bit ls, and dw the half d times a fixed factor."""

    #: dw = d * dw_factor (None: dw = d, no multiplication)
    dw_factor: ClassVar[float | None] = None
    half_fields: ClassVar[dict[str, int]] = {"d": 0}  # the half d first (IQ1_M: none)

    @classmethod
    def _dw(cls, d: np.ndarray) -> np.ndarray:
        return np.repeat(d if cls.dw_factor is None else d * np.float32(cls.dw_factor), 8)

    @classmethod
    def unit_std(cls):
        g2 = float(np.mean(cls.grid().astype(np.float64) ** 2))
        k = 1.0 if cls.dw_factor is None else cls.dw_factor
        return float(k * np.sqrt(_odd_sub_mean_square() * g2))

    @classmethod
    def _d(cls, blk: np.ndarray) -> np.ndarray:
        """The block's half d, float32 [N] (at byte 0 unless a type says otherwise)."""
        return _half(blk, 0)

    @classmethod
    def _codes_subs(cls, blk: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """int8 codes [N, 8, 32] and int16 sub-scales u [N, 8, 2] of blocks blk [N, block_bytes]."""
        raise NotImplementedError

    @classmethod
    def decode_blocks(cls, blk):
        codes, sub = cls._codes_subs(blk)
        return codes, sub, cls._dw(cls._d(blk)), None, None


class IQ2_XS(_IQFormat, qtype=QT.IQ2_XS):
    """256 values, 74 B: d: half, qs: uint16[32] (low 9 bits grid index into a 512 x 8 grid,
    high 7 bits index into the 128-entry sign table), scales: uint8[8] (one nibble per 16
    values, low nibble first)."""

    dw_factor = 0.125
    sign_index = True
    sub_per_16 = True
    mmq_kernel = "mmq_iq2_xs"
    grid_source, table_name = "IQ2_XS", "IQ2XS"

    @classmethod
    def _codes_subs(cls, blk):
        N = blk.shape[0]
        q = _u16(blk[:, 2:66])  # [N, 32]
        g = cls.grid()[q & np.uint16(511)]  # [N, 32, 8]
        s = sign_table()[q >> np.uint16(9)]  # [N, 32, 8]
        return (g * s).reshape(N, 8, 32), _odd_ls(_nibble_pairs(blk[:, 66:74]))


class IQ3_XXS(_IQFormat, qtype=QT.IQ3_XXS):
    """256 values, 98 B: d: half, qs: uint8[64] (grid indices into a 256 x 4 grid), aux:
    uint32[8], one per 32 values: bits 7k..7k+6 index the sign table for the k-th 8 values,
    bits 28..31 the scale."""

    dw_factor = 0.25
    sign_index = True
    mmq_kernel = "mmq_iq3_xxs"
    grid_source, table_name = "IQ3_XXS", "IQ3XXS"

    @classmethod
    def _codes_subs(cls, blk):
        N = blk.shape[0]
        g = cls.grid()[blk[:, 2:66]]  # [N, 64, 4]
        aux = _u32(blk[:, 66:98])  # [N, 8]
        codes = (g.reshape(N, 8, 4, 8) * _aux_signs(aux)).reshape(N, 8, 32)
        return codes, _both(_odd_ls(aux >> np.uint32(28)))


class IQ3_S(_IQFormat, qtype=QT.IQ3_S):
    """256 values, 110 B: d: half, qs: uint8[64] (low 8 bits of a 9-bit index into a 512 x 4
    grid), qh: uint8[8] (bit 8 of the indices, one byte per 32 values), signs: uint8[32] (one
    bit per value), scales: uint8[4] (one nibble per 32 values, low nibble first)."""

    mmq_kernel = "mmq_iq3_s"
    grid_source, table_name = "IQ3_S", "IQ3S"

    @classmethod
    def _codes_subs(cls, blk):
        N = blk.shape[0]
        qs = blk[:, 2:66].astype(np.uint16)
        hi = ((blk[:, 66:74, None] >> _BITS_8) & np.uint8(1)).reshape(N, 64).astype(np.uint16)
        g = cls.grid()[qs | (hi << np.uint16(8))]  # [N, 64, 4]
        s = _bit_signs(blk[:, 74:106])  # [N, 32, 8]
        codes = (g.reshape(N, 256) * s.reshape(N, 256)).reshape(N, 8, 32)
        return codes, _both(_odd_ls(_nibble_pairs(blk[:, 106:110])).reshape(N, 8))


# The K-quants and the legacy quants of llama-quantize's default mixes, registered after the
# formats above (their module imports this one's base class).
from strata_prefill.contract import kquants  # noqa: E402,F401

# --------------------------------------------------------------------------- #
# The low-bit grid types of llama-quantize's IQ file types (IQ2_XXS, IQ2_S, IQ1_S, IQ1_M),
# registered after the K-quants: block layouts from ggml-common.h's block_iq2_xxs, block_iq2_s,
# block_iq1_s and block_iq1_m. Each decodes to the PLAIN epilogue's integer form, dw = d / 8.

class IQ2_XXS(_IQFormat, qtype=QT.IQ2_XXS):
    """256 values, 66 B: d: half, then per 32 values 8 bytes: 4 grid indices (uint8, into a
    256 x 8 grid, one per 8 values) and a uint32 aux: bits 7k..7k+6 index the sign table for
    the k-th 8 values, bits 28..31 the scale ls of all 32. gguf: d * (0.5 + ls) * 0.25 * grid *
    sign; here u = 2*ls + 1 per 32 values and dw = d * 0.125 (IQ3_XXS's form with its factor)."""

    dw_factor = 0.125
    sign_index = True
    mmq_kernel = "mmq_iq2_xxs"
    grid_source, table_name = "IQ2_XXS", "IQ2XXS"

    @classmethod
    def _codes_subs(cls, blk):
        N = blk.shape[0]
        q = blk[:, 2:66].reshape(N, 8, 8)
        g = cls.grid()[q[:, :, :4]]  # [N, 8, 4, 8]
        aux = _u32(q[:, :, 4:]).reshape(N, 8)
        return (g * _aux_signs(aux)).reshape(N, 8, 32), _both(_odd_ls(aux >> np.uint32(28)))


class IQ2_S(_IQFormat, qtype=QT.IQ2_S):
    """256 values, 82 B: d: half, qs: uint8[32] (low 8 bits of a 10-bit index into a 1024 x 8
    grid, one per 8 values), signs: uint8[32] (bit i of byte k: the sign of value 8k + i),
    qh: uint8[8] (bits 2l..2l+1 of byte j: bits 8..9 of index 4j + l), scales: uint8[8] (one
    nibble per 16 values, low nibble first). u = 2*ls + 1 per 16 values, dw = d * 0.125
    (IQ2_XS's form)."""

    dw_factor = 0.125
    sub_per_16 = True
    mmq_kernel = "mmq_iq2_s"
    grid_source, table_name = "IQ2_S", "IQ2S"

    @classmethod
    def _codes_subs(cls, blk):
        N = blk.shape[0]
        hi = (blk[:, 66:74, None] >> np.array([0, 2, 4, 6], np.uint8)) & np.uint8(3)  # [N, 8, 4]
        idx = blk[:, 2:34].astype(np.uint16) | (hi.reshape(N, 32).astype(np.uint16) << np.uint16(8))
        g = cls.grid()[idx]  # [N, 32, 8]
        codes = (g * _bit_signs(blk[:, 34:66])).reshape(N, 8, 32)
        return codes, _odd_ls(_nibble_pairs(blk[:, 74:82]))  # [N, 8, 2]


class _IQ1Format(_IQFormat):
    """IQ1_S and IQ1_M: 11-bit indices into one 2048 x 8 grid of -1, 0, 1 and a delta of
    +-1/8 per group of values, gguf's value d * (2*ls + 1) * (g + delta) with a 3-bit ls.

    Integer form: codes c = 8*g + s in -9..9 (s = +1, or -1 where the delta's sign bit is set),
    u = 2*ls + 1 in 1..15, dw = d * 0.125, value (dw * u) * c. Bit for bit gguf's: d * 0.125 is
    exact (a power of two; a half's smallest subnormal over 8 is a normal float32), d * u is
    exact (11 significant bits times 4), so dw * u is gguf's d * (2*ls + 1) over 8 exactly, and
    its product with 8*g + s is the one rounding of gguf's product with g + s/8 (exact in
    float32), scaled by the power of two 8. c is never 0, and has the sign of g + s/8.

    The MMQ table buffer holds the grid as mmq.cu reads it (:meth:`table`): one uint32 per
    entry, g + 1 (0, 1 or 2) of value k in nibble k (the kernel's byte permutes take four
    values' nibbles at once), 8 KB where int8 entries would take 16 KB."""

    dw_factor = 0.125
    grid_source, table_name = "IQ1_S", "IQ1S"

    @classmethod
    def _codes(cls, idx: np.ndarray, neg: np.ndarray) -> np.ndarray:
        """int8 [..., 8]: 8*g + s for grid indices idx [...] and delta signs neg [...] (bool)."""
        return cls.grid()[idx] * np.int8(8) + np.where(neg, np.int8(-1), np.int8(1))[..., None]

    @classmethod
    def unit_std(cls):
        g2 = float(np.mean(cls.grid().astype(np.float64) ** 2))
        u2 = float(np.mean((2.0 * np.arange(8) + 1.0) ** 2))  # 3-bit ls
        return float(cls.dw_factor * np.sqrt(u2 * (64.0 * g2 + 1.0)))  # E[(8g + s)^2], s = +-1

    @classmethod
    def table(cls):
        t = (cls.grid().astype(np.int32) + 1).astype(np.uint32)  # [2048, 8], 0..2
        k = np.arange(8, dtype=np.uint32)
        words = np.bitwise_or.reduce(t << (4 * k), axis=1)  # value k's g + 1 in nibble k
        return words.astype("<u4").view(np.uint8)


class IQ1_S(_IQ1Format, qtype=QT.IQ1_S):
    """256 values, 50 B: d: half, qs: uint8[32] (low 8 bits of the index of each 8 values),
    qh: uint16[8], one per 32 values: bits 3l..3l+2 the high bits of index 4j + l, bits 12..14
    ls, bit 15 the delta's sign. One u and one delta per 32 values."""

    mmq_kernel = "mmq_iq1_s"

    @classmethod
    def _codes_subs(cls, blk):
        N = blk.shape[0]
        qh = _u16(blk[:, 34:50])  # [N, 8]
        hi = (qh[:, :, None] >> np.array([0, 3, 6, 9], np.uint16)) & np.uint16(7)  # [N, 8, 4]
        idx = blk[:, 2:34].reshape(N, 8, 4).astype(np.uint16) | (hi << np.uint16(8))
        neg = np.broadcast_to(((qh >> np.uint16(15)) != 0)[:, :, None], idx.shape)
        codes = cls._codes(idx, neg).reshape(N, 8, 32)
        return codes, _both(_odd_ls((qh >> np.uint16(12)) & np.uint16(7)))


class IQ1_M(_IQ1Format, qtype=QT.IQ1_M):
    """256 values, 56 B: qs: uint8[32] (low 8 bits of the index of each 8 values), qh:
    uint8[16] (a nibble per 8 values, low nibble first: bits 0..2 the index's high bits, bit 3
    the delta's sign), scales: uint16[4]: bits 3m..3m+2 of word w the ls of values 16 (4w + m)
    .. + 15 (m < 4), bits 12..15 of word w bits 4w..4w+3 of the block's half d.

    d is no plain half field (half_fields is empty: no byte pair holds it); scale_values and
    put_scale_values read and write it where it lies, set_scales through them."""

    half_fields: ClassVar[dict[str, int]] = {}
    sub_per_16 = True
    mmq_kernel = "mmq_iq1_m"

    @classmethod
    def _d_bits(cls, blk: np.ndarray) -> np.ndarray:
        sc = _u16(blk[:, 48:56])  # [N, 4]
        parts = (sc & np.uint16(0xF000)) >> np.array([12, 8, 4, 0], np.uint16)
        return np.bitwise_or.reduce(parts, axis=1).astype(np.uint16)

    @classmethod
    def scale_values(cls, blk):
        return cls._d_bits(blk).astype("<u2").view("<f2").astype(np.float32)[:, None]

    @classmethod
    def put_scale_values(cls, blk, v):
        h = np.asarray(v, np.float32)[:, 0].astype("<f2").view("<u2").astype(np.uint16)
        nib = ((h[:, None] >> np.array([0, 4, 8, 12], np.uint16)) & np.uint16(15)) << np.uint16(12)
        sc = (_u16(blk[:, 48:56]) & np.uint16(0x0FFF)) | nib
        blk[:, 48:56] = sc.astype("<u2").view(np.uint8).reshape(-1, 8)

    @classmethod
    def set_scales(cls, blk, d):
        cls.put_scale_values(blk, np.asarray(d, np.float32)[:, None])

    @classmethod
    def _d(cls, blk):
        return cls.scale_values(blk)[:, 0]

    @classmethod
    def _codes_subs(cls, blk):
        N = blk.shape[0]
        nib = _nibble_pairs(blk[:, 32:48]).reshape(N, 32)
        idx = blk[:, 0:32].astype(np.uint16) | ((nib & np.uint8(7)).astype(np.uint16) << np.uint16(8))
        codes = cls._codes(idx, (nib & np.uint8(8)) != 0).reshape(N, 8, 32)
        sc = _u16(blk[:, 48:56])
        ls = (sc[:, :, None] >> np.array([0, 3, 6, 9], np.uint16)) & np.uint16(7)  # [N, 4, 4]
        return codes, _odd_ls(ls.reshape(N, 8, 2))


# The codebook formats (IQ4_NL, IQ4_XS, MXFP4, NVFP4: codes looked up in a 16-entry codebook).
from strata_prefill.contract import codebooks  # noqa: E402,F401
