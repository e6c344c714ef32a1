"""The base of the weight quant formats: the :class:`QuantFormat` class a format subclasses (and
so registers: ``class Q8_0(QuantFormat, qtype=QT.Q8_0)``), the registry's readers
(:func:`formats`, :func:`with_mmq_kernel`, :func:`lookup`), the byte helpers the formats' decodes
share, and the IQ tables taken from gguf's own data (:func:`sign_table`, :func:`table_layout`).

The formats themselves live in contract/qformats.py and the modules it imports in registry order
(contract/kquants.py, contract/codebooks.py); they all import this module, which imports none of them,
so the formats stand on one base without an import circle. Read the registry through
contract/qformats.py: importing it registers every format, in order.
"""
from __future__ import annotations

import enum
from typing import ClassVar

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from strata_prefill.contract.q8_1 import Layout

QT = GGMLQuantizationType


class Epilogue(enum.Enum):
    """The float epilogue of a product's block (contract/mmq.py:_slab)."""

    PLAIN = "plain"  # (dw * da) * sumi
    MIN = "min"  # + mw * sa  (a float min per block: Q4_1)
    DMIN = "dmin"  # - (mw * da) * mi  (dmin and integer min sub-scales: Q2_K)
    # (dw0 * da) * S0 + (dw1 * da) * S1: a float scale for each 16-value half, S0 and S1 the
    # halves' integer sums (NVFP4, contract/codebooks.py; dw is then [..., nb32, 2])
    HALVES = "halves"


_REGISTRY: dict[QT, type[QuantFormat]] = {}


class QuantFormat:
    """One weight quant type. Subclasses set the class attributes and :meth:`decode_blocks`,
    and register themselves with ``qtype=``."""

    qtype: ClassVar[QT]
    #: values and bytes of one block (gguf's GGML_QUANT_SIZES)
    block_values: ClassVar[int]
    block_bytes: ClassVar[int]
    #: byte offsets of the block's half-precision fields, by name (the main scale first)
    half_fields: ClassVar[dict[str, int]]
    epilogue: ClassVar[Epilogue] = Epilogue.PLAIN
    #: every sub-scale decodes to 1: the codes are the products' integers
    unit_sub: ClassVar[bool] = False
    #: a sub-scale per 16 values: u0 and u1 of a 32-value block may differ, so a block's products
    #: take the two halves' integer sums apart (mmq.cu's split form, Tr<QT>::SPLIT)
    sub_per_16: ClassVar[bool] = False
    q8_1_layout: ClassVar[Layout] = Layout.D4
    #: fast/cuda/kernels/mmq.cu's kernel for this type (its kernel list is written from these
    #: names, fast/cuda/generated.py, and fast/cuda/products.py launches it by this name); None: no
    #: CUDA MMQ kernel (the reference and the sim only)
    mmq_kernel: ClassVar[str | None] = None
    #: fast/cuda/kernels/embed.cu's kernel that dequantizes token_embd rows of this type on the
    #: device (fast/cuda/elementwise.py embed); None: the fast path dequantizes them on the host
    embed_kernel: ClassVar[str | None] = None
    #: the gguf.quants class whose grid this type indexes, and the grid's name in mmq.cu's
    #: table buffer (TAB_<name>); None without a grid
    grid_source: ClassVar[str | None] = None
    table_name: ClassVar[str | None] = None
    #: the signs are 7-bit indices into the 128-entry sign table (sign_table), not one bit a value:
    #: mmq.cu stages the sign masks for these types only
    sign_index: ClassVar[bool] = False

    def __init_subclass__(cls, qtype: QT | None = None, **kw) -> None:
        super().__init_subclass__(**kw)
        if qtype is None:  # a base shared by several formats, not a format itself
            return
        qt = QT(qtype)
        if qt in _REGISTRY:
            raise TypeError(f"quant format {qt.name} registered twice")
        cls.qtype = qt
        vals, nbytes = GGML_QUANT_SIZES[qt]
        cls.block_values, cls.block_bytes = int(vals), int(nbytes)
        if cls.block_values % 32:
            raise TypeError(f"{qt.name} blocks are not whole 32-value blocks")
        if cls.unit_sub and cls.sub_per_16:
            raise TypeError(f"{qt.name}: unit sub-scales cannot change every 16 values")
        if (cls.grid_source is None) != (cls.table_name is None):
            raise TypeError(f"{qt.name}: a grid needs both its gguf source and its table name")
        for other in _REGISTRY.values():  # a table name shared is one table, held once
            if cls.table_name is not None and other.table_name == cls.table_name and (
                    other.grid_source != cls.grid_source or other.table.__func__ is not cls.table.__func__):
                raise TypeError(f"{qt.name}: table {cls.table_name} is {other.qtype.name}'s, another grid")
        _REGISTRY[qt] = cls

    @classmethod
    def decode_blocks(cls, blk: np.ndarray):
        """blk uint8 [N, block_bytes] -> (codes [N, n32, 32], sub [N, n32, 2], dw [N * n32]
        or [N, n32] ([N, n32, 2] for the HALVES epilogue: one per 16-value half), mw or None,
        msub or None), n32 = block_values / 32; dtypes are fixed by strata_prefill.contract.quants.decode."""
        raise NotImplementedError

    @classmethod
    def unit_std(cls) -> float:
        """Standard deviation of the dequantized values of a block with random code bits and
        its main scale set to 1 (and the min chosen by :meth:`set_scales` to centre them)."""
        raise NotImplementedError

    @classmethod
    def set_scales(cls, blk: np.ndarray, d: np.ndarray) -> None:
        """Make random block bytes blk [N, block_bytes] valid with main scale d [N] float32:
        write the half fields (and clamp codes where some bit patterns are not codes)."""
        _put_half(blk, cls.half_fields["d"], d)

    @classmethod
    def scale_values(cls, blk: np.ndarray) -> np.ndarray:
        """float32 [N, k]: each block's k half-precision scales (its half fields, in
        half_fields' order), as a pack's check for NaN and Inf reads them. A type whose scale is
        no plain half field (IQ1_M's half in four nibbles, MXFP4's e8m0 byte, NVFP4's ue4m3
        bytes) says how it assembles it."""
        return np.stack([_half(blk, off) for off in cls.half_fields.values()], 1)

    @classmethod
    def finite_blocks(cls, blk: np.ndarray) -> np.ndarray:
        """bool [N]: which blocks of blk [N, block_bytes] decode to finite values only. A block's
        codes and sub-scales are small integers, so it is its float fields (:meth:`scale_values`)
        being finite; a type whose finite scale times a code can overflow (MXFP4) says so."""
        return np.isfinite(cls.scale_values(blk)).all(axis=1)

    @classmethod
    def put_scale_values(cls, blk: np.ndarray, v: np.ndarray) -> None:
        """Write the k scales of :meth:`scale_values` into blk [N, block_bytes] from v float32
        [N, k], each rounded to half (nearest even): scale_values gives v back wherever v is a
        half's value. Every other bit of the block is kept."""
        for i, off in enumerate(cls.half_fields.values()):
            _put_half(blk, off, v[:, i])

    @classmethod
    def grid(cls) -> np.ndarray | None:
        """int8 [entries, width] grid this type indexes (expanded once), or None."""
        return None if cls.grid_source is None else _gguf_grid(cls.grid_source)

    @classmethod
    def table(cls) -> np.ndarray | None:
        """uint8 bytes of this type's grid in the CUDA MMQ table buffer (:func:`table_layout`),
        in the form mmq.cu's decode reads it: the int8 entries as they are, unless a type says
        otherwise (the IQ1 grid); None without a grid."""
        g = cls.grid()
        return None if g is None else np.ascontiguousarray(g).reshape(-1).view(np.uint8)


def formats() -> tuple[type[QuantFormat], ...]:
    """Every registered format, in registration order."""
    return tuple(_REGISTRY.values())


def with_mmq_kernel() -> tuple[type[QuantFormat], ...]:
    """The registered formats the CUDA MMQ kernel decodes (an ``mmq_kernel``), in registration
    order."""
    return tuple(f for f in _REGISTRY.values() if f.mmq_kernel is not None)


def lookup(qtype) -> type[QuantFormat] | None:
    """The format of a GGML type (a GGMLQuantizationType or its int), None if unsupported."""
    try:
        return _REGISTRY.get(QT(qtype))
    except (ValueError, TypeError):
        return None


# --------------------------------------------------------------------------- #
# Byte helpers


def _half(blk: np.ndarray, off: int) -> np.ndarray:
    """float32 [N] from the half at byte offset `off` of each block row of blk [N, bpb]: read
    through a strided view where the rows' bytes are contiguous (no gathered copy first)."""
    field = blk[:, off : off + 2]
    if field.strides[-1] != 1:
        field = np.ascontiguousarray(field)
    return field.view("<f2")[:, 0].astype(np.float32)


def _put_half(blk: np.ndarray, off: int, v: np.ndarray) -> None:
    blk[:, off : off + 2] = v.astype("<f2").view(np.uint8).reshape(-1, 2)


def _u32(b: np.ndarray) -> np.ndarray:
    """uint32 [..., n/4] from little-endian bytes uint8 [..., n]."""
    return np.ascontiguousarray(b).view("<u4").astype(np.uint32)


def _u16(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view("<u2").astype(np.uint16)


# --------------------------------------------------------------------------- #
# IQ tables (from gguf's own data, expanded once)

_SIGN_ENTRIES, _SIGN_WIDTH = 128, 8
_grids: dict[str, np.ndarray] = {}
_signs: list[np.ndarray] = []


def sign_table() -> np.ndarray:
    """int8 [128, 8] of +-1: the 128-entry sign table (7 stored bits plus an implied parity
    bit), bit j of entry k giving the sign of value j."""
    if not _signs:
        from gguf import quants as gq

        ks = np.frombuffer(gq.IQ2_XXS.ksigns, dtype=np.uint8)
        assert ks.shape == (_SIGN_ENTRIES,)
        bits = (ks[:, None] >> np.arange(_SIGN_WIDTH, dtype=np.uint8)[None, :]) & np.uint8(1)
        tab = (np.int8(1) - np.int8(2) * bits.astype(np.int8)).astype(np.int8)
        tab.flags.writeable = False
        _signs.append(tab)
    return _signs[0]


def _gguf_class(name: str):
    from gguf import quants as gq

    return getattr(gq, name)


def _gguf_grid(name: str) -> np.ndarray:
    g = _grids.get(name)
    if g is None:
        cls = _gguf_class(name)
        cls.init_grid()
        f = np.asarray(cls.grid, dtype=np.float32).reshape(cls.grid_shape)
        g = f.astype(np.int8)
        assert np.array_equal(g.astype(np.float32), f)
        g.flags.writeable = False
        _grids[name] = g
    return g


def table_layout() -> dict[str, tuple[int, int]]:
    """The CUDA MMQ table buffer: {name: (byte offset, bytes)} for "SIGN" (the sign table as
    byte masks) and each registered grid's table_name in registration order (its
    :meth:`QuantFormat.table` bytes; a table two types share, IQ1_S's and IQ1_M's, once), plus
    "BYTES": (0, total). Every offset is a multiple of 16 (the kernel copies 16-byte pieces).
    fast/cuda/kernels/mmq.cu's TAB_<name> and TABLEN_<name> defines are written from these when
    it is compiled (fast/cuda/generated.py)."""
    out = {"SIGN": (0, _SIGN_ENTRIES * _SIGN_WIDTH)}
    off = out["SIGN"][1]
    for f in formats():
        if f.table_name is not None and f.table_name not in out:
            size = int(f.table().size)
            out[f.table_name] = (off, size)
            off += size
            assert off % 16 == 0, f.table_name
    out["BYTES"] = (0, off)
    return out


def _odd_sub_mean_square() -> float:
    """E[(2*ls+1)^2] for a 4-bit ls uniform: the IQ types' sub-scales."""
    return float(np.mean((2.0 * np.arange(16) + 1.0) ** 2))
