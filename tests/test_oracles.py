"""Independent oracles for the shared NumPy definitions (docs/numerics.md, sections 3-7).

Each oracle is a literal scalar loop written from the contract, one np.float32 operation per
step, in the order the document gives; it never calls the definition it checks. It compares
byte for byte with the definition on tiny random cases (1-3 rows, 1-3 blocks), so a changed
order, scale or formula in strata/mmq.py, strata/attention.py, strata/routing.py,
strata/moe.py or strata/numerics.py' sigmoid/silu turns this file red on a CPU.

What the oracles do call, and why that is allowed:
- ``strata.numerics.exp`` and ``strata.numerics.roundf``: the contract defines them as *the*
  shared primitives (section 1) that every rule uses; they have their own scalar tests in
  tests/test_numerics.py.
- ``strata.quants.decode`` for a weight's integer form (codes, sub-scales, dw, mw): the weight
  formats are pinned against ``gguf.quants.dequantize`` in tests/test_quants.py; the product's
  epilogue is what is checked here.
- ``strata.q8_1.quantize_rows`` to make the activation bytes (pinned in tests/test_q8_1.py);
  the oracle reads the 144-byte blocks itself.
"""
from __future__ import annotations

import math

import numpy as np
from gguf import GGMLQuantizationType as QT
from hypothesis import given, settings
from hypothesis import strategies as st

from strata import mmq, moe, numerics, q8_1, quants, routing
from strata.attention import KVCache, attend

F32 = np.float32
ZERO = F32(0.0)
ONE = F32(1.0)
SETTINGS = settings(max_examples=25, deadline=None)
TYPES = [QT.Q8_0, QT.Q4_1, QT.Q2_K, QT.IQ2_XS, QT.IQ3_XXS, QT.IQ3_S]


def rand(rng, shape, spread=2):
    """Random float32 values over a few binades, never zero."""
    m = rng.standard_normal(shape)
    m = np.where(m == 0, 1.0, m)
    return (m * np.exp2(rng.integers(-spread, spread + 1, shape))).astype(F32)


def exp(x):
    return numerics.exp(F32(x))[()]


def roundf(x):
    return numerics.roundf(F32(x))[()]


def same(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


# --------------------------------------------------------------------------- MMQ (section 3)


def read_q8_1_block(blk: bytes, layout, j: int):
    """32-value block j (0..3) of one 144-byte block_q8_1_mmq: (codes, da, sa)."""
    codes = np.frombuffer(blk, np.int8, 32, 16 + 32 * j).tolist()
    if layout == q8_1.Layout.D4:
        return codes, np.frombuffer(blk, "<f4", 1, 4 * j)[0], None
    h = np.frombuffer(blk, "<f2", 8, 0).astype(F32)
    if layout == q8_1.Layout.DS4:
        return codes, h[2 * j], h[2 * j + 1]
    return codes, h[j // 2], None  # D2S6: d0 for values 0..63, d1 for 64..127


def mmq_oracle(qt, raw: np.ndarray, buf: np.ndarray, n_rows: int) -> np.ndarray:
    layout = q8_1.layout_for(qt)
    dec = quants.decode(qt, raw)  # codes [N, nb, 32], sub [N, nb, 2], dw, mw, msub
    n_out, nb = dec.dw.shape
    blocks = q8_1.unpack_rows(buf, n_rows)  # [R, Kp/128, 144]
    out = np.zeros((n_rows, n_out), F32)
    for r in range(n_rows):
        for n in range(n_out):
            acc = ZERO
            for b in range(nb):  # ascending blocks from acc = 0.0f
                a, da, sa = read_q8_1_block(blocks[r, b // 4].tobytes(), layout, b % 4)
                c = dec.codes[n, b].tolist()
                u0, u1 = (int(v) for v in dec.sub[n, b])
                sumi = (u0 * sum(c[i] * a[i] for i in range(16))
                        + u1 * sum(c[i] * a[i] for i in range(16, 32)))
                dw = dec.dw[n, b]
                if qt == QT.Q4_1:
                    mw = dec.mw[n, b]
                    acc = acc + ((dw * da) * F32(sumi) + mw * sa)
                elif qt == QT.Q2_K:
                    v0, v1 = (int(v) for v in dec.msub[n, b])
                    mi = v0 * sum(a[:16]) + v1 * sum(a[16:])
                    mw = dec.mw[n, b]
                    acc = acc + ((dw * da) * F32(sumi) - (mw * da) * F32(mi))
                else:
                    acc = acc + (dw * da) * F32(sumi)
            out[r, n] = acc
    return out


@SETTINGS
@given(qt=st.sampled_from(TYPES), seed=st.integers(0, 2**32 - 1), n_rows=st.integers(1, 3),
       n_out=st.integers(1, 3), n_super=st.integers(1, 2), offset=st.sampled_from([0, 8]))
def test_mmq_epilogue(qt, seed, n_rows, n_out, n_super, offset):
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
    assert same(got, mmq_oracle(qt, raw, buf, n_rows))


# --------------------------------------------------------------------------- attention (section 5)


def int8_block(vals):
    """amax, d_inv = 127/amax, roundf, d = 1/d_inv; a non-finite d_inv: scale 0, codes 0."""
    amax = ZERO
    for v in vals:
        amax = max(amax, abs(F32(v)))
    with np.errstate(divide="ignore", over="ignore"):
        d_inv = F32(127.0) / amax
    if not np.isfinite(d_inv):
        return [0] * len(vals), ZERO
    return [int(roundf(F32(v) * d_inv)) for v in vals], ONE / d_inv


def int8_row(vals, block):
    codes, scales = [], []
    for i in range(0, len(vals), block):
        c, d = int8_block(vals[i:i + block])
        codes += c
        scales.append(d)
    return codes, scales


def tree(v):
    while len(v) > 1:
        h = len(v) // 2
        v = [v[i] + v[i + h] for i in range(h)]
    return v[0]


def attention_oracle(q, k, v, qpos, n_head_kv):
    """q [T, H, hd] at positions qpos; k, v [n_keys, n_head_kv, hd] at positions 0..n_keys-1."""
    n_tok, n_head, hd = q.shape
    kq = [[int8_row(k[j, g].tolist(), 32) for g in range(n_head_kv)] for j in range(k.shape[0])]
    vq = [[int8_row(v[j, g].tolist(), hd) for g in range(n_head_kv)] for j in range(v.shape[0])]
    kq_scale = F32(1.0 / math.sqrt(hd))  # float64, rounded once
    out = np.zeros(q.shape, F32)
    for t in range(n_tok):
        P = int(qpos[t])
        for h in range(n_head):
            g = h // (n_head // n_head_kv)
            qc, qd = int8_row(q[t, h].tolist(), 32)
            s = {}
            for j in range(P + 1):
                kc, kd = kq[j][g]
                acc = ZERO
                for b in range(hd // 32):
                    sumi = sum(qc[i] * kc[i] for i in range(32 * b, 32 * b + 32))
                    acc = acc + (qd[b] * kd[b]) * F32(sumi)
                s[j] = acc * kq_scale
            M, L, O = F32(-np.inf), ZERO, [ZERO] * hd
            for c in range(P // 64 + 1):
                keys = range(64 * c, 64 * c + 64)
                m_new = max(M, max(s[j] for j in keys if j <= P))
                alpha = exp(M - m_new)
                p = [exp(s[j] - m_new) if j <= P else ZERO for j in keys]
                lsum = tree(p)
                w = [p[i] * vq[j][g][1][0] if j <= P else ZERO for i, j in enumerate(keys)]
                wq, wd = int8_block(w)
                L = L * alpha + lsum
                for i in range(hd):
                    pv = sum(wq[jj] * vq[j][g][0][i] for jj, j in enumerate(keys) if j <= P)
                    O[i] = O[i] * alpha + wd * F32(pv)
                M = m_new
            out[t, h] = [O[i] / L for i in range(hd)]
    return out


@settings(max_examples=16, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n_tok=st.integers(1, 3), n_keys_extra=st.integers(0, 90),
       hd=st.sampled_from([32, 64, 96, 128]), gqa=st.sampled_from([(2, 1), (2, 2)]))
def test_attention(seed, n_tok, n_keys_extra, hd, gqa):
    # head_dim 96 and 128: a kq_scale that is not a power of two, over 3-4 score blocks, so
    # where the scale is applied, and how it is rounded (96), changes bits
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
    assert same(got, attention_oracle(q, k, v, qpos, n_head_kv))


# --------------------------------------------------------------------------- router (section 4)


def router_oracle(logits, k):
    ids, weights = [], []
    for row in logits:
        n = len(row)
        m = max(F32(x) for x in row)
        e = [exp(F32(x) - m) for x in row]
        lanes = [ZERO] * 32  # lane_sum: 32 strided partials, then the halving tree
        for i in range(n):
            lanes[i % 32] = lanes[i % 32] + e[i]
        p = [e[i] / tree(lanes) for i in range(n)]
        picked = []
        for _ in range(k):  # the largest remaining p; on a tie the lower id (strict >)
            best = -1
            for i in range(n):
                if i not in picked and (best < 0 or p[i] > p[best]):
                    best = i
            picked.append(best)
        s = ZERO
        for i in picked:
            s = s + p[i]
        floor = max(s, F32(6.1035e-5))
        ids.append(picked)
        weights.append([p[i] / floor for i in picked])
    return np.array(ids, np.int32), np.array(weights, F32)


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), n_tok=st.integers(1, 3), n_expert=st.integers(2, 40),
       k=st.integers(1, 8), levels=st.integers(2, 64))
def test_router(seed, n_tok, n_expert, k, levels):
    rng = np.random.default_rng(seed)
    k = min(k, n_expert)
    # logits from a few levels, so equal probabilities (ties) are common
    logits = (rng.integers(0, levels, (n_tok, n_expert)) * F32(0.375) - F32(4)).astype(F32)
    ids, w = routing.top_k(logits, k)
    want_ids, want_w = router_oracle(logits, k)
    assert same(ids, want_ids) and same(w, want_w)


# --------------------------------------------------------------------------- SwiGLU, gate (section 6)


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 3), d=st.integers(1, 40))
def test_swiglu(seed, n, d):
    rng = np.random.default_rng(seed)
    g, u = rand(rng, (n, d), 4), rand(rng, (n, d), 4)
    want = np.array([[(g[r, i] / (ONE + exp(-g[r, i]))) * u[r, i] for i in range(d)]
                     for r in range(n)], F32)
    assert same(moe.swiglu(g, u), want)


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 40))
def test_shared_expert_gate(seed, n):
    x = rand(np.random.default_rng(seed), n, 6)
    want = np.array([ONE / (ONE + exp(-x[i])) for i in range(n)], F32)
    assert same(numerics.sigmoid(x), want)


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
    want = np.zeros((n_tok, d), F32)
    for t in range(n_tok):
        for j in range(d):
            acc = ZERO
            for r in range(k):  # rank order
                acc = acc + w[t, r] * y[slot[t * k + r], j]
            if shared is not None:
                acc = acc + shared[0][t] * shared[1][t, j]
            want[t, j] = x[t, j] + acc
    assert same(moe.combine(x, w, slot, y, shared), want)
