"""Every number a user can type, for every subcommand that takes one: flags, bench's lists and arm
specs, the switch variables. Each row is a value refused in one line, `strata-prefill: error: ...`,
exit status 2, before any work: huge (past what the kernels, the header or the disk hold), negative,
zero, not a number, float-looking (1e3, 2.5), beyond the pack's context once the greedy tokens are
added, past its vocabulary or its experts.

The rows reuse tests/test_cli_paths_and_flags.py's inputs, environment and file snapshots, and
assert what its rows assert: the status, the one line and the text it must hold, no traceback,
nothing on stdout, under a second (no prompt made, no prefill, no pack planned or written), no
file appeared (no OUT.gguf, no default pack) and every input is byte for byte what it was."""
from __future__ import annotations


import numpy as np
import pytest

from strata_prefill import checks
from test_cli_paths_and_flags import (AB, BENCH, DEFAULT_PACK, FAST, RUN, WORK_S, _files, _fill,  # noqa: F401
                                      clean_env, inputs, refused_as_a_user, refused_in_process)

HUGE = str(10**25)
DIGITS_5000 = "7" * 5000  # int() itself refuses 4,300 digits: the parser must not reach it
INT32 = "must be at most 2,147,483,647 (token positions are int32 in the CUDA kernels)"
SEED64 = "must be at most 18,446,744,073,709,551,615 (a seed is 64 bits"
CONTEXT = 32768  # the tiny preset's context length (the pack of the rows and the default pack)
BENCH_SIM = ["bench", "--pack", "{pack}", "--backend", "sim", "--json", "{dir}/out.json"]
MAKE = ["make-pack", "{dir}/out.gguf", "--no-progress"]
KERNELS = ["build-kernels", "--cache", "{dir}/cubins"]


@pytest.fixture(scope="module")
def long_prompt(inputs):
    """A prompt file of CONTEXT - 2 random ids: it fits the context, not with --greedy 8."""
    path = f"{inputs['dir']}/long-prompt.txt"
    ids = np.random.default_rng(2424).integers(0, 512, CONTEXT - 2)
    with open(path, "w") as f:
        f.write(" ".join(map(str, ids)))
    return path


# (argument template, text the one line must contain, environment)
RUN_ROWS = [
    # --prompt-tokens N: huge, past the context, not a count
    (RUN + ["--prompt-tokens", HUGE], f"run: argument --prompt-tokens: {INT32}, got '{HUGE}'", {}),
    (RUN + ["--prompt-tokens", "1000000000"], "--prompt-tokens 1000000000 needs 1,000,000,000 positions, beyond "
                                               "the pack's context length (32,768): at most 32,768 prompt tokens", {}),
    (RUN + ["--prompt-tokens", str(CONTEXT + 1)], "--prompt-tokens 32769 needs 32,769 positions, beyond the pack's", {}),
    (["run", "--greedy", "0", "--no-progress", "--prompt-tokens", "40000"],
     "--prompt-tokens 40000 needs 40,000 positions, beyond the default pack's context length (32,768)", {}),
    (RUN + ["--prompt-tokens", "1e3"], "'1e3' is not a token count (a count is a positive integer, in digits: "
                                       "1000) nor a prompt file", {}),
    (RUN + ["--prompt-tokens", "2.5"], "'2.5' is not a token count", {}),
    (RUN + ["--prompt-tokens", "0"], "'0' is not a token count", {}),
    (RUN + ["--prompt-tokens", "-" + HUGE], "is not a token count", {}),
    (RUN + ["--prompt-tokens", DIGITS_5000], "must be at most 2,147,483,647", {}),
    # --greedy: its tokens but the last are fed back after the prompt: they share the context
    (RUN + ["--prompt-tokens", str(CONTEXT), "--greedy", "2"],
     "--prompt-tokens 32768 with --greedy 2 needs 32,769 positions (32,768 + 1 greedy tokens fed back), beyond "
     "the pack's context length (32,768): at most 32,767 prompt tokens with --greedy 2 or at most --greedy 1", {}),
    (RUN + ["--greedy", "40000"], "--prompt-tokens 8 with --greedy 40000 needs 40,007 positions", {}),
    (RUN + ["--prompt-tokens", "{long-prompt}", "--greedy", "8"],
     "--prompt-tokens {long-prompt} (32,766 tokens) with --greedy 8 needs 32,773 positions", {}),
    (["run", "--no-progress", "--greedy", "32768"], "with --greedy 32768 needs 32,967 positions (200 + 32,767 "
                                                    "greedy tokens fed back), beyond the default pack's context", {}),
    (RUN + ["--greedy", HUGE], f"run: argument --greedy: {INT32}", {}),
    (RUN + ["--greedy", "-1"], "run: argument --greedy: must be an integer >= 0, got '-1'", {}),
    (RUN + ["--greedy", "1.5"], "--greedy: must be an integer >= 0, got '1.5'", {}),
    (RUN + ["--greedy", "8e0"], "--greedy: must be an integer >= 0, got '8e0' (in digits: 8)", {}),
    # --prefill
    (RUN + ["--prefill", "-1"], "--prefill: must be 'auto' or a positive integer, got '-1'", {}),
    (RUN + ["--prefill", "0"], "--prefill: must be 'auto' or a positive integer, got '0'", {}),
    (RUN + ["--prefill", "1e3"], "--prefill: must be 'auto' or a positive integer, got '1e3' (in digits: 1000)", {}),
    (RUN + ["--prefill", HUGE], f"--prefill: {INT32}", {}),
    (RUN + ["--prefill", "Auto"], "--prefill: must be 'auto' or a positive integer, got 'Auto'", {}),
    # --top: past the vocabulary, huge, not a number
    (RUN + ["--top", "1000"], "--top 1000: the pack's vocabulary has 512 tokens: at most 512", {}),
    (["run", "--greedy", "0", "--top", "513"], "--top 513: the default pack's vocabulary has 512 tokens", {}),
    (RUN + ["--top", DIGITS_5000], "--top: must be at most 9,223,372,036,854,775,807, got '7777777777777777'"
                                   "...(5,000 characters)", {}),
    (RUN + ["--top", "five"], "--top: must be a positive integer, got 'five'", {}),
    (RUN + ["--top", "1_0"], "--top: must be a positive integer, got '1_0' (in digits: 10)", {}),
    (RUN + ["--top", "\u0661\u0662"], "--top: must be a positive integer", {}),  # Arabic-Indic digits
    # --seed of the prompt
    (RUN + ["--seed", str(2**64)], f"run: argument --seed: {SEED64}", {}),
    (RUN + ["--seed", "-1"], "--seed: must be an integer >= 0, got '-1'", {}),
    (RUN + ["--seed", "0x10"], "--seed: must be an integer >= 0, got '0x10'", {}),
    # the fast path's counts
    (FAST + ["--expert-cache", "-3"], "--expert-cache: must be 'auto' or an integer >= 0, got '-3'", {}),
    (FAST + ["--expert-cache", "1e3"], "--expert-cache: must be 'auto' or an integer >= 0, got '1e3' (in digits: "
                                       "1000)", {}),
    (FAST + ["--expert-cache", HUGE], "--expert-cache: must be at most 9,223,372,036,854,775,807", {}),
    (FAST + ["--expert-cache", "4", "--ring", "0"], "--ring: must be a positive integer, got '0'", {}),
    (FAST + ["--expert-cache", "4", "--ring", "33"], "--ring 33: the pack has 32 experts (2 layers x 16): more "
                                                     "can do nothing more: at most 32", {}),
    (FAST + ["--expert-cache", "4", "--ring", "-" + HUGE], "--ring: must be a positive integer", {}),
    (FAST + ["--expert-cache", "4", "--stream-min", "0"], "--stream-min: must be 'auto' or a positive integer, got '0'", {}),
    (FAST + ["--expert-cache", "4", "--stream-min", "1k"], "--stream-min: must be 'auto' or a positive integer, got '1k'", {}),
    (RUN + ["--impl", "fast", "--vram-reserve-mib", "-1"], "--vram-reserve-mib: must be an integer >= 0", {}),
    # numbers given through the switch variables
    (FAST + ["--expert-cache", "4"], "STRATA_PREFILL_RING must be a positive integer, got '1e3' (in digits: 1000)",
     {"STRATA_PREFILL_RING": "1e3"}),
    (FAST + ["--expert-cache", "4"], "STRATA_PREFILL_RING=1000000000000: the pack has 32 experts",
     {"STRATA_PREFILL_RING": "1000000000000"}),
    (FAST, "STRATA_PREFILL_STREAM_MIN must be 'auto' or a positive integer, got '-4'", {"STRATA_PREFILL_STREAM_MIN": "-4"}),
    (RUN, "STRATA_PREFILL_THREADS must be a positive integer, got '0'", {"STRATA_PREFILL_THREADS": "0"}),
    (RUN, "STRATA_PREFILL_THREADS must be at most 1,024 (each is a thread of this process), got '100000'",
     {"STRATA_PREFILL_THREADS": "100000"}),
    (RUN, "STRATA_PREFILL_THREADS must be a positive integer, got '2.0' (in digits: 2)",
     {"STRATA_PREFILL_THREADS": "2.0"}),
]

BENCH_ROWS = [
    (BENCH_SIM + AB + ["--tokens", "8,8"], "bench: argument --tokens: prompt length 8 is given twice", {}),
    (BENCH_SIM + AB + ["--tokens", "8,16,08"], "prompt length 8 is given twice", {}),
    (BENCH_SIM + AB + ["--tokens", "8," + HUGE], f"bench: argument --tokens: {INT32}, got '{HUGE}'", {}),
    (BENCH_SIM + AB + ["--tokens", "40000"], "--tokens: 40000 tokens exceed the pack's context length (32,768)", {}),
    (["bench", "--backend", "sim", *AB, "--tokens", "8,40000"],
     "--tokens: 40000 tokens exceed the default pack's context length (32,768)", {}),
    (BENCH_SIM + AB + ["--tokens", "0,8"], "--tokens: must be a positive integer, got '0'", {}),
    (BENCH_SIM + AB + ["--tokens", "-8"], "--tokens: must be a positive integer, got '-8'", {}),
    (BENCH_SIM + AB + ["--tokens", "1e3"], "--tokens: must be a positive integer, got '1e3' (in digits: 1000)", {}),
    (BENCH_SIM + AB + ["--tokens", ","], "--tokens: needs at least one prompt length", {}),
    (BENCH_SIM + AB + ["--tokens", "8", "--reps", "0"], "--reps: must be a positive integer, got '0'", {}),
    (BENCH_SIM + AB + ["--tokens", "8", "--reps", "2.5"], "--reps: must be a positive integer, got '2.5'", {}),
    (BENCH_SIM + AB + ["--tokens", "8", "--seed", str(2**64)], f"bench: argument --seed: {SEED64}", {}),
    (BENCH_SIM + AB + ["--tokens", "8", "--prefill", "-1"], "--prefill: must be 'auto' or a positive integer", {}),
    (BENCH_SIM + ["--tokens", "8", "--a", "ring=0", "--b", "default"], "--a: ring must be a positive integer, got '0'", {}),
    (BENCH_SIM + ["--tokens", "8", "--a", "expert-cache=0,ring=33", "--b", "default"],
     "--a: ring 33: the pack has 32 experts (2 layers x 16)", {}),
    (BENCH_SIM + ["--tokens", "8", "--a", "default", "--b", "expert-cache=-3"],
     "--b: expert-cache must be 'auto' or an integer >= 0, got '-3'", {}),
    (BENCH_SIM + ["--tokens", "8", "--a", "STRATA_PREFILL_STREAM_MIN=1e3", "--b", "default"],
     "--a: STRATA_PREFILL_STREAM_MIN must be 'auto' or a positive integer, got '1e3' (in digits: 1000)", {}),
    (BENCH_SIM + AB + ["--tokens", "8"], "STRATA_PREFILL_THREADS must be a positive integer, got '-1'",
     {"STRATA_PREFILL_THREADS": "-1"}),
]

MAKE_PACK_ROWS = [
    (MAKE + ["--preset", "strata", "--layers", "100000"], "not enough free disk for {dir}/out.gguf: the pack takes", {}),
    (MAKE + ["--layers", "1000000000"], "not enough free disk for {dir}/out.gguf", {}),
    (MAKE + ["--layers", str(2**32)], "make-pack: argument --layers: must be at most 4,294,967,295 (a GGUF header "
                                      "holds block_count as a uint32), got '4294967296'", {}),
    (MAKE + ["--layers", "-1"], "--layers: must be a positive integer, got '-1'", {}),
    (MAKE + ["--layers", "0"], "--layers: must be a positive integer, got '0'", {}),
    (MAKE + ["--layers", "1e3"], "--layers: must be a positive integer, got '1e3' (in digits: 1000)", {}),
    (MAKE + ["--seed", str(2**64)], f"make-pack: argument --seed: {SEED64}", {}),
    (MAKE + ["--seed", "-1"], "--seed: must be an integer >= 0, got '-1'", {}),
    (MAKE + ["--seed", "1.5"], "--seed: must be an integer >= 0, got '1.5'", {}),
    (MAKE + ["--seed", DIGITS_5000], f"--seed: {SEED64}", {}),
]

KERNEL_ROWS = [
    (KERNELS + ["--jobs", "0"], "build-kernels: argument --jobs: must be a positive integer, got '0'", {}),
    (KERNELS + ["--jobs", "-2"], "--jobs: must be a positive integer, got '-2'", {}),
    (KERNELS + ["--jobs", "100000"], "--jobs: must be at most 1,024 (each is a thread of this process)", {}),
    (KERNELS + ["--jobs", "4.0"], "--jobs: must be a positive integer, got '4.0' (in digits: 4)", {}),
]

PLOT_ROWS = [
    (["plot", "{trace}", "{dir}/out.png", "--chunk", "-1"], "plot: argument --chunk: must be an integer >= 0, got '-1'", {}),
    (["plot", "{trace}", "{dir}/out.png", "--min-gap-us", "inf"], "--min-gap-us must be a finite number >= 0, got inf", {}),
    (["plot", "{trace}", "{dir}/out.png", "--min-gap-us", "nan"], "--min-gap-us must be a finite number >= 0, got nan", {}),
    (["plot", "{trace}", "{dir}/out.png", "--chunk", "1e3"], "--chunk: must be an integer >= 0, got '1e3' (in digits: "
                                                            "1000)", {}),
]

CASES = RUN_ROWS + BENCH_ROWS + MAKE_PACK_ROWS + KERNEL_ROWS + PLOT_ROWS


def _row_id(case) -> str:
    args, _needle, env = case
    shown = [a if len(a) <= 12 else a[:6] + "..." for a in args if not a.startswith("{")]
    return " ".join([*shown[:1], *shown[-2:], *(f"{k}={v[:8]}" for k, v in env.items())])


@pytest.mark.parametrize("template, needle, env", CASES, ids=[_row_id(c) for c in CASES])
def test_a_number_is_refused_in_one_line_before_any_work(inputs, long_prompt, clean_env, monkeypatch, capsys,
                                                          template, needle, env):
    names = {**inputs, "long-prompt": long_prompt, "cache": str(clean_env / "cache")}
    args = [_fill(a, names) for a in template]
    for var, value in env.items():
        monkeypatch.setenv(var, _fill(value, names))
    line = refused_in_process(args, _fill(needle, names), inputs, clean_env, capsys)  # nor the default pack
    assert len(line) < 400, line  # a 5,000-digit value is shown cut


# the cases, as a user runs them: a process of its own, its exit status, nothing made (no
# OUT.gguf, no default pack in the cache home), in the time a process takes to start and refuse
AS_A_USER = [
    (["run", "--prompt-tokens", HUGE], f"run: argument --prompt-tokens: {INT32}"),
    (["run", "--prompt-tokens", "1000000000"], "--prompt-tokens 1000000000 with --greedy 8 needs 1,000,000,007 "
                                               "positions (1,000,000,000 + 7 greedy tokens fed back), beyond the "
                                               "default pack's context length (32,768)"),
    (["make-pack", "{dir}/user.gguf", "--seed", str(2**64)], f"make-pack: argument --seed: {SEED64}"),
    (["make-pack", "{dir}/user.gguf", "--preset", "strata", "--layers", "100000"],
     "not enough free disk for {dir}/user.gguf"),
]


@pytest.mark.parametrize("template, needle", AS_A_USER, ids=[_row_id((c[0], c[1], {})) for c in AS_A_USER])
def test_refused_in_a_process_of_its_own(inputs, tmp_path, template, needle):
    took = refused_as_a_user(inputs, tmp_path, template, needle)
    assert took < 15, f"refused after {took:.1f} s"  # was 61 s, 87 s and 4 GB, or never


# ---- the parser and the context check on their own: the edges a row cannot reach cheaply -----

@pytest.mark.parametrize("text, value", [("1", 1), (" 42 ", 42), ("+7", 7), ("007", 7),
                                         (str(checks.COUNT_MAX), checks.COUNT_MAX)])
def test_integer_takes_decimal_digits(text, value):
    assert checks.integer(text, 1) == value


@pytest.mark.parametrize("text, message", [
    ("0", "must be a positive integer, got '0'"),
    (str(checks.COUNT_MAX + 1), "must be at most 9,223,372,036,854,775,807"),
    ("-" + "9" * 100, "must be a positive integer"),
    ("9" * 100, "must be at most"),
    ("1e3", "(in digits: 1000)"),
    ("1e400", "got '1e400'"),  # inf: no hint
    ("nan", "got 'nan'"),
    ("", "got ''"),
    ("\u0663", "got '\u0663'"),
])
def test_integer_refuses_in_one_phrase(text, message):
    import argparse

    with pytest.raises(argparse.ArgumentTypeError) as exc:
        checks.integer(text, 1)
    assert message in str(exc.value)
    assert "\n" not in str(exc.value)


def test_the_limit_and_its_reason_are_said():
    import argparse

    with pytest.raises(argparse.ArgumentTypeError, match=r"must be at most 10 \(ten is plenty\), got '11'"):
        checks.bounded(1, 10, "ten is plenty")("11")
    assert checks.bounded(1, 10, "ten is plenty")("10") == 10


def test_the_context_holds_the_prompt_and_the_greedy_tokens_but_the_last():
    """The edge exactly: the last greedy token is never fed back (strata_prefill/session.py), so a
    prompt of C - G + 1 tokens and G greedy tokens fit a context of C, one more does not."""
    from strata_prefill.formats.config import PRESETS
    from strata_prefill.contract.errors import InputError

    cfg = PRESETS["tiny"].replace(context_length=100)
    checks.counts_fit(cfg, 100, greedy=1)
    checks.counts_fit(cfg, 93, greedy=8)
    checks.counts_fit(cfg, 100, greedy=0, top=512)
    with pytest.raises(InputError, match=r"--prompt-tokens 94 with --greedy 8 needs 101 positions"):
        checks.counts_fit(cfg, 94, greedy=8)
    with pytest.raises(InputError, match=r"--prompt-tokens 101 needs 101 positions"):
        checks.counts_fit(cfg, 101, greedy=1)
    with pytest.raises(InputError, match=r"--top 513: the pack's vocabulary has 512 tokens"):
        checks.counts_fit(cfg, 1, top=513)


def test_make_pack_sizes_its_data_from_the_arguments_as_it_writes_it(tmp_path):
    """data_bytes (one layer planned, counted per layer) is the pack's data exactly: the file
    made is that plus its header and alignment, never less."""
    import argparse
    import os

    from strata_prefill.formats.make_pack import make_pack
    from strata_prefill.formats.pack import Pack
    from strata_prefill.commands.make_pack import data_bytes

    for layers, expert, dense, tie in ((3, "Q8_0", "Q8_0", False), (1, "Q2_K", "F16", True)):
        args = argparse.Namespace(preset="tiny", layers=layers, expert_type=expert, dense_type=dense,
                                  router_type=None, tie_embeddings=tie)
        out = make_pack(tmp_path / f"p{layers}.gguf", "tiny", layers=layers, expert_type=expert,
                        dense_type=dense, tie_embeddings=tie, progress=False)
        data = sum(int(t.n_bytes) for t in Pack.open(out).reader.tensors)
        size = os.path.getsize(out)
        assert data_bytes(args) == data < size
        assert size - data < 1 << 20  # the header and the padding of a tiny pack
