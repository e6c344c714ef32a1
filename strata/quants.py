"""Weight quant formats: block layouts, integer decoding, dequantization, Q8_0
quantization and random valid blocks for synthetic packs.

Every supported type decodes (`decode`) into the integer form the MMQ contract
works on (docs/numerics.md section 3): per 32-value block, int codes `c[32]`,
integer sub-scales `u0, u1` (values 0..15 and 16..31), a float scale `dw`, and for
Q4_1 / Q2_K a float min `mw` (Q2_K also integer min sub-scales `v0, v1`).
`dequantize` is computed from that decoded form with exactly the contract's
formulas and equals `gguf.quants.dequantize` bit for bit.

Block layouts (bytes, little endian; "half" is IEEE binary16):

- Q8_0   (32 values, 34 B):  d: half, qs: int8[32]
- Q4_1   (32 values, 20 B):  d: half, m: half, qs: uint8[16]; value i < 16 is
  the low nibble of qs[i], value 16 + i the high nibble
- Q2_K   (256 values, 84 B): scales: uint8[16] (low nibble scale, high nibble
  min, one per 16 values), qs: uint8[64], d: half, dmin: half. Value
  128*h + 32*j + i is bits 2j..2j+1 of qs[32*h + i]
- IQ2_XS (256 values, 74 B): d: half, qs: uint16[32] (low 9 bits grid index into
  a 512 x 8 grid, high 7 bits index into the 128-entry sign table), scales:
  uint8[8] (one nibble per 16 values, low nibble first)
- IQ3_XXS (256 values, 98 B): d: half, qs: uint8[64] (grid indices into a
  256 x 4 grid), aux: uint32[8], one per 32 values: bits 7k..7k+6 index the sign
  table for the k-th 8 values, bits 28..31 the scale
- IQ3_S  (256 values, 110 B): d: half, qs: uint8[64] (low 8 bits of a 9-bit
  index into a 512 x 4 grid), qh: uint8[8] (bit 8 of the indices, one byte per
  32 values), signs: uint8[32] (one bit per value), scales: uint8[4] (one nibble
  per 32 values, low nibble first)

The IQ grids and the sign table are taken from the gguf package's own data and
expanded once (lazily) to int8 tables; nothing else in strata holds them.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from strata.blockquant import SCALE, quantize_blocks
from strata.errors import PackError

QT = GGMLQuantizationType

SUPPORTED_TYPES: tuple[GGMLQuantizationType, ...] = (
    QT.Q8_0,
    QT.Q4_1,
    QT.Q2_K,
    QT.IQ2_XS,
    QT.IQ3_XXS,
    QT.IQ3_S,
)

_F16_OFFSETS = {
    # byte offsets of the half-precision fields of each block
    QT.Q8_0: {"d": 0},
    QT.Q4_1: {"d": 0, "m": 2},
    QT.Q2_K: {"d": 80, "dmin": 82},
    QT.IQ2_XS: {"d": 0},
    QT.IQ3_XXS: {"d": 0},
    QT.IQ3_S: {"d": 0},
}


# --------------------------------------------------------------------------- #
# Sizes


def _check_type(qtype) -> GGMLQuantizationType:
    try:
        qt = GGMLQuantizationType(qtype)
    except (ValueError, TypeError):
        qt = None
    if qt is None or qt not in SUPPORTED_TYPES:
        name = getattr(qtype, "name", None) or str(qtype)
        supported = ", ".join(t.name for t in SUPPORTED_TYPES)
        raise PackError(f"unsupported quant type {name} (supported: {supported})")
    return qt


def block_size(qtype) -> tuple[int, int]:
    """(values_per_block, bytes_per_block) of a supported type."""
    qt = _check_type(qtype)
    vals, nbytes = GGML_QUANT_SIZES[qt]
    return int(vals), int(nbytes)


def row_bytes(qtype, n_values: int) -> int:
    """Bytes of a row of n_values values; n_values must be a multiple of the block size."""
    qt = _check_type(qtype)
    vals, nbytes = block_size(qt)
    n = int(n_values)
    if n < 0 or n % vals != 0:
        raise PackError(
            f"row of {n_values} values is not a multiple of the {qt.name} block size ({vals} values)"
        )
    return n // vals * nbytes


# --------------------------------------------------------------------------- #
# IQ tables (from gguf's own data, expanded once)


@lru_cache(maxsize=None)
def _sign_table() -> np.ndarray:
    """int8 [128, 8] of +-1: the 128-entry sign table (7 stored bits plus an
    implied parity bit), bit j of entry k giving the sign of value j."""
    from gguf import quants as gq

    ks = np.frombuffer(gq.IQ2_XXS.ksigns, dtype=np.uint8)
    assert ks.shape == (128,)
    bits = (ks[:, None] >> np.arange(8, dtype=np.uint8)[None, :]) & np.uint8(1)
    tab = (np.int8(1) - np.int8(2) * bits.astype(np.int8)).astype(np.int8)
    tab.flags.writeable = False
    return tab


@lru_cache(maxsize=None)
def _grid(qtype) -> np.ndarray:
    """int8 [entries, width] grid of an IQ type, from gguf's packed grid data."""
    from gguf import quants as gq

    cls = {QT.IQ2_XS: gq.IQ2_XS, QT.IQ3_XXS: gq.IQ3_XXS, QT.IQ3_S: gq.IQ3_S}[QT(qtype)]
    cls.init_grid()
    g = np.asarray(cls.grid, dtype=np.float32).reshape(cls.grid_shape)
    out = g.astype(np.int8)
    assert np.array_equal(out.astype(np.float32), g)
    out.flags.writeable = False
    return out


# --------------------------------------------------------------------------- #
# Decoding


@dataclass
class Decoded:
    """Integer form of quantized rows; leading dims as the raw input, nb32 = values / 32.

    codes: int8 [..., nb32, 32]; sub: int16 [..., nb32, 2]; dw: float32 [..., nb32];
    mw: float32 [..., nb32] or None; msub: int16 [..., nb32, 2] or None.
    """

    qtype: GGMLQuantizationType
    codes: np.ndarray
    sub: np.ndarray
    dw: np.ndarray
    mw: np.ndarray | None = None
    msub: np.ndarray | None = None


def _half(blk: np.ndarray, off: int) -> np.ndarray:
    """float32 [N] from the half at byte offset `off` of each block row of blk [N, bpb]."""
    h = np.ascontiguousarray(blk[:, off : off + 2]).view("<f2")[:, 0]
    return h.astype(np.float32)


def _u32(b: np.ndarray) -> np.ndarray:
    """uint32 [..., n/4] from little-endian bytes uint8 [..., n]."""
    return np.ascontiguousarray(b).view("<u4").astype(np.uint32)


def _u16(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view("<u2").astype(np.uint16)


def _blocks(qtype, raw) -> tuple[GGMLQuantizationType, np.ndarray, tuple[int, ...], int]:
    qt = _check_type(qtype)
    raw = np.asarray(raw)
    if raw.dtype != np.uint8:
        raise PackError(f"{qt.name} data must be uint8 bytes, got {raw.dtype}")
    if raw.ndim < 1:
        raise PackError(f"{qt.name} data must have at least one dimension")
    vals, nbytes = block_size(qt)
    rb = raw.shape[-1]
    if rb % nbytes != 0:
        raise PackError(
            f"{qt.name} row of {rb} bytes is not a multiple of the block size ({nbytes} bytes)"
        )
    lead = raw.shape[:-1]
    nblk = rb // nbytes
    blk = raw.reshape(-1, nbytes)
    return qt, blk, lead, nblk * vals // 32


def decode(qtype, raw) -> Decoded:
    """Decode uint8 [..., row_bytes] into the contract's integer form (see Decoded)."""
    qt, blk, lead, nb32 = _blocks(qtype, raw)
    N = blk.shape[0]  # number of blocks
    mw = msub = None

    if qt == QT.Q8_0:
        dw = _half(blk, 0)
        codes = blk[:, 2:34].view(np.int8).reshape(N, 1, 32)
        sub = np.ones((N, 1, 2), np.int16)
    elif qt == QT.Q4_1:
        dw = _half(blk, 0)
        mw = _half(blk, 2)
        qs = blk[:, 4:20]
        codes = np.concatenate([qs & np.uint8(15), qs >> np.uint8(4)], axis=1)
        codes = codes.view(np.int8).reshape(N, 1, 32)
        sub = np.ones((N, 1, 2), np.int16)
    elif qt == QT.Q2_K:
        sc = blk[:, 0:16]
        qs = blk[:, 16:80].reshape(N, 2, 1, 32)
        shifts = np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
        codes = ((qs >> shifts) & np.uint8(3)).view(np.int8).reshape(N, 8, 32)
        sub = (sc & np.uint8(15)).astype(np.int16).reshape(N, 8, 2)
        msub = (sc >> np.uint8(4)).astype(np.int16).reshape(N, 8, 2)
        dw = np.repeat(_half(blk, 80), 8)
        mw = np.repeat(_half(blk, 82), 8)
    elif qt == QT.IQ2_XS:
        d = _half(blk, 0)
        q = _u16(blk[:, 2:66])  # [N, 32]
        g = _grid(qt)[q & np.uint16(511)]  # [N, 32, 8]
        s = _sign_table()[q >> np.uint16(9)]  # [N, 32, 8]
        codes = (g * s).reshape(N, 8, 32)
        sc = blk[:, 66:74]
        ls = np.stack([sc & np.uint8(15), sc >> np.uint8(4)], axis=-1).astype(np.int16)
        sub = (2 * ls + 1).reshape(N, 8, 2)
        dw = np.repeat(d * np.float32(0.125), 8)
    elif qt == QT.IQ3_XXS:
        d = _half(blk, 0)
        g = _grid(qt)[blk[:, 2:66]]  # [N, 64, 4]
        aux = _u32(blk[:, 66:98])  # [N, 8]
        sh = np.array([0, 7, 14, 21], np.uint32)
        sidx = (aux[:, :, None] >> sh) & np.uint32(127)  # [N, 8, 4]
        s = _sign_table()[sidx]  # [N, 8, 4, 8]
        codes = (g.reshape(N, 8, 4, 8) * s).reshape(N, 8, 32)
        ls = (aux >> np.uint32(28)).astype(np.int16)  # [N, 8]
        u = 2 * ls + 1
        sub = np.stack([u, u], axis=-1)
        dw = np.repeat(d * np.float32(0.25), 8)
    elif qt == QT.IQ3_S:
        d = _half(blk, 0)
        qs = blk[:, 2:66].astype(np.uint16)
        qh = blk[:, 66:74]
        bit = np.arange(8, dtype=np.uint8)
        hi = ((qh[:, :, None] >> bit) & np.uint8(1)).reshape(N, 64).astype(np.uint16)
        g = _grid(qt)[qs | (hi << np.uint16(8))]  # [N, 64, 4]
        sb = ((blk[:, 74:106, None] >> bit) & np.uint8(1)).view(np.int8)  # [N, 32, 8]
        s = np.int8(1) - np.int8(2) * sb
        codes = (g.reshape(N, 256) * s.reshape(N, 256)).reshape(N, 8, 32)
        sc = blk[:, 106:110]
        ls = np.stack([sc & np.uint8(15), sc >> np.uint8(4)], axis=-1).astype(np.int16)
        u = (2 * ls + 1).reshape(N, 8)
        sub = np.stack([u, u], axis=-1)
        dw = np.repeat(d, 8)
    else:  # pragma: no cover - _check_type guards
        raise AssertionError(qt)

    def shp(a, tail=()):
        return None if a is None else np.ascontiguousarray(a).reshape(*lead, nb32, *tail)

    return Decoded(
        qtype=qt,
        codes=shp(codes.astype(np.int8, copy=False), (32,)),
        sub=shp(sub.astype(np.int16, copy=False), (2,)),
        dw=shp(dw.astype(np.float32, copy=False)),
        mw=shp(mw),
        msub=shp(msub, (2,)),
    )


def folded_codes(dec: Decoded) -> np.ndarray:
    """float32 [..., nb32, 32]: codes times the sub-scale of their half (exact integers).

    A float32 dot of a row with 32 int8 activations gives the exact int32 `sumi`
    (every partial sum is an integer below 2^24)."""
    c = dec.codes.astype(np.int32)
    u = np.repeat(dec.sub.astype(np.int32), 16, axis=-1)
    return (c * u).astype(np.float32)


def folded_mins(dec: Decoded) -> np.ndarray:
    """float32 [..., nb32, 32]: Q2_K min sub-scale of each value's half (v0 x16, v1 x16)."""
    if dec.msub is None:
        raise PackError(f"{dec.qtype.name} has no min sub-scales")
    return np.repeat(dec.msub.astype(np.float32), 16, axis=-1)


# --------------------------------------------------------------------------- #
# Dequantization (docs/numerics.md section 3, from Decoded)


def dequantize_decoded(dec: Decoded) -> np.ndarray:
    """float32 [..., values] from the decoded form, with the contract's formulas."""
    qt = dec.qtype
    c = dec.codes.astype(np.float32)  # [..., nb32, 32]
    dw = dec.dw[..., None]  # [..., nb32, 1]
    if qt == QT.Q8_0:
        y = dw * c
    elif qt == QT.Q4_1:
        y = dw * c + dec.mw[..., None]
    else:
        ch = c.reshape(*c.shape[:-1], 2, 16)
        du = dw * dec.sub.astype(np.float32)  # [..., nb32, 2]  (dw * u)
        y = du[..., None] * ch
        if qt == QT.Q2_K:
            mv = dec.mw[..., None] * dec.msub.astype(np.float32)  # mw * v
            y = y - mv[..., None]
    return y.reshape(*c.shape[:-2], -1)


def dequantize(qtype, raw) -> np.ndarray:
    """float32 [..., values] of uint8 [..., row_bytes]; equals gguf.quants.dequantize bit for bit."""
    return dequantize_decoded(decode(qtype, raw))


# --------------------------------------------------------------------------- #
# Q8_0 quantization (the loader's conversion of float matrices)


def quantize_q8_0(x) -> np.ndarray:
    """float rows [..., K] (K a multiple of 32) -> Q8_0 bytes uint8 [..., K/32*34].

    Per 32-block, :func:`strata.blockquant.quantize_blocks` with the SCALE rule:
    amax = max|x|, d = amax / 127, id = 1/d, q = roundf(x * id), all float32; an all-zero
    block gives d = 0, q = 0. d stored as half (round to nearest even). Same bytes as ggml's
    reference quantize_row_q8_0 (and gguf.quants for Q8_0) on finite input."""
    x = np.asarray(x, dtype=np.float32)
    if x.ndim < 1 or x.shape[-1] % 32 != 0:
        raise PackError(f"Q8_0 row of {x.shape[-1] if x.ndim else 0} values is not a multiple of 32")
    lead = x.shape[:-1]
    q, d = quantize_blocks(x.reshape(-1, 32), 32, SCALE)
    out = np.empty((q.shape[0], 34), np.uint8)
    out[:, 0:2] = d.astype("<f2").view(np.uint8)
    out[:, 2:] = q.view(np.uint8)
    return out.reshape(*lead, x.shape[-1] // 32 * 34)


# --------------------------------------------------------------------------- #
# Random valid blocks


@lru_cache(maxsize=None)
def _unit_std(qtype) -> float:
    """Standard deviation of the dequantized values of a block with random code
    bits and its main scale set to 1 (and, for Q4_1 / Q2_K, the min chosen by
    random_blocks to centre the values)."""
    qt = QT(qtype)
    odd2 = float(np.mean((2.0 * np.arange(16) + 1.0) ** 2))  # E[(2*ls+1)^2]
    if qt == QT.Q8_0:
        return float(np.sqrt(np.mean(np.arange(-127, 128, dtype=np.float64) ** 2)))
    if qt == QT.Q4_1:
        return float(np.std(np.arange(16, dtype=np.float64)))
    if qt == QT.Q2_K:
        # x = u*c - 1.5*v with u, v uniform 0..15 and c uniform 0..3: mean 0.
        u = np.arange(16, dtype=np.float64)
        eu, eu2, ec, ec2 = u.mean(), (u**2).mean(), 1.5, 3.5
        var = eu2 * ec2 - 2 * 1.5 * eu * ec * eu + 2.25 * eu2
        return float(np.sqrt(var))
    g2 = float(np.mean(_grid(qt).astype(np.float64) ** 2))
    k = {QT.IQ2_XS: 0.125, QT.IQ3_XXS: 0.25, QT.IQ3_S: 1.0}[qt]
    return float(k * np.sqrt(odd2 * g2))


def _put_half(blk: np.ndarray, off: int, v: np.ndarray) -> None:
    blk[:, off : off + 2] = v.astype("<f2").view(np.uint8).reshape(-1, 2)


def random_blocks(qtype, n_blocks: int, rng: np.random.Generator, std: float = 0.02) -> np.ndarray:
    """uint8 [n_blocks, bytes_per_block]: random valid blocks whose dequantized
    values have roughly standard deviation `std`; all code bits random, half
    scales finite. Deterministic for a given Generator state."""
    qt = _check_type(qtype)
    _, nbytes = block_size(qt)
    n = int(n_blocks)
    if n < 0:
        raise ValueError(f"n_blocks must be >= 0, got {n_blocks}")
    if not (np.isfinite(std) and 0 < std < 1e3):
        raise ValueError(f"std must be finite and in (0, 1000), got {std}")
    # raw 64-bit draws of the bit generator: all code bits random, ~GB/s
    words = rng.bit_generator.random_raw((n * nbytes + 7) // 8)
    blk = words.view(np.uint8)[: n * nbytes].reshape(n, nbytes)
    # per-block scale: target scale times a random factor in [0.5, 1.5)
    d = (rng.random(n, dtype=np.float32) + np.float32(0.5)) * np.float32(std / _unit_std(qt))
    if qt == QT.Q8_0:
        q = blk[:, 2:].view(np.int8)
        np.maximum(q, np.int8(-127), out=q)  # codes in -127..127
        _put_half(blk, 0, d)
    elif qt == QT.Q4_1:
        _put_half(blk, 0, d)
        _put_half(blk, 2, d * np.float32(-7.5))  # m centres the codes 0..15
    elif qt == QT.Q2_K:
        _put_half(blk, 80, d)
        _put_half(blk, 82, d * np.float32(1.5))  # dmin: E[u*c] = 1.5 E[v]
    else:
        _put_half(blk, 0, d)
    return blk
