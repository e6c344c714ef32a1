"""The gpt-oss MoE pieces of the numerics contract (docs/numerics.md sections 4, 6 and 7):
the router's bias and its softmax over the selected logits (strata_prefill.contract.routing.top_k with
gating="softmax_selected"), the clamped SwiGLU (strata_prefill.contract.moe.swiglu_oai), the expert biases
(strata_prefill.contract.moe.add_expert_bias, strata_prefill.contract.moe.combine's down_bias, strata_prefill.contract.routing.row_experts).

Each vectorized definition against its scalar loop in reference/scalar.py (bytes), against
float64 (bounded, the bound derived from the operations' roundings), and the default forms of
the functions that grew a variant against their scalar loops too (their bytes did not move).
Inputs are random and never zero; the SwiGLU's include values a few ulp around the clamp
limits, far beyond them, and gates so negative that exp(-t) overflows.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strata_prefill.reference import scalar
from strata_prefill.contract import moe, numerics, routing

F32 = np.float32
SETTINGS = settings(max_examples=40, deadline=None)
EPS = 2.0 ** -24  # a float32 rounding's relative error


def same(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def rand(rng, shape, scale=2.0):
    m = rng.standard_normal(shape) * scale
    return np.where(m == 0, 1.0, m).astype(F32)


def around_limits(rng, shape, limit=7.0) -> np.ndarray:
    """Values that exercise the clamps: a few ulp either side of +-limit, beyond them (up to
    1e4), inside, and gates far below zero (exp(-alpha g) overflows below about -51.7)."""
    lim = F32(limit)
    near = np.array([np.nextafter(lim, F32(0)), lim, np.nextafter(lim, F32(np.inf))], F32)
    near = np.concatenate([near, -near, near + F32(2 ** -20), -near - F32(2 ** -20)])
    kind = rng.integers(0, 4, shape)
    out = np.where(kind == 0, rng.choice(near, shape),
                   np.where(kind == 1, np.sign(rng.standard_normal(shape)) * np.exp(rng.uniform(2.0, 9.2, shape)),
                            np.where(kind == 2, rng.uniform(-60.0, -40.0, shape), rng.standard_normal(shape) * 4)))
    return np.where(out == 0, 1.0, out).astype(F32)


# --------------------------------------------------------------------------- swiglu_oai


@SETTINGS
@given(seed=st.integers(0, 2 ** 32 - 1), n=st.integers(1, 3), d=st.integers(1, 60))
def test_swiglu_oai_is_its_scalar_loop(seed, n, d):
    rng = np.random.default_rng(seed)
    g, u = around_limits(rng, (n, d)), around_limits(rng, (n, d))
    assert same(moe.swiglu_oai(g, u), scalar.swiglu_oai(g, u))


def _swiglu_oai64(g, u, alpha=1.702, limit=7.0):
    a = float(F32(alpha))
    g64 = np.minimum(g.astype(np.float64), limit)
    u64 = np.clip(u.astype(np.float64), -limit, limit)
    t = a * g64
    with np.errstate(over="ignore"):
        return g64 / (1.0 + np.exp(-t)) * (u64 + 1.0), t


@SETTINGS
@given(seed=st.integers(0, 2 ** 32 - 1), d=st.integers(1, 300))
def test_swiglu_oai_against_float64(seed, d):
    """Relative error at most (|t| + 8) float32 roundings (t = alpha * g: its rounding moves
    exp's argument by |t| eps; exp's own 1.22 ulp, the sum, the quotient, u + 1, the product),
    and where exp(-t) overflows (the contract: +inf, so -0.0) the float64 value is below 1e-35."""
    rng = np.random.default_rng(seed)
    g, u = around_limits(rng, (2, d)), around_limits(rng, (2, d))
    got = moe.swiglu_oai(g, u).astype(np.float64)
    want, t = _swiglu_oai64(g, u)
    err = np.abs(got - want)
    bound = (np.abs(t) + 8.0) * EPS * np.abs(want) + 1e-35
    assert np.all(err <= bound), (err / np.maximum(np.abs(want), 1e-300)).max()
    assert np.all(np.isfinite(got))


def test_swiglu_oai_clamps():
    """The clamp values themselves: a gate above the limit counts as the limit, an up above
    or below as +-limit (u + 1 in [-6, 8]); a NaN passes both clamps."""
    g = np.array([7.0, 8.0, 1e30, np.inf, 2.0, 2.0, 2.0, np.nan, 1.0], F32)
    u = np.array([1.0, 1.0, 1.0, 1.0, 9.0, -9.0, -np.inf, 1.0, np.nan], F32)
    h = moe.swiglu_oai(g, u)
    assert same(h[1:4], np.repeat(h[0], 3))  # every gate past 7 is 7
    assert same(h[4:5], moe.swiglu_oai(np.array([2.0], F32), np.array([7.0], F32)))
    assert same(h[5:7], np.repeat(moe.swiglu_oai(np.array([2.0], F32), np.array([-7.0], F32)), 2))
    assert np.isnan(h[7]) and np.isnan(h[8])
    # far below zero: exp(-t) is +inf in the contract and the product is -0.0 (not NaN)
    z = moe.swiglu_oai(np.array([-60.0], F32), np.array([3.0], F32))
    assert z.tobytes() == np.array([-0.0], F32).tobytes()


def test_swiglu_oai_parameters_are_data():
    """alpha and limit are parameters (the architecture's data), rounded to float32 once."""
    rng = np.random.default_rng(5)
    g, u = around_limits(rng, (3, 40)), around_limits(rng, (3, 40))
    assert same(moe.glu(g, u, moe.SwigluOai()), moe.swiglu_oai(g, u))
    assert same(moe.glu(g, u, moe.SwigluOai(1.5, 3.0)), scalar.swiglu_oai(g, u, 1.5, 3.0))
    assert not same(moe.swiglu_oai(g, u, 1.5, 3.0), moe.swiglu_oai(g, u))
    assert same(moe.glu(g, u), moe.swiglu(g, u))
    with pytest.raises(TypeError):
        moe.glu(g, u, "oai")


# --------------------------------------------------------------------------- the router


def _ranked_logits(rng, shape, levels):
    """Logits from a few levels (ties between experts are common), never zero."""
    v = (rng.integers(1, levels + 1, shape) * F32(0.375) - F32(0.1875) * levels).astype(F32)
    return np.where(v == 0, F32(0.125), v)


@SETTINGS
@given(seed=st.integers(0, 2 ** 32 - 1), n_tok=st.integers(1, 3), n_expert=st.integers(2, 40),
       k=st.integers(1, 8), levels=st.integers(2, 64), with_bias=st.booleans())
def test_selected_router_is_its_scalar_loop(seed, n_tok, n_expert, k, levels, with_bias):
    rng = np.random.default_rng(seed)
    k = min(k, n_expert)
    logits = _ranked_logits(rng, (n_tok, n_expert), levels)
    bias = _ranked_logits(rng, n_expert, 4) if with_bias else None
    ids, w = routing.top_k(logits, k, bias=bias, gating=routing.SOFTMAX_SELECTED)
    want_ids, want_w = scalar.top_k_selected(logits, k, bias)
    assert same(ids, want_ids) and same(w, want_w)


@SETTINGS
@given(seed=st.integers(0, 2 ** 32 - 1), n_tok=st.integers(1, 4), n_expert=st.integers(4, 128),
       k=st.integers(1, 32), spread=st.floats(0.5, 40.0))
def test_selected_router_against_float64(seed, n_tok, n_expert, k, spread):
    """The ids: the k largest float32 biased logits (logits + bias, one float32 addition),
    ties to the lower id (Python's sort of (-v, id)). The weights: a float64 softmax over those
    k, within (2 max|v - m| + 16) float32 roundings relative (the subtraction's rounding moves
    exp's argument by |v - m| eps; exp's 1.22 ulp twice over, the tree sum, the quotient)."""
    rng = np.random.default_rng(seed)
    k = min(k, n_expert)
    logits, bias = rand(rng, (n_tok, n_expert), spread), rand(rng, n_expert, 1.0)
    ids, w = routing.top_k(logits, k, bias=bias, gating=routing.SOFTMAX_SELECTED)
    v = logits + bias  # float32: the definition's biased logits
    for t in range(n_tok):
        order = sorted(range(n_expert), key=lambda i: (-float(v[t, i]), i))[:k]
        assert ids[t].tolist() == order
        sel = v[t, order].astype(np.float64)
        e = np.exp(sel - sel.max())
        want = e / e.sum()
        bound = (2 * (sel.max() - sel.min()) + 16.0) * EPS * want + 1e-37
        assert np.all(np.abs(w[t].astype(np.float64) - want) <= bound)


def test_selected_router_edges():
    """+0.0 and -0.0 tie (the lower id first); a NaN logit ranks after every number; a NaN among
    the selected makes the row's weights NaN; -inf logits are picked last and weigh 0."""
    v = np.array([[-0.0, 0.0, np.nan, -np.inf, 1.0, -np.inf]], F32)
    ids, w = routing.top_k(v, 3, gating=routing.SOFTMAX_SELECTED)
    assert ids.tolist() == [[4, 0, 1]]
    ids, w = routing.top_k(v, 5, gating=routing.SOFTMAX_SELECTED)
    assert ids.tolist() == [[4, 0, 1, 3, 5]] and w[0, 3] == 0 and w[0, 4] == 0
    ids, w = routing.top_k(v, 6, gating=routing.SOFTMAX_SELECTED)
    assert ids.tolist() == [[4, 0, 1, 3, 5, 2]] and np.isnan(w).all()
    assert same(scalar.top_k_selected(v, 6)[0], ids)


def test_router_bias_and_default_scoring():
    """The bias is one float32 addition per logit, the same for either scoring; the default
    scoring (softmax over every expert) is unchanged: still its scalar loop, bias or not."""
    rng = np.random.default_rng(3)
    logits, bias = rand(rng, (5, 32)), rand(rng, 32)
    assert same(routing.add_router_bias(logits, bias), logits + bias)
    assert all(same(a, b) for a, b in zip(routing.top_k(logits, 4), scalar.top_k(logits, 4)))
    assert all(same(a, b) for a, b in zip(routing.top_k(logits, 4, bias=bias), scalar.top_k(logits + bias, 4)))
    with pytest.raises(ValueError):
        routing.top_k(logits, 4, gating="sigmoid")
    with pytest.raises(ValueError):
        routing.add_router_bias(logits, bias[:5])


# --------------------------------------------------------------------------- expert biases


@SETTINGS
@given(seed=st.integers(0, 2 ** 32 - 1), n_tok=st.integers(1, 30), n_expert=st.integers(1, 16),
       k=st.integers(1, 4), n=st.integers(1, 40))
def test_row_experts_and_gate_up_bias(seed, n_tok, n_expert, k, n):
    """row_experts names, for each expert-sorted row, the expert whose range of the routing
    tables holds it; add_expert_bias adds that expert's bias row, value by value."""
    rng = np.random.default_rng(seed)
    k = min(k, n_expert)
    ids = np.argsort(rng.random((n_tok, n_expert)), axis=1)[:, :k].astype(np.int32)
    tab = routing.routing_tables(ids, n_expert)
    rexp = routing.row_experts(ids, tab.slot)
    assert same(rexp, np.repeat(np.arange(n_expert, dtype=np.int32), tab.cnt))
    v, bias = rand(rng, (tab.n_rows, n)), rand(rng, (n_expert, n))
    got = moe.add_expert_bias(v, bias, rexp)
    for r in range(tab.n_rows):
        assert same(got[r], np.array([v[r, j] + bias[rexp[r], j] for j in range(n)], F32))


@SETTINGS
@given(seed=st.integers(0, 2 ** 32 - 1), n_tok=st.integers(1, 3), k=st.integers(1, 4), d=st.integers(1, 8),
       with_shared=st.booleans())
def test_combine_down_bias_is_its_scalar_loop(seed, n_tok, k, d, with_shared):
    rng = np.random.default_rng(seed)
    n_expert = k + 3
    x, w = rand(rng, (n_tok, d)), rand(rng, (n_tok, k))
    slot = rng.permutation(n_tok * k).astype(np.int32)
    y = rand(rng, (n_tok * k, d), 6)
    ids = np.argsort(rng.random((n_tok, n_expert)), axis=1)[:, :k].astype(np.int32)
    bd = rand(rng, (n_expert, d), 3)
    shared = (rand(rng, n_tok), rand(rng, (n_tok, d), 6)) if with_shared else None
    got = moe.combine(x, w, slot, y, shared, down_bias=(bd, ids))
    assert same(got, scalar.combine(x, w, slot, y, shared, down_bias=(bd, ids)))
    assert same(moe.combine(x, w, slot, y, shared), scalar.combine(x, w, slot, y, shared))
    # the bias is Y's: the same bytes as the combine of the biased rows
    yb = y.copy()
    yb[slot] = y[slot] + bd[ids.reshape(-1)]
    assert same(got, moe.combine(x, w, slot, yb, shared))


# --------------------------------------------------------------------------- the sim backend


def test_sim_backend_steps_take_the_variants():
    """fast/sim.py's MoE steps compute the NumPy definitions with the gpt-oss variants (the
    router's bias and scoring, row_experts, the clamped SwiGLU with gate/up biases, alone and
    fused with H's quantize, the combine's down bias); their defaults stay the plain forms."""
    from strata_prefill.fast.sim import SimBackend
    from strata_prefill.contract import q8_1

    rng = np.random.default_rng(11)
    T, E, K, n, D = 7, 8, 3, 96, 64
    be = SimBackend()
    logits, rb = rand(rng, (T, E)), rand(rng, E, 1.0)
    ids, w = be.top_k(logits, K, bias=rb, gating=routing.SOFTMAX_SELECTED)
    ids0, w0 = be.top_k(logits, K)
    want_ids, want_w = routing.top_k(logits, K, bias=rb, gating=routing.SOFTMAX_SELECTED)
    tab = routing.routing_tables(want_ids, E)
    rexp = be.row_experts(ids, tab.slot)  # filled in stream order, before the steps that read it
    g, u = around_limits(rng, (T * K, n)), around_limits(rng, (T * K, n))
    bg, bu = rand(rng, (E, n)), rand(rng, (E, n))
    act = moe.SwigluOai()
    h = be.swiglu_rows(g, u, 2, T * K - 1, act=act, expert_bias=(rexp, bg, bu))
    h0 = be.swiglu_rows(g, u, 0, T * K)
    layout = q8_1.Layout.D4
    buf = be.alloc_q8(T * K, n)
    be.swiglu_quantize(gate=g, up=u, r0=0, r1=T * K, layout=layout, out=buf, row0=0, n_rows_total=T * K, act=act,
                       expert_bias=(rexp, bg, bu))
    x, y, bd = rand(rng, (T, D)), rand(rng, (T * K, D)), rand(rng, (E, D))
    out = be.combine(x, w, tab.slot, y, None, down_bias=(bd, ids))
    be.streams.synchronize()

    assert same(ids, want_ids) and same(w, want_w)
    assert all(same(a, b) for a, b in zip((ids0, w0), routing.top_k(logits, K)))
    want_rexp = routing.row_experts(want_ids, tab.slot)
    assert same(rexp, want_rexp)
    r = slice(2, T * K - 1)
    want_h = moe.swiglu_oai(moe.add_expert_bias(g[r], bg, want_rexp[r]), moe.add_expert_bias(u[r], bu, want_rexp[r]))
    assert same(h, want_h)
    assert same(h0, moe.swiglu(g, u))
    hq = moe.swiglu_oai(moe.add_expert_bias(g, bg, want_rexp), moe.add_expert_bias(u, bu, want_rexp))
    assert same(q8_1.unpack_rows(buf.data, T * K), q8_1.quantize_rows(hq, layout))
    assert same(out, moe.combine(x, want_w, tab.slot, y, None, down_bias=(bd, want_ids)))
