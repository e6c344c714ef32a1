"""Routing: top-K selection and the tables against their sequential definitions."""
import numpy as np
from hypothesis import given, settings, strategies as st

from strata_prefill.contract import numerics
from strata_prefill.contract.routing import RENORM_FLOOR, routing_tables, top_k


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


def random_tables(n_expert: int, n_tok: int, rng):
    """Routing tables of n_tok tokens each picking the same random number of distinct experts,
    and the routed experts in ascending id."""
    k = int(rng.integers(1, n_expert + 1))
    ids = np.stack([rng.choice(n_expert, k, replace=False) for _ in range(n_tok)]).astype(np.int32)
    tab = routing_tables(ids, n_expert)
    return tab, np.nonzero(tab.cnt)[0]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 64), st.integers(1, 40), st.integers(1, 16), st.integers(0, 2**31 - 1))
def test_plan_groups_cuts_the_routed_experts_in_id_order(n_expert, n_tok, group, seed):
    """Every routed expert once, in ascending id, `group` a group, each with its own rows."""
    from strata_prefill.fast.walk import plan_groups

    tab, order = random_tables(n_expert, n_tok, np.random.default_rng(seed))
    groups = plan_groups(order, tab.cnt, tab.off, group)
    assert [e for g in groups for e in g.experts] == order.tolist()
    assert all(len(g.experts) == group for g in groups[:-1]) and 1 <= len(groups[-1].experts) <= group
    for g in groups:
        assert g.bounds.dtype == np.int32 and g.bounds.shape == (len(g.experts), 2)
        for e, (b, end) in zip(g.experts, g.bounds):
            assert (b, end) == (tab.off[e], tab.off[e] + tab.cnt[e])
        assert (g.row_begin, g.row_end) == (g.bounds[0, 0], g.bounds[-1, 1])
