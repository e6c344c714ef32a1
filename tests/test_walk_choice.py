"""The walk each layer of a chunk (or window) takes, chosen by coverage (issue 26, item 4):
strata_prefill.fast.schedule.choose_layer on its own (the uniform bound, the measured coverage scaled to a unit's
tokens, the previous layer's, the token prior, a number for stream_min keeping the threshold
rule), the engine's choices and the bytes they copy on the sim, the reference's bytes whatever
the rule chose, the unit pass in layer order, and the line run --timing prints for each unit."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from strata_prefill.fast import make_fast_engine
from strata_prefill.fast.options import AUTO, resolve
from strata_prefill.fast.schedule import (CopySchedule, WalkChoice, choose_layer, expected_coverage, predicted_head, scaled_coverage,
                            stream_need)
from strata_prefill.reference import ReferenceEngine
from strata_prefill.fast.tuning import STREAM_HIDE_KB, STREAM_MIN
from strata_prefill.session import Session
from strata_prefill.verify.cases import parity_rows
from strata_prefill.verify.common import assert_same_run, copied_by_choices, run_engine


BLOB = 3_600_000


def _layer(n_tok, layer=0, stream_min=AUTO, k=10, e=512, streamed=(342, 341), measured=None, routed=None,
           hide=STREAM_HIDE_KB * 1000, reach=1):
    return choose_layer(layer=layer, n_tok=n_tok, stream_min=stream_min, k_used=k, n_expert=e,
                        streamed=list(streamed), blob_bytes=[BLOB] * len(streamed), hide_per_token=hide,
                        measured=measured, routed=routed, reach=reach)


# ---- the rule on its own -------------------------------------------------------------------
def test_expected_coverage_is_one_minus_the_miss_chance():
    assert expected_coverage(1, 10, 512) == pytest.approx(10 / 512)
    assert expected_coverage(254, 10, 512) == pytest.approx(1 - (1 - 10 / 512) ** 254)
    assert expected_coverage(0, 10, 512) == 0.0
    assert expected_coverage(3, 16, 16) == 1.0  # every expert routed by every token


def test_scaled_coverage_keeps_the_measure_at_its_own_tokens():
    assert scaled_coverage(0.4, 64, 64) == pytest.approx(0.4)
    assert scaled_coverage(0.4, 64, 128) == pytest.approx(1 - 0.6 ** 2)
    assert scaled_coverage(1.0, 64, 1) == 1.0  # saturated: the uniform bound caps it (choose_layer)
    assert scaled_coverage(0.0, 64, 1000) == 0.0


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 40_000), k=st.integers(1, 16), e=st.integers(16, 512), layer=st.integers(0, 1),
       share=st.floats(0, 1), n_measured=st.integers(1, 8192), hide=st.integers(0, 10**6))
def test_measured_rule_is_monotone_in_tokens(n, k, e, layer, share, n_measured, hide):
    """With the last unit measured, more tokens never expect less coverage nor need more, so a
    layer that streams still streams with more tokens; the estimate never passes the uniform
    bound."""
    streamed = (e // 2, e // 3)
    measured = (n_measured, [int(share * s) for s in streamed])
    a = _layer(n, layer, k=k, e=e, streamed=streamed, measured=measured, hide=hide)
    b = _layer(n + 1 + n // 3, layer, k=k, e=e, streamed=streamed, measured=measured, hide=hide)
    assert a.basis == "last unit"
    assert a.coverage <= b.coverage + 1e-12 and b.need <= a.need
    assert not a.streams or b.streams
    assert a.coverage <= expected_coverage(n, k, e) + 1e-12
    assert a.streams == (a.coverage >= a.need)


def test_the_need_is_the_skipped_bytes_under_the_layer_s_compute():
    """(1 - c) * layer bytes <= tokens * hide: at 254 tokens and 110 KB a token a layer of 342
    blobs of 3.6 MB streams only from 0.98 coverage; from 11,193 tokens at any."""
    layer_bytes = 342 * BLOB
    assert stream_need(254, layer_bytes, 110_000) == pytest.approx(1 - 254 * 110_000 / layer_bytes)
    assert stream_need(11_193, layer_bytes, 110_000) == 0.0
    assert stream_need(254, layer_bytes, 0) == 1.0  # nothing hidden: stream only what every expert needs
    assert stream_need(254, 0, 110_000) == 0.0


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 40_000), stream_min=st.integers(1, 40_000), layer=st.integers(0, 1))
def test_a_number_keeps_the_threshold_rule(n, stream_min, layer):
    """stream_min N: streamed from N tokens, staged below, whatever the coverage would say."""
    c = _layer(n, layer, stream_min=stream_min, measured=(64, [1, 1]), routed=[1, None])
    assert c.basis == "threshold" and c.coverage is None
    assert c.streams == (n >= stream_min)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 40_000))
def test_the_prompt_s_first_layer_takes_the_token_prior(n):
    """Layer 0 of a prompt's first unit has no routing to read: streamed from STREAM_MIN tokens
    (uniform top-k would stream nearly every prompt, 0.99 at 254 tokens, where this pack's
    routing reached 0.37)."""
    c = _layer(n)
    assert c.basis == "prior" and c.coverage is None
    assert c.streams == (n >= STREAM_MIN)


def test_a_later_layer_waits_for_the_routing_before_it():
    """From STREAM_MIN tokens layer 1 is chosen from layer 0's routing of the same tokens, once it
    is known; a layer that streams nothing is passed over. Below, the prior stages it whatever
    layer 0 routed (another layer's measure stages, never streams, what the prior stages)."""
    assert _layer(4096, layer=1, routed=[None, None]) is None
    c = _layer(4096, layer=1, routed=[120, None])
    assert c.basis == "layer 0" and c.coverage == pytest.approx(120 / 342) and not c.streams
    assert c.need == pytest.approx(stream_need(4096, 341 * BLOB, STREAM_HIDE_KB * 1000))
    c = _layer(4096, layer=1, routed=[300, None])  # 0.88 of the experts: at 4,096 tokens enough
    assert c.streams and c.need < 0.88
    c = _layer(4096, layer=2, streamed=(342, 0, 341), routed=[300, None, None])
    assert c.basis == "layer 0" and c.streams
    c = _layer(254, layer=1, routed=[342, None])
    assert c.basis == "prior" and not c.streams and c.coverage is None
    c = _layer(254, layer=1, streamed=(0, 341))  # no earlier layer streams: the prior
    assert c.basis == "prior" and not c.streams


@settings(max_examples=300, deadline=None)
@given(n_layer=st.integers(2, 9), data=st.data(), reach=st.integers(1, 4))
def test_choose_ahead_reads_the_nearest_routed_of_the_layers_it_reaches(n_layer, data, reach):
    """choose_ahead N: a layer is chosen from the routing of the nearest of the N streaming layers
    before it that has routed (its coverage is that layer's), and waits (None) while none of those
    has; with N = 1, only the nearest one. Layers streaming nothing are passed over."""
    streamed = data.draw(st.lists(st.integers(0, 300), min_size=n_layer, max_size=n_layer))
    routed = [data.draw(st.one_of(st.none(), st.integers(0, s))) for s in streamed]
    layer = n_layer - 1
    c = _layer(4096, layer, streamed=streamed, routed=routed, reach=reach)
    prev = [l for l in range(layer) if streamed[l]]
    if not streamed[layer]:
        assert c.walk == "resident"
        return
    if not prev:
        assert c.basis == "prior"
        return
    known = [l for l in prev[-reach:] if routed[l] is not None]
    if not known:
        assert c is None
        return
    src = known[-1]
    assert c.basis == f"layer {src}"
    assert c.coverage == pytest.approx(min(expected_coverage(4096, 10, 512), routed[src] / streamed[src]))
    # a farther reach never waits where a nearer one chooses, and chooses alike where the nearest has routed
    wider = _layer(4096, layer, streamed=streamed, routed=routed, reach=reach + 1)
    assert wider is not None and (routed[prev[-1]] is None or wider == c)


def test_choose_ahead_two_chooses_a_layer_once_the_layer_two_before_has_routed():
    three = (342, 341, 341)
    assert _layer(4096, 2, streamed=three, routed=[300, None, None]) is None
    c = _layer(4096, 2, streamed=three, routed=[300, None, None], reach=2)
    assert c.basis == "layer 0" and c.coverage == pytest.approx(300 / 342) and c.streams
    layers = [_layer(4096, streamed=three), _layer(4096, 1, streamed=three, routed=[300, None, None]), c]
    line = WalkChoice("coverage", 4096, AUTO, sum(three), sum(three) * BLOB, layers=layers).line()
    assert "L1-2 streamed (coverage 0.88 >= 0.63, from the routing of the layer 1-2 before)" in line, line


def test_the_last_unit_s_same_layer_comes_before_the_previous_layer():
    few = (64, [20, 20])  # 64 tokens reached 20 of each layer's ~340 streamed experts
    c = _layer(64, layer=1, measured=few, routed=[342, None], hide=10**7)
    assert c.basis == "last unit" and not c.streams and c.coverage == pytest.approx(20 / 341)
    assert _layer(64, layer=1, measured=(64, [342, 341]), routed=[0, None], hide=10**7).streams


def test_nothing_streamed_is_resident():
    assert _layer(5000, streamed=(0, 0)).walk == "resident"
    u = WalkChoice("coverage", 5000, AUTO, 0, 0, layers=[_layer(5000, l, streamed=(0, 0)) for l in (0, 1)])
    assert u.walk == "resident" and not u.streams and u.line().startswith("resident")


def test_a_unit_s_line_names_each_run_of_layers():
    three = (342, 341, 341)
    layers = [_layer(4096, streamed=three), _layer(4096, 1, streamed=three, routed=[300, None, None])]
    u = WalkChoice("coverage", 4096, AUTO, sum(three), sum(three) * BLOB, layers=layers)
    assert u.walk == "streamed" and u.streams  # the prior streams layer 0 at 4,096 tokens
    u = WalkChoice("coverage", 4096, AUTO, sum(three), sum(three) * BLOB,
                   layers=layers + [_layer(4096, 2, streamed=three, routed=[300, 100, None])])
    assert u.walk == "mixed" and not u.streams
    line = u.line()
    assert line.startswith("mixed: 4096 tokens, L0 streamed (no routing of the layer measured yet, "
                           "4096 tokens >= 1024)"), line
    assert "L1 streamed (coverage 0.88 >= 0.63, from the previous layer's routing)" in line
    assert "L2 staged (coverage 0.29 < 0.63" in line and "1024 streamed experts, 3.69 GB a pass" in line


def test_auto_is_a_value_of_stream_min_and_the_default():
    assert resolve({}).stream_min == AUTO
    assert resolve({"stream_min": "auto"}).stream_min == AUTO
    assert resolve({}, environ={"STRATA_PREFILL_STREAM_MIN": "auto"}).stream_min == AUTO
    assert resolve({}, environ={"STRATA_PREFILL_STREAM_MIN": "64"}).stream_min == 64


# ---- the engine on the sim -------------------------------------------------------------------
def _prompt(pack, n, seed=0, few=False):
    rng = np.random.default_rng(seed)
    if few:
        return rng.choice(rng.integers(0, pack.config.n_vocab, 3), n).astype(np.int32)
    return rng.integers(0, pack.config.n_vocab, n).astype(np.int32)


def _engine(pack, **kw):
    """Chunk by chunk (window off): the choices are the chunks'."""
    kw.setdefault("window", "off")
    return make_fast_engine(pack, "sim", **kw)


def _streamed_bytes(pack, engine) -> int:
    p = engine.placement
    return sum(2 * pack.expert_blob_bytes(l)[0] + pack.expert_blob_bytes(l)[1]
               for l in range(pack.config.n_layer) for _ in p.streamed(l))


@pytest.mark.parametrize("stream_min, walks", [(40, ["staged"] * 3), (32, ["streamed", "streamed", "staged"]),
                                               (1, ["streamed"] * 3)])
def test_engine_threshold_choices_and_bytes_are_the_old_rule(make_test_pack, stream_min, walks):
    """A number for stream_min: the chunks that reach it stream (one whole pass each), the others
    stage, every layer alike, exactly as before the coverage rule (with no head: stage_head 0)."""
    pack = make_test_pack("tiny", "Q8_0")
    eng = _engine(pack, expert_cache=4, ring=8, stream_min=stream_min, stage_head=0)
    Session(eng, chunk=32, progress=False).run(_prompt(pack, 70), greedy=0)
    assert [c.walk for c in eng.walk_choices] == walks
    assert all(c.rule == "threshold" and all(lc.basis == "threshold" for lc in c.layers) for c in eng.walk_choices)
    assert eng.counters["copy_bytes"] == copied_by_choices(pack, eng)
    n_streamed = walks.count("streamed")
    if n_streamed == 3:
        assert eng.counters["copy_bytes"] == 3 * _streamed_bytes(pack, eng)
    else:  # the staged chunks copy only routed experts: less than a pass each
        assert n_streamed * _streamed_bytes(pack, eng) < eng.counters["copy_bytes"] < 3 * _streamed_bytes(pack, eng)


def test_engine_auto_is_the_default_and_chooses_layer_by_layer(make_test_pack, tmp_path):
    """The default on the tiny pack (top-4 of 16): the first chunk (32 tokens) stages on the
    token prior; the next chunks read the last chunk's routing and stream; the one-token greedy
    steps stage (the measure scaled to one token, at most 4/16). The reference's bytes, and
    exactly the bytes the choices copy."""
    pack = make_test_pack("tiny", "IQ2_XS")
    ids = _prompt(pack, 70, 5)
    ref = run_engine(ReferenceEngine(pack), ids, 32, tmp_path / "ref", greedy=2)
    eng = _engine(pack, expert_cache=5, ring=8)
    got = run_engine(eng, ids, 32, tmp_path / "fast", greedy=2)
    assert_same_run(ref, got, pack, "stream_min auto")
    first, second, third, *greedy = eng.walk_choices
    assert first.rule == "coverage" and first.walk == "staged" and first.measured is None
    assert all(c.basis == "prior" for c in first.layers)
    assert second.streams and third.streams and second.measured == 32 and third.measured == 32
    assert all(c.basis == "last unit" for c in second.layers + third.layers)
    assert greedy and all(u.walk == "staged" for u in greedy)
    assert all(c.basis == "last unit" and c.coverage < c.need for u in greedy for c in u.layers)
    assert eng.counters["copy_bytes"] == copied_by_choices(pack, eng)


def test_a_long_first_chunk_reads_the_layer_before(make_test_pack, tmp_path):
    """A first chunk of 1,100 tokens: layer 0 streams on the prior, layer 1 by layer 0's routing
    of the same tokens; with nothing hidden (stream_hide 0) only full coverage streams."""
    pack = make_test_pack("tiny", "Q8_0")
    ids = _prompt(pack, 1100, 6)
    for hide, walk1 in ((STREAM_HIDE_KB, "streamed"), (0, None)):
        eng = _engine(pack, expert_cache=5, ring=8, stream_hide=hide)
        Session(eng, chunk=1100, progress=False).run(ids, greedy=0)
        (unit,) = eng.walk_choices
        l0, l1 = unit.layers
        assert l0.basis == "prior" and l0.streams
        assert l1.basis == "layer 0" and l1.coverage == pytest.approx(unit.routed[0] / len(eng.placement.streamed(0)))
        assert l1.walk == (walk1 or ("streamed" if l1.coverage == 1.0 else "staged"))
        assert eng.counters["copy_bytes"] == copied_by_choices(pack, eng)


def test_choose_ahead_queues_a_layer_s_copies_a_layer_earlier_and_keeps_the_bytes(make_test_pack, monkeypatch):
    """The 4-layer small pack, one chunk of 1,100 tokens, a third of the experts cached: after
    layer l has routed, the pass holds the layers up to l + choose_ahead (each streaming: the
    tokens route most of every layer), each chosen from the routing of the layer that many
    before it at most; the first-token logits are the same bytes whatever the reach, and the
    bytes copied are the choices'."""
    pack = make_test_pack("small", "Q8_0")
    ids = _prompt(pack, 1100, 8)
    chosen_after = []
    real = CopySchedule.layer_pass

    def spy(self, layer, tab):
        out = real(self, layer, tab)
        chosen_after.append(len(self.layers))
        return out

    monkeypatch.setattr(CopySchedule, "layer_pass", spy)
    logits = {}
    n_layer = pack.config.n_layer
    for reach in (1, 2, 3):
        chosen_after.clear()
        eng = _engine(pack, expert_cache=pack.config.n_layer * pack.config.n_expert // 3, ring=64, choose_ahead=reach)
        logits[reach] = Session(eng, chunk=1100, progress=False).prefill(ids).tobytes()
        (unit,) = eng.walk_choices
        assert all(c.streams for c in unit.layers), unit.line()
        assert chosen_after == [min(n_layer, l + 1 + reach) for l in range(n_layer)]
        for l, c in enumerate(unit.layers[1:], 1):
            assert c.basis == f"layer {max(0, l - reach)}"
        assert eng.counters["copy_bytes"] == copied_by_choices(pack, eng)
    assert logits[1] == logits[2] == logits[3]


def test_a_prompt_of_one_id_stages_after_its_first_chunk(make_test_pack):
    """A prompt of one id routes every token alike (4 of 16 experts a layer): after the first
    chunk each layer reads the last chunk's measure and stages; the same choices on a second run."""
    pack = make_test_pack("tiny", "Q8_0")
    ids = np.full(192, 7, np.int32)
    runs = []
    for _ in range(2):
        eng = _engine(pack, expert_cache=0, ring=8, stream_hide=1)  # 64 KB hidden: c < 0.98 stages
        Session(eng, chunk=64, progress=False).run(ids, greedy=0)
        runs.append(eng.walk_choices)
        assert eng.counters["copy_bytes"] == copied_by_choices(pack, eng)
    assert runs[0] == runs[1]
    first, *rest = runs[0]
    assert first.measured is None and first.routed == (4, 4)
    for c in rest:
        assert c.measured == 64 and c.walk == "staged"
        assert all(lc.basis == "last unit" and lc.coverage == pytest.approx(0.25) for lc in c.layers)


@pytest.mark.parametrize("plan", [("staged", "streamed", "staged"), ("streamed", "staged", "streamed"),
                                  ("staged", "staged", "streamed")])
def test_the_unit_pass_holds_the_layers_in_order(make_test_pack, tmp_path, monkeypatch, plan):
    """Whatever the rule answers and whenever it can answer (here every layer at the unit's
    start, as a measured last unit allows), a unit's pass holds each layer's entries after the
    layer before it: a later layer's copies queued ahead of a staged one's could fill the ring
    with entries no walk can release yet. The reference's bytes, the copies the choices name."""
    from strata_prefill.fast import schedule

    pack = make_test_pack("small", "Q8_0")
    assert pack.config.n_layer >= len(plan)

    def planned(*, layer, **kw):
        return schedule.LayerChoice(plan[layer % len(plan)], "last unit", 0.5)

    monkeypatch.setattr(schedule, "choose_layer", planned)
    ids = _prompt(pack, 80, 3)
    ref = run_engine(ReferenceEngine(pack), ids, 40, tmp_path / "ref", greedy=0)
    eng = _engine(pack, expert_cache=_all(pack) // 3, ring=6)
    got = run_engine(eng, ids, 40, tmp_path / "fast", greedy=0)
    assert_same_run(ref, got, pack, f"planned walks {plan}")
    layers = [l for l, _ in eng.schedule.ring_pass.entries]
    assert layers == sorted(layers)
    assert eng.counters["copy_bytes"] == copied_by_choices(pack, eng)


def _all(pack) -> int:
    return pack.config.n_layer * pack.config.n_expert


def test_auto_window_is_one_unit(make_test_pack, tmp_path):
    """A layer-major window is one unit of the rule: one record per window, from the window's
    tokens, and the reference's bytes."""
    pack = make_test_pack("tiny", "Q8_0")
    ids = _prompt(pack, 100, 9)
    ref = run_engine(ReferenceEngine(pack), ids, 20, tmp_path / "ref", greedy=2)
    eng = _engine(pack, expert_cache=3, ring=8, window=60)
    got = run_engine(eng, ids, 20, tmp_path / "fast", greedy=2)
    assert_same_run(ref, got, pack, "stream_min auto, window 60")
    assert [c.tokens for c in eng.walk_choices] == [60, 40, 1]
    assert [c.walk for c in eng.walk_choices] == ["staged", "streamed", "staged"]


def test_timing_prints_each_unit_s_walk(make_test_pack, capsys):
    from strata_prefill.cli import main

    pack = make_test_pack("tiny", "Q8_0")
    argv = ["run", "--pack", str(pack.path), "--impl", "fast", "--backend", "sim", "--expert-cache", "4",
            "--ring", "8", "--prompt-tokens", "40", "--prefill", "20", "--greedy", "0", "--no-progress", "--timing",
            "--window", "off"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("walk ")]
    assert len(lines) == 2, out
    assert "L0-1 staged (no routing of the layer measured yet, 20 tokens < 1024; the first" in lines[0]
    assert "from the last 20 tokens' routing" in lines[1]
    assert main(argv + ["--stream-min", "30"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("walk ")]
    assert lines and all("staged: 20 tokens < stream_min 30; the first" in line for line in lines)
    assert main(argv + ["--stream-min", "30", "--stage-head", "0"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("walk ")]
    assert lines and all("staged: 20 tokens < stream_min 30 (" in line for line in lines)


@pytest.mark.parametrize("case", [c for c in parity_rows("sim") if dict(c.arm).get("stream_min") == AUTO],
                         ids=lambda c: c.name)
def test_auto_parity_rows_take_both_walks(case, make_test_pack):
    """Each sim parity row of stream_min auto (verify/cases.py) streams some layers and stages
    others, so the gate's bytes cover both of the rule's answers."""
    pack = make_test_pack(case.preset, case.expert_type, **dict(case.pack_options))
    eng = _engine(pack, **case.options)
    Session(eng, chunk=case.chunk, progress=False).run(case.prompt_ids(pack.config.n_vocab), greedy=case.greedy)
    walks = {lc.walk for c in eng.walk_choices for lc in c.layers}
    assert walks == {"streamed", "staged"}, [c.line() for c in eng.walk_choices]


def test_stream_hide_is_a_switch():
    from strata_prefill.contract.errors import InputError

    assert resolve({}).stream_hide == STREAM_HIDE_KB
    assert resolve({}, environ={"STRATA_PREFILL_STREAM_HIDE": "0"}).stream_hide == 0
    with pytest.raises(InputError, match="stream.hide"):
        resolve({"stream_hide": -1})
    # more hidden per token streams more: a layer staged at 55 KB a token streams at 220
    c = _layer(4096, layer=1, routed=[200, None], hide=55_000)
    assert not c.streams and _layer(4096, layer=1, routed=[200, None], hide=220_000).streams


# ---- a staged layer's head (stage_head): copied before its routing ------------------------
def test_stage_head_sizes():
    from strata_prefill.fast.schedule import stage_head
    from strata_prefill.fast.tuning import COPY_BYTES_PER_S, STAGE_GAP_PER_TOKEN_S, STAGE_GAP_S

    blob = 2_690_000  # the strata pack's IQ2_XS blob (gate, up, down)
    kw = dict(blob_bytes=blob, n_streamed=341, k_used=10, n_expert=512)
    assert stage_head(n_tok=1030, setting=0, **kw) == 0
    assert stage_head(n_tok=1030, setting=7, **kw) == 7
    assert stage_head(n_tok=1030, setting=10_000, **kw) == 341  # at most every streamed expert
    gap = STAGE_GAP_S + 1030 * STAGE_GAP_PER_TOKEN_S
    assert stage_head(n_tok=1030, setting=AUTO, **kw) == int(gap * COPY_BYTES_PER_S
                                                             * expected_coverage(1030, 10, 512) // blob)
    autos = [stage_head(n_tok=n, setting=AUTO, **kw) for n in (1, 8, 64, 254, 1030, 4096, 50_000)]
    assert autos == sorted(autos) and autos[-1] == 341  # more tokens, a longer gap and more of it routed
    assert autos[0] == 0  # a greedy step routes 2% of the experts: no head worth its copies
    assert 12 <= stage_head(n_tok=254, setting=AUTO, **kw) <= 18  # about 0.8 ms of the link
    assert stage_head(n_tok=1030, setting=AUTO, **{**kw, "n_streamed": 0}) == 0
    assert resolve({}).stage_head == AUTO
    assert resolve({}, environ={"STRATA_PREFILL_STAGE_HEAD": "5"}).stage_head == 5


def _head_engine(pack, log, monkeypatch, **kw):
    """A sim engine that notes, as each layer's routing reaches the host, the entries the unit
    pass then holds for that layer."""
    real = CopySchedule.layer_pass

    def layer_pass(self, layer, tab):
        if self.ring_pass is not None:
            log.append((layer, [e for l, e in self.ring_pass.entries if l == layer]))
        return real(self, layer, tab)

    monkeypatch.setattr(CopySchedule, "layer_pass", layer_pass)
    return _engine(pack, **kw)


def _head_run(make_test_pack, tmp_path, monkeypatch, make_engine, what, **kw):
    """The small Q8_0 pack's 40-token prompt in chunks of 20 through `make_engine` (_head_engine
    or _predict_engine: a third of the experts cached, a ring of 16, stream_min 1024, and kw),
    checked for the reference's bytes and for copies of what its choices name, no more.
    Returns (pack, engine, log)."""
    pack = make_test_pack("small", "Q8_0")
    ids = _prompt(pack, 40, 8)
    ref = run_engine(ReferenceEngine(pack), ids, 20, tmp_path / "ref", greedy=0)
    log = []
    eng = make_engine(pack, log, monkeypatch, expert_cache=_all(pack) // 3, ring=16, stream_min=1024, **kw)
    got = run_engine(eng, ids, 20, tmp_path / "fast", greedy=0)
    assert_same_run(ref, got, pack, what)
    assert eng.counters["copy_bytes"] == copied_by_choices(pack, eng)
    return pack, eng, log


@pytest.mark.parametrize("head", [0, 1, 3, 64])  # 64: a layer's every expert, more than it streams
def test_a_staged_layers_head_is_queued_before_its_routing(make_test_pack, tmp_path, monkeypatch, head):
    """stage_head N: when a staged layer's routing reaches the host its pass already holds its
    first N streamed experts (a head of more is every one), right behind the layer before's
    entries; its routed ones past the head join after. The reference's bytes; the copies are
    the head and the routed ones past it, no more."""
    pack, eng, log = _head_run(make_test_pack, tmp_path, monkeypatch, _head_engine, f"stage_head {head}",
                               stage_head=head)
    units = eng.walk_choices
    assert len(units) == 2 and all(c.walk == "staged" for u in units for c in u.layers)
    n_layer = pack.config.n_layer
    assert len(log) == 2 * n_layer
    for i, (layer, before) in enumerate(log):
        streamed = [int(e) for e in eng.placement.streamed(layer)]
        assert before == streamed[:head], (layer, before)
        assert units[i // n_layer].layers[layer].head == min(head, len(streamed))
    layers = [l for l, _ in eng.schedule.ring_pass.entries]
    assert layers == sorted(layers)  # the last unit's pass: every layer's entries after the layer before's
    for layer in range(n_layer):
        mine = [e for l, e in eng.schedule.ring_pass.entries if l == layer]
        assert mine == sorted(mine)  # head then the routed ones past it: ascending ids


def test_a_head_costs_link_time_only(make_test_pack, tmp_path):
    """A head of every streamed expert copies what the streamed walk copies, a head of none what
    the earlier staged walk copies; one in between lies between them; the same bytes each time."""
    pack = make_test_pack("small", "IQ2_XS")
    ids = _prompt(pack, 48, 9)
    ref = run_engine(ReferenceEngine(pack), ids, 48, tmp_path / "ref", greedy=0)
    copied = {}
    for name, kw in (("none", dict(stage_head=0)), ("some", dict(stage_head=5)), ("all", dict(stage_head=64)),
                     ("streamed", dict(stream_min=1))):
        eng = _engine(pack, expert_cache=_all(pack) // 3, ring=16, **kw)
        got = run_engine(eng, ids, 48, tmp_path / name, greedy=0)
        assert_same_run(ref, got, pack, name)
        copied[name] = eng.counters["copy_bytes"]
        assert copied[name] == copied_by_choices(pack, eng)
    assert copied["none"] < copied["some"] < copied["all"] == copied["streamed"]


def test_no_head_through_the_staging_ring(make_test_pack, monkeypatch):
    """stage_in_ring 0: a staged layer's pass is its own, of its routed experts only, so a head
    does nothing there: the switch table's rule refuses one (fast/options.py), and with the rule
    set aside none is taken."""
    from strata_prefill.fast import options
    from strata_prefill.contract.errors import InputError

    pack = make_test_pack("small", "Q8_0")
    kw = dict(expert_cache=_all(pack) // 3, ring=16, stage_in_ring=0, stage_head=4, stream_min=1024)
    with pytest.raises(InputError, match="^--stage-head 4 needs --stage-in-ring 1: --stage-in-ring is 0: it does nothing$"):
        _engine(pack, **kw)
    monkeypatch.setattr(options, "refuse_idle", lambda *a, **k: None)
    eng = _engine(pack, **kw)
    Session(eng, chunk=20, progress=False).run(_prompt(pack, 40, 8), greedy=0)
    assert all(c.walk == "staged" and c.head == 0 for u in eng.walk_choices for c in u.layers)
    assert eng.counters["copy_bytes"] == copied_by_choices(pack, eng)


# ---- a head chosen by the predicted routing (head_predict) ---------------------------------
def test_predicted_head_takes_the_most_named_streamed_experts():
    cnt = np.zeros(16, np.int32)
    cnt[[1, 3, 5, 9, 12, 15]] = [4, 9, 9, 1, 7, 2]
    streamed = np.array([0, 1, 3, 5, 6, 9, 12, 15])
    assert predicted_head(cnt, streamed, 3) == [3, 5, 12]  # 9, 9, 7: ascending, the order they are queued
    assert predicted_head(cnt, streamed, 2) == [3, 5]  # a tie goes to the lower id
    assert predicted_head(cnt, np.array([0, 3, 12, 15]), 2) == [3, 12]  # only streamed experts
    assert predicted_head(cnt, streamed, 100) == [1, 3, 5, 9, 12, 15]  # only named ones: never 0 or 6
    assert predicted_head(cnt, streamed, 0) == []
    assert predicted_head(np.zeros(16, np.int32), streamed, 4) == []


def test_visit_order_meets_the_entries_in_pass_order():
    from strata_prefill.fast.walk import visit_order

    streamed = [1, 2, 4, 6, 7, 9]
    assert visit_order([4, 9], [], streamed) == [4, 9]
    assert visit_order([2, 4, 9], [1, 2], streamed) == [1, 2, 4, 9]  # a head of the lowest ids: by id
    assert visit_order([0, 2, 5, 9], [1, 2], streamed) == [0, 1, 2, 5, 9]  # in_place 0: resident ones among them
    assert visit_order([2, 4, 9], [6, 9], streamed) == [6, 9, 2, 4]  # predicted: the head, then the routed rest


def test_runs_are_cut_where_ids_fall():
    from strata_prefill.fast.walk import plan_runs

    visit = [6, 9, 2, 4, 7]
    entry_of = {e: k for k, e in enumerate(visit)}
    runs = plan_runs(visit, {6, 9, 2, 4, 7}, entry_of, n_slots=16, cap=64)
    assert runs == [[6, 9], [2, 4, 7]]
    assert plan_runs(visit, {9, 2}, entry_of, n_slots=16, cap=64) == [[9], [2]]
    assert plan_runs([1, 2, 3], {1, 2, 3}, {1: 0, 2: 1, 3: 2}, n_slots=16, cap=64) == [[1, 2, 3]]


def test_head_predict_needs_the_ring_walk(make_test_pack):
    from strata_prefill.contract.errors import InputError

    pack = make_test_pack("tiny", "Q8_0")
    for kw in (dict(ring_in_place=0), dict(in_place=0, ring_in_place=0), dict(stage_in_ring=0)):
        with pytest.raises(InputError, match="--head-predict 1 needs"):
            _engine(pack, expert_cache=4, head_predict=1, **kw)


def _predict_engine(pack, log, monkeypatch, counts=None, **kw):
    """_head_engine with head_predict, whose log also gets ("predicted", layer, counts) for each
    prediction the host reads; `counts(layer, cnt)`, where given, replaces what the predictor
    named for `layer` (a planted prediction)."""
    eng = _head_engine(pack, log, monkeypatch, head_predict=1, **kw)
    real_counts, real_predict = eng.be.expert_counts, eng._predict_next
    now = {}

    def predict_next(layer, x):
        now["layer"] = layer + 1
        real_predict(layer, x)

    def expert_counts(ids, n_expert):
        got, layer = real_counts(ids, n_expert), now["layer"]

        class Read:
            @property
            def cnt(self):
                c = np.asarray(got.cnt).copy()
                c = c if counts is None else counts(layer, c)
                log.append(("predicted", layer, c))
                return c
        return Read()

    eng._predict_next, eng.be.expert_counts = predict_next, expert_counts
    return eng


@pytest.mark.parametrize("head", [1, 3, 64])
def test_a_predicted_head_is_queued_before_its_routing(make_test_pack, tmp_path, monkeypatch, head):
    """head_predict: every staged layer after the first of its unit has its head from the
    prediction the host read, the `head` streamed experts it names most often in id order, in
    the pass when its routing reaches the host, its routed rest after; the reference's bytes;
    the copies are the head and the routed ones it lacks, no more."""
    pack, eng, log = _head_run(make_test_pack, tmp_path, monkeypatch, _predict_engine,
                               f"head_predict, stage_head {head}", stage_head=head)
    predicted = [(l, c) for tag, l, c in (e for e in log if e[0] == "predicted")]
    before = [e for e in log if e[0] != "predicted"]
    n_layer = pack.config.n_layer
    assert [l for l, _ in predicted] == list(range(1, n_layer)) * 2  # every layer but a unit's first
    for i, (layer, entries) in enumerate(before):
        streamed = eng.placement.streamed(layer)
        choice = eng.walk_choices[i // n_layer].layers[layer]
        if layer == 0:
            assert entries == [int(e) for e in streamed[:head]] and not choice.predicted
        else:
            cnt = predicted[(i // n_layer) * (n_layer - 1) + layer - 1][1]
            assert entries == predicted_head(cnt, streamed, head) and choice.predicted
        assert choice.head == len(entries)


def test_a_planted_head_of_the_highest_ids_keeps_the_bytes(make_test_pack, tmp_path, monkeypatch):
    """A prediction planted to name the highest streamed ids (and experts no token routes): the
    routed rest then all lie below the head, so the ids fall where it ends and the runs are cut
    there; the reference's bytes, the copies the records say, every head entry where planted."""
    pack = make_test_pack("small", "IQ2_XS")
    ids = _prompt(pack, 48, 9)
    ref = run_engine(ReferenceEngine(pack), ids, 48, tmp_path / "ref", greedy=0)
    E = pack.config.n_expert

    def highest(layer, cnt):
        return np.arange(E, dtype=np.int32)  # the higher the id, the more it is named

    log = []
    eng = _predict_engine(pack, log, monkeypatch, counts=highest, expert_cache=_all(pack) // 3, ring=8, stage_head=5,
                          stream_min=1024, ring_run=3)
    got = run_engine(eng, ids, 48, tmp_path / "fast", greedy=0)
    assert_same_run(ref, got, pack, "a planted head")
    assert eng.counters["copy_bytes"] == copied_by_choices(pack, eng)
    for layer, entries in (e for e in log if e[0] != "predicted"):
        if layer:
            assert entries == [int(e) for e in eng.placement.streamed(layer)[-5:]]
    u = eng.walk_choices[0]
    assert all(u.in_head[l] <= u.layers[l].head for l in range(pack.config.n_layer))


def test_the_timing_line_names_predicted_heads(make_test_pack):
    pack = make_test_pack("small", "Q8_0")
    eng = _engine(pack, expert_cache=_all(pack) // 3, ring=16, stage_head=3, stream_min=1024, head_predict=1)
    Session(eng, chunk=40, progress=False).run(_prompt(pack, 40, 8), greedy=0)
    line = eng.walk_choices[0].line()
    n = pack.config.n_layer
    assert f"3 copied ahead, {n - 1} of {n} heads as the layer before predicted" in line, line


def test_the_predictor_routes_the_units_first_rows(make_test_pack, tmp_path, monkeypatch):
    """The predictor's router takes a unit's first PREDICT_ROWS rows (8 here): every prediction
    the host reads names 8 rows' top-k experts, and the bytes are the reference's."""
    import strata_prefill.fast.engine

    monkeypatch.setattr(strata_prefill.fast.engine, "PREDICT_ROWS", 8)
    pack, eng, log = _head_run(make_test_pack, tmp_path, monkeypatch, _predict_engine, "a predictor of 8 rows",
                               stage_head=4)
    sums = [int(c.sum()) for tag, _l, c in (e for e in log if e[0] == "predicted")]
    assert sums and all(s == 8 * pack.config.n_expert_used for s in sums), sums


def test_cuda_routing_and_prediction_counts_use_their_own_buffers(monkeypatch):
    """The cuda backend's routing_tables and expert_counts with stand-ins for PyCUDA and the
    launch: each reader's counts land in a page-locked buffer of its own, so a prediction read
    late never sees the routing's counts (or the other way round); a reader's next launch
    resolves its last DevTables before the buffer is rewritten; a resolved DevTables keeps its
    own copy."""
    import sys
    import types

    from strata_prefill.fast.cuda import backend as cb

    fake = types.ModuleType("pycuda.driver")
    copies = []

    class Event:
        def __init__(self, flags=None):
            self.waited = 0

        def record(self, stream):
            pass

        def synchronize(self):
            self.waited += 1

    fake.Event = Event
    fake.event_flags = types.SimpleNamespace(DISABLE_TIMING=2)
    fake.pagelocked_zeros = lambda shape, dtype: np.zeros(shape, dtype)

    def memcpy_dtoh_async(dst, src, stream):
        dst[...] = src
        copies.append(dst)

    fake.memcpy_dtoh_async = memcpy_dtoh_async
    pkg = types.ModuleType("pycuda")
    pkg.driver = fake
    monkeypatch.setitem(sys.modules, "pycuda", pkg)
    monkeypatch.setitem(sys.modules, "pycuda.driver", fake)

    def routing_tables(dev, ids, n_expert):
        cnt = np.bincount(np.asarray(ids).ravel(), minlength=n_expert).astype(np.int32)
        off = (np.cumsum(cnt) - cnt).astype(np.int32)
        return types.SimpleNamespace(slot=None, src=None, cnt=types.SimpleNamespace(gpudata=cnt),
                                     off=types.SimpleNamespace(gpudata=off))

    monkeypatch.setattr(cb.ops, "routing_tables", routing_tables)

    class Phases:
        def host_phase(self, name):
            import contextlib
            return contextlib.nullcontext()

    be = cb.CudaBackend.__new__(cb.CudaBackend)
    import collections

    be.dev, be.stress, be.phases = types.SimpleNamespace(stream=None, counters=collections.Counter()), None, Phases()
    be._counts_host, be._counts_pending = {}, {}
    routed = be.routing_tables(np.array([[1, 2], [2, 3]]), 6)
    predicted = be.expert_counts(np.array([[5, 5], [4, 5]]), 6)
    assert list(predicted.cnt) == [0, 0, 0, 0, 1, 3] and list(routed.cnt) == [0, 1, 2, 1, 0, 0]
    assert list(routed.off) == [0, 0, 1, 3, 4, 4]
    assert copies[0] is not copies[2]  # two buffers
    again = be.routing_tables(np.array([[0, 0], [0, 0]]), 6)  # rewrites the routing's buffer only
    assert list(routed.cnt) == [0, 1, 2, 1, 0, 0] and list(again.cnt) == [4, 0, 0, 0, 0, 0]
    assert list(predicted.cnt) == [0, 0, 0, 0, 1, 3]
    late = be.expert_counts(np.array([[1, 1], [1, 1]]), 6)
    unread = be.expert_counts(np.array([[2, 2], [2, 2]]), 6)  # resolves `late` before its buffer is reused
    assert late._ready.waited == 1 and list(late.cnt) == [0, 4, 0, 0, 0, 0]
    assert list(unread.cnt) == [0, 0, 4, 0, 0, 0]
    assert be.counters["host_reads"] == 5  # the five tables, each read back once
