"""One rule for a switch that would do nothing (fast/options.py: each switch declares what it
needs, refuse_idle derives every refusal from that). Derived from the table itself: for every
need of every switch, a setting that leaves only that need unmet is refused, in one line naming
the switch as it was set and what it needs, whether the switch is a `run` flag, its variable or a
bench arm, and by the engine too; the setting that meets every need is accepted; values past the
most the pack can use are refused. And the refusals are true: where a need is unmet, the sim
runs the same launches, copies and logits whatever the switch says."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strata_prefill.fast import options
from strata_prefill.fast.options import AUTO, CUDA, FAST, OnOff
from strata_prefill.contract.errors import InputError
from strata_prefill.cli import main
from switch_needs import LAYER_EXPERTS, TOTAL, applies, cases, facts_of, setting_for, values

ROOT = Path(__file__).resolve().parent.parent
CASES = cases()
IDS = [f"{sw.keyword}-{type(need).__name__}-{getattr(need, 'keyword', '')}" for sw, need in CASES]
FIXTURES = settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture
def no_switch_variables(monkeypatch):
    for name in [n for sw in options.SWITCHES for n in sw.variables + sw.opposites] + ["STRATA_PREFILL_TIMING"]:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture(scope="module")
def tiny(make_test_pack):
    return make_test_pack("tiny", "Q8_0")


def text(value) -> str:
    return str(int(value)) if isinstance(value, bool) else str(value)


def keywords(setting: dict, sw) -> dict:
    """The keywords a setting gives an engine (its expert cache a keyword where it sizes it)."""
    out = dict(setting["switches"])
    if setting["impl"] == "fast" and setting["expert_cache"] != AUTO:
        out.setdefault("expert_cache", setting["expert_cache"])
    return out


def run_argv(pack, setting: dict, sw, by_variable: bool = False) -> tuple[list[str], dict]:
    """`run` on the setting: the switches as flags (`sw` as its variable where by_variable)."""
    argv = ["run", "--pack", str(pack.path), "--prompt-tokens", "20", "--greedy", "1", "--no-progress",
            "--impl", setting["impl"]]
    if setting["impl"] == "fast":
        argv += ["--backend", setting["backend"]]
    env = {}
    for kw, v in keywords(setting, sw).items():
        if by_variable and kw == sw.keyword:
            env[sw.variable] = text(v)
        else:
            argv += [options.flag_label(kw), text(v)]
    return argv, env


def refused(argv: list[str], capsys) -> str:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse
        code = exc.code
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and len(err.splitlines()) == 1 and "Traceback" not in err, (argv, err)
    assert err.startswith("strata-prefill: error: ")
    return err.strip().removeprefix("strata-prefill: error: ")


def says(line: str, spelled: str, need, label) -> None:
    """The refusal names the switch as it was set and what it needs, and says it does nothing."""
    assert line.startswith(f"{spelled} needs {need.text(label)}: "), line
    assert line.endswith(": it does nothing"), line


def draw(data, sw, need):
    return data.draw(st.sampled_from(values(sw, need)), label=sw.keyword)


# ---- the rule, as the table declares it ---------------------------------------------------------
def test_every_switch_declares_its_needs_and_every_need_says_what_it_is():
    for sw in options.SWITCHES:
        assert sw.requirements[0] is FAST  # every switch is the fast path's
        assert CUDA in sw.requirements or sw.kind != options.KERNEL_FORM
        for need in sw.requirements:
            assert need.text(options.flag_label) and "\n" not in need.text(options.flag_label)
            for target in [getattr(n, "keyword", None) for n in getattr(need, "needs", (need,))]:
                assert target is None or (target in options.BY_KEYWORD and target != sw.keyword)
        assert sw.most in (None, "experts", "layer_experts")
    assert options.needs_cell(options.BY_KEYWORD["ring_run"]).startswith("experts that stream; `in_place` 1")


@pytest.mark.parametrize("sw, need", CASES, ids=IDS)
@FIXTURES
@given(data=st.data())
def test_a_setting_that_meets_every_need_is_accepted(sw, need, data):
    value = draw(data, sw, need)
    setting = setting_for(sw, value)
    options.refuse_idle(keywords(setting, sw), facts_of(setting), environ={})
    assert options.settle(keywords(setting, sw), facts_of(setting)) == keywords(setting, sw)


@pytest.mark.parametrize("sw, need", CASES, ids=IDS)
@FIXTURES
@given(data=st.data())
def test_every_need_is_enforced_for_the_run_flag(sw, need, data, tiny, capsys, no_switch_variables):
    value = draw(data, sw, need)
    setting = setting_for(sw, value, need)
    argv, _ = run_argv(tiny, setting, sw)
    says(refused(argv, capsys), f"{sw.flag} {text(value)}", need, options.flag_label)


@pytest.mark.parametrize("sw, need", [c for c in CASES if c[0].variable],
                         ids=[i for i, c in zip(IDS, CASES) if c[0].variable])
@FIXTURES
@given(data=st.data())
def test_every_need_is_enforced_for_the_variable(sw, need, data, tiny, capsys, no_switch_variables):
    value = draw(data, sw, need)
    setting = setting_for(sw, value, need)
    argv, env = run_argv(tiny, setting, sw, by_variable=True)
    for name, v in env.items():
        no_switch_variables.setenv(name, v)
    says(refused(argv, capsys), f"{sw.variable}={text(value)}", need, options.flag_label)


def arm_name(keyword: str) -> str:
    return keyword.replace("_", "-")


@pytest.mark.parametrize("sw, need", [c for c in CASES if c[1] is not FAST],
                         ids=[i for i, c in zip(IDS, CASES) if c[1] is not FAST])
@FIXTURES
@given(data=st.data())
def test_every_need_is_enforced_for_a_bench_arm(sw, need, data, tiny, capsys, no_switch_variables, tmp_path):
    """bench runs the fast path only: every need but --impl fast."""
    value = draw(data, sw, need)
    setting = setting_for(sw, value, need)
    spec = ",".join(f"{arm_name(kw)}={text(v)}" for kw, v in keywords(setting, sw).items())
    line = refused(["bench", "--pack", str(tiny.path), "--backend", setting["backend"], "--tokens", "8", "--reps", "1",
                    "--no-progress", "--json", str(tmp_path / "b.json"), "--a", "default", "--b", spec], capsys)
    says(line.removeprefix("--b: "), f"{arm_name(sw.keyword)} {text(value)}", need, arm_name)
    assert line.startswith("--b: ") and not (tmp_path / "b.json").exists()


ENGINE_CASES = [(i, c) for i, c in zip(IDS, CASES) if c[1] not in (FAST, CUDA) and CUDA not in c[0].requirements]


@pytest.mark.parametrize("sw, need", [c for _, c in ENGINE_CASES], ids=[i for i, _ in ENGINE_CASES])
def test_every_need_is_enforced_by_the_engine(sw, need, tiny, no_switch_variables):
    """The engine checks once it has placed the experts (the cuda backend's auto cache is known
    only there), before any weight is loaded (here the sim: a switch that needs cuda is the
    command line's to refuse)."""
    from strata_prefill.fast import make_fast_engine

    value = values(sw, need)[-1]
    setting = setting_for(sw, value, need)
    with pytest.raises(InputError) as err:
        make_fast_engine(tiny, "sim", **keywords(setting, sw))
    says(str(err.value), f"{sw.flag} {text(value)}", need, options.flag_label)


@pytest.mark.parametrize("sw", [sw for sw in options.SWITCHES if sw.most], ids=lambda sw: sw.keyword)
def test_a_value_past_what_the_pack_can_use_is_refused(sw, tiny, capsys, no_switch_variables, tmp_path):
    most = {"experts": TOTAL, "layer_experts": LAYER_EXPERTS}[sw.most]
    setting = setting_for(sw, most + 1)
    options.refuse_idle(keywords(setting_for(sw, most), sw), facts_of(setting_for(sw, most)), environ={})
    what = "the pack has 32 experts (2 layers x 16)" if sw.most == "experts" else "a layer of the pack has 16 experts"
    want = f"{sw.flag} {most + 1}: {what}: more can do nothing more: at most {most}"
    argv, _ = run_argv(tiny, setting, sw)
    assert refused(argv, capsys) == want
    if sw.variable:
        argv, env = run_argv(tiny, setting, sw, by_variable=True)
        no_switch_variables.setenv(sw.variable, env[sw.variable])
        assert refused(argv, capsys) == want.replace(f"{sw.flag} ", f"{sw.variable}=")
        no_switch_variables.delenv(sw.variable)
    spec = ",".join(f"{arm_name(kw)}={text(v)}" for kw, v in keywords(setting, sw).items())
    line = refused(["bench", "--pack", str(tiny.path), "--backend", "sim", "--tokens", "8", "--json",
                    str(tmp_path / "b.json"), "--a", spec, "--b", "default"], capsys)
    assert line == "--a: " + want.replace(f"{sw.flag} ", f"{arm_name(sw.keyword)} ")


def test_settle_drops_what_does_nothing_and_caps_what_is_past_the_most():
    facts = options.placed_facts("fast", "sim", TOTAL, TOTAL, "--expert-cache 32", 2, 16)
    assert options.settle({"ring": 8, "group_gather": 0, "quant_gather": 1, "in_place": 1}, facts) == {
        "quant_gather": 1, "in_place": 1}
    facts = options.placed_facts("fast", "sim", 10, TOTAL, "--expert-cache 10", 2, 16)
    assert options.settle({"ring": 384, "stage_head": 100, "ring_run": 3, "ring_in_place": 0}, facts) == {
        "ring": 32, "stage_head": 16, "ring_in_place": 0}


# ---- the refusals are true: an unmet need leaves the run as it is ---------------------------------
def _sim_run(pack, kw: dict, monkeypatch) -> tuple:
    from strata_prefill.fast import make_fast_engine
    from strata_prefill.session import Session

    with monkeypatch.context() as m:
        m.setattr(options, "refuse_idle", lambda *a, **k: None)  # the rule is what is tested here
        eng = make_fast_engine(pack, "sim", **kw)
    ids = np.random.default_rng(5).integers(0, pack.config.n_vocab, 70)
    res = Session(eng, chunk=32, progress=False).run(ids, greedy=1)
    return res.logits.tobytes(), res.greedy, dict(eng.counters)


@pytest.mark.parametrize("sw, need", [c for _, c in ENGINE_CASES], ids=[i for i, _ in ENGINE_CASES])
def test_where_a_need_is_unmet_the_switch_changes_nothing(sw, need, tiny, monkeypatch, no_switch_variables):
    """The switch's values a need applies to, in the setting that leaves that need unmet (the
    rest as the value needs): the same logits, greedy tokens and counters (launches, gathers,
    copies and their bytes, waits, events) as the switch's default there."""
    runs = {}
    default = getattr(options.DEFAULTS, sw.keyword)
    for value in values(sw, need)[:2] + values(sw, need)[-1:]:
        setting = setting_for(sw, value, need)
        base = keywords(setting, sw)
        base.pop(sw.keyword)
        runs[text(value)] = _sim_run(tiny, keywords(setting, sw), monkeypatch)
        if default is not None:
            runs["default"] = _sim_run(tiny, base, monkeypatch)
    first = next(iter(runs.values()))
    for name, run in runs.items():
        assert run == first, (sw.keyword, need, name)


# ---- the cases first found accepted, each refused by the rule ---------------------------------------
FAST_SIM = ["--impl", "fast", "--backend", "sim"]


@pytest.mark.parametrize("args, env, needle", [
    (FAST_SIM + ["--expert-cache", "10", "--head-predict", "1", "--stage-head", "0"], {},
     "--head-predict 1 needs --stage-head other than 0: --stage-head is 0: it does nothing"),
    (FAST_SIM + ["--expert-cache", "10", "--ring-run", "3", "--ring-in-place", "0"], {},
     "--ring-run 3 needs --ring-in-place 1: --ring-in-place is 0: it does nothing"),
    (FAST_SIM + ["--expert-cache", "10", "--flush-on-skip", "1"], {},
     "--flush-on-skip 1 needs --ring-in-place 0 or --in-place 0: --ring-in-place is 1 (the default) and "
     "--in-place is 1 (the default): it does nothing"),
    (FAST_SIM + ["--expert-cache", "10", "--flush-on-skip", "1"], {"STRATA_PREFILL_RING_IN_PLACE": "1"},
     "--ring-in-place is 1 (STRATA_PREFILL_RING_IN_PLACE)"),
    ([], {"STRATA_PREFILL_RING": "8"}, "STRATA_PREFILL_RING=8 needs --impl fast: this run is --impl reference"),
    ([], {"STRATA_PREFILL_WINDOW": "64"}, "STRATA_PREFILL_WINDOW=64 needs --impl fast"),
    ([], {"STRATA_PREFILL_HEAD_PREDICT": "1"}, "STRATA_PREFILL_HEAD_PREDICT=1 needs --impl fast"),
    ([], {"STRATA_PREFILL_TIMING": "1"}, "STRATA_PREFILL_TIMING=1 times the fast path's streams: it needs --impl fast"),
    (FAST_SIM, {"STRATA_PREFILL_RING": "8"}, "STRATA_PREFILL_RING=8 needs experts that stream (an expert cache "
                                             "smaller than the pack): every expert is resident (the sim holds all 32"),
    (FAST_SIM, {"STRATA_PREFILL_HEAD_PREDICT": "1"}, "STRATA_PREFILL_HEAD_PREDICT=1 needs experts that stream"),
    (FAST_SIM + ["--expert-cache", "10", "--stage-head", "17"], {},
     "--stage-head 17: a layer of the pack has 16 experts: more can do nothing more: at most 16"),
    (FAST_SIM + ["--expert-cache", "10", "--prefill", "16", "--window", "8"], {},
     "--window 8 is less than the chunk (16 tokens, --prefill): a window holds whole chunks"),
    (FAST_SIM + ["--window", "8"], {}, "--window 8 is less than the chunk (20 tokens, the whole prompt)"),
])
def test_the_cases_found_accepted_are_refused(tiny, capsys, no_switch_variables, args, env, needle):
    for name, v in env.items():
        no_switch_variables.setenv(name, v)
    line = refused(["run", "--pack", str(tiny.path), "--prompt-tokens", "20", "--no-progress", *args], capsys)
    assert needle in line, line


@pytest.mark.parametrize("window, prefill, tokens, line", [
    ("100000", "8", "32", "window    32 tokens (4 chunk(s) a window, 1 window(s); --window 100000: the prompt's 4 "
                          "chunk(s) of 8, fewer than the 12500 it would hold)"),
    ("1024", "auto", "20", "window    20 tokens (1 chunk(s) a window, 1 window(s); --window 1024: the prompt's 1 "
                           "chunk(s) of 20, fewer than the 51 it would hold)"),
    ("16", "8", "32", "window    16 tokens (2 chunk(s) a window, 2 window(s); --window 16: 2 whole chunk(s))"),
])
def test_a_window_past_the_prompt_is_printed_as_taken(tiny, capsys, no_switch_variables, window, prefill, tokens, line):
    assert main(["run", "--pack", str(tiny.path), "--prompt-tokens", tokens, "--greedy", "1", "--no-progress",
                 *FAST_SIM, "--window", window, "--prefill", prefill]) == 0
    out = capsys.readouterr().out
    assert [ln for ln in out.splitlines() if ln.startswith("window")] == [line]


def test_no_other_source_refuses_a_switch_that_does_nothing():
    """The rule's words are fast/options.py's alone: no second list of switches that need
    streaming, or of what needs what, anywhere in fast/ or strata_prefill/."""
    found = []
    for top in ("fast", "strata_prefill"):
        for path in sorted((ROOT / top).rglob("*.py")):
            if path == ROOT / "fast" / "options.py":
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if re.search(r"STREAMING\s*=|fast_switches_used|shapes how streamed|picks how resident|"
                             r"needs --in-place|: it does nothing", line):
                    found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not found, "\n".join(found)
