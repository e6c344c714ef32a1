"""The walk a chunk (or window) takes, chosen by coverage (issue 26, item 4): fast.walk.choose_walk
on its own (the uniform expectation, the measured coverage scaled to a unit's tokens, monotone in
tokens, a number for stream_min keeping the threshold rule), the engine's choices and the bytes
they copy on the sim, the reference's bytes whatever the rule chose, and the line run --timing
prints for each unit."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from fast import make_fast_engine
from fast.options import AUTO, resolve
from fast.walk import STREAM_COVERAGE, choose_walk, expected_coverage, scaled_coverage
from reference import ReferenceEngine
from strata.constants import STREAM_MIN
from strata.session import Session
from verify.cases import parity_rows
from verify.common import assert_same_run, run_engine


def _choice(n_tok, stream_min=AUTO, k=10, e=512, streamed=(342, 341), blob=(3_600_000, 3_600_000), measured=None):
    return choose_walk(n_tok=n_tok, stream_min=stream_min, k_used=k, n_expert=e, streamed=list(streamed),
                       blob_bytes=list(blob), measured=measured)


# ---- the rule on its own -------------------------------------------------------------------
def test_expected_coverage_is_one_minus_the_miss_chance():
    assert expected_coverage(1, 10, 512) == pytest.approx(10 / 512)
    assert expected_coverage(254, 10, 512) == pytest.approx(1 - (1 - 10 / 512) ** 254)
    assert expected_coverage(0, 10, 512) == 0.0
    assert expected_coverage(3, 16, 16) == 1.0  # every expert routed by every token


def test_scaled_coverage_keeps_the_measure_at_its_own_tokens():
    assert scaled_coverage(0.4, 64, 64) == pytest.approx(0.4)
    assert scaled_coverage(0.4, 64, 128) == pytest.approx(1 - 0.6 ** 2)
    assert scaled_coverage(1.0, 64, 1) == 1.0  # saturated: the uniform bound caps it (choose_walk)
    assert scaled_coverage(0.0, 64, 1000) == 0.0


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 40_000), k=st.integers(1, 16), e=st.integers(16, 512),
       measured_share=st.none() | st.floats(0, 1), n_measured=st.integers(1, 8192))
def test_coverage_rule_is_monotone_in_tokens(n, k, e, measured_share, n_measured):
    """More tokens never expect less coverage, so a unit that streams still streams with more
    tokens; the estimate never passes the uniform expectation."""
    streamed = (e // 2, e // 3)
    measured = None if measured_share is None else (n_measured, [int(measured_share * s) for s in streamed])
    a = _choice(n, k=k, e=e, streamed=streamed, blob=(1000, 3000), measured=measured)
    b = _choice(n + 1 + n // 3, k=k, e=e, streamed=streamed, blob=(1000, 3000), measured=measured)
    assert a.coverage <= b.coverage + 1e-12
    assert not a.streams or b.streams
    assert a.coverage <= expected_coverage(n, k, e) + 1e-12
    assert a.streams == (a.coverage >= STREAM_COVERAGE)
    assert a.staged_bytes <= a.streamed_bytes


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 40_000), stream_min=st.integers(1, 40_000))
def test_a_number_keeps_the_threshold_rule(n, stream_min):
    """stream_min N: streamed from N tokens, staged below, whatever the coverage would say."""
    c = _choice(n, stream_min=stream_min, measured=(64, [1, 1]))
    assert c.rule == "threshold" and c.coverage is None
    assert c.streams == (n >= stream_min)


def test_uniform_expectation_at_the_lead_s_lengths():
    """The 2-layer strata pack with a third of its experts cached (683 streamed of 1,024; top-10
    of 512): 254 tokens expect nearly all of them, one token about 2%."""
    c = _choice(254)
    assert c.streams and c.coverage > 0.99 and c.measured is None
    assert "streamed: coverage 0.993 >= 0.50 of 683 streamed experts" in c.line()
    assert not _choice(1).streams
    # the threshold rule stages the same 254 tokens
    assert not _choice(254, stream_min=STREAM_MIN).streams
    assert _choice(254, stream_min=STREAM_MIN).line().startswith("staged: 254 tokens < stream_min 1024")


def test_measured_coverage_can_stage_what_uniform_routing_would_stream():
    """A routing that keeps to few experts: the measure of the last unit, not the uniform
    expectation, decides."""
    few = (64, [20, 20])  # 64 tokens reached 20 of each layer's ~340 streamed experts
    c = _choice(64, measured=few)
    assert not c.streams and c.coverage == pytest.approx(20 / 342 * 0.5 + 20 / 341 * 0.5, rel=1e-3)
    assert "measured on the last 64 tokens" in c.line()
    assert _choice(64).streams


def test_nothing_streamed_is_resident():
    c = _choice(5000, streamed=(0, 0))
    assert c.walk == "resident" and not c.streams
    assert c.line().startswith("resident")


def test_auto_is_a_value_of_stream_min_and_the_default_is_the_threshold():
    assert resolve({}).stream_min == STREAM_MIN
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
    stage, exactly as before the coverage rule."""
    pack = make_test_pack("tiny", "Q8_0")
    eng = _engine(pack, expert_cache=4, ring=8, stream_min=stream_min)
    Session(eng, chunk=32, progress=False).run(_prompt(pack, 70), greedy=0)
    assert [c.walk for c in eng.walk_choices] == walks
    assert all(c.rule == "threshold" for c in eng.walk_choices)
    n_streamed = walks.count("streamed")
    if n_streamed == 3:
        assert eng.counters["copy_bytes"] == 3 * _streamed_bytes(pack, eng)
    else:  # the staged chunks copy only routed experts: less than a pass each
        assert n_streamed * _streamed_bytes(pack, eng) < eng.counters["copy_bytes"] < 3 * _streamed_bytes(pack, eng)


def test_engine_auto_streams_long_chunks_and_stages_greedy_steps(make_test_pack, tmp_path):
    """auto on the tiny pack (top-4 of 16): the prompt's chunks stream, the one-token greedy
    steps stage (measured coverage scaled to one token, at most 4/16); the reference's bytes."""
    pack = make_test_pack("tiny", "IQ2_XS")
    ids = _prompt(pack, 70, 5)
    ref = run_engine(ReferenceEngine(pack), ids, 32, tmp_path / "ref", greedy=2)
    eng = _engine(pack, expert_cache=5, ring=8, stream_min="auto")
    got = run_engine(eng, ids, 32, tmp_path / "fast", greedy=2)
    assert_same_run(ref, got, pack, "stream_min auto")
    walks = [c.walk for c in eng.walk_choices]
    assert walks[:3] == ["streamed"] * 3 and walks[3:] and set(walks[3:]) == {"staged"}
    assert eng.walk_choices[0].measured is None
    assert [c.measured for c in eng.walk_choices[1:3]] == [32, 32]
    assert all(c.coverage < STREAM_COVERAGE for c in eng.walk_choices[3:])


def test_engine_auto_reads_the_last_unit_s_routing(make_test_pack):
    """A prompt of three ids routes few experts: the first chunk streams on the uniform
    expectation, the next ones see the measure, and the choice is the same on a second run."""
    pack = make_test_pack("tiny", "Q8_0")
    ids = _prompt(pack, 192, 2, few=True)
    runs = []
    for _ in range(2):
        eng = _engine(pack, expert_cache=0, ring=8, stream_min="auto")
        Session(eng, chunk=64, progress=False).run(ids, greedy=0)
        runs.append(eng.walk_choices)
    assert runs[0] == runs[1]
    first, *rest = runs[0]
    assert first.measured is None and first.coverage == pytest.approx(expected_coverage(64, 4, 16))
    n_streamed = pack.config.n_layer * pack.config.n_expert
    for c in rest:
        assert c.measured == 64 and c.coverage < first.coverage
        assert c.n_streamed == n_streamed


def test_auto_window_is_one_unit(make_test_pack, tmp_path):
    """A layer-major window is one unit of the rule: one choice per window, from the window's
    tokens, and the reference's bytes."""
    pack = make_test_pack("tiny", "Q8_0")
    ids = _prompt(pack, 100, 9)
    ref = run_engine(ReferenceEngine(pack), ids, 20, tmp_path / "ref", greedy=2)
    eng = _engine(pack, expert_cache=3, ring=8, stream_min="auto", window=60)
    got = run_engine(eng, ids, 20, tmp_path / "fast", greedy=2)
    assert_same_run(ref, got, pack, "stream_min auto, window 60")
    assert [c.tokens for c in eng.walk_choices] == [60, 40, 1]
    assert [c.walk for c in eng.walk_choices] == ["streamed", "streamed", "staged"]


def test_timing_prints_each_unit_s_walk(make_test_pack, capsys):
    from strata_prefill.cli import main

    pack = make_test_pack("tiny", "Q8_0")
    argv = ["run", "--pack", str(pack.path), "--impl", "fast", "--backend", "sim", "--expert-cache", "4",
            "--ring", "8", "--prompt-tokens", "40", "--prefill", "20", "--greedy", "0", "--no-progress", "--timing",
            "--window", "off"]
    assert main(argv + ["--stream-min", "auto"]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("walk ")]
    assert len(lines) == 2, out
    assert "streamed: coverage" in lines[0] and "uniform top-k" in lines[0]
    assert "measured on the last 20 tokens" in lines[1]
    assert main(argv + ["--stream-min", "30"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("walk ")]
    assert lines and all("staged: 20 tokens < stream_min 30" in line for line in lines)


@pytest.mark.parametrize("case", [c for c in parity_rows("sim") if dict(c.arm).get("stream_min") == AUTO],
                         ids=lambda c: c.name)
def test_auto_parity_rows_take_both_walks(case, make_test_pack):
    """Each sim parity row of stream_min auto (verify/cases.py) streams some units and stages
    others, so the gate's bytes cover both of the rule's answers."""
    pack = make_test_pack(case.preset, case.expert_type, **dict(case.pack_options))
    eng = _engine(pack, **case.options)
    Session(eng, chunk=case.chunk, progress=False).run(case.prompt_ids(pack.config.n_vocab), greedy=case.greedy)
    walks = {c.walk for c in eng.walk_choices}
    assert walks == {"streamed", "staged"}, [c.line() for c in eng.walk_choices]
