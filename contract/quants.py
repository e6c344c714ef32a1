"""Weight quant formats: block layouts, integer decoding, dequantization, Q8_0
quantization and random valid blocks for synthetic packs.

The formats themselves (block layouts, decoding, grids, random-block scales) are the classes
of :mod:`strata_prefill.contract.qformats`, one per supported type; this module is their common interface.
`decode` gives the contract's integer form (docs/numerics.md section 3); `dequantize` is
computed from that decoded form with exactly the contract's formulas and equals
`gguf.quants.dequantize` bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from gguf import GGMLQuantizationType

from strata_prefill.contract import qformats
from strata_prefill.contract.blockquant import SCALE, quantize_blocks
from strata_prefill.contract.errors import PackError

QT = GGMLQuantizationType

SUPPORTED_TYPES: tuple[GGMLQuantizationType, ...] = tuple(f.qtype for f in qformats.formats())

# byte offsets of the half-precision fields of each block, by type
_F16_OFFSETS = {f.qtype: dict(f.half_fields) for f in qformats.formats()}


# --------------------------------------------------------------------------- #
# Sizes


def _format(qtype) -> type[qformats.QuantFormat]:
    fmt = qformats.lookup(qtype)
    if fmt is None:
        name = getattr(qtype, "name", None) or str(qtype)
        supported = ", ".join(t.name for t in SUPPORTED_TYPES)
        raise PackError(f"unsupported quant type {name} (supported: {supported})")
    return fmt


def _check_type(qtype) -> GGMLQuantizationType:
    return _format(qtype).qtype


def block_size(qtype) -> tuple[int, int]:
    """(values_per_block, bytes_per_block) of a supported type."""
    fmt = _format(qtype)
    return fmt.block_values, fmt.block_bytes


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
# IQ tables (strata_prefill.contract.qformats expands them once)


def _sign_table() -> np.ndarray:
    """int8 [128, 8] of +-1: the IQ sign table (strata_prefill.contract.qformats.sign_table)."""
    return qformats.sign_table()


def _grid(qtype) -> np.ndarray:
    """int8 [entries, width] grid of an IQ type, from gguf's packed grid data."""
    g = _format(qtype).grid()
    if g is None:
        raise PackError(f"{QT(qtype).name} has no grid")
    return g


# --------------------------------------------------------------------------- #
# Decoding


@dataclass
class Decoded:
    """Integer form of quantized rows; leading dims as the raw input, nb32 = values / 32.

    codes: int8 [..., nb32, 32]; sub: int16 [..., nb32, 2]; dw: float32 [..., nb32]
    ([..., nb32, 2] for the HALVES epilogue: dw0, dw1 of the two 16-value halves);
    mw: float32 [..., nb32] or None; msub: int16 [..., nb32, 2] or None.
    """

    qtype: GGMLQuantizationType
    codes: np.ndarray
    sub: np.ndarray
    dw: np.ndarray
    mw: np.ndarray | None = None
    msub: np.ndarray | None = None


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
    fmt = _format(qt)
    codes, sub, dw, mw, msub = fmt.decode_blocks(blk)
    dw_tail = (2,) if fmt.epilogue is qformats.Epilogue.HALVES else ()

    def shp(a, tail=()):
        return None if a is None else np.ascontiguousarray(a).reshape(*lead, nb32, *tail)

    return Decoded(
        qtype=qt,
        codes=shp(codes.astype(np.int8, copy=False), (32,)),
        sub=shp(sub.astype(np.int16, copy=False), (2,)),
        dw=shp(dw.astype(np.float32, copy=False), dw_tail),
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
    """float32 [..., nb32, 32]: the min sub-scale of each value's half (v0 x16, v1 x16), for
    the types with integer min sub-scales (the DMIN epilogue: Q2_K, Q4_K, Q5_K)."""
    if dec.msub is None:
        raise PackError(f"{dec.qtype.name} has no min sub-scales")
    return np.repeat(dec.msub.astype(np.float32), 16, axis=-1)


# --------------------------------------------------------------------------- #
# Dequantization (docs/numerics.md section 3, from Decoded)


def dequantize_decoded(dec: Decoded) -> np.ndarray:
    """float32 [..., values] from the decoded form, with the contract's formulas."""
    fmt = _format(dec.qtype)
    c = dec.codes.astype(np.float32)  # [..., nb32, 32]
    ch = c.reshape(*c.shape[:-1], 2, 16)
    if fmt.epilogue is qformats.Epilogue.HALVES:  # dw_h * c, a scale for each half
        return (dec.dw[..., None] * ch).reshape(*c.shape[:-2], -1)
    dw = dec.dw[..., None]  # [..., nb32, 1]
    if fmt.unit_sub:
        y = dw[..., None] * ch  # dw * c
    else:
        du = dw * dec.sub.astype(np.float32)  # [..., nb32, 2]  (dw * u)
        y = du[..., None] * ch
    if fmt.epilogue is qformats.Epilogue.MIN:
        y = y + dec.mw[..., None, None]
    elif fmt.epilogue is qformats.Epilogue.DMIN:
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

    Per 32-block, :func:`strata_prefill.contract.blockquant.quantize_blocks` with the SCALE rule:
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
    """Standard deviation of the dequantized values of a block with random code bits and its
    main scale set to 1 (strata_prefill.contract.qformats.QuantFormat.unit_std)."""
    return _format(qtype).unit_std()


def random_blocks(qtype, n_blocks: int, rng: np.random.Generator, std: float = 0.02) -> np.ndarray:
    """uint8 [n_blocks, bytes_per_block]: random valid blocks whose dequantized
    values have roughly standard deviation `std`; all code bits random, half
    scales finite. Deterministic for a given Generator state."""
    qt = _check_type(qtype)
    nbytes = _format(qt).block_bytes
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
    _format(qt).set_scales(blk, d)
    return blk
