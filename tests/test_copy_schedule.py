"""The copy schedule as one object (fast/schedule.py): a unit's WalkChoice cannot change once
made, the ring places are a typed handle that prints as the words the traces always wrote, and
a unit's CopySchedule alone answers why an expert was copied, which the copies the sim backend
was asked for confirm, expert by expert."""
import dataclasses
import json
import re

import numpy as np
import pytest

from strata_prefill.fast import make_fast_engine
from strata_prefill.fast.experts import Place, Ring
from strata_prefill.fast.schedule import CopySchedule, LayerChoice, PromptSchedules, WalkChoice
from strata_prefill.session import Session


def _prompt(pack, n, seed):
    return np.random.default_rng(seed).integers(0, pack.config.n_vocab, n).astype(np.int32)


def test_a_walk_choice_cannot_change_after_it_is_made():
    layers = [LayerChoice("staged", "prior", head=3), LayerChoice("streamed", "layer 0", 0.9, 0.5)]
    routed, in_head = [5, None], [2, 0]
    u = WalkChoice("coverage", 64, "auto", 30, 3_000_000, layers=layers, routed=routed, in_head=in_head)
    before = u.line()
    for name, value in (("tokens", 1), ("layers", ()), ("routed", (1, 1)), ("measured", 64)):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(u, name, value)
    assert isinstance(u.layers, tuple) and isinstance(u.routed, tuple) and isinstance(u.in_head, tuple)
    layers.append(LayerChoice("staged", "layer 1", 0.1, 0.5))  # the lists it was made from change:
    routed[1], in_head[0] = 7, 9  # the record does not
    assert len(u.layers) == 2 and u.routed == (5, None) and u.in_head == (2, 0) and u.line() == before
    with pytest.raises(AttributeError):
        u.layers.append(layers[-1])


def test_an_engine_s_records_stay_as_made(make_test_pack):
    """The records a run left are whole and stay so while the engine runs the next prompt."""
    pack = make_test_pack("tiny", "IQ2_XS")
    eng = make_fast_engine(pack, "sim", expert_cache=5, ring=8, window="off")
    Session(eng, chunk=32, progress=False).run(_prompt(pack, 70, 5), greedy=1)
    first = eng.walk_choices
    kept = [(u.line(), u.layers, u.routed, u.in_head) for u in first]
    assert all(len(u.layers) == pack.config.n_layer and None not in u.routed for u in first)
    Session(eng, chunk=20, progress=False).run(_prompt(pack, 40, 6), greedy=0)
    assert [(u.line(), u.layers, u.routed, u.in_head) for u in first] == kept
    assert [u.tokens for u in eng.walk_choices] == [20, 20]  # a prompt from position 0 starts the list again


def test_places_print_the_words_the_traces_wrote():
    assert [p.value for p in Place] == ["cache", "ring", "stage"]
    assert Place.RING == "ring" and f"{Place.STAGE} slot 3" == "stage slot 3" and str(Place.CACHE) == "cache"
    assert json.dumps({"ring": Place.RING}) == '{"ring": "ring"}'
    ring = Ring(Place.RING, 4)
    assert ring.place is Place.RING


# each: (pack, chunk, prompt tokens, greedy steps, switches); together they take the streamed walk,
# the staged walk with heads of the lowest ids and of the predicted routing, and the staging ring
CASES = {
    "streamed and staged": ("tiny", "IQ2_XS", 32, 70, 2, dict(expert_cache=5, ring=8)),
    "predicted heads": ("small", "Q8_0", 20, 40, 0, dict(expert_cache="third", ring=16, stage_head=3,
                                                         stream_min=1024, head_predict=1)),
    "staging ring": ("small", "Q8_0", 20, 40, 0, dict(expert_cache="third", ring=16, stage_in_ring=0,
                                                      stream_min=1024)),
    "window": ("tiny", "Q8_0", 20, 100, 1, dict(expert_cache=3, ring=8, window=60)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_schedule_alone_says_why_an_expert_was_copied(make_test_pack, monkeypatch, case):
    """For every expert of every layer of every unit, CopySchedule.why says "copied ahead" (queued
    before the layer's routing), "copied after" (at its routing) or "not copied", and names the
    pass entry it came through: the sim's copies agree, one by one (each copy's tag names its
    pass and entry), and what was copied ahead is what the pass held when the routing came."""
    preset, qtype, chunk, n, greedy, kw = CASES[case]
    pack = make_test_pack(preset, qtype)
    if kw.get("expert_cache") == "third":
        kw = {**kw, "expert_cache": pack.config.n_layer * pack.config.n_expert // 3}
    kw.setdefault("window", "off")
    n_layer, n_expert = pack.config.n_layer, pack.config.n_expert
    units = []  # per unit: ({layer: its entries in the unit pass when its routing came}, {(layer, expert): why})
    real_pass, real_begin = CopySchedule.layer_pass, PromptSchedules.begin

    def layer_pass(self, layer, tab):
        held = [] if self.ring_pass is None else [e for l, e in self.ring_pass.entries if l == layer]
        units[-1][0][layer] = held
        return real_pass(self, layer, tab)

    def answers(unit):
        units[-1][1].update({(l, e): unit.why(l, e) for l in range(n_layer) for e in range(n_expert)})

    def begin(self, n_tok, first_position=0):
        if self.now is not None:
            answers(self.now)  # its schedule is kept until the next unit starts
        units.append(({}, {}))
        return real_begin(self, n_tok, first_position)

    monkeypatch.setattr(CopySchedule, "layer_pass", layer_pass)
    monkeypatch.setattr(PromptSchedules, "begin", begin)
    eng = make_fast_engine(pack, "sim", **kw)
    copies = set()  # (pass, entry, layer, expert) of every copy the backend was asked for
    real_copy = eng.be.copy_experts

    def copy_experts(*, ring, slots, experts, tags, wait_for):
        for ring_, _slot, layer, expert, entry in tags:
            assert ring_ is ring
            p, k = entry.split(":")
            copies.add((int(p), int(k), layer, expert))
        return real_copy(ring=ring, slots=slots, experts=experts, tags=tags, wait_for=wait_for)

    eng.be.copy_experts = copy_experts
    Session(eng, chunk=chunk, progress=False).run(_prompt(pack, n, 3), greedy=greedy)
    answers(eng.schedule)
    assert len(units) == len(eng.walk_choices) > 1
    seen = {"copied ahead": 0, "copied after": 0, "not copied": 0}
    explained = set()
    for before_routing, whys in units:
        for (layer, e), why in whys.items():
            kind = next(k for k in seen if why.startswith(k))
            seen[kind] += 1
            if eng.placement.resident[layer, e]:
                assert kind == "not copied" and "resident" in why, why
                continue
            if kind == "not copied":
                assert "its routing skipped" in why, why
                continue
            m = re.search(r"; entry (\d+) of pass (\d+) \((ring|stage)\)$", why)
            assert m, why
            k, p = int(m.group(1)), int(m.group(2))
            assert (p, k, layer, e) in copies, why
            explained.add((p, k, layer, e))
            assert (e in before_routing[layer]) == (kind == "copied ahead"), why
    assert explained == copies  # every copy the backend made is one the schedules explain
    assert seen["not copied"] and (seen["copied ahead"] or case == "staging ring")  # no head through the staging ring
    every = [why for _, whys in units for why in whys.values()]
    if case == "staging ring":
        assert seen["copied after"] and all(w.endswith("(stage)") for w in every if w.startswith("copied after"))
    if case == "predicted heads":
        assert any("the layer before's prediction named most" in w for w in every)
