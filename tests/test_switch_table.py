"""The fast path's switch table (fast/options.py) is the one place a switch is declared: the
user guide's table (docs/user-guide.md) is its output, `run`'s flags and bench's arm names are made from it, the engine
and the backends read the variables it names, and no other source spells those names."""
from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from strata_prefill.fast import options
from strata_prefill.fast.options import Count, OnOff
from strata_prefill.contract.errors import InputError
from strata_prefill import arms, checks
from strata_prefill.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
ALL_VARIABLES = [name for sw in options.SWITCHES for name in sw.variables + sw.opposites]


def other(sw) -> str:
    """A value of `sw` other than its default, as a flag or variable spells it (within what the
    tiny pack can use: a switch's most)."""
    if isinstance(sw.value, OnOff):
        return "0" if sw.default else "1"
    return str(sw.value.minimum + 7)


def parsed(sw, text: str):
    """`text` as the engine holds it once resolved."""
    return text == "1" if isinstance(sw.value, OnOff) else int(text)


@pytest.fixture
def no_switch_variables(monkeypatch):
    for name in ALL_VARIABLES + list(options.RETIRED):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture(scope="module")
def sim_engine(make_test_pack):
    """An engine on the sim on a tiny pack, its switches from the environment of the call
    (backend="cuda": on the GPU, for a kernel form, which the sim refuses as doing nothing)."""
    from strata_prefill.fast import make_fast_engine

    pack = make_test_pack("tiny", "Q8_0")
    return lambda backend="sim", **kw: make_fast_engine(pack, backend, **kw)


def test_the_user_guides_table_is_the_tables_output():
    text = (ROOT / options.TABLE_DOC).read_text()
    assert text.count(options.BEGIN) == 1 and text.count(options.END) == 1
    assert options.with_table(text) == text, \
        f"{options.TABLE_DOC}'s switch table is stale: python3 -m strata_prefill.fast.options {options.TABLE_DOC}"
    for sw in options.SWITCHES:
        assert f"| `{sw.keyword}` | `{sw.flag}` |" in text


def test_every_switch_is_declared_once_with_a_kind_a_value_type_and_one_line_of_help():
    keywords = [sw.keyword for sw in options.SWITCHES]
    assert len(set(keywords)) == len(keywords)
    assert len(set(ALL_VARIABLES)) == len(ALL_VARIABLES)
    assert [f.name for f in options.dataclasses.fields(options.FastOptions)] == keywords
    for sw in options.SWITCHES:
        assert sw.kind in options.KINDS
        assert isinstance(sw.value, (OnOff, Count))
        assert sw.help and "\n" not in sw.help and "|" not in sw.help  # one cell of the user guide's table
        assert sw.variable is None or sw.variable.startswith("STRATA_PREFILL_")
        assert sw.flag == "--" + sw.keyword.replace("_", "-")
        if sw.default is None:
            assert sw.default_text, f"{sw.keyword}: a rule for a default says which"


@pytest.mark.parametrize("variable", options.RETIRED)
def test_a_retired_switch_is_refused_by_name_everywhere(variable, no_switch_variables):
    """A retired kernel form's variable, bench arm name or run flag is refused by name (a script
    that still sets one would A/B nothing), and is no switch of the table any more."""
    keyword = variable.removeprefix("STRATA_PREFILL_").lower()
    assert keyword not in options.BY_KEYWORD and variable not in ALL_VARIABLES
    no_switch_variables.setenv(variable, "0")
    for call in (options.resolve, arms.environment_aliases):
        with pytest.raises(InputError, match=f"^{variable} is retired: every run takes "):
            call()
    for name in (variable, keyword, keyword.replace("_", "-"), "--" + keyword.replace("_", "-")):
        with pytest.raises(InputError, match=f"^--a: '{name}' is retired: every run takes "):
            arms.parse_arm(f"{name}=0", "--a")


@pytest.mark.parametrize("sw", options.SWITCHES, ids=lambda sw: sw.keyword)
def test_every_flag_is_one_of_run_and_its_value_reaches_the_engine_keyword(sw):
    parser = build_parser()
    help_text = parser._subparsers._group_actions[0].choices["run"].format_help()
    assert sw.flag in help_text
    args = parser.parse_args(["run", "--impl", "fast", sw.flag, other(sw)])
    assert getattr(args, sw.keyword) == int(other(sw))
    from strata_prefill.commands.run import fast_engine_kwargs

    assert fast_engine_kwargs(args) == {sw.keyword: int(other(sw))}
    assert getattr(parser.parse_args(["run"]), sw.keyword) is None  # not given: variable or default


@pytest.mark.parametrize("sw", options.SWITCHES, ids=lambda sw: sw.keyword)
def test_every_flag_refuses_what_its_type_refuses(sw, capsys):
    bad = "2" if isinstance(sw.value, OnOff) else str(sw.value.minimum - 1)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", sw.flag, bad])
    assert sw.flag in capsys.readouterr().err
    with pytest.raises(argparse.ArgumentTypeError):
        arms.SWITCHES[sw.keyword][1](bad)


def test_nothing_set_resolves_to_the_tables_defaults(no_switch_variables):
    assert options.resolve() == options.DEFAULTS
    assert options.DEFAULTS.group_gather is True and options.DEFAULTS.quant_gather is False
    assert options.DEFAULTS.expert_cache == "auto" and options.DEFAULTS.ring is None


@pytest.mark.parametrize("sw", [sw for sw in options.SWITCHES if sw.variable], ids=lambda sw: sw.keyword)
def test_every_variable_is_the_one_the_engine_reads(sw, no_switch_variables, sim_engine):
    """Each in a setting where it does something (its needs met: tests/switch_needs.py)."""
    from switch_needs import setting_for

    setting = setting_for(sw, parsed(sw, other(sw)))
    context = {k: v for k, v in setting["switches"].items() if k != sw.keyword}
    if setting["expert_cache"] != options.AUTO:
        context["expert_cache"] = setting["expert_cache"]
    if setting["backend"] != "sim":
        from strata_prefill.fast.cuda.runtime import cuda_available

        ok, why = cuda_available()
        if not ok:
            pytest.skip(f"{sw.keyword} is a kernel form, read on the GPU: cuda backend unavailable: {why}")
        context["backend"] = setting["backend"]
    no_switch_variables.setenv(sw.variable, other(sw))
    eng = sim_engine(**context)
    assert getattr(eng.options, sw.keyword) == parsed(sw, other(sw))
    if sw.keyword == "ring":  # engine.ring is the ring itself
        assert eng.ring.n_slots == parsed(sw, other(sw))
    else:
        assert getattr(eng, sw.keyword) == parsed(sw, other(sw))
    for rest in options.SWITCHES:  # no other switch moved
        if rest is not sw and rest.keyword not in ("ring", "expert_cache", *context):  # the engine sizes these two
            assert getattr(eng.options, rest.keyword) == rest.default, rest.keyword
    if sw.kind == options.KERNEL_FORM:  # the backend reads the engine's options
        assert eng.be.options is eng.options
        assert getattr(eng.be, sw.keyword) == parsed(sw, other(sw))
    # a keyword argument wins over the variable
    given = (not parsed(sw, other(sw))) if isinstance(sw.value, OnOff) else parsed(sw, other(sw)) + 1
    assert getattr(sim_engine(**context, **{sw.keyword: given}).options, sw.keyword) == given


@pytest.mark.parametrize("sw", [sw for sw in options.SWITCHES if sw.variable], ids=lambda sw: sw.keyword)
def test_a_bad_variable_is_refused_by_name(sw, no_switch_variables):
    bad = "2" if isinstance(sw.value, OnOff) else "x"
    no_switch_variables.setenv(sw.variable, bad)
    with pytest.raises(InputError, match=f"^{sw.variable} must be "):
        options.resolve()
    with pytest.raises(InputError, match=f"^{sw.variable} must be "):
        checks.environment_values()


def test_the_quant_gather_variables_older_name_is_an_alias_the_new_name_wins(no_switch_variables):
    sw = options.BY_KEYWORD["quant_gather"]
    assert sw.variable == "STRATA_PREFILL_QUANT_GATHER" and sw.aliases == ("STRATA_QUANT_GATHER",)
    env = no_switch_variables
    env.setenv("STRATA_QUANT_GATHER", "1")
    assert options.resolve().quant_gather is True
    env.setenv("STRATA_PREFILL_QUANT_GATHER", "0")
    assert options.resolve().quant_gather is False  # both set: the new name
    env.setenv("STRATA_PREFILL_QUANT_GATHER", "")
    assert options.resolve().quant_gather is True  # empty is unset
    env.setenv("STRATA_QUANT_GATHER", "yes")
    with pytest.raises(InputError, match="^STRATA_QUANT_GATHER must be 0 or 1, got 'yes'"):
        options.resolve()
    with pytest.raises(InputError, match="^STRATA_QUANT_GATHER must be 0 or 1, got 'yes'"):
        arms.environment_aliases()
    env.setenv("STRATA_PREFILL_QUANT_GATHER", "1")  # the alias is not read: its value does nothing
    arms.environment_aliases()
    assert options.resolve().quant_gather is True
    assert "STRATA_QUANT_GATHER" in (ROOT / options.TABLE_DOC).read_text()
    # bench's arms take either name, and describe the new one
    assert arms.parse_arm("STRATA_QUANT_GATHER=1", "--a") == arms.parse_arm("STRATA_PREFILL_QUANT_GATHER=1", "--a")
    assert arms.describe({"quant_gather": 1}) == "STRATA_PREFILL_QUANT_GATHER=1"


def test_the_alias_is_refused_before_any_work(no_switch_variables, capsys, tmp_path):
    """run and bench check the older name as the new one is checked: one line, before the
    pack is opened (the pack named does not exist)."""
    from strata_prefill.cli import main

    no_switch_variables.setenv("STRATA_QUANT_GATHER", "2")
    missing = str(tmp_path / "no-such.gguf")
    for argv in (["run", "--impl", "fast", "--backend", "sim", "--pack", missing],
                 ["bench", "--backend", "sim", "--pack", missing, "--a", "default", "--b", "default",
                  "--json", str(tmp_path / "b.json")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.splitlines() == ["strata-prefill: error: STRATA_QUANT_GATHER must be 0 or 1, got '2'"], err


def test_the_engine_takes_no_keyword_the_table_lacks(sim_engine):
    with pytest.raises(TypeError, match="unknown fast-path switch 'group_gathr'"):
        sim_engine(group_gathr=0)


def test_keyword_values_are_checked_as_before(no_switch_variables):
    assert options.resolve({"group_gather": 0}).group_gather is False
    assert options.resolve({"expert_cache": "auto", "ring": 4}).ring == 4
    with pytest.raises(InputError, match=r"--ring must be >= 1, got 0"):
        options.resolve({"ring": 0})
    with pytest.raises(InputError, match=r"--expert-cache must be an integer, got 'lots'"):
        options.resolve({"expert_cache": "lots"})
    with pytest.raises(InputError, match=r"--vram-reserve-mib must be >= 0, got -1"):
        options.resolve({"vram_reserve_mib": -1})


def test_no_other_source_spells_a_switch_variable():
    """Only fast/options.py names the switch variables in fast/ and strata_prefill/: the others
    read the table (a name written twice is a name that can drift)."""
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, ALL_VARIABLES)) + r")\b")
    found = []
    for top in ("fast", "strata_prefill"):
        for path in sorted((ROOT / top).rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts or path == ROOT / "fast" / "options.py":
                continue
            try:
                text = path.read_text()
            except UnicodeDecodeError:
                continue
            for n, line in enumerate(text.splitlines(), 1):
                if m := pattern.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{n}: {m.group(0)}")
    assert not found, "switch variables named outside fast/options.py:\n" + "\n".join(found)


def test_the_seeds_gather_one_is_group_gather_the_other_way_round(no_switch_variables):
    """STRATA_PREFILL_GATHER_ONE=1 (seed #439's name) is one gather launch per expert:
    group_gather 0; the table's own variable wins where both are set; a bad value is refused by
    its name before any work; bench's arms take it too."""
    sw = options.BY_KEYWORD["group_gather"]
    assert sw.opposites == ("STRATA_PREFILL_GATHER_ONE",)
    env = no_switch_variables
    env.setenv("STRATA_PREFILL_GATHER_ONE", "1")
    assert options.resolve().group_gather is False
    env.setenv("STRATA_PREFILL_GATHER_ONE", "0")
    assert options.resolve().group_gather is True
    env.setenv("STRATA_PREFILL_GATHER_ONE", "1")
    env.setenv("STRATA_PREFILL_GROUP_GATHER", "1")
    assert options.resolve().group_gather is True  # both set: the table's name
    env.delenv("STRATA_PREFILL_GROUP_GATHER")
    env.setenv("STRATA_PREFILL_GATHER_ONE", "yes")
    with pytest.raises(InputError, match="^STRATA_PREFILL_GATHER_ONE must be 0 or 1, got 'yes'"):
        options.resolve()
    with pytest.raises(InputError, match="^STRATA_PREFILL_GATHER_ONE "):
        arms.environment_aliases()
    env.delenv("STRATA_PREFILL_GATHER_ONE")
    assert arms.parse_arm("STRATA_PREFILL_GATHER_ONE=1", "--a") == {"group_gather": 0}
    assert arms.parse_arm("STRATA_PREFILL_GATHER_ONE=0", "--a") == {"group_gather": 1}
    assert "`STRATA_PREFILL_GATHER_ONE`: 1 sets it to 0" in (ROOT / options.TABLE_DOC).read_text()
