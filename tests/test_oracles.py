"""The vectorized NumPy definitions (docs/numerics.md, sections 2-7) against their scalar
loops in reference/scalar.py, byte for byte.

reference/scalar.py states each rule element by element, in the contract's order, one float32
operation per step, without calling the definition it states. Here each is compared with the
vectorized definition on tiny random cases (1-3 rows, 1-3 blocks), so a changed order, scale or
formula in contract/q8_1.py, contract/blockquant.py, contract/mmq.py, contract/attention.py,
contract/routing.py, contract/moe.py or contract/numerics.py' sigmoid/silu turns this file red on a
CPU.
"""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from hypothesis import given, settings
from hypothesis import strategies as st

from strata_prefill.reference import scalar
from strata_prefill.contract import blockquant, mmq, moe, numerics, q8_1, quants, routing
from strata_prefill.contract.attention import KVCache, attend

F32 = np.float32
SETTINGS = settings(max_examples=25, deadline=None)
TYPES = list(quants.SUPPORTED_TYPES)


def rand(rng, shape, spread=2):
    """Random float32 values over a few binades, never zero."""
    m = rng.standard_normal(shape)
    m = np.where(m == 0, 1.0, m)
    return (m * np.exp2(rng.integers(-spread, spread + 1, shape))).astype(F32)


def same(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


# --------------------------------------------------------------------------- int8 blocks, q8_1 (section 2)


@pytest.mark.parametrize("case", ["zeros", "negative zeros", "tiny", "nan", "inf", "-inf", "mixed"])
def test_int8_block_edges(case):
    """The defined edge cases of one group: scale 0 and codes 0 where 127/amax is not finite;
    an infinite value: scale +inf, codes 0."""
    x = rand(np.random.default_rng(7), 32)
    x = {"zeros": np.zeros(32, F32), "negative zeros": np.full(32, -0.0, F32),
         "tiny": np.full(32, F32(1e-38)), "mixed": x}.get(case, x)
    if case in ("nan", "inf", "-inf"):
        x[5] = F32({"nan": np.nan, "inf": np.inf, "-inf": -np.inf}[case])
    codes, d = blockquant.quantize_blocks(x, 32)
    want_codes, want_d = scalar.int8_block(x.tolist())
    assert same(codes, np.array(want_codes, np.int8)) and same(d, np.array([want_d], F32))


@SETTINGS
@given(layout=st.sampled_from(list(q8_1.Layout)), seed=st.integers(0, 2**32 - 1),
       n_rows=st.integers(1, 3), K=st.sampled_from([32, 100, 512, 640]), spread=st.integers(0, 30),
       zero_group=st.booleans(), cancelling=st.booleans())
def test_q8_1_quantize(layout, seed, n_rows, K, spread, zero_group, cancelling):
    rng = np.random.default_rng(seed)
    x = rand(rng, (n_rows, K), spread)
    if cancelling:  # +-2^14 cancel and a 2^-14 beside them survives or not by the order of the
        # sums, whose halves keep 2^-14 (the smallest normal half)
        x = rng.choice(np.array([2.0**14, -2.0**14, 2.0**-14, -2.0**-14, 1.0, -1.0], F32), (n_rows, K))
    if zero_group:  # an all-zero 32-value group inside the first row
        x[0, :32] = 0.0
    assert same(q8_1.quantize_rows(x, layout), scalar.q8_1_rows(x, layout))


# --------------------------------------------------------------------------- MMQ (section 3)


@pytest.mark.parametrize("qt", TYPES, ids=[t.name for t in TYPES])
@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n_rows=st.integers(1, 3), n_out=st.integers(1, 3),
       n_super=st.integers(1, 2), offset=st.sampled_from([0, 8]))
def test_mmq_epilogue(qt, seed, n_rows, n_out, n_super, offset):
    """Every weight type, each epilogue (PLAIN, MIN, DMIN) as its type takes it."""
    rng = np.random.default_rng(seed)
    vals, nbytes = quants.block_size(qt)
    K = 256 * n_super  # a multiple of every type's block: 1-2 superblocks, 8-16 32-blocks
    raw = quants.random_blocks(qt, n_out * K // vals, rng).reshape(n_out, K // vals * nbytes)
    layout = q8_1.layout_for(qt)
    # an offset makes the codes of a block mostly large and of one sign: integer sums of 15-16
    # bits, whose products with a half scale are no longer exact (so an order shows)
    x = rand(rng, (n_rows, K)) + F32(offset)
    buf = q8_1.pack_rows(q8_1.quantize_rows(x, layout))
    got = mmq.mmq(qt, raw, q8_1.decode_rows(buf, n_rows, layout))
    assert same(got, scalar.mmq(qt, raw, buf, n_rows))


# --------------------------------------------------------------------------- attention (section 5)


@settings(max_examples=16, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n_tok=st.integers(1, 3), n_keys_extra=st.integers(0, 90),
       hd=st.sampled_from([32, 64, 96, 128]), gqa=st.sampled_from([(2, 1), (2, 2)]))
def test_attention(seed, n_tok, n_keys_extra, hd, gqa):
    # head_dim 96 and 128: a KQ2 that is not a power of two times log2(e) on a longer row, so
    # where the scales are applied, and in which order, changes bits
    rng = np.random.default_rng(seed)
    n_head, n_head_kv = gqa
    n_keys = n_tok + n_keys_extra  # 1-2 key blocks; the queries are the last n_tok positions
    k = rand(rng, (n_keys, n_head_kv, hd))
    v = rand(rng, (n_keys, n_head_kv, hd))
    q = rand(rng, (n_tok, n_head, hd))
    qpos = np.arange(n_keys - n_tok, n_keys)
    cache = KVCache(1, n_head_kv, hd)
    cache.write(0, np.arange(n_keys), k, v)
    got = attend(cache, 0, q, qpos)
    assert same(got, scalar.attention(q, k, v, qpos, n_head_kv))


# --------------------------------------------------------------------------- router (section 4)


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), n_tok=st.integers(1, 3), n_expert=st.integers(2, 40),
       k=st.integers(1, 8), levels=st.integers(2, 64))
def test_router(seed, n_tok, n_expert, k, levels):
    rng = np.random.default_rng(seed)
    k = min(k, n_expert)
    # logits from a few levels, so equal probabilities (ties) are common
    logits = (rng.integers(0, levels, (n_tok, n_expert)) * F32(0.375) - F32(4)).astype(F32)
    ids, w = routing.top_k(logits, k)
    want_ids, want_w = scalar.top_k(logits, k)
    assert same(ids, want_ids) and same(w, want_w)


# --------------------------------------------------------------------------- SwiGLU, gate (section 6)


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 3), d=st.integers(1, 40))
def test_swiglu(seed, n, d):
    rng = np.random.default_rng(seed)
    g, u = rand(rng, (n, d), 4), rand(rng, (n, d), 4)
    assert same(moe.swiglu(g, u), scalar.swiglu(g, u))


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 40))
def test_shared_expert_gate(seed, n):
    x = rand(np.random.default_rng(seed), n, 6)
    assert same(numerics.sigmoid(x), scalar.sigmoid(x))


# --------------------------------------------------------------------------- combine (section 7)


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), n_tok=st.integers(1, 3), k=st.integers(1, 4),
       d=st.integers(1, 8), with_shared=st.booleans())
def test_combine(seed, n_tok, k, d, with_shared):
    rng = np.random.default_rng(seed)
    x = rand(rng, (n_tok, d))
    w = rand(rng, (n_tok, k))
    slot = rng.permutation(n_tok * k).astype(np.int32)
    y = rand(rng, (n_tok * k, d), 6)
    shared = (rand(rng, n_tok), rand(rng, (n_tok, d), 6)) if with_shared else None
    assert same(moe.combine(x, w, slot, y, shared), scalar.combine(x, w, slot, y, shared))
