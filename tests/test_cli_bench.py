"""`strata-prefill bench` on the sim backend: the table, the JSON, the logits check, the counts
each arm must show, and one-line errors for bad arms before any work."""
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strata_prefill.fast import options
from strata_prefill import arms
from strata_prefill.cli import main
from strata_prefill.commands import bench, run

SHORT = ["--backend", "sim", "--tokens", "40,70", "--reps", "2"]
COLUMNS = "| prompt tokens | arm A ms | arm B ms | change | launches A/B | waits A/B | events A/B | bytes A/B |"


def bench_run(pack, tmp_path, *extra):
    """(exit status, JSON file) of a short bench on the sim."""
    out = tmp_path / "out.json"
    return main(["bench", "--pack", str(pack.path), *SHORT, "--json", str(out), *extra]), out


def test_table_rows_columns_and_json_hold_every_rep(make_test_pack, tmp_path, capsys):
    pack = make_test_pack("tiny", "Q4_1")
    md = tmp_path / "ab.md"
    assert main(["bench", "--pack", str(pack.path), *SHORT, "--a", "default", "--b", "default",
                 "--markdown", str(md)]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert COLUMNS in lines
    rows = [ln for ln in lines if ln.startswith("| 40 |") or ln.startswith("| 70 |")]
    assert len(rows) == 2 and all(r.count("|") == COLUMNS.count("|") for r in rows)
    assert "host perf_counter" in out
    assert "logits: identical bytes in all 4 prompt pairs" in lines
    progress = [ln for ln in err.splitlines() if ln.startswith("bench: ")]
    assert [ln.split(":")[1] for ln in progress] == [" 40 tokens", " 70 tokens"]  # one line per length
    assert md.read_text().splitlines()[-1] == "logits: identical bytes in all 4 prompt pairs"
    data = json.loads(md.with_suffix(".json").read_text())  # the default JSON sits beside --markdown
    assert data["setup"]["backend"] == "sim" and data["setup"]["reps"] == 2
    assert data["setup"]["pack"] == str(pack.path.resolve())
    assert data["logits_identical"] is True
    assert [x["tokens"] for x in data["lengths"]] == [40, 70]
    for length in data["lengths"]:
        assert [r["order"] for r in length["reps"]] == ["AB", "BA"]
        for r in length["reps"]:
            for arm in "AB":
                assert r[arm]["ms"] > 0
                assert set(bench.COUNTED) <= set(r[arm])
                assert r[arm]["launches"] > 0


def test_group_gather_arms_same_bytes_and_the_counts_they_must_differ_in(make_test_pack, tmp_path, capsys):
    pack = make_test_pack("tiny", "Q8_0")
    n_all = pack.config.n_layer * pack.config.n_expert
    assert 5 < n_all  # experts stream
    # one copy per expert in both arms, so that the copies are the same count (coalesced, which
    # entries go together depends on when slots are released, which the arms change)
    # the gathered walk (ring_in_place 0), where group_gather sets what one gather takes
    status, out = bench_run(pack, tmp_path, "--a", "STRATA_PREFILL_GROUP_GATHER=0 expert-cache=5 copy_coalesce=0 "
                            "ring_in_place=0", "--b", "expert_cache=5 copy_coalesce=0 ring_in_place=0")
    text = capsys.readouterr().out
    assert status == 0
    assert "logits: identical bytes in all 4 prompt pairs" in text
    assert "settings A/B: group_gather 0/1" in text
    data = json.loads(out.read_text())
    assert data["setup"]["arms"]["A"]["keywords"] == {"group_gather": 0, "expert_cache": 5, "copy_coalesce": 0,
                                                      "ring_in_place": 0}
    assert data["setup"]["arms"]["B"]["settings"]["resident_experts"] == 5
    for length in data["lengths"]:
        for r in length["reps"]:
            a, b = r["A"], r["B"]
            assert a["gathers"] > b["gathers"] and a["events"] > b["events"] and a["waits"] > b["waits"]
            assert a["launches"] > b["launches"]
            assert a["copies"] == b["copies"] > 0 and a["copy_bytes"] == b["copy_bytes"] > 0


def test_equal_non_finite_logits_are_no_agreement(make_test_pack, tmp_path, capsys, monkeypatch):
    pack = make_test_pack("tiny", "Q8_0")
    real = bench.timed_prefill

    def nan_in_both_arms(engine, ids, chunk):
        seconds, logits, counts, phases = real(engine, ids, chunk)
        logits = logits.copy()
        logits[11] = np.nan  # the same NaN in both arms: the bytes agree, the run is still wrong
        return seconds, logits, counts, phases

    monkeypatch.setattr(bench, "timed_prefill", nan_in_both_arms)
    status, out = bench_run(pack, tmp_path, "--a", "default", "--b", "default")
    text = capsys.readouterr().out
    assert status == 1
    (line,) = [ln for ln in text.splitlines() if ln.startswith("logits")]
    assert line.startswith("logits NOT FINITE in 4 of 4 prompt pairs, first at ")
    assert "1 NaN or Inf values, the first at token id 11 (nan)" in line
    data = json.loads(out.read_text())
    assert data["logits_identical"] is True and data["logits_finite"] is False


def test_a_planted_logits_difference_is_reported_and_the_run_finishes(make_test_pack, tmp_path, capsys,
                                                                      monkeypatch):
    pack = make_test_pack("tiny", "Q8_0")
    real = bench.timed_prefill

    def flip_in_arm_a(engine, ids, chunk):
        seconds, logits, counts, phases = real(engine, ids, chunk)
        if not engine.group_gather and len(ids) == 70:
            logits = logits.copy()
            logits.view(np.uint32)[7] ^= 1  # one bit of one logit
        return seconds, logits, counts, phases

    monkeypatch.setattr(bench, "timed_prefill", flip_in_arm_a)
    status, out = bench_run(pack, tmp_path, "--a", "group_gather=0,in_place=0", "--b", "default")
    text = capsys.readouterr().out
    assert status == 1
    line = [ln for ln in text.splitlines() if ln.startswith("logits")]
    assert len(line) == 1
    assert line[0].startswith("logits DIFFER in 2 of 4 prompt pairs, first at 70 tokens rep 1 "
                              "(first differing index 7: ")
    data = json.loads(out.read_text())
    assert data["logits_identical"] is False
    assert [r["logits_identical"] for x in data["lengths"] for r in x["reps"]] == [True, True, False, False]


@settings(max_examples=50, deadline=None)
@given(n=st.integers(1, 300), seed=st.integers(0, 2**32 - 1), data=st.data())
def test_first_difference_finds_the_first_differing_element(n, seed, data):
    a = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    assert bench.first_difference(a, a.copy()) is None
    i = data.draw(st.integers(0, n - 1))
    b = a.copy()
    later = data.draw(st.lists(st.integers(i + 1, n - 1), max_size=3)) if i + 1 < n else []
    for k in [i, *later]:  # the first planted flip and some after it
        b.view(np.uint32)[k] ^= 1 << data.draw(st.integers(0, 31))
    assert bench.first_difference(a, b) == i
    assert bench.first_difference(a, b[:-1]) == -1


def test_first_difference_compares_bytes_not_values():
    a = np.random.default_rng(3).standard_normal(16).astype(np.float32)
    b = a.copy()
    a[5], b[5] = 0.0, -0.0  # equal as numbers, not as bytes
    assert bench.first_difference(a, b) == 5


@pytest.mark.parametrize("spec", [
    "STRATA_PREFILL_GROUP_GATHER=0", "group_gather=0", "group-gather=0", "--group-gather=0"])
def test_a_switch_has_its_variable_keyword_and_flag_names(spec):
    assert arms.parse_arm(spec, "--a") == {"group_gather": 0}


def test_arm_specs_combine_and_describe_themselves():
    kw = arms.parse_arm("STRATA_PREFILL_RING=8, expert-cache=auto copy_coalesce=1", "--b")
    assert kw == {"ring": 8, "expert_cache": "auto", "copy_coalesce": 1}
    assert arms.parse_arm(arms.describe(kw), "--b") == kw
    assert arms.parse_arm(" default ", "--a") == {}


def test_the_arms_know_every_switch_of_run_and_its_variable():
    import argparse

    p = argparse.ArgumentParser()
    run.add_fast_switches(p)
    flags = {a.dest for a in p._actions if a.dest not in ("help", "backend") and a.help != argparse.SUPPRESS}
    assert set(arms.SWITCHES) == flags
    retired = {a.option_strings[0] for a in p._actions if a.help == argparse.SUPPRESS}
    assert retired == {arms.retired_flag(v) for v in options.RETIRED}  # refused by name (test_switch_table)
    for sw in options.SWITCHES:
        assert arms.SWITCHES[sw.keyword][0] == sw.variable


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    return tmp_path / "cache"


@pytest.mark.parametrize("args, message", [
    (["--a", "foo=1", "--b", "default"], "--a: unknown switch 'foo'"),
    (["--a", "default", "--b", "STRATA_PREFILL_GROUP_GATHER=2"], "--b: STRATA_PREFILL_GROUP_GATHER must be 0 or 1"),
    (["--a", "expert-cache=-1", "--b", "default"], "--a: expert-cache must be 'auto' or an integer >= 0"),
    (["--a", "ring=0", "--b", "default"], "--a: ring must be a positive integer"),
    (["--a", "default,ring=4", "--b", "default"], "'default' stands alone"),
    (["--a", " ", "--b", "default"], "--a: an empty arm"),
    (["--a", "group_gather", "--b", "default"], "is not NAME=VALUE"),
    (["--a", "ring=4,STRATA_PREFILL_RING=5", "--b", "default"], "given twice"),
    (["--a", "default", "--b", "default", "--tokens", "40,0"], "--tokens: must be a positive integer"),
    (["--a", "default", "--b", "default", "--reps", "0"], "--reps: must be a positive integer"),
    (["--b", "default"], "the following arguments are required: --a"),
])
def test_bad_input_is_one_line_and_exit_2_before_any_work(cache_home, tmp_path, capsys, args, message):
    assert main(["bench", "--backend", "sim", *args]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.splitlines()) == 1 and err.startswith("strata-prefill: error: ")
    assert message in err
    assert not cache_home.exists()  # the default pack was not made
    assert not list(tmp_path.glob("bench-*.json"))


def test_prompts_longer_than_the_context_are_refused_before_the_engines(make_test_pack, tmp_path, capsys):
    pack = make_test_pack("tiny", "Q8_0")
    too_long = pack.config.context_length + 1
    assert main(["bench", "--pack", str(pack.path), "--backend", "sim", "--a", "default", "--b", "default",
                 "--tokens", str(too_long), "--json", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("strata-prefill: error: --tokens: ") and "context length" in err
    assert not (tmp_path / "x.json").exists()


def test_phases_add_their_table_and_the_json_defaults_to_a_dated_file_here(make_test_pack, tmp_path, capsys,
                                                                          monkeypatch):
    pack = make_test_pack("tiny", "Q8_0")
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "--pack", str(pack.path), "--backend", "sim", "--tokens", "40", "--reps", "1",
                 "--a", "default", "--b", "STRATA_QUANT_GATHER=1", "--phases"]) == 0
    out = capsys.readouterr().out
    assert "phase medians, ms, A / B (device phases, then host phases" in out and "attention" in out
    head = next(line for line in out.splitlines() if line.startswith("| prompt tokens | ") and "attention" in line)
    cols = [c.strip() for c in head.strip("|").split("|")]
    # the host phases apart, after every device phase, then their share of the prefill's time
    host_at = [i for i, c in enumerate(cols) if c.endswith("(host)")]
    assert host_at and cols[-1] == "host share of the prefill" and host_at == list(range(host_at[0], len(cols) - 1))
    row = next(line for line in out.splitlines() if line.startswith("| 40 | ") and "%" in line)
    a_share, b_share = (float(v.strip().rstrip("%")) for v in row.strip("|").split("|")[-1].split("/"))
    assert 0 <= a_share <= 100 and 0 <= b_share <= 100
    saved = list(tmp_path.glob("bench-*.json"))
    assert len(saved) == 1 and f"json: {saved[0].name}" in out
    rep = json.loads(saved[0].read_text())["lengths"][0]["reps"][0]
    for arm in "AB":
        assert rep[arm]["phases_ms"]["attention"] > 0
