"""q8_1 buffers (docs/numerics.md section 2): contract/q8_1.py against the scalar quantizer of
reference/scalar.py (q8_1_rows, q8_1_block), the byte layout, and gather == scatter over random
routings."""

from __future__ import annotations


import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from hypothesis import given, settings
from hypothesis import strategies as st

from strata_prefill.reference import scalar
from strata_prefill.contract import q8_1
from strata_prefill.contract.errors import PackError
from strata_prefill.contract.q8_1 import BLOCK_BYTES, LAYOUT_D2S6, LAYOUT_D4, LAYOUT_DS4

F32 = np.float32
LAYOUTS = [LAYOUT_D4, LAYOUT_DS4, LAYOUT_D2S6]


def rand_rows(rng, shape, spread=6):
    m = rng.standard_normal(shape)
    e = rng.integers(-spread, spread + 1, size=shape)
    return (m * np.exp2(e)).astype(np.float32)


# --------------------------------------------------------------------------- basics


def test_layout_for():
    assert q8_1.layout_for(QT.Q8_0) == LAYOUT_D4
    assert q8_1.layout_for(QT.IQ2_XS) == LAYOUT_D4
    assert q8_1.layout_for(QT.IQ3_XXS) == LAYOUT_D4
    assert q8_1.layout_for(QT.IQ3_S) == LAYOUT_D4
    assert q8_1.layout_for(QT.Q4_1) == LAYOUT_DS4
    assert q8_1.layout_for(QT.Q2_K) == LAYOUT_D2S6
    assert q8_1.layout_for(int(QT.Q2_K)) == LAYOUT_D2S6
    # the K-quants multiply with integer block sums (Q4_K, Q5_K) or none: a float32 scale each
    for qt in (QT.Q4_0, QT.Q5_0, QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.Q3_K):
        assert q8_1.layout_for(qt) == LAYOUT_D4
    assert q8_1.layout_for(QT.Q5_1) == LAYOUT_DS4  # Q4_1's float min times the block's sum
    for qt in (QT.IQ4_NL, QT.IQ4_XS, QT.MXFP4, QT.NVFP4):  # the codebook types: float32 scales
        assert q8_1.layout_for(qt) == LAYOUT_D4
    for bad in (QT.F32, QT.F16, QT.TQ2_0, QT.TQ1_0, 9999):
        with pytest.raises(PackError):
            q8_1.layout_for(bad)
    assert (int(LAYOUT_D4), int(LAYOUT_DS4), int(LAYOUT_D2S6)) == (0, 1, 2)


def test_sizes():
    assert BLOCK_BYTES == 144
    assert q8_1.padded_len(1) == 512
    assert q8_1.padded_len(512) == 512
    assert q8_1.padded_len(640) == 1024
    assert q8_1.padded_len(2560) == 2560
    assert q8_1.buffer_nbytes(3, 640) == 3 * 8 * 144
    assert q8_1.buffer_nbytes(0, 640) == 0
    buf = q8_1.alloc_buffer(5, 700)
    assert buf.dtype == np.uint8 and buf.shape == (5 * 8 * 144,) and not buf.any()
    with pytest.raises(ValueError):
        q8_1.padded_len(0)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("K", [1, 31, 96, 128, 200, 512, 640, 1030])
def test_quantize_rows_matches_scalar_oracle(layout, K):
    rng = np.random.default_rng(K * 3 + int(layout))
    x = rand_rows(rng, (3, K))
    if K >= 64:
        x[1, 32:64] = 0.0  # an all-zero 32-block inside a row
    got = q8_1.quantize_rows(x, layout)
    assert got.dtype == np.uint8 and got.shape == (3, q8_1.padded_len(K) // 128, 144)
    assert np.array_equal(got, scalar.q8_1_rows(x, layout))


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(LAYOUTS), st.integers(1, 3), st.integers(1, 600), st.integers(0, 2**32 - 1),
       st.integers(0, 30))
def test_quantize_rows_matches_scalar_oracle_random(layout, R, K, seed, spread):
    rng = np.random.default_rng(seed)
    x = rand_rows(rng, (R, K), spread=spread)
    assert np.array_equal(q8_1.quantize_rows(x, layout), scalar.q8_1_rows(x, layout))


def test_quantize_refuses_float64():
    with pytest.raises(TypeError):
        q8_1.quantize_rows(np.ones((1, 32)), LAYOUT_D4)


# --------------------------------------------------------------------------- byte layout


def test_header_offsets_d4():
    x = np.zeros((1, 512), np.float32)
    x[0, 128 + 64 + 5] = -2.0  # block kb=1, 32-block j=2
    b = q8_1.quantize_rows(x, LAYOUT_D4)[0]
    assert not b[0].any() and not b[2].any() and not b[3].any()
    d = b[1, :16].view("<f4")
    assert d[0] == 0 and d[1] == 0 and d[3] == 0 and d[2] == F32(1.0) / (F32(127.0) / F32(2.0))
    codes = b[1, 16:].view(np.int8)
    assert codes[69] == -127 and np.count_nonzero(codes) == 1


def test_header_offsets_ds4():
    x = np.zeros((1, 512), np.float32)
    x[0, 3 * 32 + 1] = 4.0
    x[0, 3 * 32 + 2] = 1.0
    b = q8_1.quantize_rows(x, LAYOUT_DS4)[0, 0]
    h = b[:16].view("<f2")
    # d0 s0 d1 s1 d2 s2 d3 s3
    assert (h[:6] == 0).all()
    assert h[6] == np.float16(F32(1.0) / (F32(127.0) / F32(4.0))) and h[7] == 5.0
    codes = b[16:].view(np.int8)
    assert codes[97] == 127 and codes[98] == 32  # roundf(1 * 31.75) = 32


def test_header_offsets_d2s6():
    x = np.zeros((1, 512), np.float32)
    x[0, 70] = 8.0     # second 64-group, 16-group 4
    x[0, 100] = 100.0  # second 64-group, 16-group 6: not summed
    x[0, 3] = -1.0     # first 64-group, 16-group 0
    b = q8_1.quantize_rows(x, LAYOUT_D2S6)[0, 0]
    h = b[:16].view("<f2")
    assert h[0] == np.float16(F32(1.0) / F32(127.0)) and h[1] == np.float16(F32(1.0) / (F32(127.0) / F32(100.0)))
    assert list(h[2:].astype(np.float32)) == [-1.0, 0.0, 0.0, 0.0, 8.0, 0.0]
    codes = b[16:].view(np.int8)
    assert codes[3] == -127 and codes[100] == 127 and codes[70] == 10  # roundf(8 * 1.27) = 10


def test_padding_blocks_are_zero():
    rng = np.random.default_rng(4)
    x = rand_rows(rng, (2, 200))
    for layout in LAYOUTS:
        b = q8_1.quantize_rows(x, layout)
        assert b.shape == (2, 4, 144)
        assert not b[:, 2:].any()  # whole padding blocks: every byte zero
        assert not b[:, 1, 16 + 72:].any()  # codes of values 200..255
        dec = q8_1.decode_rows(b, 2, layout)
        assert (dec.d[:, 8:] == 0).all() and (dec.codes[:, 8:] == 0).all()


def test_column_block_major():
    rng = np.random.default_rng(6)
    R, K = 5, 1000
    x = rand_rows(rng, (R, K))
    rows = q8_1.quantize_rows(x, LAYOUT_DS4)
    buf = q8_1.pack_rows(rows)
    assert buf.shape == (q8_1.buffer_nbytes(R, K),)
    for kb in range(rows.shape[1]):
        for r in range(R):
            off = (kb * R + r) * 144
            assert np.array_equal(buf[off:off + 144], rows[r, kb])
    assert np.array_equal(q8_1.unpack_rows(buf, R), rows)
    out = q8_1.alloc_buffer(R, K)
    q8_1.gather_quantize(x, np.arange(R), LAYOUT_DS4, out)
    assert np.array_equal(out, buf)


def test_all_zero_block_and_row():
    x = np.zeros((2, 256), np.float32)
    x[1, 128:] = np.linspace(-1, 1, 128, dtype=np.float32)
    for layout in LAYOUTS:
        b = q8_1.quantize_rows(x, layout)
        assert not b[0].any() and not b[1, 0].any()
        assert b[1, 1].any()
        dec = q8_1.decode_rows(b, 2, layout)
        assert (dec.d[0] == 0).all() and (dec.codes[0] == 0).all()


def test_negative_zero_block():
    # amax of -0.0 is 0: d = 0 and codes 0; the float sums keep the sign (-0.0 + -0.0)
    x = np.full((1, 128), -0.0, np.float32)
    assert not q8_1.quantize_rows(x, LAYOUT_D4).any()
    b = q8_1.quantize_rows(x, LAYOUT_DS4)[0, 0]
    assert list(b[:16].view("<u2")) == [0, 0x8000] * 4 and not b[16:].any()
    assert np.array_equal(b, np.frombuffer(scalar.q8_1_block([F32(-0.0)] * 128, LAYOUT_DS4), np.uint8))


def test_ties_round_half_away():
    # amax 127 -> d_inv = 1 exactly, so x * d_inv lands on the ties themselves
    vals = [127.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 126.5, -126.5, 0.49999997, -0.49999997]
    x = np.zeros((1, 512), np.float32)
    x[0, :len(vals)] = vals
    for layout in LAYOUTS:
        codes = q8_1.quantize_rows(x, layout)[0, 0, 16:].view(np.int8)[:len(vals)]
        assert list(codes) == [127, 1, -1, 2, -2, 3, -3, 127, -127, 0, 0]


# --------------------------------------------------------------------------- decode / describe


@pytest.mark.parametrize("layout", LAYOUTS)
def test_decode_rows(layout):
    rng = np.random.default_rng(8)
    R, K = 3, 640
    x = rand_rows(rng, (R, K))
    rows = q8_1.quantize_rows(x, layout)
    buf = q8_1.pack_rows(rows)
    dec = q8_1.decode_rows(buf, R, layout)
    dec2 = q8_1.decode_rows(rows, R, layout)
    nb32 = q8_1.padded_len(K) // 32
    assert dec.codes.dtype == np.int8 and dec.codes.shape == (R, nb32, 32)
    assert dec.d.dtype == np.float32 and dec.d.shape == (R, nb32)
    for a, b in ((dec.codes, dec2.codes), (dec.d, dec2.d)):
        assert np.array_equal(a, b)
    assert np.array_equal(dec.codes.reshape(R, -1, 128), rows[..., 16:].view(np.int8))
    hdr = rows[..., :16]
    if layout == LAYOUT_D4:
        assert dec.s is None and dec.s16 is None
        assert np.array_equal(dec.d, hdr.copy().view("<f4").reshape(R, -1))
    elif layout == LAYOUT_DS4:
        h = hdr.copy().view("<f2").reshape(R, -1, 4, 2).astype(np.float32)
        assert dec.s16 is None and dec.s.dtype == np.float32 and dec.s.shape == (R, nb32)
        assert np.array_equal(dec.d, h[..., 0].reshape(R, -1))
        assert np.array_equal(dec.s, h[..., 1].reshape(R, -1))
    else:
        h = hdr.copy().view("<f2").astype(np.float32)
        assert dec.s is None and dec.s16.shape == (R, 6 * nb32 // 4)
        assert np.array_equal(dec.d[:, 0::4], h[..., 0]) and np.array_equal(dec.d[:, 1::4], h[..., 0])
        assert np.array_equal(dec.d[:, 2::4], h[..., 1]) and np.array_equal(dec.d[:, 3::4], h[..., 1])
        assert np.array_equal(dec.s16, h[..., 2:].reshape(R, -1))
    # dequantized values are close to the inputs (a sanity check, not the contract); a half
    # scale is off by up to 2^-11 relative, times codes up to 127
    tol = 0.51 if layout == LAYOUT_D4 else 0.57
    deq = (dec.codes.astype(np.float32) * dec.d[..., None]).reshape(R, -1)[:, :K]
    assert np.all(np.abs(deq - x) <= np.repeat(dec.d, 32, axis=1)[:, :K] * tol + 1e-30)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_describe_block(layout):
    rng = np.random.default_rng(12)
    b = q8_1.quantize_rows(rand_rows(rng, (1, 128)), layout)[0, 0]
    text = q8_1.describe_block(b, layout)
    assert layout.name in text and "codes[" in text
    if layout == LAYOUT_D4:
        assert "d = " in text
    elif layout == LAYOUT_DS4:
        assert "d3 = " in text and "s3 = " in text
    else:
        assert "d1 = " in text and "s5 = " in text
    assert str(int(b[16:].view(np.int8)[0])) in text


# --------------------------------------------------------------------------- gather == scatter


def routing_tables(ids: np.ndarray, E: int):
    """docs/numerics.md section 4, literally: counts, exclusive prefix sums over expert id, then
    for pairs i in ascending order slot[i] = off[e]++ and src[slot[i]] = t."""
    T, K = ids.shape
    flat = ids.reshape(-1).tolist()
    cnt = [0] * E
    for e in flat:
        cnt[e] += 1
    off, acc = [], 0
    for e in range(E):
        off.append(acc)
        acc += cnt[e]
    slot = [0] * (T * K)
    src = [0] * (T * K)
    for i, e in enumerate(flat):
        slot[i] = off[e]
        off[e] += 1
        src[slot[i]] = i // K
    return np.array(slot, np.int64), np.array(src, np.int64)


def random_ids(rng, T, E, K):
    """Distinct experts per token, skewed (Zipf-like) popularity via Gumbel top-K."""
    logp = -rng.uniform(0.0, 3.0) * np.log1p(rng.permutation(E)).astype(np.float64)
    keys = logp[None, :] + rng.gumbel(size=(T, E))
    return np.argsort(-keys, axis=1, kind="stable")[:, :K]


def poisoned_run(fill, nbytes, rng):
    """Run ``fill(out)`` on two buffers poisoned with complementary nonzero patterns; every
    byte written means both results agree everywhere."""
    a = rng.integers(1, 255, size=nbytes, dtype=np.uint8)  # 1..254
    b = np.uint8(255) - a                                   # also 1..254, differs from a
    outs = []
    for poison in (a, b):
        out = poison.copy()
        fill(out)
        outs.append(out)
    unwritten = np.flatnonzero(outs[0] != outs[1])
    assert unwritten.size == 0, f"{unwritten.size} bytes never written, first at {unwritten[0]}"
    return outs[0]


def check_gather_equals_scatter(T, E, K, hidden, layout, seed):
    rng = np.random.default_rng(seed)
    x = rand_rows(rng, (T, hidden), spread=8)
    x[rng.integers(T)] = 0.0  # one all-zero token
    ids = random_ids(rng, T, E, K)
    slot, src = routing_tables(ids, E)
    # tables are a permutation, sorted by expert id (stable in pair order)
    assert np.array_equal(np.sort(slot), np.arange(T * K))
    assert np.array_equal(src[slot], np.arange(T * K) // K)
    e_of_row = ids.reshape(-1)[np.argsort(slot)]
    assert np.all(np.diff(e_of_row) >= 0)

    n = q8_1.buffer_nbytes(T * K, hidden)
    g = poisoned_run(lambda out: q8_1.gather_quantize(x, src, layout, out), n, rng)
    s = poisoned_run(lambda out: q8_1.scatter_quantize(x, slot, K, layout, out), n, rng)
    if not np.array_equal(g, s):
        i = int(np.flatnonzero(g != s)[0])
        blk = i // 144
        R = T * K
        raise AssertionError(
            f"gather != scatter at byte {i} (block kb={blk // R}, row {blk % R}):\n"
            f"gather:  {q8_1.describe_block(g[blk * 144:(blk + 1) * 144], layout)}\n"
            f"scatter: {q8_1.describe_block(s[blk * 144:(blk + 1) * 144], layout)}"
        )
    # and both are the per-row quantization of the routed tokens
    rows = q8_1.unpack_rows(g, T * K)
    tok = np.arange(T)
    pick = rng.choice(T * K, size=min(64, T * K), replace=False)
    want = q8_1.quantize_rows(x[src[pick]], layout)
    assert np.array_equal(rows[pick], want)
    assert set(src.tolist()) == set(tok.tolist())


@st.composite
def routings(draw):
    T = draw(st.one_of(st.integers(1, 64), st.integers(1, 3000)))
    E = draw(st.integers(1, 512))
    K = draw(st.integers(1, min(10, E)))
    hidden = draw(st.one_of(st.sampled_from([32, 128, 512, 640]), st.integers(1, 640)))
    seed = draw(st.integers(0, 2**32 - 1))
    return T, E, K, hidden, seed


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda l: l.name)
@settings(max_examples=20, deadline=None)
@given(routings())
def test_gather_equals_scatter(layout, routing):
    T, E, K, hidden, seed = routing
    check_gather_equals_scatter(T, E, K, hidden, layout, seed)


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda l: l.name)
def test_gather_equals_scatter_large(layout):
    # the MoE shape of the seeds: 512 experts, top-10, a few thousand tokens
    check_gather_equals_scatter(T=2500, E=512, K=10, hidden=512, layout=layout, seed=99)


def test_buffer_size_mismatch_is_an_error():
    x = np.ones((4, 64), np.float32)
    with pytest.raises(ValueError):
        q8_1.gather_quantize(x, np.arange(4), LAYOUT_D4, q8_1.alloc_buffer(5, 64))
    with pytest.raises(ValueError):
        q8_1.scatter_quantize(x, np.arange(7), 2, LAYOUT_D4, q8_1.alloc_buffer(8, 64))
