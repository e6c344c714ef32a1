"""Fuzzed, not listed: every value-taking flag of every subcommand (walked from the argparse
parsers themselves), every environment variable the command reads (strata_prefill/variables.py)
and every field of a trace file (`run --trace`, read by `plot`), fed what a user might type by
mistake: random text, empty and blank strings, huge, negative, NaN, infinite and overflowing
numbers, float-looking and foreign digits, paths that are folders, devices or too long.

Each example runs the command in-process (`cli.main`, the exit status and stderr a user sees)
from a command line that is valid without the fuzzed value, and asserts: exit status 0 (the
value is valid, and the command ran to its end) or 2 with exactly one line on stderr,
`strata-prefill: error: ...`, nothing on stdout and the refusal in under WORK_S (before any
work); never a traceback (an exception escaping main fails the example with it); every input
byte for byte what it was. The work a valid value starts is real and small: a one-layer pack,
prompts of 4 tokens; only build-kernels' compiles are stood in for (nvcc's minutes).

The examples are bounded (a few per flag, variable or field, a deadline each: EXAMPLES) so the
file runs in about a minute on a 2-core machine.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strata_prefill import arms, cli, variables
from strata_prefill.commands import run as run_command

WORK_S = 1.0  # a refusal before any work takes less than this
ROOT = Path(__file__).resolve().parent.parent
# examples per flag, variable and trace field: a few each, so the file takes under a minute on
# two cores; FUZZ_EXAMPLES=N (e.g. 100) fuzzes deeper on a machine with time to spare
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", 0))


def fuzz_settings(examples: int):
    return settings(max_examples=EXAMPLES or examples, deadline=10_000,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


# ---- values a user might type ----------------------------------------------------------------
EDGE = ["", " ", "\t", "0", "1", "2", "-1", "-0", "+3", "nan", "NaN", "inf", "-inf", "1e999", "-1e999", "1e3",
        "2.5", "0x10", "1_000", "08", str(2**31), str(2**32), str(2**63), str(2**64), "9" * 400, "-" + "9" * 40,
        "\u0661\u0662", "auto", "off", "none", "default", "yes", "true", "-", "--", "-x", "=", ",", ":", "{}", "[]",
        "/", ".", "..", "/dev/null", "/proc/strata-prefill-fuzz", "a/b", "x" * 300, "\udcff", "é", "sim",
        "STRATA_PREFILL_RING=1", "ring=0", "yarn:4:4096", "linear:0", "sm_90", "Q8_0", "logits"]


def _safe(text: str) -> bool:
    """Random text that may name a path only inside the example's own folder: not absolute, not
    up (..), not the home folder (~), no NUL (argv and the environment cannot hold one)."""
    return ("\x00" not in text and not text.lstrip().startswith(("/", "~"))
            and ".." not in re.split(r"[/\s]", text))


TEXT = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=24)
# numbers: small valid counts, zero and negative ones, and huge ones past every limit a count has
# (a pack's context, int32 positions, a seed's 64 bits); a valid count of real size (a 30,000-token
# prompt) is work, not a bad value, and other tests run it
NUMBERS = st.one_of(st.integers(0, 9).map(str), st.integers(max_value=0).map(str),
                    st.integers(min_value=2**64).map(str),
                    st.floats(allow_nan=True, allow_infinity=True).map(repr),
                    st.floats(allow_nan=True, allow_infinity=True).map(str))
VALUES = st.one_of(st.sampled_from(EDGE), NUMBERS, TEXT.filter(_safe))


# ---- the command lines: a valid one per subcommand, the fuzzed value on top ------------------

def leaves(parser: argparse.ArgumentParser, words: tuple = ()):
    """(words, parser) of every subcommand that takes no further subcommand (cache info, ...)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield words, parser
        return
    for name, sub in subs[0].choices.items():
        yield from leaves(sub, words + (name,))


def value_actions(parser: argparse.ArgumentParser) -> list:
    """The actions that take a value: positionals and flags with arguments (--help and the
    on/off flags take none)."""
    return [a for a in parser._actions if a.nargs != 0 and not isinstance(a, argparse._SubParsersAction)]


PARSER = cli.build_parser()
LEAVES = dict(leaves(PARSER))
FLAGS = [(words, a.dest, a.option_strings[0] if a.option_strings else None)
         for words, p in LEAVES.items() for a in value_actions(p)]

SMALL = ["--prompt-tokens", "4", "--greedy", "0", "--no-progress"]
# a valid command line of each subcommand: (options, {positional dest: value}); {name} is a
# file of the `inputs` fixture, {here} the example's own folder
BASE = {
    ("run",): (["--pack", "{pack}", *SMALL], {}),
    ("make-pack",): (["--no-progress"], {"out": "{here}/out.gguf"}),
    ("info",): ([], {"pack": "{pack}"}),
    ("diff",): ([], {"a": "{logits}", "b": "{logits}"}),
    ("bench",): (["--pack", "{pack}", "--backend", "sim", "--a", "default", "--b", "expert-cache=4", "--tokens", "4",
                  "--reps", "1", "--json", "{here}/bench.json", "--no-progress"], {}),
    ("plot",): ([], {"trace": "{trace}", "out": "{here}/out.png"}),
    ("build-kernels",): (["--cache", "{here}/cubins"], {}),
    ("cache", "info"): (["--dir", "{here}/rc"], {}),
    ("cache", "clear"): (["--dir", "{here}/rc"], {}),
}
# `run`'s flags of the fast path go on a fast run on the sim, with experts that stream
FAST = ["--impl", "fast", "--backend", "sim", "--expert-cache", "4"]
FAST_DESTS = set(arms.SWITCHES) | set(run_command.FAST_ONLY)


def command_line(words: tuple, dest: str | None = None, flag: str | None = None,
                 value: str | None = None) -> list[str]:
    """The valid command line of `words` (placeholders unfilled), with `value` given to the flag
    or positional `dest`."""
    options, positionals = BASE[words]
    options = list(options)
    if words == ("run",) and dest in FAST_DESTS:
        options += FAST
    if flag is not None:
        options += [flag, value]
    out = [*words, *options]
    for a in value_actions(LEAVES[words]):
        if not a.option_strings:
            out.append(value if a.dest == dest else positionals[a.dest])
    return out


def _fill(text: str, names: dict) -> str:
    for name, path in names.items():
        text = text.replace("{" + name + "}", path)
    return text


# ---- the inputs, and one example's world ------------------------------------------------------

@pytest.fixture(scope="module")
def inputs(make_test_pack, tmp_path_factory):
    """The files the command lines read, in a folder of their own: a one-layer pack, a logits
    dump, a trace of a fast run on the sim (made by the command itself)."""
    d = tmp_path_factory.mktemp("fuzz-inputs")
    pack = d / "pack.gguf"
    shutil.copyfile(make_test_pack("tiny", "Q8_0", layers=1).path, pack)
    names = {"pack": str(pack), "logits": str(d / "logits.f32"), "trace": str(d / "trace.json")}
    with world(names) as (status, _out, err):
        status.append(cli.main(["run", "--pack", str(pack), "--prompt-tokens", "20", "--prefill", "8", "--greedy", "0",
                                "--no-progress", "--impl", "fast", "--backend", "sim", "--expert-cache", "4",
                                "--dump-first-logits", names["logits"], "--trace", names["trace"]]))
    assert status == [0], err.getvalue()
    return {"dir": str(d), **names}


def _digests(folder: str) -> dict:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(folder).rglob("*")) if p.is_file()}


@contextlib.contextmanager
def world(names: dict, env: dict | None = None):
    """A fresh folder as the current folder and the cache home, none of a developer's STRATA_*
    variables, `env` set; (a list for the status, stdout, stderr) captured. Everything restored."""
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    here = tempfile.mkdtemp(prefix="strata-fuzz-")
    names["here"] = here
    try:
        for var in [v for v in os.environ if v.startswith("STRATA_")]:
            del os.environ[var]
        os.environ["XDG_CACHE_HOME"] = os.path.join(here, "cache")
        os.environ.update({k: _fill(v, names) for k, v in (env or {}).items()})
        os.chdir(here)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            yield [], out, err
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        shutil.rmtree(here, ignore_errors=True)


def ran_or_refused(args: list[str], inputs: dict, env: dict | None = None) -> int:
    """Run main(args) in a world of its own and assert the outcome (the module's docstring);
    its exit status."""
    names = dict(inputs)
    before = _digests(inputs["dir"])
    with world(names, env) as (_status, out, err):
        args = [_fill(a, names) for a in args]
        t0 = time.perf_counter()
        status = cli.main(args)
        took = time.perf_counter() - t0
    stdout, stderr = out.getvalue(), err.getvalue()
    shown = f"{args} {env or ''}: exit {status}\n{stderr}"
    assert "Traceback" not in stderr, shown
    assert status in (0, 2), shown
    if status == 2:
        lines = stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("strata-prefill: error: "), shown
        assert stdout == "", shown
        assert took < WORK_S, f"refused after {took:.2f} s: {shown}"
    assert _digests(inputs["dir"]) == before, f"an input changed: {shown}"
    return status


@pytest.fixture
def no_compiles(monkeypatch):
    """build-kernels runs its checks and plans its modules; nvcc's minutes of compiles are
    stood in for by a build that reports every module present."""
    from strata_prefill.fast.cuda import kernel_cache

    monkeypatch.setattr(kernel_cache, "build_all", lambda folder, arch, todo, jobs, progress=None: [])
    monkeypatch.setattr(kernel_cache, "nvcc_release", lambda: "nvcc (stood in for)")


# ---- the tests ------------------------------------------------------------------------------------

def test_every_subcommand_has_a_valid_command_line():
    """A new subcommand (or cache action) needs its base line here before its flags are fuzzed."""
    assert set(BASE) == set(LEAVES)


BASE_ROWS = [(words, None) for words in sorted(BASE)] + [(("run",), "ring")]  # "ring": the fast run


@pytest.mark.parametrize("words, dest", BASE_ROWS, ids=[" ".join(w) + (" (fast)" if d else "") for w, d in BASE_ROWS])
def test_the_base_command_lines_run(inputs, no_compiles, words, dest):
    """Each base line on its own runs to exit 0: a fuzzed value's refusal is the value's."""
    assert ran_or_refused(command_line(words, dest), inputs) == 0


@pytest.mark.parametrize("words, dest, flag", FLAGS, ids=[f"{' '.join(w)} {f or d}" for w, d, f in FLAGS])
@fuzz_settings(5)
@given(value=VALUES)
def test_every_flag_takes_a_bad_value_in_one_line(inputs, no_compiles, words, dest, flag, value):
    ran_or_refused(command_line(words, dest, flag, value), inputs)


# ---- every variable the command reads ---------------------------------------------------------
# (variable, command words, the run it rides on): `run` both as the reference and as a fast run
# on the sim, so a variable of either path is read where it matters
VARIABLE_ROWS = [(name, (cmd,) if cmd != "cache" else ("cache", "info"), path)
                 for name, var in sorted(variables.variables().items()) for cmd in var.commands
                 for path in (("reference", "fast") if cmd == "run" else ("-",))]


@pytest.mark.parametrize("name, words, path", VARIABLE_ROWS, ids=[f"{n} {' '.join(w)} {p}" for n, w, p in VARIABLE_ROWS])
@fuzz_settings(3)
@given(value=VALUES)
def test_every_variable_takes_a_bad_value_in_one_line(inputs, no_compiles, name, words, path, value):
    args = command_line(words, dest="ring" if path == "fast" else None)  # "ring": any switch, for FAST
    ran_or_refused(args, inputs, env={name: value})


def test_the_variable_table_holds_every_variable_the_code_reads():
    """Every `STRATA_*` name the command's packages read from the environment (a literal passed
    to os.environ.get or environ.get, or a module's ENV constant) is a row of the table, so the
    test above feeds it."""
    read = set()
    for package in ("contract", "formats", "strata_prefill", "fast", "reference"):
        for path in (ROOT / package).rglob("*.py"):
            text = path.read_text()
            read |= set(re.findall(r"environ(?:\.get)?\(\s*[\"'](STRATA_[A-Z0-9_]+)", text))
            read |= set(re.findall(r"^ENV\w*\s*=\s*[\"'](STRATA_[A-Z0-9_]+)", text, re.M))
    from strata_prefill.fast import options

    read |= {n for sw in options.SWITCHES for n in (*sw.variables, *sw.opposites)} | set(options.RETIRED)
    assert read and read <= set(variables.variables()), sorted(read - set(variables.variables()))


# ---- every field of a trace file ------------------------------------------------------------------

def _shape(path: tuple) -> tuple:
    """A field's path with its list indices as '*': ('traceEvents', 3, 'args', 'chunk') ->
    ('traceEvents', '*', 'args', 'chunk'), a field of every event that has one."""
    return tuple("*" if isinstance(p, int) else p for p in path)


def _fields(doc, path=()):
    """(path, value) of every field of the JSON document, leaves and containers."""
    if path:
        yield path, doc
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _fields(v, path + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _fields(v, path + (i,))


def _trace_doc() -> dict:
    """A trace as `run --trace` writes one (the same code: strata_prefill.fast.trace.chrome_json), with both
    tracks, several chunks and every args key the sim records."""
    import numpy as np

    from strata_prefill.fast.trace import Span, chrome_json

    rng = np.random.default_rng(41)
    spans, t = [], 0.0
    for chunk in range(3):
        for layer in range(2):
            for name, track, args in (("attention", "compute", {"kernel": "rmsnorm"}),
                                      ("copy", "copy", {"expert": 3, "ring": "ring", "slot": 1, "bytes": 2048}),
                                      ("wait copy", "compute", {"what": "copy"}),
                                      ("moe", "compute", {"experts": [[layer, 3]], "rows": 4, "streamed": 1})):
                dur = float(rng.uniform(1e-6, 5e-5))
                spans.append(Span(track, name, t, dur, {"chunk": chunk, "layer": layer, **args}))
                t += dur * 0.7
    return chrome_json(spans, "strata-prefill fast/sim",
                       {"chunk_tokens": 8, "window_tokens": 8, "units": ["chunk 0", "chunk 1", "chunk 2"]})


TRACE = _trace_doc()
FIELD_SHAPES = sorted({_shape(p) for p, _ in _fields(TRACE)})
JSON_VALUES = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(min_value=10**300, max_value=10**301),
                        st.floats(allow_nan=True, allow_infinity=True), TEXT, st.just(""),
                        st.lists(st.integers(), max_size=3), st.dictionaries(TEXT, st.integers(), max_size=2),
                        st.just("__delete__"))


@pytest.fixture(scope="module")
def trace_folder(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz-trace")


@pytest.mark.parametrize("shape", FIELD_SHAPES, ids=[".".join(s) for s in FIELD_SHAPES])
@fuzz_settings(5)
@given(data=st.data())
def test_every_field_of_a_trace_read_by_plot(inputs, trace_folder, shape, data):
    """A trace with one field replaced (by any JSON value, NaN and 300-digit integers among them)
    or deleted: plot draws it or refuses it in one line, before drawing anything."""
    import copy

    doc = copy.deepcopy(TRACE)
    paths = [p for p, _ in _fields(doc) if _shape(p) == shape]
    path = data.draw(st.sampled_from(paths), label="field")
    value = data.draw(JSON_VALUES, label="value")
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    if value == "__delete__":
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    trace = trace_folder / "mutated.json"
    trace.write_text(json.dumps(doc))
    names = {**inputs, "trace": str(trace), "dir": str(trace_folder)}
    chunk = data.draw(st.sampled_from(["0", "2"]), label="--chunk")  # the first unit, or the last
    ran_or_refused(["plot", "{trace}", "{here}/out.png", "--chunk", chunk], names)


# the mutations that once ended plot in a traceback (a report's, and this file's findings), each
# refused by name: (field path, value, what the one line says)
FOUND = [
    (("traceEvents", 4, "args"), "a string", "event 4: args must be an object, got 'a string'"),
    (("traceEvents", 4, "args"), None, "event 4: args must be an object, got None"),
    (("traceEvents", 1, "args"), None, "event 1 (thread_name): args must be an object with a string name"),
    (("traceEvents", 4, "pid"), [1], "event 4: pid must be an integer, got [1]"),
    (("traceEvents", 4, "args", "chunk"), "0", "event 4: args.chunk must be an integer >= 0, got '0'"),
    (("traceEvents", 4, "args", "chunk"), 0.5, "event 4: args.chunk must be an integer >= 0, got 0.5"),
    (("traceEvents", 4, "ts"), float("nan"), "event 4: ts must be a finite number >= 0 (microseconds), got nan"),
    (("traceEvents", 4, "dur"), 10**400, "event 4: dur must be a finite number >= 0 (microseconds)"),
    (("otherData", "units", 0), "", "otherData.units must be a list of names (non-blank strings)"),
]


@pytest.mark.parametrize("path, value, needle", FOUND, ids=[".".join(map(str, p)) + f"={v!r}"[:24] for p, v, _ in FOUND])
def test_the_trace_fields_that_once_raised_are_refused_by_name(inputs, trace_folder, path, value, needle):
    import copy

    doc = copy.deepcopy(TRACE)
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    trace = trace_folder / "found.json"
    trace.write_text(json.dumps(doc))
    names = {**inputs, "trace": str(trace), "dir": str(trace_folder)}
    with world(names) as (_status, out, err):
        assert cli.main(["plot", str(trace), "out.png"]) == 2
    (line,) = err.getvalue().splitlines()
    assert line.startswith(f"strata-prefill: error: {trace}: {needle}"), line
    assert out.getvalue() == ""
