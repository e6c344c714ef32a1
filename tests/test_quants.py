"""strata_prefill.contract.quants: block decoding against gguf's dequantizer (bit for bit), the
integer form used by MMQ, Q8_0 quantization and random valid blocks."""

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as QT
from gguf import quants as gq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strata_prefill.contract import qformats
from strata_prefill.contract import quants as Q
from strata_prefill.contract.errors import PackError

TYPES = list(Q.SUPPORTED_TYPES)
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])

#: scales stored as bytes, not halves: (offset, count) per block (MXFP4 e8m0, NVFP4 ue4m3)
BYTE_SCALES = {QT.MXFP4: (0, 1), QT.NVFP4: (0, 4)}
#: MXFP4's largest e8m0 byte whose values stay finite (2^124 * 12); random_raw keeps below it,
#: tests/test_codebooks.py covers the bytes above (infinite values, as gguf's)
E8M0_FINITE_MAX = 252
#: the types whose scales are halves (the extreme-half tests; the byte scales' every value:
#: tests/test_codebooks.py)
HALF_SCALED = [t for t in TYPES if t not in BYTE_SCALES]


def bits(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def scale_halves(qt, flat) -> np.ndarray:
    """uint16 [N, k]: the bits of each block's half scales (the registry's scale_values)."""
    return qformats.lookup(qt).scale_values(flat).astype("<f2").view("<u2")


def put_scale_halves(qt, flat, h) -> None:
    """Write the half scales of blocks flat [N, block_bytes] from their bits h [N, k]."""
    h = np.asarray(h, "<u2")
    qformats.lookup(qt).put_scale_values(flat, h.view("<f2").astype(np.float32))


def finite_scales(qt, flat) -> np.ndarray:
    """flat [N, block_bytes] with each half scale's inf / NaN exponent made finite (bit 14
    flipped; every other bit as drawn)."""
    if qt in BYTE_SCALES:  # byte scales are never NaN or Inf
        return flat
    h = scale_halves(qt, flat)
    bad = (h & 0x7C00) == 0x7C00
    if bad.any():
        put_scale_halves(qt, flat, np.where(bad, h ^ 0x4000, h))
    return flat


def scale_byte_mask(qt) -> np.ndarray:
    """bool [block_bytes]: the bytes any bit of a block's half scales lies in."""
    fmt = qformats.lookup(qt)
    k = len(qformats.lookup(qt).scale_values(np.zeros((1, fmt.block_bytes), np.uint8))[0])
    touched = np.zeros(fmt.block_bytes, np.uint8)
    for h in (0xFBFF, 0x0400):  # together every bit of a half
        blk = np.zeros((1, fmt.block_bytes), np.uint8)
        put_scale_halves(qt, blk, np.full((1, k), h))
        touched |= blk[0]
    return touched != 0


def random_raw(qt, shape, rng):
    """Fully random bytes [..., row_bytes] of whole blocks whose half scales are
    finite (any sign, subnormals included) and whose values are finite (MXFP4's e8m0 byte at
    most E8M0_FINITE_MAX)."""
    vals, nbytes = GGML_QUANT_SIZES[qt]
    *lead, nblk = shape
    raw = rng.integers(0, 256, size=(*lead, nblk, nbytes), dtype=np.uint8)
    flat = finite_scales(qt, raw.reshape(-1, nbytes))
    if qt == QT.MXFP4:
        flat[:, 0] = np.minimum(flat[:, 0], E8M0_FINITE_MAX)
    return raw.reshape(*lead, nblk * nbytes)


def assert_matches_gguf(qt, raw):
    ours = Q.dequantize(qt, raw)
    ref = gq.dequantize(raw, qt)
    assert ours.dtype == np.float32
    assert ours.shape == ref.shape
    assert np.isfinite(ref).all()
    np.testing.assert_array_equal(bits(ours), bits(ref))


# --------------------------------------------------------------------------- sizes


def test_block_sizes_and_row_bytes():
    for qt in TYPES:
        vals, nbytes = GGML_QUANT_SIZES[qt]
        assert Q.block_size(qt) == (vals, nbytes)
        assert Q.row_bytes(qt, 3 * vals) == 3 * nbytes
        assert Q.row_bytes(qt, 0) == 0
        assert Q.block_size(int(qt)) == (vals, nbytes)
    assert Q.block_size(QT.Q8_0) == (32, 34)
    assert Q.block_size(QT.Q4_1) == (32, 20)
    assert Q.block_size(QT.Q2_K) == (256, 84)
    assert Q.block_size(QT.IQ2_XS) == (256, 74)
    assert Q.block_size(QT.IQ3_XXS) == (256, 98)
    assert Q.block_size(QT.IQ3_S) == (256, 110)
    assert Q.block_size(QT.Q4_0) == (32, 18)
    assert Q.block_size(QT.Q5_0) == (32, 22)
    assert Q.block_size(QT.Q5_1) == (32, 24)
    assert Q.block_size(QT.Q4_K) == (256, 144)
    assert Q.block_size(QT.Q5_K) == (256, 176)
    assert Q.block_size(QT.Q6_K) == (256, 210)
    assert Q.block_size(QT.Q3_K) == (256, 110)
    assert Q.block_size(QT.IQ2_XXS) == (256, 66)
    assert Q.block_size(QT.IQ2_S) == (256, 82)
    assert Q.block_size(QT.IQ1_S) == (256, 50)
    assert Q.block_size(QT.IQ1_M) == (256, 56)


@pytest.mark.parametrize("qt", [QT.F32, QT.F16, QT.TQ2_0, QT.TQ1_0, 9999, "junk"])
def test_unsupported_type(qt):
    with pytest.raises(PackError, match="unsupported quant type .* \\(supported: Q8_0, Q4_1"):
        Q.block_size(qt)
    with pytest.raises(PackError, match="unsupported quant type"):
        Q.row_bytes(qt, 256)
    with pytest.raises(PackError, match="unsupported quant type"):
        Q.decode(qt, np.zeros((1, 34), np.uint8))
    with pytest.raises(PackError, match="unsupported quant type"):
        Q.random_blocks(qt, 1, np.random.default_rng(0))


@pytest.mark.parametrize("qt", TYPES)
def test_bad_lengths(qt):
    vals, nbytes = GGML_QUANT_SIZES[qt]
    for n in (vals + 16, vals - 1, 7, -vals):
        with pytest.raises(PackError, match="not a multiple"):
            Q.row_bytes(qt, n)
    with pytest.raises(PackError, match="not a multiple"):
        Q.decode(qt, np.ones((2, nbytes + 1), np.uint8))
    with pytest.raises(PackError, match="not a multiple"):
        Q.dequantize(qt, np.ones((nbytes * 2 - 1,), np.uint8))
    with pytest.raises(PackError):
        Q.dequantize(qt, np.ones((2, nbytes), np.float32))


# --------------------------------------------------------------------------- dequantize vs gguf


@SETTINGS
@given(
    qt=st.sampled_from(TYPES),
    seed=st.integers(0, 2**32 - 1),
    rows=st.integers(1, 5),
    nblk=st.integers(1, 4),
    std=st.sampled_from([0.02, 1e-3, 0.5, 7.0]),
)
def test_random_blocks_dequantize_bit_exact(qt, seed, rows, nblk, std):
    rng = np.random.default_rng(seed)
    _, nbytes = GGML_QUANT_SIZES[qt]
    raw = Q.random_blocks(qt, rows * nblk, rng, std=std).reshape(rows, nblk * nbytes)
    assert_matches_gguf(qt, raw)


@SETTINGS
@given(
    qt=st.sampled_from(TYPES),
    seed=st.integers(0, 2**32 - 1),
    lead=st.lists(st.integers(1, 3), min_size=0, max_size=2),
    nblk=st.integers(1, 3),
)
def test_random_bytes_dequantize_bit_exact(qt, seed, lead, nblk):
    raw = random_raw(qt, (*lead, nblk), np.random.default_rng(seed))
    assert_matches_gguf(qt, raw)


@pytest.mark.parametrize("qt", TYPES)
def test_dequantize_bit_exact_many_blocks(qt):
    # Every value of a few thousand blocks: random valid ones and fully random bytes,
    # with an expert-stacked leading shape [experts, rows, row_bytes].
    rng = np.random.default_rng(int(qt) + 100)
    _, nbytes = GGML_QUANT_SIZES[qt]
    raw = Q.random_blocks(qt, 3 * 8 * 16, rng).reshape(3, 8, 16 * nbytes)
    assert_matches_gguf(qt, raw)
    assert_matches_gguf(qt, random_raw(qt, (4, 16, 32), rng))


def test_dequantize_sub_scale_extremes():
    # All-minimum and all-maximum scale nibbles and extreme (but finite) halves.
    rng = np.random.default_rng(7)
    for qt in HALF_SCALED:
        _, nbytes = GGML_QUANT_SIZES[qt]
        raw = random_raw(qt, (6, 2), rng).reshape(12, nbytes)
        for i, h in enumerate([0x7BFF, 0xFBFF, 0x0001, 0x8001, 0x0400, 0x3C00]):
            rows = raw[2 * i : 2 * i + 2]
            put_scale_halves(qt, rows, np.full(scale_halves(qt, rows).shape, h))
            assert (scale_halves(qt, rows) == h).all()
        assert_matches_gguf(qt, raw)


@SETTINGS
@given(qt=st.sampled_from(HALF_SCALED), seed=st.integers(0, 2**32 - 1), nblk=st.integers(1, 4),
       halves=st.lists(st.one_of(st.sampled_from([0x0001, 0x8001, 0x03FF, 0x0400, 0x7BFF, 0xFBFF, 0x0000, 0x8000]),
                                 st.integers(0, 0xFFFF).filter(lambda h: (h & 0x7C00) != 0x7C00)),
                       min_size=1, max_size=4))
def test_extreme_scales_dequantize_bit_exact(qt, seed, nblk, halves):
    """Random valid blocks whose half scales are the extremes (subnormal, the largest, signed
    zeros) or any finite half, one drawn list cycled over every block and scale."""
    rng = np.random.default_rng(seed)
    _, nbytes = GGML_QUANT_SIZES[qt]
    raw = Q.random_blocks(qt, nblk, rng)
    k = scale_halves(qt, raw).shape[1]
    h = np.resize(np.array(halves, np.uint16), nblk * k).reshape(nblk, k)
    put_scale_halves(qt, raw, h)
    assert (scale_halves(qt, raw) == h).all()
    assert_matches_gguf(qt, raw.reshape(1, nblk * nbytes))


# --------------------------------------------------------------------------- decoded form


# What each type's integer form holds: the codes' values, the sub-scales' values (None: all 1),
# the min sub-scales' values (None: no min sub-scales), whether mw is present, whether dw and
# mw are one per 256-value superblock, and whether a 32-block's two sub-scales are equal.
# The IQ types: the codes' magnitudes, the factor k of dw = d * k, the sub-scales' values and
# whether a 32-block's two are equal (one scale per 32 values).
_IQ_CODES = {QT.IQ2_XS: {8, 25, 43}, QT.IQ3_XXS: {4, 12, 20, 28, 36, 44, 52, 62},
             QT.IQ3_S: {1, 3, 5, 7, 9, 11, 13, 15}, QT.IQ2_XXS: {8, 25, 43}, QT.IQ2_S: {8, 25, 43},
             QT.IQ1_S: {1, 7, 9}, QT.IQ1_M: {1, 7, 9}}
_IQ_FORM = {QT.IQ2_XS: (0.125, range(1, 32, 2), False), QT.IQ3_XXS: (0.25, range(1, 32, 2), True),
            QT.IQ3_S: (1.0, range(1, 32, 2), True), QT.IQ2_XXS: (0.125, range(1, 32, 2), True),
            QT.IQ2_S: (0.125, range(1, 32, 2), False), QT.IQ1_S: (0.125, range(1, 16, 2), True),
            QT.IQ1_M: (0.125, range(1, 16, 2), False)}
FORM = {
    QT.Q8_0: dict(codes=range(-128, 128), sub=None, msub=None, mw=False),
    QT.Q4_1: dict(codes=range(16), sub=None, msub=None, mw=True),
    QT.Q2_K: dict(codes=range(4), sub=range(16), msub=range(16), mw=True, superblock=True),
    QT.Q4_0: dict(codes=range(-8, 8), sub=None, msub=None, mw=False),
    QT.Q5_0: dict(codes=range(-16, 16), sub=None, msub=None, mw=False),
    QT.Q5_1: dict(codes=range(32), sub=None, msub=None, mw=True),
    QT.Q4_K: dict(codes=range(16), sub=range(64), msub=range(64), mw=True, superblock=True, equal=True),
    QT.Q5_K: dict(codes=range(32), sub=range(64), msub=range(64), mw=True, superblock=True, equal=True),
    QT.Q6_K: dict(codes=range(-32, 32), sub=range(-128, 128), msub=None, mw=False, superblock=True),
    QT.Q3_K: dict(codes=range(-4, 4), sub=range(-32, 32), msub=None, mw=False, superblock=True),
}
# The codebook types: codes are codebook entries (every one taken), no mins; IQ4_XS a signed
# sub-scale ls - 32 per 32 values and d per superblock.
CODEBOOK_FORM = {
    QT.IQ4_NL: dict(sub=None),
    QT.IQ4_XS: dict(sub=range(-32, 32), superblock=True),
    QT.MXFP4: dict(sub=None),
    QT.NVFP4: dict(sub=None),
}


def sub_values(qt):
    """The values a type's sub-scales take (None: every one is 1)."""
    if qt in _IQ_CODES:
        return _IQ_FORM[qt][1]
    return (FORM[qt] if qt in FORM else CODEBOOK_FORM[qt])["sub"]


def byte_scales(qt, blk) -> np.ndarray:
    """float32 [..., k]: MXFP4's and NVFP4's scales, decoded here from their layout's definition
    (float64, then rounded to float32: every one is exact): e8m0 e as 2^(e - 128); ue4m3 b
    times 0.5 with exponent bits 3..6 (bias 7), mantissa bits 0..2, 0 and 0x7F giving 0."""
    off, n = BYTE_SCALES[qt]
    b = blk[..., off:off + n].astype(np.int64)
    if qt == QT.MXFP4:
        v = np.ldexp(1.0, b - 128)
    else:
        e, m = (b >> 3) & 15, b & 7
        v = np.where(e == 0, m * 2.0**-9, (1 + m / 8) * np.ldexp(1.0, e - 7)) * 0.5
        v = np.where(b == 0x7F, 0.0, v)
    f = v.astype(np.float32)
    assert (f.astype(np.float64) == v).all()
    return f


def takes(a, values):
    """a holds only these values, and every one of them where a has 16 draws per value (the
    chance that random bytes miss one is then below 1e-5)."""
    got = set(np.unique(a).tolist())
    assert got <= set(values)
    if a.size >= 16 * len(values):
        assert got == set(values)


@pytest.mark.parametrize("qt", TYPES)
def test_decoded_shapes_and_ranges(qt):
    rng = np.random.default_rng(int(qt))
    vals, nbytes = GGML_QUANT_SIZES[qt]
    raw = random_raw(qt, (2, 3, 5), rng)
    dec = Q.decode(qt, raw)
    nb32 = 5 * vals // 32
    assert dec.qtype == qt
    assert dec.codes.shape == (2, 3, nb32, 32) and dec.codes.dtype == np.int8
    assert dec.sub.shape == (2, 3, nb32, 2) and dec.sub.dtype == np.int16
    c, u = dec.codes.astype(int), dec.sub.astype(int)
    if qt in CODEBOOK_FORM:
        fmt = qformats.lookup(qt)
        takes(c, fmt.codebook().tolist())
        if sub_values(qt) is None:
            assert (u == 1).all()
        else:
            takes(u, sub_values(qt))
            assert (u[..., 0] == u[..., 1]).all()
        assert dec.mw is None and dec.msub is None
        blk = raw.reshape(2, 3, 5, nbytes)
        if qt in BYTE_SCALES:
            scales = byte_scales(qt, blk)  # [2, 3, 5, 1 or 4]
            want = scales.reshape(2, 3, nb32) if qt == QT.MXFP4 else scales.reshape(2, 3, nb32, 2)
        else:
            d = np.ascontiguousarray(blk[..., 0:2]).view("<f2")[..., 0].astype(np.float32)
            want = np.repeat(d, 8 if CODEBOOK_FORM[qt].get("superblock") else 1, axis=-1)
        assert dec.dw.dtype == np.float32
        np.testing.assert_array_equal(bits(dec.dw), bits(want))  # NVFP4: dw [..., nb32, 2]
        return
    assert dec.dw.shape == (2, 3, nb32) and dec.dw.dtype == np.float32
    if qt in _IQ_CODES:
        k, subs, equal = _IQ_FORM[qt]
        takes(u, subs)
        takes(np.abs(c), _IQ_CODES[qt])
        assert (c < 0).any() and (c > 0).any()
        assert (u[..., 0] == u[..., 1]).all() == equal
        # dw = d * k, d the block's half
        d = qformats.lookup(qt).scale_values(raw.reshape(-1, nbytes))[:, 0].reshape(2, 3, 5)
        expect = np.repeat(d * np.float32(k), 8, axis=-1)
        np.testing.assert_array_equal(bits(dec.dw), bits(expect))
        assert dec.mw is None and dec.msub is None
        return
    form = FORM[qt]
    takes(c, form["codes"])
    if form["sub"] is None:
        assert (u == 1).all()
    else:
        takes(u, form["sub"])
        if form.get("equal"):
            assert (u[..., 0] == u[..., 1]).all()
    if form["mw"]:
        assert dec.mw.shape == (2, 3, nb32) and dec.mw.dtype == np.float32
    else:
        assert dec.mw is None
    if form["msub"] is None:
        assert dec.msub is None
        with pytest.raises(PackError):
            Q.folded_mins(dec)
    else:
        assert dec.msub.shape == (2, 3, nb32, 2) and dec.msub.dtype == np.int16
        takes(dec.msub, form["msub"])
        if form.get("equal"):
            assert (dec.msub[..., 0] == dec.msub[..., 1]).all()
    # the main scale (and the min) is the half at its offset, one per block of the type
    halves = [np.ascontiguousarray(raw.reshape(2, 3, 5, nbytes)[..., o:o + 2]).view("<f2")[..., 0]
              for o in qformats.lookup(qt).half_fields.values()]
    per = 8 if form.get("superblock") else 1
    np.testing.assert_array_equal(bits(dec.dw), bits(np.repeat(halves[0].astype(np.float32), per, axis=-1)))
    if form["mw"]:
        np.testing.assert_array_equal(bits(dec.mw), bits(np.repeat(halves[1].astype(np.float32), per, axis=-1)))


def test_q8_0_q4_1_decode_fields():
    rng = np.random.default_rng(3)
    raw = random_raw(QT.Q8_0, (4, 2), rng)
    dec = Q.decode(QT.Q8_0, raw)
    blk = raw.reshape(4, 2, 34)
    np.testing.assert_array_equal(dec.codes, blk[..., 2:].view(np.int8))
    np.testing.assert_array_equal(dec.dw, np.ascontiguousarray(blk[..., :2]).view("<f2")[..., 0])
    raw = random_raw(QT.Q4_1, (4, 2), rng)
    dec = Q.decode(QT.Q4_1, raw)
    blk = raw.reshape(4, 2, 20)
    np.testing.assert_array_equal(dec.codes[..., :16], blk[..., 4:] & 15)
    np.testing.assert_array_equal(dec.codes[..., 16:], blk[..., 4:] >> 4)
    np.testing.assert_array_equal(dec.mw, np.ascontiguousarray(blk[..., 2:4]).view("<f2")[..., 0])


def test_iq_tables():
    s = Q._sign_table()
    assert s.shape == (128, 8) and s.dtype == np.int8
    assert set(np.unique(s)) == {-1, 1}
    assert ((s < 0).sum(axis=1) % 2 == 0).all()  # even number of minus signs
    assert (s[:, :7] == np.where((np.arange(128)[:, None] >> np.arange(7)) & 1, -1, 1)).all()
    assert Q._grid(QT.IQ2_XS).shape == (512, 8)
    assert Q._grid(QT.IQ3_XXS).shape == (256, 4)
    assert Q._grid(QT.IQ3_S).shape == (512, 4)
    assert Q._grid(QT.IQ2_XXS).shape == (256, 8)
    assert Q._grid(QT.IQ2_S).shape == (1024, 8)
    assert Q._grid(QT.IQ1_S).shape == (2048, 8)
    assert Q._grid(QT.IQ1_M) is Q._grid(QT.IQ1_S)  # one grid, expanded once
    for qt in (QT.IQ2_XS, QT.IQ3_XXS, QT.IQ3_S, QT.IQ2_XXS, QT.IQ2_S, QT.IQ1_S):
        g = Q._grid(qt)
        assert g.dtype == np.int8
        if qt == QT.IQ1_S:
            assert set(np.unique(g)) == {-1, 0, 1}
        else:  # positive entries: the signs come apart (mmq.cu's sgn negates bytes 1..127)
            assert g.min() > 0 and g.max() < 128
        assert len(np.unique(g, axis=0)) == len(g)  # all grid points distinct
        assert Q._grid(qt) is g  # expanded once


# --------------------------------------------------------------------------- integer products


def _acts(rng, shape):
    """int8 activations, never zero."""
    return (rng.integers(1, 128, size=shape) * rng.choice([-1, 1], size=shape)).astype(np.int8)


@SETTINGS
@given(qt=st.sampled_from(TYPES), seed=st.integers(0, 2**32 - 1), valid=st.booleans())
def test_folded_codes_float_matmul_is_exact_int_dot(qt, seed, valid):
    rng = np.random.default_rng(seed)
    vals, nbytes = GGML_QUANT_SIZES[qt]
    rows, nblk = 3, 2
    if valid:
        raw = Q.random_blocks(qt, rows * nblk, rng).reshape(rows, nblk * nbytes)
    else:
        raw = random_raw(qt, (rows, nblk), rng)
    dec = Q.decode(qt, raw)
    nb32 = nblk * vals // 32
    a = _acts(rng, (nb32, 32))

    f = Q.folded_codes(dec)
    assert f.dtype == np.float32 and f.shape == (rows, nb32, 32)
    # float32 matmul over each 32-block
    sumi_f = np.matmul(f[:, :, None, :], a.astype(np.float32)[None, :, :, None])[..., 0, 0]
    c = dec.codes.astype(np.int64)
    u = dec.sub.astype(np.int64)
    a64 = a.astype(np.int64)
    sumi = u[..., 0] * (c[..., :16] * a64[:, :16]).sum(-1) + u[..., 1] * (c[..., 16:] * a64[:, 16:]).sum(-1)
    assert np.abs(sumi).max() < 2**31
    np.testing.assert_array_equal(sumi_f.astype(np.int64), sumi)
    assert (sumi_f == sumi.astype(np.float32)).all()

    if dec.msub is not None:
        fm = Q.folded_mins(dec)
        assert fm.dtype == np.float32 and fm.shape == (rows, nb32, 32)
        mi_f = np.matmul(fm[:, :, None, :], a.astype(np.float32)[None, :, :, None])[..., 0, 0]
        v = dec.msub.astype(np.int64)
        mi = v[..., 0] * a64[:, :16].sum(-1) + v[..., 1] * a64[:, 16:].sum(-1)
        np.testing.assert_array_equal(mi_f.astype(np.int64), mi)


def test_folded_codes_worst_case_within_float_exact_range():
    # The largest |code * sub| of each type times 127, over 32 values, stays below 2^24.
    worst = {QT.Q8_0: 128, QT.Q4_1: 15, QT.Q2_K: 3 * 15, QT.IQ2_XS: 43 * 31,
             QT.IQ3_XXS: 62 * 31, QT.IQ3_S: 15 * 31, QT.Q4_0: 8, QT.Q5_0: 16, QT.Q5_1: 31,
             QT.Q4_K: 15 * 63, QT.Q5_K: 31 * 63, QT.Q6_K: 32 * 128, QT.Q3_K: 4 * 32,
             QT.IQ4_NL: 127, QT.IQ4_XS: 127 * 32, QT.MXFP4: 12, QT.NVFP4: 12,
             QT.IQ2_XXS: 43 * 31, QT.IQ2_S: 43 * 31, QT.IQ1_S: 9 * 15, QT.IQ1_M: 9 * 15}
    rng = np.random.default_rng(11)
    for qt in TYPES:
        dec = Q.decode(qt, random_raw(qt, (8, 4), rng))
        assert np.abs(Q.folded_codes(dec)).max() <= worst[qt]
        assert worst[qt] * 127 * 32 < 2**24


def test_dequantize_decoded_formula():
    # dequantize is computed from the decoded form with the contract's formulas.
    rng = np.random.default_rng(5)
    for qt in TYPES:
        raw = Q.random_blocks(qt, 4, rng).reshape(2, -1)
        dec = Q.decode(qt, raw)
        c = dec.codes.astype(np.float32)
        u = np.repeat(dec.sub.astype(np.float32), 16, axis=-1)
        dw = dec.dw[..., None]
        epilogue = qformats.lookup(qt).epilogue
        if epilogue is qformats.Epilogue.HALVES:  # dw [..., nb32, 2]: one scale a half
            y = np.repeat(dec.dw, 16, axis=-1) * c
        elif sub_values(qt) is None:  # no sub-scales
            y = dw * c
            if epilogue is qformats.Epilogue.MIN:
                y = y + dec.mw[..., None]
        elif epilogue is qformats.Epilogue.DMIN:
            v = np.repeat(dec.msub.astype(np.float32), 16, axis=-1)
            y = (dw * u) * c - dec.mw[..., None] * v
        else:
            y = (dw * u) * c
        np.testing.assert_array_equal(bits(y.reshape(2, -1)), bits(Q.dequantize(qt, raw)))


# --------------------------------------------------------------------------- random_blocks


@pytest.mark.parametrize("qt", TYPES)
@pytest.mark.parametrize("std", [0.02, 0.3])
def test_random_blocks_valid_and_scaled(qt, std):
    vals, nbytes = GGML_QUANT_SIZES[qt]
    n = 4096 * 32 // vals
    a = Q.random_blocks(qt, n, np.random.default_rng(42), std=std)
    b = Q.random_blocks(qt, n, np.random.default_rng(42), std=std)
    c = Q.random_blocks(qt, n, np.random.default_rng(43), std=std)
    assert a.dtype == np.uint8 and a.shape == (n, nbytes)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    x = Q.dequantize(qt, a)
    assert np.isfinite(x).all()
    assert std / 3 < x.std() < std * 3
    assert abs(x.mean()) < std
    dec = Q.decode(qt, a)
    if qt == QT.Q8_0:
        assert dec.codes.min() >= -127 and dec.codes.max() <= 127
    # sub-scale bits random: every sub-scale value of the type appears
    if sub_values(qt) is not None:
        assert set(np.unique(dec.sub)) == set(sub_values(qt))
    # scales are finite and positive (mins of Q4_1 negative)
    h = qformats.lookup(qt).scale_values(a)
    assert np.isfinite(h).all() and (h != 0).all()
    if qt in BYTE_SCALES:  # byte scales positive, and values finite (checked above)
        assert (byte_scales(qt, a) > 0).all()


def test_random_blocks_code_bits_random():
    rng = np.random.default_rng(9)
    for qt in TYPES:
        a = Q.random_blocks(qt, 2048, rng)
        # every byte position outside the scales takes many values
        mask = ~scale_byte_mask(qt)
        if qt in BYTE_SCALES:
            off, n = BYTE_SCALES[qt]
            mask[off : off + n] = False
        counts = [len(np.unique(a[:, j])) for j in np.flatnonzero(mask)]
        assert min(counts) > 200
    # IQ grid indices cover the whole grid
    dec_src = Q.random_blocks(QT.IQ3_S, 4096, rng)
    qs = dec_src[:, 2:66].astype(int) | (
        ((dec_src[:, 66:74, None] >> np.arange(8)) & 1).reshape(-1, 64).astype(int) << 8
    )
    assert len(np.unique(qs)) == 512


def test_random_blocks_generator_stream_deterministic():
    r1, r2 = np.random.default_rng(1), np.random.default_rng(1)
    for qt in TYPES:
        np.testing.assert_array_equal(Q.random_blocks(qt, 17, r1), Q.random_blocks(qt, 17, r2))
    assert Q.random_blocks(QT.Q8_0, 0, r1).shape == (0, 34)
    with pytest.raises(ValueError):
        Q.random_blocks(QT.Q8_0, 4, r1, std=float("nan"))


# --------------------------------------------------------------------------- quantize_q8_0


@SETTINGS
@given(
    seed=st.integers(0, 2**32 - 1),
    rows=st.integers(1, 4),
    nblk=st.integers(1, 6),
    scale=st.sampled_from([1e-6, 0.02, 1.0, 300.0, 3e5]),
)
def test_quantize_q8_0_matches_gguf(seed, rows, nblk, scale):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, nblk * 32)) * scale).astype(np.float32)
    q = Q.quantize_q8_0(x)
    assert q.dtype == np.uint8 and q.shape == (rows, nblk * 34)
    np.testing.assert_array_equal(q, gq.quantize(x, QT.Q8_0))
    # round trip: within half a step (of the half-rounded scale) plus the scale's rounding
    y = Q.dequantize(QT.Q8_0, q)
    d = np.repeat(Q.decode(QT.Q8_0, q).dw, 32, axis=-1).astype(np.float64)
    amax = np.repeat(np.abs(x.reshape(rows, nblk, 32)).max(-1), 32, axis=-1).astype(np.float64)
    err = np.abs(y.astype(np.float64) - x)
    # where amax / 127 is a normal half (no underflow or overflow of the stored scale)
    ok = (amax / 127 >= 2.0**-14) & (amax / 127 <= 65504)
    assert (err <= 0.5 * d + amax * 2e-3)[ok].all()


def test_quantize_q8_0_ties_round_half_away_from_zero():
    # amax = 127 gives d = 1, id = 1: x * id is x exactly.
    x = np.array([127.0, -0.5, 0.5, 1.5, 2.5, -2.5, -3.5, 0.49999997, -0.49999997, 126.5,
                  -126.5, 3.0, -7.25, 7.75, 64.5, -64.5] * 2, np.float32)
    q = Q.quantize_q8_0(x)
    assert q.shape == (34,)
    assert q[:2].view("<f2")[0] == 1.0
    codes = q[2:].view(np.int8)[:16]
    expect = [127, -1, 1, 2, 3, -3, -4, 0, 0, 127, -127, 3, -7, 8, 65, -65]
    assert codes.tolist() == expect
    assert codes.tolist() != np.round(x[:16]).astype(int).tolist()  # np.round is half-to-even
    np.testing.assert_array_equal(q, gq.quantize(x, QT.Q8_0))


def test_quantize_q8_0_zero_block_and_shapes():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 3, 96)).astype(np.float32)
    x[1, 2, 32:64] = 0.0  # one deliberate all-zero block
    q = Q.quantize_q8_0(x)
    assert q.shape == (2, 3, 3 * 34)
    assert (q[1, 2, 34:68] == 0).all()
    np.testing.assert_array_equal(q.reshape(6, -1), gq.quantize(x.reshape(6, -1), QT.Q8_0))
    # float16 / bfloat16-like input goes through float32
    xh = x.astype(np.float16)
    np.testing.assert_array_equal(Q.quantize_q8_0(xh), Q.quantize_q8_0(xh.astype(np.float32)))
    with pytest.raises(PackError, match="multiple of 32"):
        Q.quantize_q8_0(np.ones((2, 33), np.float32))
