"""ring_in_place on the sim backend: streamed experts multiplied in their ring slots. The runs'
plan (plan_runs: never a run the ring cannot hold), the hazard checks against planted early
releases, the counts that must fall, and hypothesis over routings, rings, groups, caches and
schedules (the parity rows are verify/cases.py's, arm `rip1`)."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from strata_prefill.fast import make_fast_engine
from strata_prefill.fast.sim_streams import POLICIES, ScheduleHazard
from strata_prefill.fast.walk import LayerWalk, plan_runs
from strata_prefill.reference import ReferenceEngine
from switch_needs import settled
from strata_prefill.verify.common import assert_same_run, copied_by_choices, run_engine


def _prompt(pack, n, seed=5):
    return np.random.default_rng(seed).integers(0, pack.config.n_vocab, n).astype(np.int32)


def _engine(pack, policy="copy_first", sched=1, **kw):
    return make_fast_engine(pack, "sim", sim_options=dict(schedule_seed=sched, policy=policy), **kw)


# ---- the plan --------------------------------------------------------------------------------
@given(n=st.integers(1, 60), ring=st.integers(1, 40), cap=st.integers(1, 16), seed=st.integers(0, 2**16),
       head=st.integers(0, 60))
def test_runs_fit_the_ring_and_the_cap_and_keep_the_order(n, ring, cap, seed, head):
    """Visits in entry order: ascending ids, or (head_predict) a head of any of them ascending,
    then the others ascending."""
    rng = np.random.default_rng(seed)
    ids = rng.choice(200, n, replace=False)
    visit = sorted(ids[:head].tolist()) + sorted(ids[head:].tolist())
    routed = {e for e in visit if rng.random() < 0.6}
    entry_of = {e: k for k, e in enumerate(visit)}  # the streamed walk: every visited id an entry
    runs = plan_runs(visit, routed, entry_of, ring, cap)
    assert [e for r in runs for e in r] == [e for e in visit if e in routed]
    for r in runs:
        assert 1 <= len(r) <= cap
        assert r == sorted(r)  # a run's rows are its experts' in id order
        assert entry_of[r[-1]] - entry_of[r[0]] < ring  # the copy of its last entry needs no release of its own
    for a, b in zip(runs, runs[1:]):  # a run is cut only where the cap, the ring or a fall of the ids says so
        assert len(a) == cap or entry_of[b[0]] - entry_of[a[0]] >= ring or b[0] < a[-1]


# ---- the detector catches early releases ---------------------------------------------------
def _release_after_the_wait(self, run):
    """The planted bug: the run's slots released right after the copy wait, before the products
    that read them."""
    be, ring_pass = self.be, self.ring_pass
    entries = [ring_pass.index[(self.layer, e)] for e in run.experts]
    be.wait(event=ring_pass.ring.copied_of[ring_pass.slot_of(entries[-1])], what="the run's last copy")
    ring_pass.release(entries, be.record())  # too early: the products below still read the slots
    r = self.rows
    args = dict(layer=self.layer, experts=len(run.experts), rows=run.n_rows)
    self.batch_gate_up(run, args)
    self.swiglu_h(int(run.bounds[0, 0]), int(run.bounds[-1, 1]), args)
    be.mmq_batch_down(layer=self.layer, batch=run, act=r.down_in, n_rows=r.n_rows, y=r.y)


def _release_before_down(self, run):
    """Released after gate/up but before the down product, which reads the slots too."""
    be, ring_pass = self.be, self.ring_pass
    entries = [ring_pass.index[(self.layer, e)] for e in run.experts]
    be.wait(event=ring_pass.ring.copied_of[ring_pass.slot_of(entries[-1])], what="the run's last copy")
    r = self.rows
    args = dict(layer=self.layer, experts=len(run.experts), rows=run.n_rows)
    self.batch_gate_up(run, args)
    self.swiglu_h(int(run.bounds[0, 0]), int(run.bounds[-1, 1]), args)
    ring_pass.release(entries, be.record())
    be.mmq_batch_down(layer=self.layer, batch=run, act=r.down_in, n_rows=r.n_rows, y=r.y)


PLANTED = {"release right after the copy wait": _release_after_the_wait,
           "release before the down product": _release_before_down}


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("ring", [4, 32])  # 32: the pack's every expert, deeper than a layer's entries: no refill
@pytest.mark.parametrize("case", sorted(PLANTED))
def test_an_early_release_is_caught(make_test_pack, tmp_path, monkeypatch, case, ring, policy):
    pack = make_test_pack("tiny", "Q8_0")
    kw = dict(expert_cache=0, ring=ring, stream_min=1, ring_in_place=1)
    ids = _prompt(pack, 3)
    run_engine(_engine(pack, policy, **kw), ids, 64, tmp_path / "ok", greedy=0, layer_dumps=False)  # clean
    monkeypatch.setattr(LayerWalk, "multiply_run", PLANTED[case])
    with pytest.raises(ScheduleHazard) as err:
        run_engine(_engine(pack, policy, **kw), ids, 64, tmp_path / "bad", greedy=0, layer_dumps=False)
    msg = str(err.value)
    assert " slot " in msg and "expert " in msg and "layer " in msg, msg
    # a ring of 4 may refill the slot before the read is enqueued (that check fires first); a
    # ring of 32 never refills within a layer: the release itself is what is reported
    assert "released" in msg or (ring == 4 and "refilled" in msg), msg


def test_a_refill_before_the_last_read_is_caught(make_test_pack, tmp_path, monkeypatch):
    """The copy side told nothing of the products' hold: a slot marked free for refills with no
    event to wait for (and the backend not told of the release, so only the refill's own check
    can see it) is a refill before the last product that reads the slot."""
    from strata_prefill.fast.experts import RingPass

    pack = make_test_pack("tiny", "Q8_0")

    def forget_event(self, ks, event):
        for k in ks:
            s = self.slot_of(k)
            self.ring.used_of[s], self.ring.copied_of[s] = None, None  # the refill waits for nothing
            self.released[k] = True
        self.copy_ahead()

    kw = dict(expert_cache=0, ring=4, stream_min=1, ring_in_place=1)
    monkeypatch.setattr(RingPass, "release", forget_event)
    with pytest.raises(ScheduleHazard, match="without waiting for the release"):
        run_engine(_engine(pack, **kw), _prompt(pack, 3), 64, tmp_path, greedy=0, layer_dumps=False)


def test_a_skip_before_its_copy_keeps_the_slots_release():
    """An entry the routing skips before its copy was due (a pass opened with no head, its first
    entry skipped) leaves its slot as it was: the slot still holds the pass before's entry, and
    the refill waits for that entry's release, not for nothing."""
    from strata_prefill.fast.experts import Place, Ring, RingPass

    class Backend:
        def __init__(self):
            self.copies = []

        def copy_experts(self, *, ring, slots, experts, tags, wait_for):
            self.copies.append((tags[0][-1], list(wait_for)))
            return f"copied {tags[0][-1]}"

        def released(self, **_):
            pass

    be, ring = Backend(), Ring(Place.RING, 1)
    first = RingPass(be, ring, [(1, 0)], 1, coalesce=False)
    first.copy_ahead()
    first.release([0], "read by the products")  # its reads are before this event
    second = RingPass(be, ring, [(1, 3), (1, 0)], 2, coalesce=False)  # no head: nothing copied yet
    second.release([0], None)  # entry 0 skipped before its copy: the slot still holds 1:0
    assert be.copies[1] == ("2:0", ["read by the products"])
    assert ring.used_of == ["read by the products"]
    second.release([1], None)  # entry 1 skipped after its copy was enqueued: nothing left to wait for
    assert be.copies[2] == ("2:1", ["read by the products"]) and ring.used_of == [None]


def test_a_skip_before_its_copy_found_by_hypothesis(make_test_pack, tmp_path):
    """test_windows_same_bytes_fewer_copies' falsifying example (one-token chunks, a ring of one
    slot, no head): the skipped first entry of a chunk's pass once dropped the release of the
    slot's last read, and the refill raced the products of the chunk before."""
    pack = make_test_pack("tiny", "IQ2_XS")
    kw = settled(pack, ring=1, expert_cache=28, stream_min="auto", group_gather=False, in_place=True,
                 copy_coalesce=False, stage_head=0)
    run_engine(_engine(pack, "random", 0, window="off", **kw), _prompt(pack, 18, seed=0), 1, tmp_path, greedy=1,
               layer_dumps=False)


def test_a_product_needs_its_copy(make_test_pack, tmp_path, monkeypatch):
    """A run multiplied without its copy wait reads a slot whose copy may not have landed."""
    pack = make_test_pack("tiny", "Q8_0")
    monkeypatch.setattr(type(_engine(pack).be), "wait", lambda self, *, event, what: None)
    with pytest.raises(ScheduleHazard, match="without waiting for"):
        run_engine(_engine(pack, expert_cache=0, ring=8, stream_min=1, ring_in_place=1), _prompt(pack, 3), 64,
                   tmp_path, greedy=0, layer_dumps=False)


# ---- the counts ------------------------------------------------------------------------------
def counts(pack, tmp_path, n_tok, **kw):
    eng = _engine(pack, "random", **kw)
    run_engine(eng, _prompt(pack, n_tok, seed=8), "auto", tmp_path, greedy=0, layer_dumps=False)
    return dict(eng.counters)


@pytest.mark.parametrize("cache", [0, 1 / 3])
@pytest.mark.parametrize("stream_min", [1, 4096])  # streamed and staged walks
def test_no_gathers_and_fewer_launches_waits_and_events(make_test_pack, tmp_path, cache, stream_min):
    """A few tokens on the small pack (64 experts, top-8), so the streamed walk skips ring entries
    inside groups: the gathered walk flushes a group in pieces there (a wait, a gather and an
    event each), a run spans them. With ring_in_place no gather is launched, the copies are the
    same, and in the streamed walk launches, waits and events fall. The staged walk's ring of 8
    cuts a layer's dozen streamed experts in two either way: two gathers and one set of
    products, or two runs' products (waits and events the same, launches a few more)."""
    pack = make_test_pack("small", "Q8_0")
    n_all = pack.config.n_layer * pack.config.n_expert
    kw = dict(expert_cache=int(cache * n_all), ring=16, stream_min=stream_min, copy_coalesce=0)  # one copy an expert: the counts compare
    off = counts(pack, tmp_path / "off", 12, ring_in_place=0, **kw)
    on = counts(pack, tmp_path / "on", 12, ring_in_place=1, ring_run=16, **kw)
    assert off["gathers"] > 0 and on.get("gathers", 0) == 0
    assert "gather_group" not in on and "gather_one" not in on
    for k in ("copies", "copy_bytes", "copy_events"):
        assert on[k] == off[k], k
    assert on["waits"] <= off["waits"] and on["events"] <= off["events"]
    if stream_min == 1:  # skips inside groups: pieces the runs do not need
        assert on["waits"] < off["waits"] and on["events"] < off["events"]
        assert on["launches"] < off["launches"]


def test_per_expert_mode_one_wait_and_event_per_streamed_expert(make_test_pack, tmp_path):
    """group_gather 0: every run holds one expert (one wait, its products, one event)."""
    pack = make_test_pack("small", "Q8_0")
    cfg = pack.config
    got = counts(pack, tmp_path, 300, expert_cache=0, stream_min=1, ring=128, ring_in_place=1, group_gather=0)
    n_experts = cfg.n_layer * cfg.n_expert  # 300 tokens route every one of 64 experts
    assert got["waits"] == got["events"] == n_experts and got.get("gathers", 0) == 0


def test_the_switch_does_nothing_without_in_place(make_test_pack, tmp_path, monkeypatch):
    """in_place 0 gathers every expert: ring_in_place 1 then changes no count, and the switch
    table's rule refuses it (fast/options.py)."""
    from strata_prefill.fast import options
    from strata_prefill.contract.errors import InputError

    pack = make_test_pack("small", "Q8_0")
    kw = dict(expert_cache=20, ring=16, stream_min=1, in_place=0)
    with pytest.raises(InputError, match="^--ring-in-place 1 needs --in-place 1: --in-place is 0: it does nothing$"):
        _engine(pack, ring_in_place=1, **kw)
    monkeypatch.setattr(options, "refuse_idle", lambda *a, **k: None)
    assert counts(pack, tmp_path / "a", 12, **kw) == counts(pack, tmp_path / "b", 12, ring_in_place=1, **kw)


# ---- hypothesis: any routing, ring, group, cache and schedule gives the reference's bytes --
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n_tok=st.integers(1, 90), seed=st.integers(0, 2**16), ring=st.sampled_from([1, 2, 3, 8, 16, 96]),
       run_cap=st.integers(1, 40), cache=st.integers(0, 32), stream_min=st.sampled_from([1, 40, 1024, "auto"]),
       gg=st.booleans(), coalesce=st.booleans(), policy=st.sampled_from(POLICIES), sched=st.integers(0, 2**16),
       window=st.sampled_from([None, 64]), head=st.sampled_from([0, 1, 3, "auto"]), predict=st.booleans())
def test_any_schedule_same_bytes(make_test_pack, tmp_path_factory, n_tok, seed, ring, run_cap, cache,
                                 stream_min, gg, coalesce, policy, sched, window, head, predict):
    pack = make_test_pack("tiny", "IQ2_XS")
    ids = _prompt(pack, n_tok, seed)
    out = tmp_path_factory.mktemp("h")
    ref = run_engine(ReferenceEngine(pack), ids, 32, out / "ref", greedy=1)
    eng = _engine(pack, policy, sched, **settled(pack, ring=ring, ring_run=run_cap, expert_cache=cache,
                                                 stream_min=stream_min, group_gather=gg, copy_coalesce=coalesce,
                                                 ring_in_place=1, window=window, stage_head=head,
                                                 head_predict=int(predict)))
    got = run_engine(eng, ids, 32, out / "fast", greedy=1)
    assert_same_run(ref, got, pack, f"ring {ring} run cap {run_cap} cache {cache} stream_min {stream_min} "
                                    f"window {window} stage_head {head} head_predict {int(predict)}")
    assert eng.counters["copy_bytes"] == copied_by_choices(pack, eng)  # what the walks chose, no more


# ---- the cuda backend's tile lists, without a GPU -------------------------------------------
def test_cuda_tiles_cover_ring_and_cache_from_one_base(monkeypatch):
    """The cuda backend's prepare_batches with a stand-in device and tiers: one upload for a
    layer's batches; each tile entry's 64-bit offset, added to its batch's base, is the address of
    its expert's blob, whether that lies in the expert cache or in a ring slot (two allocations,
    the ring's here below the cache's)."""
    from types import SimpleNamespace

    from strata_prefill.fast.cuda import backend as cb
    from strata_prefill.fast.experts import Place
    from strata_prefill.fast.walk import Batch

    monkeypatch.delenv("STRATA_MMQ_CONFIG", raising=False)
    monkeypatch.delenv("STRATA_MMQ_DEFINES", raising=False)
    cache_base, ring_base, blob, slot_bytes = 0x7F00_0000_0000, 0x7E00_0000_0000, 4096, 8192
    rank = np.arange(64)

    class Tiers:
        def addr(self, layer, where, index):
            return cache_base + int(rank[index]) * blob if where == Place.CACHE else ring_base + int(index) * slot_bytes

        def cache_offsets(self, layer, experts):
            return cache_base, rank[np.asarray(experts)].astype(np.int64) * blob

    uploads = []

    class Dev:
        def upload(self, a):
            uploads.append(np.array(a))
            return SimpleNamespace(gpudata=0x1000)

    be = cb.CudaBackend.__new__(cb.CudaBackend)
    be.dev, be.tiers, be._prepared, be._prepared_keep, be._tiles_keep = Dev(), Tiers(), {}, None, None
    be.pack = SimpleNamespace(expert_types=lambda layer: (cb.quants.QT.Q8_0, cb.quants.QT.Q8_0))
    resident = Batch((1, 4), np.array([[0, 5], [9, 300]], np.int32))
    run = Batch((2, 3, 7), np.array([[5, 9], [300, 301], [301, 340]], np.int32),
                places=((Place.RING, 5, None), (Place.RING, 6, None), (Place.CACHE, 7, None)))
    be.prepare_batches(layer=0, batches=[resident, run])
    assert len(uploads) == 1
    flat = uploads[0].reshape(-1, 4)
    at = 0
    for b in (resident, run):
        base, lists = be._batch_tiles(0, b)
        ((tiles, n, _cfg, live),) = lists  # a host-cut batch: one list, no live count
        assert tiles == 0x1000 + 16 * at and live is None  # its slice of the one upload
        mine = flat[at:at + n].view(np.uint32).astype(np.int64)
        at += n
        want = [be.tiers.addr(0, w, i) for w, i, _t in b.places] if b.places else \
            [cache_base + int(rank[e]) * blob for e in b.experts]
        got = base + (mine[:, 2] | (mine[:, 3] << 32))
        which = [next(i for i, (r0, r1) in enumerate(b.bounds) if r0 <= t0 < r1) for t0 in mine[:, 0]]
        assert list(got) == [want[i] for i in which]
        assert list(mine[:, 0]) == sorted(mine[:, 0]) and base % 2 == 0
    assert at == len(flat)


def test_bench_arms_show_the_counts_fall(make_test_pack, tmp_path, capsys):
    """`strata-prefill bench` takes the switch by its variable: same logits bytes, the B arm's
    row of the table with no gathers in its JSON and fewer waits and events."""
    import json

    from strata_prefill.cli import main

    pack = make_test_pack("small", "Q8_0")
    out = tmp_path / "ab.json"
    status = main(["bench", "--pack", str(pack.path), "--backend", "sim", "--tokens", "12", "--reps", "1",
                   "--a", "expert-cache=20,ring=16,stream-min=1,STRATA_PREFILL_RING_IN_PLACE=0",
                   "--b", "expert-cache=20,ring=16,stream-min=1,STRATA_PREFILL_RING_IN_PLACE=1", "--json", str(out)])
    text = capsys.readouterr().out
    assert status == 0 and "logits: identical bytes" in text, text
    rep = json.loads(out.read_text())["lengths"][0]["reps"][0]
    assert rep["A"]["gathers"] > 0 and rep["B"]["gathers"] == 0
    assert rep["B"]["waits"] < rep["A"]["waits"] and rep["B"]["events"] < rep["A"]["events"]
    assert rep["B"]["launches"] < rep["A"]["launches"]
