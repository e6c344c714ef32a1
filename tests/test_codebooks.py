"""The codebook formats (contract/codebooks.py): IQ4_NL, IQ4_XS, MXFP4 and NVFP4 against
gguf.quants.dequantize, the independent oracle, over random blocks, every scale byte and every
codebook index.

The exact relation, as float32 operations in this order, per value of a 32-block with code c
(the codebook entry of its 4-bit index), sub-scale u and scale dw (dw_h of its 16-value half
for NVFP4):

- IQ4_NL, MXFP4:  x = dw * c
- IQ4_XS:         x = (dw * u) * c
- NVFP4:          x = dw_h * c

with MXFP4's dw = 2^(e - 128) of its e8m0 byte and NVFP4's dw_h half its ue4m3 byte's value. It
holds bit for bit for every block, infinite values included (MXFP4's e8m0 bytes above 252 with
large codes); blocks of IQ4_NL and IQ4_XS keep their half d finite, as every half-scaled type's
tests do.
"""
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as QT
from gguf import quants as gq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strata_prefill.contract import codebooks, mmq, q8_1, qformats, quants

TYPES = [QT.IQ4_NL, QT.IQ4_XS, QT.MXFP4, QT.NVFP4]
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ggml-common.h's tables: kvalues_iq4nl, and kvalues_mxfp4 (e2m1 doubled; NVFP4's too)
KVALUES_IQ4NL = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)
KVALUES_MXFP4 = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)
# halves at the edges: the largest finite (both signs), the smallest subnormal, the smallest
# normal, one, a negative subnormal
EDGE_HALVES = (0x7BFF, 0xFBFF, 0x0001, 0x8001, 0x0400, 0x3C00, 0x83FF)


def bits(a):
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


def e8m0(b) -> np.ndarray:
    """2^(b - 128) in float64 (exact in float32: 2^-128 and 2^-127 are subnormals)."""
    return np.ldexp(1.0, np.asarray(b, np.int64) - 128)


def ue4m3_half(b) -> np.ndarray:
    """Half the value of ue4m3 bytes b in float64, from the format's definition."""
    b = np.asarray(b, np.int64)
    e, m = (b >> 3) & 15, b & 7
    v = np.where(e == 0, m * 2.0**-9, (1 + m / 8) * np.ldexp(1.0, e - 7)) * 0.5
    return np.where((b == 0) | (b == 0x7F), 0.0, v)


def relation(qt, dec) -> np.ndarray:
    """The values from the integer form, by the module docstring's relation."""
    c = dec.codes.astype(np.float32)
    if qt == QT.NVFP4:
        y = np.repeat(dec.dw, 16, axis=-1) * c
    elif qt == QT.IQ4_XS:
        y = (dec.dw[..., None] * np.repeat(dec.sub.astype(np.float32), 16, axis=-1)) * c
    else:
        y = dec.dw[..., None] * c
    return y.reshape(*y.shape[:-2], -1)


def put_half(blk, off, h):
    blk[:, off:off + 2] = np.asarray(h, "<u2").reshape(-1, 1).view(np.uint8).reshape(-1, 2)


def assert_gguf(qt, raw):
    with np.errstate(over="ignore", invalid="ignore"):  # MXFP4's largest scales overflow, as gguf's
        ref = gq.dequantize(raw, qt)
        dec = quants.decode(qt, raw)
        np.testing.assert_array_equal(bits(relation(qt, dec)), bits(ref))
        np.testing.assert_array_equal(bits(quants.dequantize(qt, raw)), bits(ref))
    return ref


# --------------------------------------------------------------------------- the tables


def test_codebooks_are_ggml_tables():
    for qt, want in ((QT.IQ4_NL, KVALUES_IQ4NL), (QT.IQ4_XS, KVALUES_IQ4NL), (QT.MXFP4, KVALUES_MXFP4),
                     (QT.NVFP4, KVALUES_MXFP4)):
        cb = qformats.lookup(qt).codebook()
        assert cb.dtype == np.int8 and cb.tolist() == list(want)
        assert qformats.lookup(qt).codebook() is cb  # read once
        with pytest.raises(ValueError):
            cb[0] = 1  # read-only: the one copy


def test_codebook_words_hold_entry_4w_plus_b_in_byte_b():
    for qt in TYPES:
        fmt = qformats.lookup(qt)
        words = fmt.codebook_words()
        got = [np.int8(np.uint8((words[i // 4] >> (8 * (i % 4))) & 0xFF)) for i in range(16)]
        assert got == fmt.codebook().tolist()
    # entries 12..15, -4 -6 -8 -12, are the bytes FC FA F8 F4 of word 3, entry 12 the lowest
    assert qformats.lookup(QT.MXFP4).codebook_words()[3] == 0xF4F8FAFC


def test_scale_decoders_against_the_definitions():
    every = np.arange(256, dtype=np.uint8)
    np.testing.assert_array_equal(codebooks.e8m0_half(every).astype(np.float64), e8m0(every))
    np.testing.assert_array_equal(codebooks.ue4m3_half(every).astype(np.float64), ue4m3_half(every))
    # ggml's bit patterns below 2: 0x00200000 and 0x00400000, subnormals kept
    assert bits(codebooks.e8m0_half(np.array([0, 1, 2, 255], np.uint8))).tolist() == [
        0x00200000, 0x00400000, 0x00800000, 0x7F000000]
    assert codebooks.ue4m3_half(np.array([0x7F, 0xFF, 0x80, 0x01, 0x7E], np.uint8)).tolist() == [
        0.0, 240.0, 0.0, 2.0**-10, 224.0]


# --------------------------------------------------------------------------- against gguf


@SETTINGS
@given(qt=st.sampled_from(TYPES), seed=st.integers(0, 2**32 - 1), rows=st.integers(1, 4),
       nblk=st.integers(1, 3), scale=st.one_of(st.integers(0, 255), st.sampled_from(EDGE_HALVES),
                                               st.integers(0, 0xFFFF)))
def test_random_bytes_every_scale_against_gguf(qt, seed, rows, nblk, scale):
    """Fully random blocks, one block's scale set to `scale`: any e8m0 or ue4m3 byte (MXFP4,
    NVFP4; its low byte for a wider draw), any finite half (IQ4_NL, IQ4_XS: its inf/NaN
    exponent flipped), the edge halves among them."""
    rng = np.random.default_rng(seed)
    nbytes = GGML_QUANT_SIZES[qt][1]
    blk = rng.integers(0, 256, (rows * nblk, nbytes), dtype=np.uint8)
    if qt in (QT.IQ4_NL, QT.IQ4_XS):
        h = np.ascontiguousarray(blk[:, 0:2]).view("<u2")[:, 0]
        put_half(blk, 0, np.where((h & 0x7C00) == 0x7C00, h ^ 0x4000, h))
        put_half(blk[:1], 0, scale if (scale & 0x7C00) != 0x7C00 else scale ^ 0x4000)
    else:
        blk[0, :1 if qt == QT.MXFP4 else 4] = scale & 0xFF
    assert_gguf(qt, blk.reshape(rows, -1))


@SETTINGS
@given(qt=st.sampled_from(TYPES), seed=st.integers(0, 2**32 - 1), rows=st.integers(1, 4),
       nblk=st.integers(1, 3), std=st.sampled_from([1e-3, 0.02, 0.5, 40.0]))
def test_random_valid_blocks_against_gguf(qt, seed, rows, nblk, std):
    rng = np.random.default_rng(seed)
    raw = quants.random_blocks(qt, rows * nblk, rng, std=std).reshape(rows, -1)
    ref = assert_gguf(qt, raw)
    assert np.isfinite(ref).all()


def _every_index(n_blocks, nbytes, qs_off, rng) -> np.ndarray:
    """Blocks whose code bytes are random but whose first 8 code bytes hold every 4-bit index
    in both nibbles."""
    blk = rng.integers(0, 256, (n_blocks, nbytes), dtype=np.uint8)
    idx = np.arange(16, dtype=np.uint8)
    blk[:, qs_off:qs_off + 8] = (idx[0::2] | (idx[1::2][::-1] << 4))[None]
    return blk


def test_every_e8m0_byte_every_index():
    rng = np.random.default_rng(1)
    blk = _every_index(256, 17, 1, rng)
    blk[:, 0] = np.arange(256)
    ref = assert_gguf(QT.MXFP4, blk)
    assert np.isinf(ref).any() and (ref == 0).any()  # 2^125 * 12 overflows; index 0 and 8 are 0
    assert (np.abs(ref[ref != 0]).min() == np.float32(2.0**-128))  # the subnormal scale, kept


def test_every_ue4m3_byte_every_index():
    rng = np.random.default_rng(2)
    blk = _every_index(256, 36, 4, rng)
    blk[:, 0:4] = rng.integers(0, 256, (256, 4), dtype=np.uint8)
    blk[:, 0] = np.arange(256)  # every byte as the first half's scale
    blk[:, 3] = np.arange(256)[::-1]  # and as the last one's
    ref = assert_gguf(QT.NVFP4, blk)
    dec = quants.decode(QT.NVFP4, blk)
    np.testing.assert_array_equal(dec.dw[:, 0, 0].astype(np.float64), ue4m3_half(np.arange(256)))
    np.testing.assert_array_equal(dec.dw[:, 1, 1].astype(np.float64), ue4m3_half(np.arange(256)[::-1]))
    assert np.isfinite(ref).all()


@pytest.mark.parametrize("qt", [QT.IQ4_NL, QT.IQ4_XS])
def test_every_index_edge_halves(qt):
    rng = np.random.default_rng(3)
    nbytes = GGML_QUANT_SIZES[qt][1]
    blk = _every_index(len(EDGE_HALVES) * 4, nbytes, 2 if qt == QT.IQ4_NL else 8, rng)
    put_half(blk, 0, np.repeat(EDGE_HALVES, 4))
    assert_gguf(qt, blk)


def test_iq4_xs_every_sub_scale():
    """Every 6-bit scale ls (u = ls - 32, -32..31) in every 32-block position."""
    rng = np.random.default_rng(4)
    blk = rng.integers(0, 256, (64, 136), dtype=np.uint8)
    put_half(blk, 0, 0x3C00)
    ls = (np.arange(64)[:, None] + 7 * np.arange(8)[None]) % 64  # [64 blocks, 8 32-blocks]
    lo, hi = ls & 15, ls >> 4
    blk[:, 4:8] = (lo[:, 0::2] | (lo[:, 1::2] << 4)).astype(np.uint8)
    sh = (hi << (2 * np.arange(8))).sum(axis=1).astype("<u2")
    blk[:, 2:4] = sh.view(np.uint8).reshape(-1, 2)
    assert_gguf(QT.IQ4_XS, blk)
    dec = quants.decode(QT.IQ4_XS, blk)
    np.testing.assert_array_equal(dec.sub[..., 0], ls - 32)
    np.testing.assert_array_equal(dec.sub[..., 1], ls - 32)


# --------------------------------------------------------------------------- the integer form


def test_iq4_xs_largest_block_sum_is_exact():
    """u = -32 and every code -127 against activation codes 127: a block sum of
    32 * 127 * 127 * 32 = 16,516,096, below 2^24, the product's float32 matmul exact."""
    blk = np.zeros((4, 136), np.uint8)
    put_half(blk, 0, 0x3C00)  # d = 1; scales 0: ls 0, u -32; codes index 0: -127
    raw = blk.reshape(1, -1)  # one row of K = 1024
    x = np.full((1, 1024), 1.0, np.float32)
    layout = q8_1.layout_for(QT.IQ4_XS)
    rows = q8_1.quantize_rows(x, layout)
    dec_act = q8_1.decode_rows(rows, 1, layout)
    assert (dec_act.codes[0, :32] == 127).all()  # [32 blocks, 32 codes]
    pw = mmq.prepare(QT.IQ4_XS, raw)  # w [32 blocks, 1 row, 32]: c * u
    a, w = dec_act.codes[0, :32].astype(np.float32), pw.w[:, 0].astype(np.float32)
    sumi = np.matmul(a[:, None, :], w[:, :, None])[:, 0, 0]  # float32, block by block
    assert sumi.tolist() == [32 * 127 * 127 * 32] * 32 and 32 * 127 * 127 * 32 < 2**24
    got = mmq.mmq(QT.IQ4_XS, raw, dec_act)
    da = dec_act.d[0, 0]
    t = np.float32(np.float32(1.0) * da) * np.float32(16516096)  # (dw * da) * sumi, each block
    acc = np.float32(0.0)
    for _ in range(32):
        acc = np.float32(acc + t)
    assert got[0, 0] == acc


def test_nvfp4_halves_scale_apart():
    """A 32-block whose halves' scales differ: each half's sum takes its own scale, in the
    epilogue's order (dw0 * da) * S0 + (dw1 * da) * S1."""
    rng = np.random.default_rng(5)
    blk = rng.integers(0, 256, (1, 36), dtype=np.uint8)
    blk[0, 0:4] = [0x38, 0x50, 0x41, 0x07]  # four different scales
    x = rng.standard_normal((3, 64)).astype(np.float32)
    layout = q8_1.layout_for(QT.NVFP4)
    act = q8_1.decode_rows(q8_1.quantize_rows(x, layout), 3, layout)
    got = mmq.mmq(QT.NVFP4, blk, act)
    dec = quants.decode(QT.NVFP4, blk)
    c = dec.codes[0].astype(np.int64)  # [2, 32]
    for r in range(3):
        acc = np.float32(0.0)
        for b in range(2):
            a = act.codes[r, b].astype(np.int64)
            s0, s1 = int((c[b, :16] * a[:16]).sum()), int((c[b, 16:] * a[16:]).sum())
            da = act.d[r, b]
            t = np.float32(dec.dw[0, b, 0] * da) * np.float32(s0)
            u = np.float32(dec.dw[0, b, 1] * da) * np.float32(s1)
            acc = np.float32(acc + np.float32(t + u))
        assert bits(got[r, 0]) == bits(acc)


# --------------------------------------------------------------------------- random blocks, scales


def test_random_scales_vary_and_spread():
    rng = np.random.default_rng(6)
    nv = quants.random_blocks(QT.NVFP4, 2048, rng, std=0.02)
    assert (nv[:, 0:4] >= 1).all() and (nv[:, 0:4] <= 0x7E).all()  # positive, bit 7 clear
    assert (nv[:, 0] != nv[:, 1]).mean() > 0.5  # the two halves of a 32-block: their own scales
    mx = quants.random_blocks(QT.MXFP4, 2048, rng, std=0.02)
    assert 2 <= mx[:, 0].min() and mx[:, 0].max() <= 252 and len(np.unique(mx[:, 0])) >= 2
    for qt in TYPES:
        x = quants.dequantize(qt, quants.random_blocks(qt, 4096, rng, std=0.3))
        assert np.isfinite(x).all() and 0.3 * 0.85 < float(np.std(x)) < 0.3 * 1.15


def test_scale_values():
    """The scales a reader checks for NaN and Inf: the byte scales decoded, the halves read."""
    rng = np.random.default_rng(7)
    mx = rng.integers(0, 256, (300, 17), dtype=np.uint8)
    np.testing.assert_array_equal(codebooks.MXFP4.scale_values(mx)[:, 0].astype(np.float64), e8m0(mx[:, 0]))
    nv = rng.integers(0, 256, (300, 36), dtype=np.uint8)
    got = codebooks.NVFP4.scale_values(nv)
    assert got.shape == (300, 4) and got.dtype == np.float32
    np.testing.assert_array_equal(got.astype(np.float64), ue4m3_half(nv[:, 0:4]))
    xs = rng.integers(0, 256, (300, 136), dtype=np.uint8)
    put_half(xs[:1], 0, 0x7E00)  # a NaN d shows
    sv = codebooks.IQ4_XS.scale_values(xs)
    assert sv.shape == (300, 1) and np.isnan(sv[0, 0])
    np.testing.assert_array_equal(sv[:, 0], np.ascontiguousarray(xs[:, 0:2]).view("<f2")[:, 0].astype(np.float32))


# --------------------------------------------------------------------------- packs


def test_make_pack_writes_each_and_cuda_takes_it(tmp_path):
    """make-pack writes every codebook type as the experts' and the dense matrices' type, and
    the cuda backend finds nothing to refuse in such a pack (its bytes: the parity rows,
    verify/cases.py); the types fit 640-wide rows (the strata preset's down projection) but
    IQ4_XS, whose 256-value blocks fall back to Q8_0 there."""
    from strata_prefill.formats.config import PRESETS
    from strata_prefill.formats.make_pack import DENSE_TYPES, EXPERT_TYPES, expert_types, make_pack
    from strata_prefill.formats.pack import Pack

    for qt in TYPES:
        assert qt in EXPERT_TYPES and qt in DENSE_TYPES
        pack = Pack.open(make_pack(tmp_path / f"{qt.name}.gguf", "tiny", expert_type=qt.name, dense_type=qt.name,
                                   seed=1))
        assert pack.cuda_type_problems() == [] and pack.fallbacks == []
        assert pack.expert_types(0) == (qt, qt)
        assert pack.tensor_type("token_embd") == qt and pack.tensor_type("output") == qt
        gu, down, fell = expert_types(PRESETS["strata"], qt.name)
        assert gu == qt and (down, fell) == ((QT.Q8_0, ["ffn_down_exps"]) if qt == QT.IQ4_XS else (qt, []))
