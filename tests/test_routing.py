"""Routing: top-K selection and the tables against their sequential definitions."""
import numpy as np
from hypothesis import given, settings, strategies as st

from strata import numerics
from strata.routing import RENORM_FLOOR, routing_tables, top_k


def tables_by_definition(ids, n_expert):
    """The literal loop of docs/numerics.md section 4."""
    n_tok, k = ids.shape
    cnt = np.zeros(n_expert, np.int64)
    for e in ids.reshape(-1):
        cnt[e] += 1
    off = np.zeros(n_expert, np.int64)
    for e in range(1, n_expert):
        off[e] = off[e - 1] + cnt[e - 1]
    run = off.copy()
    slot = np.zeros(n_tok * k, np.int64)
    src = np.full(n_tok * k, -1, np.int64)
    for i in range(n_tok * k):
        e = ids[i // k, i % k]
        slot[i] = run[e]
        run[e] += 1
        src[slot[i]] = i // k
    order = [e for e in range(n_expert) if cnt[e] > 0]
    return cnt, off, slot, src, order


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n_tok=st.integers(1, 300),
       n_expert=st.integers(1, 512), k=st.integers(1, 10))
def test_tables_match_sequential_definition(seed, n_tok, n_expert, k):
    rng = np.random.default_rng(seed)
    k = min(k, n_expert)
    # distinct experts per token, as top-K gives; a skewed pick so some experts are hot
    ids = np.stack([rng.choice(n_expert, size=k, replace=False,
                               p=rng.dirichlet(np.full(n_expert, 0.3)) if n_expert > 1 else None)
                    for _ in range(n_tok)])
    tab = routing_tables(ids, n_expert)
    cnt, off, slot, src, order = tables_by_definition(ids, n_expert)
    np.testing.assert_array_equal(tab.cnt, cnt)
    np.testing.assert_array_equal(tab.off, off)
    np.testing.assert_array_equal(tab.slot, slot)
    np.testing.assert_array_equal(tab.src, src)
    np.testing.assert_array_equal(tab.order, order)
    assert sorted(tab.slot.tolist()) == list(range(n_tok * k))  # a permutation of rows


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n_tok=st.integers(1, 50), n_expert=st.integers(2, 128),
       k=st.integers(1, 10))
def test_top_k_by_definition(seed, n_tok, n_expert, k):
    rng = np.random.default_rng(seed)
    k = min(k, n_expert)
    logits = (rng.standard_normal((n_tok, n_expert)) * 3).astype(np.float32)
    # plant exact ties: a copied logit gives an equal probability
    logits[:, -1] = logits[:, 0]
    ids, w = top_k(logits, k)
    p = numerics.softmax(logits)
    for t in range(n_tok):
        want = sorted(range(n_expert), key=lambda e: (-float(p[t, e]), e))[:k]
        assert ids[t].tolist() == want
        total = np.float32(0)
        for e in want:
            total = np.float32(total + p[t, e])
        expect = (p[t, want] / max(total, RENORM_FLOOR)).astype(np.float32)
        assert w[t].view(np.uint32).tolist() == expect.view(np.uint32).tolist()
