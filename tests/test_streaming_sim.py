"""Expert streaming on the sim backend: the placement policy, the hazard detector against
deliberately broken schedules, and hypothesis over routings, rings, groups and schedules."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from strata_prefill.fast import make_fast_engine
from strata_prefill.fast.experts import RingPass, place_experts
from strata_prefill.fast.sim_streams import POLICIES, ScheduleHazard
from strata_prefill.fast.walk import LayerWalk
from strata_prefill.reference import ReferenceEngine
from switch_needs import settled
from strata_prefill.verify.common import assert_same_run, copied_by_choices, run_engine


# ---- placement ------------------------------------------------------------------------------
@given(n_layer=st.integers(1, 6), n_expert=st.integers(1, 64), frac=st.floats(0, 1.2))
def test_placement_counts_spread_and_host_order(n_layer, n_expert, frac):
    n = int(frac * n_layer * n_expert)
    p = place_experts(n_layer, n_expert, n)
    assert p.n_resident == min(n, n_layer * n_expert)
    per_layer = p.resident.sum(axis=1)
    assert per_layer.max() - per_layer.min() <= 1  # an even split over layers
    assert list(per_layer) == sorted(per_layer, reverse=True)  # the extra ones go to the first layers
    # cache slots and host indices number residents and streamed experts in (layer, id) order
    assert list(p.cache_slot[p.resident]) == list(range(p.n_resident))
    assert list(p.host_index[~p.resident]) == list(range(p.n_streamed))
    for l in range(n_layer):  # evenly spread: gaps between residents differ by at most one
        ids = np.nonzero(p.resident[l])[0]
        if len(ids) > 2:
            gaps = np.diff(ids)
            assert gaps.max() - gaps.min() <= 1
    assert (place_experts(n_layer, n_expert, n).resident == p.resident).all()  # deterministic


# ---- the detector catches broken schedules ------------------------------------------------
def _prompt(pack, n, seed=5):
    return np.random.default_rng(seed).integers(0, pack.config.n_vocab, n).astype(np.int32)


def _run(pack, tmp_path, n_tok=3, policy="copy_first", **kw):
    """The gathered walk by default (ring_in_place 0): tests/test_ring_in_place.py has the other."""
    kw.setdefault("ring_in_place", 0)
    eng = make_fast_engine(pack, "sim", sim_options=dict(schedule_seed=1, policy=policy), **kw)
    return run_engine(eng, _prompt(pack, n_tok), 64, tmp_path, greedy=0, layer_dumps=False)


def _release_before_gather(self, batch):
    ring_pass = self.ring_pass
    streamed = [m.entry for m in batch if m.entry is not None]
    if streamed:
        self.be.wait(event=ring_pass.ring.copied_of[ring_pass.slot_of(streamed[-1])], what="the last copy")
        ring_pass.release(streamed, self.be.record())  # released (and refilled) too early
    self.be.gather(layer=self.layer, members=self._places(batch), q0=batch[0].q)


def _wait_on_first_copy(self, batch):
    ring_pass = self.ring_pass
    streamed = [m.entry for m in batch if m.entry is not None]
    if streamed:
        self.be.wait(event=ring_pass.ring.copied_of[ring_pass.slot_of(streamed[0])], what="the first copy")  # not the last
    self.be.gather(layer=self.layer, members=self._places(batch), q0=batch[0].q)
    if streamed:
        ring_pass.release(streamed, self.be.record())


def _stale_used_of(self, ks, event):
    for k in ks:
        s = self.slot_of(k)
        if event is None:  # a skipped entry: forget the slot's event
            self.ring.used_of[s] = None
        # else: keep the stale entry, from the slot's previous contents
        self.ring.copied_of[s] = None
        self.released[k] = True
    self.copy_ahead()


def _never_spans(self, entry):
    return False  # the group held across skips is never gathered early, however far it reaches


def _copy_without_waiting(self, run):
    ring = self.ring
    slots = [self.slot_of(k) for k in run]
    tags = [self.tag(k) for k in run]
    done = self.be.copy_experts(ring=ring.place, slots=slots, experts=[self.entries[k] for k in run],
                                tags=tags, wait_for=[])
    for s, t in zip(slots, tags):
        ring.copied_of[s], ring.tag_of[s] = done, t


BROKEN = {
    "release before the group's gather": (LayerWalk, "gather", _release_before_gather, dict(ring=4)),
    "stale used_of after a per-slot release": (RingPass, "release", _stale_used_of,
                                               dict(ring=4, group_gather=0)),
    "no flush of an open group that spans the ring": (LayerWalk, "spans_ring", _never_spans,
                                                      dict(ring=4, stream_min=1, flush_on_skip=0)),
    "refill without waiting": (RingPass, "_copy", _copy_without_waiting, dict(ring=4)),
    # one copy per expert: coalesced, a group's members can land in one copy, its first the last
    "wait on the group's first copy": (LayerWalk, "gather", _wait_on_first_copy, dict(ring=8, copy_coalesce=0)),
}


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_schedules_are_caught(make_test_pack, tmp_path, monkeypatch, case, policy):
    cls, attr, broken, kw = BROKEN[case]
    pack = make_test_pack("tiny", "Q8_0")
    _run(pack, tmp_path / "ok", n_tok=3, policy=policy, expert_cache=0, **kw)  # the real walk is clean
    monkeypatch.setattr(cls, attr, broken)
    with pytest.raises(ScheduleHazard) as err:
        _run(pack, tmp_path / "broken", n_tok=3, policy=policy, expert_cache=0, **kw)
    msg = str(err.value)
    assert " slot " in msg and "expert " in msg and "layer " in msg, msg


def test_wait_on_nothing_is_a_hazard(make_test_pack, tmp_path, monkeypatch):
    """A gather whose copy was never enqueued waits on no event: reported, not run."""
    pack = make_test_pack("tiny", "Q8_0")
    monkeypatch.setattr(RingPass, "copy_ahead", lambda self, limit=None: None)
    with pytest.raises(ScheduleHazard, match="nothing will record"):
        _run(pack, tmp_path, expert_cache=0, ring=8)


# ---- hypothesis: any routing, ring, group, cache and schedule gives the reference's bytes --
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n_tok=st.integers(1, 90), seed=st.integers(0, 2**16), ring=st.sampled_from([1, 2, 3, 8, 16, 96]),
       group_size=st.integers(1, 16), cache=st.integers(0, 32), stream_min=st.sampled_from([1, 40, 1024, "auto"]),
       gg=st.booleans(), qg=st.booleans(), coalesce=st.booleans(), in_place=st.booleans(),
       flush_on_skip=st.booleans(), stage_in_ring=st.booleans(), policy=st.sampled_from(POLICIES), sched=st.integers(0, 2**16),
       head=st.sampled_from([0, 1, 3, "auto"]))
def test_any_schedule_same_bytes(make_test_pack, tmp_path_factory, n_tok, seed, ring, group_size, cache,
                                 stream_min, gg, qg, coalesce, in_place, flush_on_skip, stage_in_ring, policy,
                                 sched, head):
    pack = make_test_pack("tiny", "IQ2_XS")
    ids = _prompt(pack, n_tok, seed)
    out = tmp_path_factory.mktemp("h")
    ref = run_engine(ReferenceEngine(pack), ids, 32, out / "ref", greedy=1)
    eng = make_fast_engine(pack, "sim", sim_options=dict(schedule_seed=sched, policy=policy), group_size=group_size,
                           **settled(pack, ring=ring, expert_cache=cache, stream_min=stream_min, group_gather=gg,
                                     quant_gather=qg, copy_coalesce=coalesce, in_place=in_place,
                                     flush_on_skip=flush_on_skip, stage_in_ring=stage_in_ring, ring_in_place=0,
                                     stage_head=head))
    got = run_engine(eng, ids, 32, out / "fast", greedy=1)
    assert_same_run(ref, got, pack, f"ring {ring} group {group_size} cache {cache} stream_min {stream_min} "
                                    f"in_place {in_place} flush_on_skip {flush_on_skip} stage_in_ring {stage_in_ring} "
                                    f"stage_head {head}")
    assert eng.counters["copy_bytes"] == copied_by_choices(pack, eng)  # what the walks chose, no more


@pytest.mark.parametrize("ring", [4, 32])  # 32: the pack's every expert
def test_a_group_held_across_skips_is_gathered_once(make_test_pack, tmp_path, ring):
    """A short prompt routes few of a layer's experts, so the streamed walk meets skipped
    entries between a group's members: flush_on_skip 1 gathers the group in pieces there, 0
    holds it (one wait, gather and event a group where the ring is long enough) and gives the
    same bytes; with a ring shorter than the span the group is gathered early, never stalls."""
    pack = make_test_pack("tiny", "Q8_0")
    counts, runs = {}, {}
    for fos in (1, 0):
        eng = make_fast_engine(pack, "sim", sim_options=dict(schedule_seed=3, policy="copy_first"), ring=ring,
                               expert_cache=0, stream_min=1, flush_on_skip=fos, ring_in_place=0)
        runs[fos] = run_engine(eng, _prompt(pack, 5), 64, tmp_path / f"f{fos}", greedy=0, layer_dumps=False)
        counts[fos] = dict(eng.counters)
    assert_same_run(runs[1], runs[0], pack, f"flush_on_skip 1 against 0, ring {ring}")
    assert counts[0]["copy_bytes"] == counts[1]["copy_bytes"]  # the same entries cross the link
    for what in ("gathers", "waits", "events"):
        assert counts[0][what] < counts[1][what], (what, counts)
