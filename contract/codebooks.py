"""The weight types whose codes are looked up in a 16-entry codebook: IQ4_NL, IQ4_XS, MXFP4 and
NVFP4. Each is one registered :class:`strata_prefill.contract.qformats.QuantFormat` (this module is imported by
contract/qformats.py, after contract/kquants.py, so the registry's order is theirs and then these).

A 4-bit index i gives the code ``codebook[i]``, an int8: IQ4_NL's and IQ4_XS's non-linear
values (-127 .. 113), MXFP4's and NVFP4's e2m1 values doubled (0, 1, 2, 3, 4, 6, 8, 12 and
their negatives). The codebooks are gguf's own data (``gguf.quants.IQ4_NL.kvalues``,
``gguf.quants.MXFP4.kvalues``, ``gguf.quants.NVFP4.kvalues``), read once; nothing else in strata
holds them, and mmq.cu gets them from here (fast/cuda/generated.py writes each one's four words
into qformats.cuh).

Each decodes to the MMQ contract's integer form (docs/numerics.md section 3):

- IQ4_NL: PLAIN with unit sub-scales, ``dw = d``, value ``dw * c``.
- IQ4_XS: PLAIN with one signed sub-scale ``u = ls - 32`` (-32..31) per 32 values (both halves),
  ``dw = d``, value ``(dw * u) * c``. Its largest ``|c * u|`` is 127 * 32, so a block's sumi is
  at most 32 * 127 * 127 * 32 = 16,516,096 < 2^24: exact, if only just.
- MXFP4: PLAIN with unit sub-scales, ``dw`` the e8m0 byte e as ggml's ``e8m0_to_fp32_half``:
  the float of bits ``0x00200000 << e`` for e < 2 (subnormals 2^-128, 2^-127), else
  ``(e - 1) << 23`` (2^(e - 128)); value ``dw * c``. Every byte is a scale (no NaN); e >= 253
  with a large code gives an infinite value, as gguf's and ggml's dequantizers do.
- NVFP4: a ue4m3 scale byte per 16 values, so the two halves of a 32-block have their own float
  scales ``dw0, dw1`` (the HALVES epilogue, unit sub-scales): the byte as ggml's
  ``ue4m3_to_fp32``, bits 3..6 the exponent E (bias 7), bits 0..2 the mantissa M, bit 7
  ignored, times 0.5: ``M * 2^-10`` for E = 0, ``(1 + M/8) * 2^(E - 8)`` else; 0x7F (and 0)
  decode to 0. Value ``dw_h * c``. Every product is exact (a scale has 4 significant bits, a
  code 2).

Since the sub-scales are integers and the scales exact floats, each relation is gguf's
dequantizer operation for operation, so the two agree bit for bit (tests/test_codebooks.py).

Block layouts (little endian, "half" IEEE binary16), from ggml-common.h's block structs:

- IQ4_NL, 32 values, 18 B: d half, qs u8[16]; value i < 16 is the low nibble of qs[i], 16 + i
  the high one.
- IQ4_XS, 256 values, 136 B: d half, scales_h u16 (bits 2j..2j+1: the high two bits of 32-block
  j's 6-bit scale ls), scales_l u8[4] (nibble j & 1 of byte j >> 1: its low four bits), qs
  u8[128]; 32-block j's values are qs[16j .. 16j+15]'s low nibbles, then their high nibbles.
- MXFP4, 32 values, 17 B: e u8 (e8m0), qs u8[16] as IQ4_NL's.
- NVFP4, 64 values, 36 B: d u8[4] (ue4m3, one per 16 values), qs u8[32]; the 16 values 16s ..
  16s+15 are qs[8s .. 8s+7]'s low nibbles, then their high nibbles.
"""
from __future__ import annotations

from typing import ClassVar

import numpy as np

from strata_prefill.contract.kquants import _nibbles, _spread
from strata_prefill.contract.qformat_base import QT, Epilogue, QuantFormat, _half, _u16

_codebooks: dict[str, np.ndarray] = {}

#: the largest e8m0 byte random blocks take: 2^(252 - 128) * 12 is below FLT_MAX, so their
#: values stay finite
_E8M0_MAX = 252
_UE4M3_ZERO = 0x7F  # decodes to 0, as 0 does


def _gguf_codebook(name: str) -> np.ndarray:
    """int8 [16]: the kvalues of gguf.quants.<name>, read once."""
    cb = _codebooks.get(name)
    if cb is None:
        from gguf import quants as gq

        kv = np.asarray(getattr(gq, name).kvalues)
        cb = kv.astype(np.int8)
        assert cb.shape == (16,) and np.array_equal(cb.astype(kv.dtype), kv)
        cb.flags.writeable = False
        _codebooks[name] = cb
    return cb


def e8m0_half(e: np.ndarray) -> np.ndarray:
    """float32 of e8m0 bytes e (uint8) as ggml's e8m0_to_fp32_half: 2^(e - 128), the subnormals
    2^-128 and 2^-127 for e = 0, 1 from their bits (no flush)."""
    e = np.asarray(e, np.uint8).astype(np.uint32)
    sub = np.uint32(0x00200000) << np.minimum(e, np.uint32(1))
    bits = np.where(e < 2, sub, (np.maximum(e, np.uint32(1)) - np.uint32(1)) << np.uint32(23))
    return bits.astype(np.uint32).view(np.float32)


def ue4m3_half(x: np.ndarray) -> np.ndarray:
    """float32 of ue4m3 bytes x (uint8) times 0.5, as ggml's ue4m3_to_fp32: exponent bits 3..6
    (bias 7), mantissa bits 0..2, bit 7 ignored; 0 and 0x7F give 0."""
    x = np.asarray(x, np.uint8)
    e = ((x >> np.uint8(3)) & np.uint8(15)).astype(np.uint32)
    m = (x & np.uint8(7)).astype(np.uint32)
    normal = (((e + np.uint32(119)) << np.uint32(23)) | (m << np.uint32(20))).view(np.float32)
    v = np.where(e == 0, m.astype(np.float32) * np.float32(2.0**-10), normal)
    return np.where(x == _UE4M3_ZERO, np.float32(0.0), v).astype(np.float32)


class _CodebookFormat(QuantFormat):
    """A format whose 4-bit indices select int8 codes from a 16-entry codebook."""

    #: the gguf.quants class whose kvalues are the codebook
    codebook_source: ClassVar[str]

    @classmethod
    def codebook(cls) -> np.ndarray:
        """int8 [16]: code of each 4-bit index."""
        return _gguf_codebook(cls.codebook_source)

    @classmethod
    def codebook_words(cls) -> tuple[int, int, int, int]:
        """The codebook as four little-endian 32-bit words, entry 4w + b in byte b of word w:
        how mmq.cu holds it (fast/cuda/generated.py writes them into qformats.cuh)."""
        w = cls.codebook().view(np.uint8).reshape(4, 4).astype(np.uint32)
        return tuple(int(v) for v in (w << (8 * np.arange(4, dtype=np.uint32))).sum(axis=1))

    @classmethod
    def _codes(cls, idx: np.ndarray) -> np.ndarray:
        return cls.codebook()[idx]

    @classmethod
    def _unit_sub_blocks(cls, blk: np.ndarray, qs: int, dw: np.ndarray):
        """decode_blocks of a 32-value block whose 16 index bytes start at byte qs and whose
        one scale is dw (IQ4_NL's half, MXFP4's e8m0): the codes, unit sub-scales, dw."""
        n = blk.shape[0]
        codes = cls._codes(_nibbles(blk[:, qs:qs + 16])).reshape(n, 1, 32)
        return codes, np.ones((n, 1, 2), np.int16), dw, None, None

    @classmethod
    def unit_std(cls):
        return float(np.std(cls.codebook().astype(np.float64)))


class IQ4_NL(_CodebookFormat, qtype=QT.IQ4_NL):
    """32 values, 18 B: d: half, qs: uint8[16]; code codebook[nibble], value dw * c."""

    codebook_source = "IQ4_NL"
    half_fields = {"d": 0}
    unit_sub = True
    mmq_kernel = "mmq_iq4_nl"

    @classmethod
    def decode_blocks(cls, blk):
        return cls._unit_sub_blocks(blk, 2, _half(blk, 0))


class IQ4_XS(_CodebookFormat, qtype=QT.IQ4_XS):
    """256 values, 136 B: d: half, scales_h: u16, scales_l: uint8[4], qs: uint8[128]; code
    codebook[nibble], sub-scale u = ls - 32 per 32 values, value (dw * u) * c with dw = d."""

    codebook_source = "IQ4_NL"
    half_fields = {"d": 0}
    mmq_kernel = "mmq_iq4_xs"
    embed_kernel = "embed_iq4_xs"

    @classmethod
    def decode_blocks(cls, blk):
        n = blk.shape[0]
        hi = (_u16(blk[:, 2:4]) >> (2 * np.arange(8, dtype=np.uint16))) & np.uint16(3)  # [N, 8]
        sl = blk[:, 4:8]
        lo = np.stack([sl & np.uint8(15), sl >> np.uint8(4)], axis=-1).reshape(n, 8)
        u = (lo.astype(np.int16) | (hi.astype(np.int16) << 4)) - np.int16(32)
        codes = cls._codes(_nibbles(blk[:, 8:136].reshape(n * 8, 16))).reshape(n, 8, 32)
        return codes, np.stack([u, u], axis=-1), np.repeat(_half(blk, 0), 8), None, None

    @classmethod
    def unit_std(cls):
        return _spread(np.arange(-32, 32), cls.codebook())


class MXFP4(_CodebookFormat, qtype=QT.MXFP4):
    """32 values, 17 B: e: e8m0 byte, qs: uint8[16]; code codebook[nibble] (doubled e2m1),
    value dw * c with dw = e8m0_half(e)."""

    codebook_source = "MXFP4"
    half_fields: ClassVar[dict[str, int]] = {}
    unit_sub = True
    mmq_kernel = "mmq_mxfp4"

    @classmethod
    def decode_blocks(cls, blk):
        return cls._unit_sub_blocks(blk, 1, e8m0_half(blk[:, 0]))

    @classmethod
    def scale_values(cls, blk):
        return e8m0_half(blk[:, 0:1])

    @classmethod
    def finite_blocks(cls, blk):
        # every e8m0 scale is finite, but from 2^125 (e >= 253) a code of 12 overflows float32:
        # those rare blocks are decoded to say which
        ok = blk[:, 0] < 253
        if not ok.all():
            big = ~ok
            codes, _, dw, _, _ = cls.decode_blocks(blk[big])
            with np.errstate(over="ignore"):
                ok[big] = np.isfinite(dw[:, None] * codes.reshape(len(dw), -1).astype(np.float32)).all(axis=1)
        return ok

    @classmethod
    def set_scales(cls, blk, d):
        # A power of two 2^k: k rounds log2(d) down or up at random, up with probability
        # (d^2 / 4^k - 1) / 3 (the block's random scale byte drawing it), so the mean square
        # scale is d^2 and the values spread as asked.
        mant, ex = np.frexp(np.asarray(d, np.float64))  # d = mant * 2^ex, mant in [0.5, 1)
        k = ex.astype(np.int64) - 1
        p = ((2.0 * mant) ** 2 - 1.0) / 3.0
        up = blk[:, 0].astype(np.float64) / 256.0 < p
        blk[:, 0] = np.clip(k + up + 128, 2, _E8M0_MAX).astype(np.uint8)


#: every ue4m3 byte that decodes to a positive scale (bit 7 clear), ascending with its value
_UE4M3_CODES = np.arange(1, _UE4M3_ZERO, dtype=np.uint8)


class NVFP4(_CodebookFormat, qtype=QT.NVFP4):
    """64 values, 36 B: d: uint8[4] (ue4m3, one per 16 values), qs: uint8[32]; code
    codebook[nibble] (doubled e2m1), value dw_h * c with dw_h = ue4m3_half of its 16 values'
    byte: per 32-block the HALVES epilogue, dw [N, 2, 2]."""

    codebook_source = "NVFP4"
    half_fields: ClassVar[dict[str, int]] = {}
    epilogue = Epilogue.HALVES
    unit_sub = True
    mmq_kernel = "mmq_nvfp4"

    @classmethod
    def decode_blocks(cls, blk):
        n = blk.shape[0]
        qs = blk[:, 4:36].reshape(n * 4, 8)
        codes = cls._codes(_nibbles(qs)).reshape(n, 2, 32)  # sub-blocks 2h and 2h + 1: 32-block h
        dw = ue4m3_half(blk[:, 0:4]).reshape(n, 2, 2)
        return codes, np.ones((n, 2, 2), np.int16), dw, None, None

    @classmethod
    def scale_values(cls, blk):
        return ue4m3_half(blk[:, 0:4])

    @classmethod
    def set_scales(cls, blk, d):
        # Each 16 values' scale the nearest ue4m3 to d * sqrt(0.5 + r), r in [0, 1) from its
        # random scale byte: the four differ, and their mean square is d^2.
        r = blk[:, 0:4].astype(np.float64) / 256.0
        t = np.asarray(d, np.float64)[:, None] * np.sqrt(0.5 + r)
        vals = ue4m3_half(_UE4M3_CODES).astype(np.float64)
        i = np.clip(np.searchsorted(vals, t), 1, len(vals) - 1)
        i = np.where(t - vals[i - 1] < vals[i] - t, i - 1, i)
        blk[:, 0:4] = _UE4M3_CODES[i]
