"""The contract element by element: docs/numerics.md's rules as plain scalar loops.

Read this file to see what a product, a quantization or the attention computes, value by
value. Each function states one section of docs/numerics.md and names the vectorized NumPy
function that it defines (the one the reference runs and the CUDA kernels name); the loops go
over elements and blocks in the contract's order, and every float is an ``np.float32`` scalar,
so each ``+``, ``*`` and ``/`` rounds to float32 once, as written. Where the order of float
operations matters, each line holds one of them.

These loops are slow, and nothing but the tests and the docs uses them: tests/test_oracles.py
compares every vectorized definition with its loop here, byte for byte, on tiny random cases,
so a changed order, scale or formula in contract/ shows there.

A loop never calls the function it defines. What it does call from contract/, and why:

- ``strata_prefill.contract.numerics.exp``, ``exp2c``, ``fma``, ``roundf`` and ``rint`` (through
  :func:`exp`, :func:`exp2c`, :func:`fma`, :func:`roundf` and :func:`rint`): the contract
  defines them as *the* shared primitives (section 1) that the rules use; they have their own
  tests in tests/test_numerics.py (fma against an exact rational oracle).
- ``strata_prefill.contract.quants.decode`` for a weight's integer form (codes, sub-scales, dw, mw): the weight
  formats are pinned against ``gguf.quants.dequantize`` in tests/test_quants.py; the product's
  epilogue is what is stated here.
- ``strata_prefill.contract.qformats.lookup(qt).epilogue`` for which of section 3's four epilogues a weight
  type takes (PLAIN, MIN, DMIN, HALVES); each is written out below.
- ``strata_prefill.contract.q8_1.unpack_rows``, ``strata_prefill.contract.q8_1.padded_len`` and ``strata_prefill.contract.q8_1.Layout``: where a
  row's 144-byte blocks sit in a buffer, how long a padded row is, and the layouts' names.
"""
from __future__ import annotations

import math

import numpy as np

from strata_prefill.contract import numerics, q8_1, qformats, quants
from strata_prefill.contract.qformats import Epilogue

F32 = np.float32
ZERO = F32(0.0)
ONE = F32(1.0)


# --------------------------------------------------------------------------- primitives (section 1)


def exp(x) -> np.float32:
    """Section 1, exp: the shared primitive on one float32."""
    return numerics.exp(F32(x))[()]


def roundf(x) -> np.float32:
    """Section 1, roundf (C roundf, half away from zero): the shared primitive on one float32."""
    return numerics.roundf(F32(x))[()]


def exp2c(x) -> np.float32:
    """Section 1, exp2c (attention's base-2 exponential): the shared primitive on one float32."""
    return numerics.exp2c(F32(x))[()]


def fma(a, b, c) -> np.float32:
    """Section 1, fma (one fused multiply-add, one rounding): the shared primitive on float32s."""
    return numerics.fma(F32(a), F32(b), F32(c))[()]


def rint(x) -> np.float32:
    """Section 1, rint (half to even): the shared primitive on one float32."""
    return numerics.rint(F32(x))[()]


def tree_sum(v: list) -> np.float32:
    """Section 1, Reductions, tree_sum (``strata_prefill.contract.numerics.tree_sum``): ``v = v[:h] + v[h:]``
    over a power-of-two length until one value."""
    while len(v) > 1:
        h = len(v) // 2
        v = [v[i] + v[i + h] for i in range(h)]
    return v[0]


def lane_sum(v: list) -> np.float32:
    """Section 1, Reductions, lane_sum (``strata_prefill.contract.numerics.lane_sum``): 32 strided partials from
    0.0f, then the halving tree over them."""
    lanes = [ZERO] * 32
    for i in range(len(v)):
        lanes[i % 32] = lanes[i % 32] + v[i]
    return tree_sum(lanes)


def softmax(row: list) -> list:
    """Section 1, softmax (``strata_prefill.contract.numerics.softmax``) over one row."""
    m = max(F32(x) for x in row)
    e = [exp(F32(x) - m) for x in row]
    s = lane_sum(e)
    return [e_i / s for e_i in e]


def sigmoid(x: np.ndarray) -> np.ndarray:
    """Section 1 (the shared expert's gate, section 6): ``1.0f / (1.0f + exp(-x))`` for each
    element (``strata_prefill.contract.numerics.sigmoid``)."""
    out = np.zeros(x.shape, F32)
    for i in np.ndindex(x.shape):
        e = exp(-x[i])
        d = ONE + e
        out[i] = ONE / d
    return out


def silu(x) -> np.float32:
    """Section 1, silu, on one float32: ``x / (1.0f + exp(-x))`` (``strata_prefill.contract.numerics.silu``)."""
    e = exp(-F32(x))
    d = ONE + e
    return F32(x) / d


# --------------------------------------------------------------------------- int8 blocks, q8_1 (section 2)


def int8_block(vals: list, qmax: int = 127, half_to_even: bool = False) -> tuple[list[int], np.float32]:
    """Section 2, one scale group by the INVERSE rule (q8_1 groups; the KV cache's V, and with
    another bound Q and K, section 5): ``strata_prefill.contract.blockquant.quantize_blocks``
    on one block. Returns (codes, d). ``qmax``: the code bound in place of 127 (Q 255, K
    511); ``half_to_even``: codes by rint, not roundf (the folded P of section 5). A group
    whose qmax/amax is not finite (all zeros, amax too small, a NaN) has d = 0 and codes 0; a
    product ``x_i * d_inv`` that is not finite (an infinite input) gives code 0."""
    amax = ZERO
    for v in vals:
        amax = np.maximum(amax, np.abs(F32(v)))  # np.maximum keeps a NaN, as the block's max does
    rnd = rint if half_to_even else roundf
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        d_inv = F32(qmax) / amax
        if not np.isfinite(d_inv):
            return [0] * len(vals), ZERO
        codes = []
        for v in vals:
            p = F32(v) * d_inv
            codes.append(int(rnd(p)) if np.isfinite(p) else 0)
        d = ONE / d_inv
    return codes, d


def q8_1_sum(vals: list) -> np.float32:
    """Section 2, block sums: runs of 4 left to right, then the halving tree over them."""
    s4 = []
    for i in range(0, len(vals), 4):
        s = F32(vals[i]) + F32(vals[i + 1])
        s = s + F32(vals[i + 2])
        s = s + F32(vals[i + 3])
        s4.append(s)
    return tree_sum(s4)


def _halves(vals) -> bytes:
    """binary16 little-endian, float32 -> half to nearest even, overflow to infinity."""
    with np.errstate(over="ignore"):
        return np.array(vals, F32).astype("<f2").tobytes()


def q8_1_block(vals: list, layout) -> bytes:
    """Section 2, The buffer: the 144 bytes of one 128-value block_q8_1_mmq (its 16-byte
    header by layout, then 128 int8 codes)."""
    assert len(vals) == 128
    if layout == q8_1.Layout.D2S6:
        c0, d0 = int8_block(vals[:64])  # one scale per 64 values
        c1, d1 = int8_block(vals[64:])
        sums = [q8_1_sum(vals[16 * j:16 * j + 16]) for j in range(6)]  # values 0..95
        header = _halves([d0, d1, *sums])
        codes = c0 + c1
    else:
        codes, ds, ss = [], [], []
        for j in range(4):
            c, d = int8_block(vals[32 * j:32 * j + 32])
            codes += c
            ds.append(d)
            ss.append(q8_1_sum(vals[32 * j:32 * j + 32]))
        if layout == q8_1.Layout.D4:
            header = np.array(ds, "<f4").tobytes()
        else:  # DS4: (d_j, s_j) half pairs
            header = _halves([v for pair in zip(ds, ss) for v in pair])
    return header + np.array(codes, np.int8).tobytes()


def q8_1_rows(x: np.ndarray, layout) -> np.ndarray:
    """Section 2: float32 rows [R, K] -> their blocks uint8 [R, Kp/128, 144], each row padded
    with zeros to Kp (``strata_prefill.contract.q8_1.quantize_rows``)."""
    R, K = x.shape
    Kp = q8_1.padded_len(K)
    out = np.zeros((R, Kp // 128, 144), np.uint8)
    for r in range(R):
        row = [F32(v) for v in x[r]] + [ZERO] * (Kp - K)
        for kb in range(Kp // 128):
            out[r, kb] = np.frombuffer(q8_1_block(row[128 * kb:128 * kb + 128], layout), np.uint8)
    return out


def q8_1_read(block: bytes, layout, j: int) -> tuple[list[int], np.float32, np.float32 | None]:
    """Section 2, Decoded for the products: 32-value group j (0..3) of one 144-byte block as
    (codes a, da, sa) (``strata_prefill.contract.q8_1.decode_rows``); sa is DS4's sum, else None."""
    codes = np.frombuffer(block, np.int8, 32, 16 + 32 * j).tolist()
    if layout == q8_1.Layout.D4:
        return codes, np.frombuffer(block, "<f4", 1, 4 * j)[0], None
    h = np.frombuffer(block, "<f2", 8, 0).astype(F32)
    if layout == q8_1.Layout.DS4:
        return codes, h[2 * j], h[2 * j + 1]
    return codes, h[j // 2], None  # D2S6: d0 for values 0..63, d1 for 64..127


# --------------------------------------------------------------------------- products (section 3)


def mmq(qt, raw: np.ndarray, buf: np.ndarray, n_rows: int) -> np.ndarray:
    """Section 3, Products (MMQ): raw weight rows [N, row_bytes] of type qt times the n_rows
    rows of the flat q8_1 buffer buf (the layout qt selects): [n_rows, N] float32
    (``strata_prefill.contract.mmq.mmq_prepared``, through ``strata_prefill.contract.mmq.mmq``)."""
    layout = q8_1.layout_for(qt)
    epilogue = qformats.lookup(qt).epilogue  # which of the four written epilogues
    dec = quants.decode(qt, raw)  # codes [N, nb, 32], sub [N, nb, 2], dw, mw, msub
    n_out, nb = dec.codes.shape[:2]
    blocks = q8_1.unpack_rows(buf, n_rows)  # [R, Kp/128, 144]
    out = np.zeros((n_rows, n_out), F32)
    for r in range(n_rows):
        for n in range(n_out):
            acc = ZERO
            for b in range(nb):  # the weight's blocks, ascending; the row's padding is never read
                a, da, sa = q8_1_read(blocks[r, b // 4].tobytes(), layout, b % 4)
                c = dec.codes[n, b].tolist()
                if epilogue is Epilogue.HALVES:  # a float scale per half: S0, S1 scaled apart
                    s0 = sum(c[i] * a[i] for i in range(16))  # exact integers
                    s1 = sum(c[i] * a[i] for i in range(16, 32))
                    dw0, dw1 = dec.dw[n, b]
                    t = dw0 * da
                    t = t * F32(s0)
                    m = dw1 * da
                    m = m * F32(s1)
                    t = t + m
                    acc = acc + t
                    continue
                u0, u1 = (int(v) for v in dec.sub[n, b])
                # exact integers: Python ints, no rounding
                sumi = u0 * sum(c[i] * a[i] for i in range(16)) + u1 * sum(c[i] * a[i] for i in range(16, 32))
                dw = dec.dw[n, b]
                t = dw * da
                t = t * F32(sumi)
                if epilogue is Epilogue.MIN:
                    m = dec.mw[n, b] * sa
                    t = t + m
                elif epilogue is Epilogue.DMIN:
                    v0, v1 = (int(v) for v in dec.msub[n, b])
                    mi = v0 * sum(a[:16]) + v1 * sum(a[16:])
                    m = dec.mw[n, b] * da
                    m = m * F32(mi)
                    t = t - m
                acc = acc + t
            out[r, n] = acc
    return out


# --------------------------------------------------------------------------- routing (section 4)


def top_k(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Section 4, Routing: softmax over all experts, the top k by probability (ties to the
    lower id), renormalized: (ids int32 [T, k], weights float32 [T, k])
    (``strata_prefill.contract.routing.top_k``)."""
    ids, weights = [], []
    for row in logits:
        p = softmax(row)
        picked = []
        for _ in range(k):  # the largest remaining p; on a tie the lower id (strict >)
            best = -1
            for i in range(len(p)):
                if i not in picked and (best < 0 or p[i] > p[best]):
                    best = i
            picked.append(best)
        s = ZERO
        for i in picked:  # rank order
            s = s + p[i]
        floor = max(s, F32(6.1035e-5))
        ids.append(picked)
        weights.append([p[i] / floor for i in picked])
    return np.array(ids, np.int32), np.array(weights, F32)


def top_k_selected(logits: np.ndarray, k: int, bias=None) -> tuple[np.ndarray, np.ndarray]:
    """Section 4, Routing, ``softmax_selected``: each logit plus its expert's bias (where there
    is one), the k largest biased logits (ties to the lower id; a NaN after every number), and
    the weights a softmax over those k in rank order (``strata_prefill.contract.routing.top_k`` with
    ``gating="softmax_selected"``)."""
    ids, weights = [], []
    for row in logits:
        v = [F32(x) if bias is None else F32(x) + F32(bias[i]) for i, x in enumerate(row)]
        picked = []
        for _ in range(k):  # the largest remaining v; on a tie the lower id (strict >); NaN last
            best = -1
            for i in range(len(v)):
                if i in picked:
                    continue
                if best < 0 or (math.isnan(v[best]) and not math.isnan(v[i])) or v[i] > v[best]:
                    best = i
            picked.append(best)
        ids.append(picked)
        sel = [v[i] for i in picked]
        m = F32(np.nan) if any(math.isnan(x) for x in sel) else max(sel)  # np.max: NaN wins
        e = [exp(x - m) for x in sel]
        s = lane_sum(e)
        weights.append([e_i / s for e_i in e])
    return np.array(ids, np.int32), np.array(weights, F32)


# --------------------------------------------------------------------------- attention (section 5)


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, qpos, n_head_kv: int, sinks=None,
              window=None) -> np.ndarray:
    """Section 5, Attention (contract v2): queries q [T, H, hd] at positions qpos over keys and
    values k, v [n_keys, n_head_kv, hd] at positions 0..n_keys-1, through the KV cache:
    [T, H, hd] float32 (``strata_prefill.contract.attention.KVCache.write``, then
    ``strata_prefill.contract.attention.attend``). sinks: float32 [H] or None; window: the
    keys a query sees, or None (section 5, "Sinks", "Sliding window")."""
    n_tok, n_head, hd = q.shape
    # the KV cache: K per head row at 511 (10-bit codes), V per head row at 127 (int8)
    kq = [[int8_block(k[j, g].tolist(), 511) for g in range(n_head_kv)] for j in range(k.shape[0])]
    vq = [[int8_block(v[j, g].tolist()) for g in range(n_head_kv)] for j in range(v.shape[0])]
    kq2 = F32(1.0 / (math.log(2.0) * math.sqrt(hd)))  # log2(e) / sqrt(hd) in float64, rounded once
    log2e = F32(1.0 / math.log(2.0))
    out = np.zeros(q.shape, F32)
    for t in range(n_tok):
        P = int(qpos[t])
        lo = 0 if window is None else max(0, P - int(window) + 1)  # the first key the query sees
        for h in range(n_head):
            g = h // (n_head // n_head_kv)
            qc, dq = int8_block(q[t, h].tolist(), 255)  # Q per head row at 255 (9-bit codes)
            dqs = dq * kq2
            # scores of the keys at positions lo..P, in base 2
            s = {}
            for j in range(lo, P + 1):
                kc, dk = kq[j][g]
                sumf = F32(sum(qc[i] * kc[i] for i in range(hd)))  # the exact integer, rounded once
                s[j] = (sumf * dk) * dqs
            # online softmax over key blocks of 64, ascending, from the block holding key lo; a
            # sink is a key merged before them whose value is zero: M = sink2, L = exp2c(0) = 1
            if sinks is None:
                M, L, O = F32(-np.inf), ZERO, [ZERO] * hd
            else:
                M, L, O = F32(sinks[h]) * log2e, ONE, [ZERO] * hd
            for c in range(lo // 64, P // 64 + 1):
                keys = range(64 * c, 64 * c + 64)
                m_new = max(M, max(s[j] for j in keys if lo <= j <= P))
                alpha = exp2c(M - m_new)  # exp2c(-inf) = 2^-125 on the first block, times 0
                p = [exp2c(s[j] - m_new) if lo <= j <= P else ZERO for j in keys]
                lsum = tree_sum(p)
                w = [p[i] * vq[j][g][1] if lo <= j <= P else ZERO for i, j in enumerate(keys)]
                wq, dw = int8_block(w, half_to_even=True)
                L = L * alpha
                L = L + lsum
                for i in range(hd):
                    pv = sum(wq[jj] * vq[j][g][0][i] for jj, j in enumerate(keys) if lo <= j <= P)  # exact
                    o = O[i] * alpha
                    O[i] = fma(dw, F32(pv), o)
                M = m_new
            out[t, h] = [O[i] / L for i in range(hd)]
    return out


# --------------------------------------------------------------------------- the MoE half (section 6)


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """Section 6: ``H = silu(g) * u`` for each element (``strata_prefill.contract.moe.swiglu``)."""
    out = np.zeros(gate.shape, F32)
    for i in np.ndindex(gate.shape):
        out[i] = silu(gate[i]) * up[i]
    return out


def swiglu_oai(gate: np.ndarray, up: np.ndarray, alpha: float = 1.702, limit: float = 7.0) -> np.ndarray:
    """Section 6, swiglu_oai, for each element (``strata_prefill.contract.moe.swiglu_oai``): the clamps (a NaN
    passes them), ``t = alpha * g``, ``s = g / (1.0f + exp(-t))``, ``H = s * (u + 1.0f)``."""
    a, lim = F32(alpha), F32(limit)
    out = np.zeros(gate.shape, F32)
    for i in np.ndindex(gate.shape):
        g, u = F32(gate[i]), F32(up[i])
        if g > lim:
            g = lim
        if u > lim:
            u = lim
        elif u < -lim:
            u = -lim
        t = a * g
        d = ONE + exp(-t)
        s = g / d
        out[i] = s * (u + ONE)
    return out


# --------------------------------------------------------------------------- combine (section 7)


def combine(x: np.ndarray, w: np.ndarray, slot: np.ndarray, y: np.ndarray, shared=None,
            down_bias=None) -> np.ndarray:
    """Section 7, Combine: per token and value, the routed outputs in rank order (each plus its
    expert's down bias first, where down_bias = (bias [E, D], ids [T, K])), then the shared
    expert (shared = (g [T], Ysh [T, D]) or None), then the residual (``strata_prefill.contract.moe.combine``)."""
    n_tok, k = w.shape
    out = np.zeros(x.shape, F32)
    for t in range(n_tok):
        for j in range(x.shape[1]):
            acc = ZERO
            for r in range(k):  # rank order
                yv = y[slot[t * k + r], j]
                if down_bias is not None:
                    yv = yv + down_bias[0][down_bias[1][t, r], j]
                m = w[t, r] * yv
                acc = acc + m
            if shared is not None:
                m = shared[0][t] * shared[1][t, j]
                acc = acc + m
            out[t, j] = x[t, j] + acc
    return out
