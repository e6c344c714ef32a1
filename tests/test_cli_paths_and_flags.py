"""Outputs that would overwrite an input or another output, and flags that would do nothing, for
every subcommand: each row is a command line refused with one line, `strata-prefill: error:
...`, exit status 2, before any work.

Each row asserts the status, the one line and the text it must hold, no traceback, nothing on
stdout, that the refusal took under a second (no prefill, no pack made), that no file appeared
anywhere under the inputs' folder, the current folder or the cache home, and that every input is
byte for byte what it was (a SHA-256 of every file before and after). The rows run in-process
(`cli.main`), so an exception that escaped the one-line handler fails the row with its traceback.

Same file means: the same path once resolved, or, where both exist, the same (st_dev, st_ino):
a hard link and a symlink to an input are that input."""
from __future__ import annotations

import hashlib
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from strata_prefill.contract.constants import PACK_FORMAT
from strata_prefill import arms
from strata_prefill.cli import main

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PACK = f"{{cache}}/strata-prefill/tiny-seed0-f{PACK_FORMAT}.gguf"  # run's built-in pack
WORK_S = 1.0  # a refusal before any work takes less than this

# FastEngine keyword -> a value its `run` flag takes (every switch in arms.SWITCHES; a test
# below holds the two sets equal, so a new switch needs a row here)
SAMPLE = {"group_gather": "0", "quant_gather": "1", "expert_cache": "4", "vram_reserve_mib": "10",
          "ring": "8", "stream_min": "4", "copy_coalesce": "1", "overlap_plan": "0", "fuse_group": "0",
          "in_place": "0", "window": "16", "ring_in_place": "1", "flush_on_skip": "1", "stage_in_ring": "1",
          "ring_run": "3", "stream_hide": "50", "choose_ahead": "3", "stage_head": "2",
          "head_predict": "1", "device_plan": "0", "device_embed": "0"}


@pytest.fixture(scope="module")
def inputs(make_test_pack, tmp_path_factory):
    """The files the rows read, in their own folder, with links to them; {name: path}. The pack
    is a copy: a check that failed would overwrite this copy, never the shared test pack."""
    d = tmp_path_factory.mktemp("paths-and-flags")
    pack = d / "pack.gguf"
    shutil.copyfile(make_test_pack("tiny", "Q8_0").path, pack)
    rng = np.random.default_rng(24)
    prompt = d / "prompt.txt"
    prompt.write_text(" ".join(str(t) for t in rng.integers(0, 512, 12)))
    trace = d / "trace.json"
    trace.write_bytes(rng.integers(0, 256, 300, dtype=np.uint8).tobytes())  # never read as a trace
    (d / "dump").mkdir()
    (d / "dump" / "layers.spd").write_text(" ".join(str(t) for t in rng.integers(0, 512, 9)))
    os.link(pack, d / "pack-link.gguf")
    os.symlink(pack, d / "pack-sym.gguf")
    os.link(trace, d / "trace-link.png")
    os.symlink(trace, d / "trace-sym.png")
    os.link(pack, d / "bench.json")  # what `bench --markdown bench.md` would write by default
    (d / "old-out.bin").write_bytes(rng.integers(0, 256, 40, dtype=np.uint8).tobytes())  # an earlier output
    os.link(d / "old-out.bin", d / "old-out-link.bin")
    (d / "layers.spd").mkdir()  # where --dump-dir {dir} would write its record file
    (d / "dev").mkdir()
    os.symlink("/dev/null", d / "dev" / "layers.spd")  # a write would rename a file onto the device
    names = {"pack": pack, "prompt": prompt, "trace": trace, "dump": d / "dump",
             "dump-prompt": d / "dump" / "layers.spd", "pack-link": d / "pack-link.gguf",
             "pack-sym": d / "pack-sym.gguf", "trace-link": d / "trace-link.png",
             "trace-sym": d / "trace-sym.png", "bench-link": d / "bench.json",
             "old-out": d / "old-out.bin", "old-out-link": d / "old-out-link.bin"}
    return {"dir": str(d), **{k: str(v) for k, v in names.items()}}


RUN = ["run", "--pack", "{pack}", "--prompt-tokens", "8", "--greedy", "0", "--no-progress"]
FAST = RUN + ["--impl", "fast", "--backend", "sim"]
CUDA = RUN + ["--impl", "fast"]  # refused before the engine: no GPU is needed to see it
BENCH = ["bench", "--pack", "{pack}", "--backend", "sim", "--tokens", "8", "--reps", "1",
         "--json", "{dir}/out.json"]
AB = ["--a", "default", "--b", "default"]
READS = "is the pack this run reads"

# (argument template, text the one line must contain, environment); {name}: a path from
# `inputs`, {cache}: the cache home of the row
PATHS = [
    # run: an output that is an input
    (RUN + ["--dump-first-logits", "{pack}"], "run: --dump-first-logits {pack} is the pack this run reads (--pack)", {}),
    (RUN + ["--dump-r", "{pack}"], "run: --dump-r {pack} " + READS + " (--pack)", {}),
    (RUN + ["--dump-r", "{dir}/dump/../pack.gguf"], "--dump-r {dir}/dump/../pack.gguf " + READS + " (--pack)", {}),
    (RUN + ["--dump-r", "{pack-link}"], "--dump-r {pack-link} " + READS + " (--pack {pack}, the same file under", {}),
    (RUN + ["--dump-first-logits", "{pack-sym}"], "--dump-first-logits {pack-sym} " + READS, {}),
    (["run", "--pack", "{pack-sym}", "--greedy", "0", "--dump-r", "{pack-link}"], READS + " (--pack {pack-sym}", {}),
    (RUN + ["--prompt-tokens", "{prompt}", "--dump-r", "{prompt}"],
     "--dump-r {prompt} is the prompt file this run reads (--prompt-tokens)", {}),
    (RUN + ["--prompt-tokens", "{dump-prompt}", "--dump-dir", "{dump}"],
     "--dump-dir's record file {dump}/layers.spd is the prompt file this run reads", {}),
    (FAST + ["--trace", "{pack}"], "run: --trace {pack} " + READS, {}),
    (FAST + ["--expert-cache", "4", "--trace", "{pack-link}"], "--trace {pack-link} " + READS, {}),
    (RUN, "STRATA_DUMP_FIRST_LOGITS {pack} " + READS, {"STRATA_DUMP_FIRST_LOGITS": "{pack}"}),
    (RUN, "STRATA_PREFILL_DUMP_R {pack-sym} " + READS, {"STRATA_PREFILL_DUMP_R": "{pack-sym}"}),
    (["run", "--greedy", "0", "--dump-r", DEFAULT_PACK], READS + " (the default pack)", {}),
    # run: two outputs in one file
    (RUN + ["--dump-first-logits", "{dir}/out.bin", "--dump-r", "{dir}/out.bin"],
     "run: --dump-r {dir}/out.bin is also the file of --dump-first-logits: two outputs cannot share one file", {}),
    (RUN + ["--dump-first-logits", "{old-out}", "--dump-r", "{old-out-link}"],
     "--dump-r {old-out-link} is also the file of --dump-first-logits {old-out}, the same file under another name", {}),
    (RUN + ["--dump-dir", "{dump}", "--dump-r", "{dump}/layers.spd"],
     "--dump-dir's record file {dump}/layers.spd is also the file of --dump-r", {}),
    (RUN + ["--dump-dir", "{dir}/d", "--dump-r", "{dir}/d"], "--dump-dir {dir}/d is also the file of --dump-r", {}),
    (FAST + ["--expert-cache", "4", "--dump-first-logits", "{dir}/t.json", "--trace", "{dir}/t.json"],
     "--trace {dir}/t.json is also the file of --dump-first-logits", {}),
    (RUN + ["--dump-r", "{dir}/r.bin"], "--dump-r {dir}/r.bin is also the file of STRATA_DUMP_FIRST_LOGITS",
     {"STRATA_DUMP_FIRST_LOGITS": "{dir}/r.bin"}),
    # plot
    (["plot", "{trace}", "{trace}"], "plot: OUT.png {trace} is the trace this plot reads (TRACE.json)", {}),
    (["plot", "{trace}", "{trace-link}"], "OUT.png {trace-link} is the trace this plot reads (TRACE.json {trace}, "
                                          "the same file under another name)", {}),
    (["plot", "{trace}", "{trace-sym}"], "OUT.png {trace-sym} is the trace this plot reads", {}),
    # bench
    (BENCH[:-2] + AB + ["--json", "{pack}"], "bench: --json {pack} is the pack this bench reads (--pack)", {}),
    (BENCH + AB + ["--markdown", "{pack-sym}"], "bench: --markdown {pack-sym} is the pack this bench reads", {}),
    (BENCH[:-2] + AB + ["--markdown", "{dir}/bench.md"],
     "bench: --json (by default) {dir}/bench.json is the pack this bench reads (--pack {pack}, the same file", {}),
    (BENCH + AB + ["--markdown", "{dir}/out.json"],
     "bench: --markdown {dir}/out.json is also the file of --json: two outputs cannot share one file", {}),
    (["bench", "--backend", "sim", *AB, "--json", DEFAULT_PACK], "bench: --json " + DEFAULT_PACK
     + " is the pack this bench reads (the default pack)", {}),
    # build-kernels: the cubin folder is not the kernels' source folder
    (["build-kernels", "--cache", str(ROOT / "fast" / "cuda" / "kernels")],
     "is the kernel source folder this build-kernels reads", {}),
]

# a `run` flag of the fast path, with the reference: --backend, --timing and --trace say why;
# a switch of the table is refused by its rule (fast/options.py: refuse_idle; every need of every
# switch is derived and tested in tests/test_switch_needs.py)
FAST_FLAGS = [("--backend", "sim"), ("--timing", None), ("--trace", "{dir}/t.json"),
              *[("--" + kw.replace("_", "-"), v) for kw, v in SAMPLE.items()]]
NEEDS_FAST = {"--backend": "--backend picks the fast path's backend: it needs --impl fast",
              "--timing": "--timing times the fast path's streams: it needs --impl fast",
              "--trace": "--trace times the fast path's streams: it needs --impl fast"}
IDLE = [
    *[(RUN + [flag] + ([v] if v is not None else []),
       NEEDS_FAST.get(flag, f"{flag} {v} needs --impl fast: this run is --impl reference: it does nothing"), {})
      for flag, v in FAST_FLAGS],
    *[(RUN + ["--impl", "reference", flag] + ([v] if v is not None else []), "it needs --impl fast", {})
      for flag, v in FAST_FLAGS[:1]],
    # run: flags that need another flag
    (RUN + ["--dump-level", "ops"], "--dump-level picks what --dump-dir records: it needs --dump-dir", {}),
    (RUN + ["--prompt-tokens", "{prompt}", "--seed", "3"], "--seed seeds the random prompt of --prompt-tokens N", {}),
    (FAST + ["--reference-cache", "{dir}/rc"], "--reference-cache keeps reference runs: it needs --impl reference", {}),
    # run --impl fast: switches that would do nothing on this pack (2 layers x 16 experts)
    (FAST + ["--expert-cache", "33"], "--expert-cache 33: the pack has 32 experts (2 layers x 16): more can do "
                                      "nothing more: at most 32", {}),
    (CUDA + ["--expert-cache", "1000"], "--expert-cache 1000: the pack has 32 experts", {}),
    (FAST + ["--vram-reserve-mib", "100"], "--vram-reserve-mib 100 needs --backend cuda: this run is --backend sim: "
                                           "it does nothing", {}),
    (CUDA + ["--expert-cache", "4", "--vram-reserve-mib", "100"],
     "--vram-reserve-mib 100 needs --expert-cache auto: --expert-cache is 4: it does nothing", {}),
    *[(FAST + [flag, v], f"{flag} {v} needs experts that stream (an expert cache smaller than the pack): every "
                         "expert is resident (the sim holds all 32 unless --expert-cache N is below that): it does "
                         "nothing", {})
      for flag, v in (("--ring", "8"), ("--stream-min", "4"), ("--copy-coalesce", "0"))],
    *[(CUDA + [flag, "1"], f"argument {flag}: retired: every run takes", {})
      for flag in ("--lean-attention", "--tiled-dense", "--widen-float", "--pair-attention")],
    (CUDA + ["--expert-cache", "0", "--ring-in-place", "0", "--in-place", "1"],
     "--in-place 1 needs resident experts (an expert cache of at least one slot) or --ring-in-place 1: none is "
     "resident (--expert-cache 0 holds none) and --ring-in-place is 0: it does nothing", {}),
    (CUDA + ["--expert-cache", "32", "--ring", "8"], "--ring 8 needs experts that stream (an expert cache smaller than "
                                                     "the pack): every expert is resident (--expert-cache 32 holds all "
                                                     "32): it does nothing", {}),
    (FAST + ["--group-gather", "0"], "--group-gather 0 needs experts that stream (an expert cache smaller than the "
                                     "pack) or --in-place 0: every expert is resident (the sim holds all 32 unless "
                                     "--expert-cache N is below that) and --in-place is 1 (the default): it does nothing",
     {}),
    (CUDA + ["--expert-cache", "32", "--in-place", "1", "--group-gather", "1"], "--group-gather 1 needs experts that "
                                                                               "stream", {}),
    # environment values the code would not take
    (RUN, "STRATA_PREFILL_TIMING must be 0 or 1, got 'yes'", {"STRATA_PREFILL_TIMING": "yes"}),
    (FAST, "STRATA_PREFILL_TIMING must be 0 or 1, got 'true'", {"STRATA_PREFILL_TIMING": "true"}),
    (RUN, "STRATA_PREFILL_GROUP_GATHER must be 0 or 1, got '2'", {"STRATA_PREFILL_GROUP_GATHER": "2"}),
    (FAST, "STRATA_PREFILL_RING must be a positive integer, got '0'", {"STRATA_PREFILL_RING": "0"}),
    (FAST, "STRATA_PREFILL_STREAM_MIN must be 'auto' or a positive integer", {"STRATA_PREFILL_STREAM_MIN": "lots"}),
    (RUN + ["--dump-dir", "{dir}/d"], "STRATA_PREFILL_DUMP_LEVEL must be one of layer, ops, got 'all'",
     {"STRATA_PREFILL_DUMP_LEVEL": "all"}),
    (RUN, "STRATA_PREFILL_THREADS must be a positive integer", {"STRATA_PREFILL_THREADS": "-2"}),
    # bench: arms whose switches would do nothing
    (BENCH + ["--a", "expert-cache=33", "--b", "default"], "--a: expert-cache 33: the pack has 32 experts", {}),
    (BENCH + ["--a", "default", "--b", "ring=8"], "--b: ring 8 needs experts that stream", {}),
    (BENCH + ["--a", "default", "--b", "STRATA_PREFILL_COPY_COALESCE=1"], "--b: copy-coalesce 1 needs experts that "
                                                                         "stream", {}),
    (BENCH + ["--a", "default", "--b", "ring-in-place=1"], "--b: ring-in-place 1 needs experts that stream", {}),
    (BENCH + ["--a", "expert-cache=4,in-place=0,ring-in-place=1", "--b", "default"],
     "--a: ring-in-place 1 needs in-place 1: in-place is 0: it does nothing", {}),
    (BENCH + ["--a", "expert_cache=32,stream-min=4", "--b", "default"],
     "--a: stream-min 4 needs experts that stream (an expert cache smaller than the pack): every expert is resident "
     "(expert-cache 32 holds all 32): it does nothing", {}),
    (BENCH + ["--a", "STRATA_PREFILL_PAIR_ATTENTION=0", "--b", "default"],
     "--a: 'STRATA_PREFILL_PAIR_ATTENTION' is retired: every run takes the pair kernel", {}),
    (BENCH + AB, "STRATA_PREFILL_WIDEN_FLOAT is retired: every run takes F16/BF16 dense matrices widened",
     {"STRATA_PREFILL_WIDEN_FLOAT": "0"}),
    (RUN, "STRATA_PREFILL_LEAN_ATTENTION is retired: every run takes the lean", {"STRATA_PREFILL_LEAN_ATTENTION": "1"}),
    (BENCH + ["--a", "default", "--b", "expert-cache=0,ring-in-place=0,in-place=0"],
     "--b: in-place 0 needs resident experts (an expert cache of at least one slot) or ring-in-place 1", {}),
    (BENCH + ["--a", "STRATA_PREFILL_GROUP_GATHER=0", "--b", "default"], "--a: group-gather 0 needs experts that "
                                                                        "stream", {}),
    (BENCH + ["--a", "vram-reserve-mib=10", "--b", "default"], "--a: vram-reserve-mib 10 needs --backend cuda: this "
                                                              "run is --backend sim", {}),
    (["bench", "--pack", "{pack}", "--tokens", "8", "--json", "{dir}/out.json", "--a", "expert-cache=4,vram-reserve-mib=10",
      "--b", "default"], "--a: vram-reserve-mib 10 needs expert-cache auto: expert-cache is 4: it does nothing", {}),
    (BENCH + ["--a", "default", "--b", "default"], "--a: STRATA_PREFILL_RING=8 needs experts that stream",
     {"STRATA_PREFILL_RING": "8"}),
    (BENCH + ["--a", "expert-cache=4,window=4", "--b", "default"], "--a: window 4 is less than the chunk (8 tokens, "
                                                                   "the whole prompt): a window holds whole chunks "
                                                                   "(--tokens 8)", {}),
    (BENCH + AB, "STRATA_PREFILL_TIMING must be 0 or 1, got 'yes'", {"STRATA_PREFILL_TIMING": "yes"}),
    (BENCH + AB, "STRATA_PREFILL_DUMP_R names a dump of a run: bench writes none", {"STRATA_PREFILL_DUMP_R": "{dir}/r.bin"}),
    (BENCH + AB, "STRATA_DUMP_FIRST_LOGITS names a dump of a run", {"STRATA_DUMP_FIRST_LOGITS": "{pack}"}),
]

# an empty path (`--dump-dir "$UNSET"`) never names the current folder or the default; a record
# file that cannot be written is refused before the prefill, not after it
EMPTY = "is an empty path: name a"
EMPTY_PATHS = [
    (["run", "--pack", "", "--greedy", "0"], "run: argument --pack: '' " + EMPTY + " file", {}),
    (RUN + ["--dump-dir", ""], "run: argument --dump-dir: '' " + EMPTY + " folder", {}),
    (RUN + ["--dump-dir", "\t"], "run: argument --dump-dir: '\\t' " + EMPTY + " folder", {}),
    (RUN + ["--reference-cache", ""], "run: argument --reference-cache: '' " + EMPTY + " folder", {}),
    (RUN + ["--dump-r", ""], "run: argument --dump-r: '' " + EMPTY + " file", {}),
    (RUN + ["--dump-first-logits", ""], "argument --dump-first-logits: '' " + EMPTY, {}),
    (RUN + ["--prompt-tokens", ""], "argument --prompt-tokens: '' " + EMPTY + " prompt file or a token count", {}),
    (FAST + ["--expert-cache", "4", "--trace", ""], "argument --trace: '' " + EMPTY + " file", {}),
    (["make-pack", ""], "make-pack: argument OUT.gguf: '' " + EMPTY + " file", {}),
    (["info", ""], "info: argument PACK: '' " + EMPTY + " file", {}),
    (["plot", "", "{dir}/o.png"], "plot: argument TRACE.json: '' " + EMPTY + " file", {}),
    (["plot", "{trace}", ""], "plot: argument OUT.png: '' " + EMPTY + " file", {}),
    (BENCH[:-2] + AB + ["--json", ""], "bench: argument --json: '' " + EMPTY, {}),
    (["bench", "--pack", "", *AB], "bench: argument --pack: '' " + EMPTY, {}),
    (BENCH + AB + ["--markdown", ""], "bench: argument --markdown: '' " + EMPTY, {}),
    (["build-kernels", "--cache", ""], "build-kernels: argument --cache: '' " + EMPTY + " folder", {}),
    (["cache", "clear", "--dir", ""], "cache clear: argument --dir: '' " + EMPTY + " folder", {}),
    (["cache", "info", "--dir", " "], "cache info: argument --dir: ' ' " + EMPTY + " folder", {}),
    (RUN, "STRATA_PREFILL_DUMP_R is set but empty (''): name a file or unset it", {"STRATA_PREFILL_DUMP_R": ""}),
    (RUN, "STRATA_DUMP_FIRST_LOGITS is set but empty (' '): name a file", {"STRATA_DUMP_FIRST_LOGITS": " "}),
    (RUN, "STRATA_PREFILL_REFERENCE_CACHE is set but empty (''): name a folder or unset it",
     {"STRATA_PREFILL_REFERENCE_CACHE": ""}),
    (["cache", "clear"], "STRATA_PREFILL_REFERENCE_CACHE is set but empty (''): name a folder",
     {"STRATA_PREFILL_REFERENCE_CACHE": ""}),
    (["build-kernels"], "STRATA_PREFILL_KERNEL_CACHE is set but empty (''): name a folder",
     {"STRATA_PREFILL_KERNEL_CACHE": ""}),
    (BENCH + AB, "STRATA_PREFILL_KERNEL_CACHE is set but empty", {"STRATA_PREFILL_KERNEL_CACHE": ""}),
    # the record file the run would write at the end is a folder, or cannot be replaced
    (RUN + ["--dump-dir", "{dir}"], "run: argument --dump-dir: {dir}/layers.spd is a folder, not a file name", {}),
    (RUN + ["--dump-dir", "{dir}/dev", "--dump-level", "ops"],
     "argument --dump-dir: cannot write {dir}/dev/layers.spd: it is not a regular file", {}),
    (RUN + ["--dump-r", "/dev/null"], "cannot write /dev/null: it is not a regular file", {}),
]

CASES = PATHS + IDLE + EMPTY_PATHS


def _fill(text: str, names: dict) -> str:
    for name, path in names.items():
        text = text.replace("{" + name + "}", path)
    return text


def _files(*folders: Path) -> dict:
    """{path: SHA-256} of every file under the folders (links as their targets' bytes)."""
    out = {}
    for folder in folders:
        for p in sorted(Path(folder).rglob("*")):
            if p.is_file():
                out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
            else:
                out[str(p)] = "folder"
    return out


def _row_id(case) -> str:
    args, _needle, env = case
    words = [a for a in args if a.startswith("--") and a not in ("--pack", "--prompt-tokens", "--greedy",
                                                                  "--no-progress", "--tokens", "--reps")]
    return " ".join([args[0], *words, *(f"{k}=" for k in env)])


@pytest.fixture
def clean_env(tmp_path, monkeypatch):
    """A cache home of the row's own, the row's folder as the current folder, and none of the
    variables the rows set (a developer's own settings must not reach them)."""
    for var in [v for v in os.environ if v.startswith("STRATA_")]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("template, needle, env", CASES, ids=[_row_id(c) for c in CASES])
def test_refused_in_one_line_before_any_work(inputs, clean_env, monkeypatch, capsys, template, needle, env):
    names = {**inputs, "cache": str(clean_env / "cache")}
    args = [_fill(a, names) for a in template]
    for var, value in env.items():
        monkeypatch.setenv(var, _fill(value, names))
    if any(DEFAULT_PACK.split("/")[0] in a for a in template):  # the default pack's folder, empty
        (clean_env / "cache" / "strata-prefill").mkdir(parents=True)
    refused_in_process(args, _fill(needle, names), inputs, clean_env, capsys)


def refused_in_process(args, needle, inputs, clean_env, capsys) -> str:
    """main(args) refuses: exit 2, one `strata-prefill: error:` line holding the needle, no
    traceback, nothing on stdout, before any work, no input changed and no output made; the line."""
    before = _files(inputs["dir"], clean_env)
    t0 = time.perf_counter()
    status = main(args)
    took = time.perf_counter() - t0
    out, err = capsys.readouterr()
    assert status == 2, err
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("strata-prefill: error: "), lines[0]
    assert needle in lines[0], lines[0]
    assert out == ""
    assert took < WORK_S, f"refused after {took:.2f} s"
    assert _files(inputs["dir"], clean_env) == before  # no input changed, no output appeared
    return lines[0]


def test_every_fast_switch_of_run_has_a_row():
    """A new switch in arms.SWITCHES (each is a `run` flag) is refused without --impl fast,
    and its row here says so."""
    assert set(SAMPLE) == set(arms.SWITCHES)


def test_the_same_file_is_found_through_links_and_spellings(tmp_path):
    """checks.distinct_files on its own: every way of naming one file is caught, two different
    files (one of them not yet there) are not."""
    from strata_prefill.contract.errors import InputError
    from strata_prefill import checks

    a = tmp_path / "a.bin"
    a.write_bytes(np.random.default_rng(1).integers(0, 256, 64, dtype=np.uint8).tobytes())
    os.link(a, tmp_path / "hard")
    os.symlink(a, tmp_path / "soft")
    os.symlink(tmp_path, tmp_path / "here")
    for other in ("hard", "soft", "here/a.bin", "./a.bin", "x/../a.bin"):
        with pytest.raises(InputError, match="is the input this t reads"):
            checks.distinct_files("t", [("IN", a, "the input")], [("--out", tmp_path / other)])
    with pytest.raises(InputError, match="--two .* is also the file of --one"):
        checks.distinct_files("t", [], [("--one", tmp_path / "new"), ("--two", tmp_path / "here" / "new")])
    checks.distinct_files("t", [("IN", a), ("--skipped", None)],
                          [("--out", tmp_path / "b.bin"), ("--none", None), ("--other", tmp_path / "c.bin")])


# the data-loss cases, as a user runs them: a process of its own, its exit status
AS_A_USER = [
    (RUN + ["--dump-first-logits", "{pack}"], "run: --dump-first-logits {pack} is the pack this run reads (--pack)"),
    (["plot", "{trace}", "{trace}"], "plot: OUT.png {trace} is the trace this plot reads (TRACE.json)"),
    (RUN + ["--dump-first-logits", "{dir}/same.bin", "--dump-r", "{dir}/same.bin"],
     "--dump-r {dir}/same.bin is also the file of --dump-first-logits"),
]


def refused_as_a_user(inputs, tmp_path, template, needle) -> float:
    """Run the command line in a process of its own, as a user would, and assert the refusal:
    exit 2, one line holding the needle, no traceback, nothing written; the seconds it took."""
    import subprocess
    import sys

    args = [_fill(a, inputs) for a in template]
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRATA_")}
    env.update(PYTHONPATH=str(ROOT), XDG_CACHE_HOME=str(tmp_path / "cache"))
    before = _files(inputs["dir"], tmp_path)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "strata_prefill", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    took = time.perf_counter() - t0
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines() == [proc.stderr.strip()] and proc.stderr.startswith("strata-prefill: error: ")
    assert _fill(needle, inputs) in proc.stderr
    assert _files(inputs["dir"], tmp_path) == before
    return took


@pytest.mark.parametrize("template, needle", AS_A_USER, ids=[_row_id((c[0], c[1], {})) for c in AS_A_USER])
def test_refused_in_a_process_of_its_own(inputs, tmp_path, template, needle):
    refused_as_a_user(inputs, tmp_path, template, needle)
