"""The IQ grid types of contract/qformats.py (IQ2_XS, IQ3_XXS, IQ3_S and llama-quantize's low-bit
IQ2_XXS, IQ2_S, IQ1_S, IQ1_M): their integer form against gguf.quants.dequantize, the
independent oracle, and the table buffer the CUDA MMQ kernel reads their grids from.

Every one is PLAIN: per value, with codes c, the odd sub-scale u of its half and dw,

    x = (dw * u) * c          (float32, in this order)

IQ2_XXS, IQ2_S and IQ2_XS: c = grid value times sign, u = 2*ls + 1, dw = d * 0.125 (gguf:
d * (0.5 + ls) * 0.25 * grid * sign). IQ1_S and IQ1_M: c = 8*g + s (g in -1, 0, 1; s = +-1,
the delta's sign), u = 2*ls + 1 from 3 bits, dw = d * 0.125 (gguf: d * (2*ls + 1) * (g + s/8)).
Both are shown exact here for every finite half d, every scale and every code, before any
block is compared.
"""
from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as QT
from gguf import quants as gq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strata_prefill.contract import qformats, quants

IQ = [f.qtype for f in qformats.formats() if f.table_name is not None]  # the types with a grid
IDS = [t.name for t in IQ]
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
F32 = np.float32


def bits(a):
    return np.ascontiguousarray(a, F32).view(np.uint32)


def every_finite_half() -> np.ndarray:
    """float32 of every finite binary16 value, both zeros and all subnormals included."""
    h = np.arange(1 << 16, dtype=np.uint32).astype("<u2")
    h = h[(h & 0x7C00) != 0x7C00]
    return h.view("<f2").astype(F32)


def relation(dec) -> np.ndarray:
    """(dw * u) * c from the integer form, value by value."""
    c = dec.codes.astype(F32)
    u = np.repeat(dec.sub.astype(F32), 16, axis=-1)
    y = (dec.dw[..., None] * u) * c
    return y.reshape(*y.shape[:-2], -1)


def finite(fmt, raw):
    """raw [N, block_bytes] with each half scale's inf / NaN exponent made finite."""
    h = fmt.scale_values(raw).astype("<f2").view("<u2")
    fmt.put_scale_values(raw, np.where((h & 0x7C00) == 0x7C00, h ^ 0x4000, h).astype("<u2")
                         .view("<f2").astype(F32))
    return raw


# --------------------------------------------------------------------------- the float steps


def test_iq2_scale_form_is_gguf_for_every_half():
    """(d * 0.125 * u) * (g * s) == ((d * (0.5 + ls) * 0.25) * g) * s, u = 2*ls + 1, for every
    finite half d, every 4-bit ls and every IQ2 grid value and sign (IQ2_XXS, IQ2_S, IQ2_XS)."""
    d = every_finite_half()[:, None, None]
    ls = np.arange(16, dtype=F32)[None, :, None]
    g = np.unique(np.concatenate([quants._grid(t).ravel() for t in (QT.IQ2_XXS, QT.IQ2_S, QT.IQ2_XS)]))
    assert set(g.tolist()) == {8, 25, 43}
    for s in (F32(1), F32(-1)):
        gv = g.astype(F32)[None, None, :]
        ours = ((d * F32(0.125)) * (F32(2) * ls + F32(1))) * (gv * s)
        theirs = ((d * (F32(0.5) + ls) * F32(0.25)) * gv) * s
        np.testing.assert_array_equal(bits(ours), bits(theirs))


def test_iq1_scale_form_is_gguf_for_every_half():
    """((d * 0.125) * u) * (8*g + s) == (d * u) * (g + s/8) for every finite half d, every 3-bit
    scale (u = 2*ls + 1) and every g in -1, 0, 1 and s = +-1: the IQ1 codes are exact."""
    d = every_finite_half()[:, None, None]
    u = (F32(2) * np.arange(8, dtype=F32) + F32(1))[None, :, None]
    g = np.array([-1, 0, 1], F32)
    for s in (1, -1):
        c = (F32(8) * g + F32(s))[None, None, :]
        gd = (g + F32(s) * F32(0.125))[None, None, :]
        np.testing.assert_array_equal(bits(((d * F32(0.125)) * u) * c), bits((d * u) * gd))


# --------------------------------------------------------------------------- blocks against gguf


@SETTINGS
@given(qt=st.sampled_from(IQ), seed=st.integers(0, 2**32 - 1), rows=st.integers(1, 4), nblk=st.integers(1, 3),
       std=st.sampled_from([1e-4, 0.02, 0.5, 40.0]), kind=st.sampled_from(["valid", "bytes", "extreme"]))
def test_integer_form_is_gguf_dequantize(qt, seed, rows, nblk, std, kind):
    """Random valid blocks, fully random bytes (half scales made finite) and random blocks with
    an extreme half scale each (subnormal, the largest, signed zeros)."""
    rng = np.random.default_rng(seed)
    fmt = qformats.lookup(qt)
    _, nbytes = GGML_QUANT_SIZES[qt]
    if kind == "bytes":
        raw = finite(fmt, rng.integers(0, 256, (rows * nblk, nbytes), dtype=np.uint8))
    else:
        raw = quants.random_blocks(qt, rows * nblk, rng, std=std)
    if kind == "extreme":
        h = rng.choice(np.array([0x0001, 0x8001, 0x03FF, 0x0400, 0x7BFF, 0xFBFF, 0x0000, 0x8000], "<u2"),
                       (rows * nblk, 1))
        fmt.put_scale_values(raw, h.view("<f2").astype(F32))
        assert (fmt.scale_values(raw).astype("<f2").view("<u2") == h).all()
    raw = raw.reshape(rows, nblk * nbytes)
    ref = gq.dequantize(raw, qt)
    assert np.isfinite(ref).all()
    np.testing.assert_array_equal(bits(relation(quants.decode(qt, raw))), bits(ref))
    np.testing.assert_array_equal(bits(quants.dequantize(qt, raw)), bits(ref))


@pytest.mark.parametrize("qt", IQ, ids=IDS)
def test_one_byte_at_a_time(qt):
    """Changing one byte of a block changes what gguf decodes and ours alike: every byte is read
    from where the layout puts it (a change that would make a half scale inf or NaN is made
    finite again)."""
    fmt = qformats.lookup(qt)
    rng = np.random.default_rng(int(qt))
    base = quants.random_blocks(qt, 1, rng)
    changed = 0
    for j in range(base.shape[1]):
        for flip in (1, 0x80, int(1 + rng.integers(0, 255))):
            raw = base.copy()
            raw[0, j] ^= np.uint8(flip)
            finite(fmt, raw)
            ref = gq.dequantize(raw, qt)
            changed += not np.array_equal(ref, gq.dequantize(base, qt))
            np.testing.assert_array_equal(bits(relation(quants.decode(qt, raw))), bits(ref))
    assert changed > 2 * base.shape[1]  # most changes change values (the check is no tautology)


def _entries(qt, codes: np.ndarray) -> np.ndarray:
    """The grid index of each group of codes (the grid's width), recovered from the decoded
    codes: |c| for the positive grids, c / 8 rounded for the IQ1 grid (c = 8*g +- 1)."""
    grid = quants._grid(qt)
    width = grid.shape[1]
    c = codes.reshape(-1, width).astype(np.int32)
    rows = np.abs(c) if grid.min() > 0 else np.rint(c / 8.0).astype(np.int32)
    lut = {r.astype(np.int8).tobytes(): i for i, r in enumerate(grid)}
    assert len(lut) == len(grid)
    return np.array([lut[r.astype(np.int8).tobytes()] for r in rows])


@pytest.mark.parametrize("qt", IQ, ids=IDS)
def test_every_grid_index(qt):
    """Blocks that together use every entry of the type's grid (checked from the decoded codes)
    decode as gguf's, bit for bit."""
    grid = quants._grid(qt)
    per_block = quants.block_size(qt)[0] // grid.shape[1]
    n = 12 * len(grid) // per_block  # ~12 draws an entry: every one is drawn (checked)
    raw = quants.random_blocks(qt, n, np.random.default_rng(int(qt) + 1), std=0.3)
    dec = quants.decode(qt, raw)
    assert len(np.unique(_entries(qt, dec.codes))) == len(grid)
    np.testing.assert_array_equal(bits(quants.dequantize(qt, raw)), bits(gq.dequantize(raw, qt)))


def test_iq1_codes_and_sub_scales():
    """IQ1's codes are 8*g + s in -9..9 (never 0), s the delta's sign per 32 values (IQ1_S) or
    per 8 (IQ1_M); its sub-scales odd 1..15, one per 32 values (IQ1_S) or per 16 (IQ1_M)."""
    rng = np.random.default_rng(5)
    for qt, group, equal in ((QT.IQ1_S, 32, True), (QT.IQ1_M, 8, False)):
        dec = quants.decode(qt, quants.random_blocks(qt, 512, rng))
        c = dec.codes.astype(np.int32).reshape(-1, group)
        assert set(np.unique(np.abs(c)).tolist()) == {1, 7, 9}
        s = np.where(c % 8 == 1, 1, -1)  # 8g + 1 is 1 mod 8, 8g - 1 is 7 mod 8
        assert (s == s[:, :1]).all()  # one delta a group
        assert (s[:, 0] > 0).any() and (s[:, 0] < 0).any()
        assert set(np.unique(dec.sub).tolist()) == set(range(1, 16, 2))
        assert bool((dec.sub[..., 0] == dec.sub[..., 1]).all()) == equal


# --------------------------------------------------------------------------- IQ1_M's scale


def test_iq1_m_scale_is_the_four_top_nibbles():
    """IQ1_M's d: bits 4w..4w+3 in the top nibble of scale word w; put_scale_values writes it
    there for every finite half and keeps every other bit, scale_values reads it back."""
    fmt = qformats.IQ1_M
    assert fmt.half_fields == {}
    d = every_finite_half()
    rng = np.random.default_rng(3)
    blk = rng.integers(0, 256, (d.size, 56), dtype=np.uint8)
    before = blk.copy()
    fmt.put_scale_values(blk, d[:, None])
    np.testing.assert_array_equal(bits(fmt.scale_values(blk)[:, 0]), bits(d))
    words = blk[:, 48:56].copy().view("<u2")
    h = d.astype("<f2").view("<u2")
    for w in range(4):
        assert ((words[:, w] >> 12) == ((h >> (4 * w)) & 15)).all()
    np.testing.assert_array_equal(words & 0x0FFF, before[:, 48:56].copy().view("<u2") & 0x0FFF)
    np.testing.assert_array_equal(blk[:, :48], before[:, :48])
    # and gguf reads the same d: a block of codes 8*g + s, scales known, at each written d
    one = blk[:4096:97]
    dec = quants.decode(QT.IQ1_M, one)
    np.testing.assert_array_equal(bits(dec.dw[:, 0]), bits(fmt.scale_values(one)[:, 0] * F32(0.125)))
    np.testing.assert_array_equal(bits(quants.dequantize(QT.IQ1_M, one)), bits(gq.dequantize(one, QT.IQ1_M)))


def test_set_scales_of_iq1_m_keeps_codes():
    rng = np.random.default_rng(8)
    blk = quants.random_blocks(QT.IQ1_M, 64, rng)
    codes = quants.decode(QT.IQ1_M, blk).codes.copy()
    d = np.linspace(0.001, 3.0, 64).astype(F32)
    qformats.IQ1_M.set_scales(blk, d)
    np.testing.assert_array_equal(qformats.IQ1_M.scale_values(blk)[:, 0], d.astype(np.float16).astype(F32))
    np.testing.assert_array_equal(quants.decode(QT.IQ1_M, blk).codes, codes)


# --------------------------------------------------------------------------- the table buffer


def test_table_layout_holds_each_grid_once():
    layout = qformats.table_layout()
    names = [f.table_name for f in qformats.formats() if f.table_name is not None]
    assert set(layout) == {"SIGN", "BYTES", *names}
    assert layout[qformats.IQ1_S.table_name] == layout[qformats.IQ1_M.table_name]
    spans = sorted(v for k, v in layout.items() if k != "BYTES")
    assert spans[0][0] == 0
    for (o0, n0), (o1, _n1) in zip(spans, spans[1:]):
        assert o0 + n0 == o1 and o1 % 16 == 0  # packed, 16-byte aligned, no table twice
    assert spans[-1][0] + spans[-1][1] == layout["BYTES"][1]
    for f in qformats.formats():
        if f.table_name is not None:
            assert layout[f.table_name][1] == f.table().size


def test_iq1_table_is_the_grid_in_nibbles_and_gives_the_kernels_codes():
    """The IQ1 table: one uint32 an entry, g + 1 of value k in nibble k; mmq.cu's iq1_codes on it
    (emulated here: __byte_perm's byte pick, each selector nibble's low 3 bits choosing a byte of
    the word of the sign's three codes) gives the codes 8*g + s of both signs, which are the
    decoded form's."""
    grid = quants._grid(QT.IQ1_S).astype(np.int32)
    e = qformats.IQ1_S.table().view("<u4").astype(np.uint64)
    assert e.size == len(grid) and qformats.IQ1_M.table().tobytes() == qformats.IQ1_S.table().tobytes()
    for k in range(8):
        assert ((e >> (4 * k)) & 15).astype(np.int32).tolist() == (grid[:, k] + 1).tolist()
    assert int(e.max()) < 2**32
    for neg, s in ((False, 1), (True, -1)):
        w = np.array([0x0007FFF7 if neg else 0x000901F9], "<u4").view(np.uint8)  # the word's 4 bytes
        def byte_perm(sel):  # bytes n = 0..3 of __byte_perm(w, 0, sel): byte (nibble n of sel) & 7 of (w, 0)
            pair = np.concatenate([w, np.zeros(4, np.uint8)])
            return np.stack([pair[(sel >> (4 * n)) & 7] for n in range(4)], 1)
        codes = np.concatenate([byte_perm(e & 0xFFFF), byte_perm(e >> 16)], 1).view(np.int8)
        np.testing.assert_array_equal(codes.astype(np.int32), 8 * grid + s)


def test_a_shared_table_name_must_be_the_same_grid():
    with pytest.raises(TypeError, match="table IQ1S is IQ1_S's, another grid"):
        class Other(qformats._IQFormat, qtype=QT.TQ1_0):  # noqa: F841
            grid_source, table_name = "IQ2_S", "IQ1S"
    assert qformats.lookup(QT.TQ1_0) is None


# --------------------------------------------------------------------------- the CUDA build


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("qt", IQ, ids=IDS)
def test_each_grid_types_kernel_compiles(tmp_path, qt):
    """mmq.cu's module of each grid type (MMQ_ONLY) compiles as the runtime builds it
    (NVCC_OPTIONS, sm_90) under the largest automatic tile configuration, and holds the kernel
    the registry names."""
    from strata_prefill.fast.cuda import products, runtime

    fmt = qformats.lookup(qt)
    src = tmp_path / "mmq.cu"
    src.write_text(runtime.kernel_source("mmq"))
    (_name, defines), = [m for m in products.mmq_modules(products.AUTO_CONFIGS[-1][1])
                         if m[1]["MMQ_ONLY"] == int(qt)]
    cmd = ["nvcc", "-cubin", "-arch=sm_90", *runtime.NVCC_OPTIONS, "-Xptxas", "-v",
           *[f"-D{k}={v}" for k, v in defines.items()], str(src), "-o", str(tmp_path / "k.cubin")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    assert re.findall(r"Compiling entry function '(\w+)'", r.stderr) == [fmt.mmq_kernel]
