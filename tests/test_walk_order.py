"""The order in which the host queues a streamed chunk's work (sim backend): the streamed pass
opens with PASS_HEAD copies and queues the rest of the ring's right after layer 0's attention
(so the device starts attention before the host has queued a ring's worth of copies), and a
layer's resident gate/up is queued before the rest of its walk is planned (so the device
multiplies while the host plans). Both change when work is queued, never a byte (the bytes:
tests/test_ring_in_place.py, tests/test_streaming_sim.py)."""
import numpy as np
import pytest

from strata_prefill.fast import make_fast_engine
from strata_prefill.fast import walk as walk_mod
from strata_prefill.fast.experts import PASS_HEAD


def _prompt(pack, n, seed=4):
    return np.random.default_rng(seed).integers(0, pack.config.n_vocab, n).astype(np.int32)


def _logged_engine(pack, log, monkeypatch, **kw):
    """A sim engine whose backend notes, in order, each copy call (its entries), each layer's
    attention half and each resident gate/up, and whose walk notes when it plans groups or runs."""
    eng = make_fast_engine(pack, "sim", **kw)
    be = eng.be
    copy, gate_up = be.copy_experts, be.mmq_batch_gate_up

    def copy_experts(**a):
        log.append(("copy", len(a["experts"])))
        return copy(**a)

    def batch_gate_up(**a):
        log.append(("resident gate/up" if a["batch"].places is None else "run gate/up", a["layer"]))
        return gate_up(**a)

    monkeypatch.setattr(be, "copy_experts", copy_experts)
    monkeypatch.setattr(be, "mmq_batch_gate_up", batch_gate_up)
    attention = eng.attention_half

    def attention_half(layer, x, positions, dump=None):
        out = attention(layer, x, positions, dump)
        log.append(("attention", layer))
        return out

    monkeypatch.setattr(eng, "attention_half", attention_half)
    for name in ("plan_groups", "ring_runs"):
        real = getattr(walk_mod, name)
        monkeypatch.setattr(walk_mod, name, lambda *a, _real=real, _name=name, **k: (log.append((_name,)), _real(*a, **k))[1])
    return eng


def test_the_pass_queues_its_head_before_layer_0s_attention_and_the_rest_after(make_test_pack, monkeypatch):
    pack = make_test_pack("small", "Q8_0")  # 4 layers x 64 experts: far more streamed entries than PASS_HEAD
    log = []
    eng = _logged_engine(pack, log, monkeypatch, expert_cache=0, stream_min=1, ring=256, copy_coalesce=0)
    eng.be.reset_cache()
    from strata_prefill.session import Session

    Session(eng, chunk=64, progress=False).prefill(_prompt(pack, 40))
    first_attention = log.index(("attention", 0))
    before = sum(n for what, *rest in log[:first_attention] if what == "copy" for n in rest)
    assert before == PASS_HEAD  # one copy an entry: exactly the head before attention
    # the rest of the ring's first copies follow the attention, before any product of layer 0
    first_product = next(i for i, e in enumerate(log) if e[0] in ("resident gate/up", "run gate/up"))
    after = sum(n for what, *rest in log[first_attention:first_product] if what == "copy" for n in rest)
    assert after == min(eng.ring.n_slots, eng.placement.n_streamed) - PASS_HEAD


@pytest.mark.parametrize("rip", [0, 1])
def test_the_resident_gate_up_is_queued_before_the_walk_is_planned(make_test_pack, monkeypatch, rip):
    pack = make_test_pack("small", "Q8_0")
    n_all = pack.config.n_layer * pack.config.n_expert
    log = []
    eng = _logged_engine(pack, log, monkeypatch, expert_cache=n_all // 3, stream_min=1, ring=96, ring_in_place=rip,
                         window="off")
    from strata_prefill.session import Session

    Session(eng, chunk=64, progress=False).prefill(_prompt(pack, 40))
    plan = "ring_runs" if rip else "plan_groups"
    for layer in range(pack.config.n_layer):
        start = log.index(("attention", layer))
        resident = log.index(("resident gate/up", layer), start)
        planned = log.index((plan,), start)
        assert resident < planned, (layer, log[start:planned + 1])


@pytest.mark.parametrize("cache", [0, 1 / 3])
def test_each_layer_starts_its_uploads_afresh(make_test_pack, monkeypatch, cache):
    """prepare_batches: every layer's first call drops the last layer's tile uploads (add False),
    with a resident batch or without one (no cache: only runs), and its runs' tiles are added."""
    pack = make_test_pack("small", "Q8_0")
    n_all = pack.config.n_layer * pack.config.n_expert
    eng = make_fast_engine(pack, "sim", expert_cache=int(cache * n_all), stream_min=1, ring=96, window="off")
    calls = []
    real = eng.be.prepare_batches
    monkeypatch.setattr(eng.be, "prepare_batches",
                        lambda **a: (calls.append((a["layer"], a.get("add", False))), real(**a))[1])
    from strata_prefill.session import Session

    Session(eng, chunk=64, progress=False).prefill(_prompt(pack, 40))
    assert calls == [(layer, add) for layer in range(pack.config.n_layer) for add in (False, True)]
