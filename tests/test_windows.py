"""Layer-major windows (the `window` switch) on the sim backend: a window's chunks run layer by
layer, attention per chunk and the MoE half once over the window, and give the reference's bytes
(every record, the residual dump, the logits and greedy tokens) while copying each streamed
expert once per (window, layer); the switch's refusals; `auto`'s sizing."""
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from strata_prefill.fast import make_fast_engine
from strata_prefill.fast.engine import window_bytes_per_token
from strata_prefill.fast.sim import SIM_WINDOW_BUDGET, SimBackend
from strata_prefill.fast.sim_streams import POLICIES
from strata_prefill.reference import ReferenceEngine
from switch_needs import settled
from strata_prefill.contract.errors import InputError
from strata_prefill.formats.records import q8_layouts
from strata_prefill.report import compare_timelines
from strata_prefill.session import Session
from strata_prefill.verify.common import assert_same_run, copied_by_choices, run_engine


def _prompt(pack, n, seed):
    return np.random.default_rng(seed).integers(0, pack.config.n_vocab, n).astype(np.int32)


def _fast(pack, sched=0, policy="random", **kw):
    return make_fast_engine(pack, "sim", sim_options=dict(schedule_seed=sched, policy=policy), **kw)


def _streamed_bytes(pack, engine) -> int:
    """The bytes of every streamed expert of every layer: what one streamed-walk pass copies."""
    p = engine.placement
    return sum(sum(pack.expert_blob_bytes(l)[:1]) * 2 + pack.expert_blob_bytes(l)[1]
               for l in range(pack.config.n_layer) for _ in p.streamed(l))


# ---- hypothesis: every window, chunk, ring, cache and gather mode gives the reference's bytes --
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n_tok=st.integers(2, 80), seed=st.integers(0, 2**16), chunk=st.integers(1, 24),
       per_window=st.integers(2, 6), extra=st.integers(0, 23), ring=st.sampled_from([1, 2, 3, 8, 16, 96]),
       cache=st.integers(0, 32), stream_min=st.sampled_from([1, 40, 1024, "auto"]), gg=st.booleans(),
       in_place=st.booleans(), coalesce=st.booleans(), policy=st.sampled_from(POLICIES),
       sched=st.integers(0, 2**16), head=st.sampled_from([0, 2, "auto"]))
def test_windows_same_bytes_fewer_copies(make_test_pack, tmp_path_factory, n_tok, seed, chunk, per_window, extra,
                                         ring, cache, stream_min, gg, in_place, coalesce, policy, sched, head):
    pack = make_test_pack("tiny", "IQ2_XS")
    ids = _prompt(pack, n_tok, seed)
    window = per_window * chunk + min(extra, chunk - 1)  # not a multiple: rounded down to whole chunks
    out = tmp_path_factory.mktemp("w")
    kw = settled(pack, ring=ring, expert_cache=cache, stream_min=stream_min, group_gather=gg, in_place=in_place,
                 copy_coalesce=coalesce, stage_head=head)
    what = f"window {window} chunk {chunk} ring {ring} cache {cache} stream_min {stream_min} gg {gg} head {head}"
    ref = run_engine(ReferenceEngine(pack), ids, chunk, out / "ref", greedy=1)
    flat = _fast(pack, sched, policy, window="off", **kw)
    got_flat = run_engine(flat, ids, chunk, out / "flat", greedy=1, layer_dumps=False)
    eng = _fast(pack, sched, policy, window=window, **kw)
    got = run_engine(eng, ids, chunk, out / "win", greedy=1)
    assert_same_run(ref, got, pack, what)
    assert got.residuals == got_flat.residuals

    # bytes copied, the one greedy step (a one-token chunk, the same in both) included: where
    # chunks and windows take the same walk (every one streamed, or every one staged) a window
    # copies no more, and in the streamed walk each window copies every streamed expert once
    b_win, b_flat = eng.counters["copy_bytes"], flat.counters["copy_bytes"]
    assert (b_win, b_flat) == (copied_by_choices(pack, eng), copied_by_choices(pack, flat)), what
    # 1024: more than any prompt here, every chunk and window stages; a head of N experts a layer
    # costs a window no more than each of its chunks (auto sizes a window's head by its tokens)
    if stream_min == 1 or (stream_min == 1024 and head != "auto"):
        assert b_win <= b_flat, what
    if stream_min == 1:
        n_windows, n_chunks = -(-n_tok // (per_window * chunk)), -(-n_tok // chunk)
        assert b_flat - b_win == (n_chunks - n_windows) * _streamed_bytes(pack, eng), what


def test_window_one_chunk_is_todays_walk(make_test_pack):
    """A window of one chunk (or up to one chunk less a token) launches, copies and waits exactly
    as no window does."""
    pack = make_test_pack("tiny", "Q8_0")
    ids = _prompt(pack, 70, 3)
    runs = []
    for window in ("off", 16, 31):
        eng = _fast(pack, expert_cache=5, ring=4, stream_min=8, window=window)
        res = Session(eng, chunk=16, progress=False).run(ids, greedy=1)
        runs.append((res.logits.tobytes(), res.greedy, dict(eng.counters), res.window))
    assert runs[0][:3] == runs[1][:3] == runs[2][:3]
    assert [r[3] for r in runs] == [16, 16, 16]


def test_streamed_copies_fall_with_the_number_of_windows(make_test_pack):
    """The streamed walk copies every streamed expert once per window: bytes = windows x pass."""
    pack = make_test_pack("tiny", "Q8_0")
    ids = _prompt(pack, 96, 11)
    got = {}
    for window in ("off", 32, 48, 96):
        eng = _fast(pack, expert_cache=3, ring=8, stream_min=1, window=window)
        Session(eng, chunk=16, progress=False).run(ids, greedy=0)
        got[window] = eng.counters["copy_bytes"]
    streamed = _streamed_bytes(pack, eng)
    assert streamed > 0
    assert got == {"off": 6 * streamed, 32: 3 * streamed, 48: 2 * streamed, 96: streamed}


# ---- refusals ----------------------------------------------------------------------------
@pytest.mark.parametrize("value, message", [
    (0, "--window must be >= 1, got 0"),
    (-8, "--window must be >= 1, got -8"),
    ("many", "--window must be an integer, got 'many'"),
])
def test_bad_window_refused(make_test_pack, value, message):
    pack = make_test_pack("tiny", "Q8_0")
    with pytest.raises(InputError) as err:
        _fast(pack, window=value)
    assert str(err.value) == message


@pytest.mark.parametrize("raw", ["0", "-1", "x", "1.5"])
def test_bad_window_variable_refused(make_test_pack, monkeypatch, raw):
    pack = make_test_pack("tiny", "Q8_0")
    monkeypatch.setenv("STRATA_PREFILL_WINDOW", raw)
    with pytest.raises(InputError) as err:
        _fast(pack)
    assert "STRATA_PREFILL_WINDOW" in str(err.value) and "\n" not in str(err.value)


def test_window_below_the_chunk_refused_before_work(make_test_pack):
    """A window holds whole chunks of the prompt: refused at the start of the prefill, before any
    layer runs, where the prompt's chunk is longer; a prompt shorter than the window takes it."""
    pack = make_test_pack("tiny", "Q8_0")
    eng = _fast(pack, window=15)
    session = Session(eng, chunk=16, progress=False)
    with pytest.raises(InputError) as err:
        session.run(_prompt(pack, 20, 1), greedy=0)
    assert str(err.value) == ("--window 15 is less than the chunk (16 tokens, --prefill): a window holds "
                              "whole chunks")
    assert eng.counters["launches"] == 0
    res = Session(eng, chunk=16, progress=False).run(_prompt(pack, 12, 1), greedy=0)  # one chunk of 12: taken
    assert res.window == 16 and eng.window_reason == "--window 15: 1 whole chunk(s)"


# ---- auto ----------------------------------------------------------------------------------
def test_auto_window_from_the_budget(make_test_pack, monkeypatch):
    pack = make_test_pack("tiny", "Q8_0")
    eng = _fast(pack, window="auto", expert_cache=5)
    per = window_bytes_per_token(pack.config)
    assert per > 0
    assert eng.window_tokens(16, 1000) == 16 * min(SIM_WINDOW_BUDGET // (per * 16), 63)
    monkeypatch.setattr(SimBackend, "window_budget_bytes", staticmethod(lambda: per * 16 * 3 + per))
    assert eng.window_tokens(16, 1000) == 48  # three whole chunks fit
    assert eng.window_tokens(16, 20) == 32  # at most the prompt's chunks
    monkeypatch.setattr(SimBackend, "window_budget_bytes", staticmethod(lambda: per))
    assert eng.window_tokens(16, 1000) == 16  # never less than one chunk


def test_auto_is_the_default_and_one_chunk_where_nothing_streams(make_test_pack):
    """No window asked: auto. Every expert resident (the sim's default cache), a window would save
    no copy, so a chunk is a window; with experts streaming, the whole prompt fits the budget."""
    pack = make_test_pack("tiny", "Q8_0")
    resident, streaming = _fast(pack), _fast(pack, expert_cache=5)
    assert resident.options.window == "auto" and resident.placement.n_streamed == 0
    assert resident.window_tokens(16, 1000) == 16
    assert streaming.window_tokens(16, 100) == 112
    assert _fast(pack, expert_cache=5, window="off").window_tokens(16, 100) == 16


def test_auto_window_same_bytes(make_test_pack, tmp_path):
    pack = make_test_pack("tiny", "Q8_0")
    ids = _prompt(pack, 50, 9)
    ref = run_engine(ReferenceEngine(pack), ids, 8, tmp_path / "ref", greedy=2)
    eng = _fast(pack, window="auto", expert_cache=7, ring=3, stream_min=1)
    got = run_engine(eng, ids, 8, tmp_path / "fast", greedy=2)
    assert_same_run(ref, got, pack, "window auto")
    s = Session(_fast(pack, window="auto", expert_cache=7), chunk=8, progress=False)
    assert s.run(ids).window == 56  # the sim's budget holds the whole prompt: one window
    # the other way round too: the windowed run's one header lines up with the reference's chunks
    assert compare_timelines(got.timeline, ref.timeline, q8_layouts(pack), pack.config.n_expert_used) is None


def test_a_window_out_of_order_is_caught(make_test_pack, tmp_path, monkeypatch):
    """The comparison sees a window whose chunks' rows are joined in the wrong order."""
    pack = make_test_pack("tiny", "Q8_0")
    ids = _prompt(pack, 40, 4)
    ref = run_engine(ReferenceEngine(pack), ids, 8, tmp_path / "ref", greedy=0)
    join = SimBackend.join_rows
    monkeypatch.setattr(SimBackend, "join_rows", lambda self, x, parts: join(self, x, parts[::-1]))
    got = run_engine(_fast(pack, window=16), ids, 8, tmp_path / "fast", greedy=0)
    miss = compare_timelines(ref.timeline, got.timeline, q8_layouts(pack), pack.config.n_expert_used)
    assert miss is not None and miss.record == "L00.ffn_norm", miss


# ---- the command line ---------------------------------------------------------------------
def test_run_prints_the_window_it_took(make_test_pack, capsys):
    from strata_prefill.cli import main

    pack = make_test_pack("tiny", "Q8_0")
    base = ["run", "--pack", str(pack.path), "--prompt-tokens", "70", "--prefill", "16", "--greedy", "2",
            "--no-progress", "--impl", "fast", "--backend", "sim", "--expert-cache", "5"]
    assert main(base + ["--window", "off"]) == 0
    flat = capsys.readouterr().out
    assert "window " not in flat  # one chunk a window: the output without windows
    assert main(base + ["--window", "40"]) == 0
    out = capsys.readouterr().out
    assert "window    32 tokens (2 chunk(s) a window, 3 window(s); --window 40: 2 whole chunk(s))" in out
    assert main(base) == 0  # the default: auto
    auto = capsys.readouterr().out
    line = next(l for l in auto.splitlines() if l.startswith("window "))
    assert re.fullmatch(r"window    80 tokens \(5 chunk\(s\) a window, 1 window\(s\); --window auto: experts stream; "
                        r"the buffers of [\d,]+ chunk\(s\) \([\d,]+ MiB a chunk\) fit in [\d,.]+ GiB, the prompt "
                        r"has 5\)", line), line
    assert main(base + ["--window", "40", "--explain"]) == 0
    explained = capsys.readouterr()
    assert "  window    the tokens of each layer-major window" in explained.err
    assert "  window " not in flat  # explained only where printed (tests/test_progress.py)
    pick = [line for line in flat.splitlines() if line.startswith(("next", "greedy"))]
    for text in (out, auto):
        assert [line for line in text.splitlines() if line.startswith(("next", "greedy"))] == pick


@pytest.mark.parametrize("args, message", [
    (["--window", "0"], "--window: must be"),
    (["--window", "-3"], "--window: must be"),
    (["--window", "big"], "--window: must be"),
    (["--window", "8", "--prefill", "16"], "--window 8 is less than the chunk (16 tokens, --prefill)"),
])
def test_run_refuses_bad_windows_in_one_line(make_test_pack, capsys, args, message):
    from strata_prefill.cli import main

    pack = make_test_pack("tiny", "Q8_0")
    try:  # argparse's refusals exit, the engine's are a return code
        code = main(["run", "--pack", str(pack.path), "--prompt-tokens", "20", "--no-progress", "--impl", "fast",
                     "--backend", "sim", *args])
    except SystemExit as exit_:
        code = exit_.code
    assert code not in (0, None)
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
