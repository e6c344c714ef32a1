"""Every bad input of every subcommand, run as a user runs it (`python3 -m strata_prefill` in a
subprocess): exactly one line on stderr, `strata-prefill: error: ...`, naming the problem, a
non-zero exit, no traceback.

A bad output path is refused while the command line is read: those cases name a pack that does
not exist, so a check that came after opening the pack (let alone after the prefill) would
report the missing pack instead, and they assert that nothing was written."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
NEVER_OPENED = "never-opened.gguf"  # the pack of the output-path cases: reaching it fails them
UNWRITABLE = "/proc/strata-prefill-test"  # a folder no one, root included, can create files in


@pytest.fixture(scope="module")
def files(make_test_pack, tmp_path_factory):
    """The inputs the cases name: a good pack, corrupt ones, bad prompts; {name: path}."""
    d = tmp_path_factory.mktemp("bad-input")
    pack = Path(make_test_pack("tiny", "Q8_0").path)
    rng = np.random.default_rng(10)
    (d / "random100.gguf").write_bytes(rng.integers(0, 256, 100, dtype=np.uint8).tobytes())
    (d / "head100.gguf").write_bytes(pack.read_bytes()[:100])  # a real header, cut short
    (d / "folder").mkdir()
    (d / "a-file").write_bytes(b"x")
    (d / "corrupt.npy").write_bytes(b"\x93NUMPY" + rng.integers(0, 256, 40, dtype=np.uint8).tobytes())
    np.save(d / "two-d.npy", rng.integers(0, 100, (3, 4), dtype=np.int32))
    np.save(d / "floats.npy", rng.standard_normal(5).astype(np.float32))
    (d / "too-big-id.txt").write_text("1 2 99999")
    ff = bytearray(pack.read_bytes())  # the tensor data all 0xFF: every half and float NaN
    start = int(make_test_pack("tiny", "Q8_0").reader.data_offset)
    ff[start:] = b"\xff" * (len(ff) - start)
    (d / "ff.gguf").write_bytes(bytes(ff))
    return {"pack": str(pack), "dir": str(d), **{p.name: str(p) for p in d.iterdir()}}


# (argument template, text the one line must contain, writes an output: the path that must not
# appear); {name} is a path from `files`
RUN = ["run", "--pack", "{pack}", "--prompt-tokens", "8", "--greedy", "0"]
OUT = ["run", "--pack", NEVER_OPENED, "--prompt-tokens", "8", "--greedy", "0"]
CASES = [
    # run: output paths
    (OUT + ["--dump-dir", "{a-file}"], "--dump-dir: cannot make folder", None),
    (OUT + ["--dump-dir", "{a-file}/sub"], "is a file", "{a-file}/sub"),
    (OUT + ["--dump-dir", UNWRITABLE + "/d"], f"cannot write {UNWRITABLE}/d", UNWRITABLE),
    (OUT + ["--dump-r", "{dir}/missing/r.bin"], "folder {dir}/missing does not exist",
     "{dir}/missing"),
    (OUT + ["--dump-r", UNWRITABLE + ".bin"], f"cannot write {UNWRITABLE}.bin", UNWRITABLE + ".bin"),
    (OUT + ["--dump-first-logits", "{dir}/missing/l.f32"], "--dump-first-logits: cannot write",
     "{dir}/missing"),
    (OUT + ["--dump-first-logits", "{folder}"], "is a folder, not a file name", None),
    # run: the prompt
    (RUN + ["--prompt-tokens", "{corrupt.npy}"], "not a readable .npy file", None),
    (RUN + ["--prompt-tokens", "{two-d.npy}"], "1-D array of token ids, this one has shape (3, 4)", None),
    (RUN + ["--prompt-tokens", "{floats.npy}"], "token ids must be integers, got float32", None),
    (RUN + ["--prompt-tokens", "-5"], "'-5' is not a token count", None),
    (RUN + ["--prompt-tokens", "{dir}/no-prompt.txt"], "prompt file not found", None),
    (RUN + ["--prompt-tokens", "{too-big-id.txt}"], "token id 99999 at prompt position 2", None),
    # run: numbers
    (RUN + ["--top", "0"], "--top: must be a positive integer, got '0'", None),
    (RUN + ["--top", "-3"], "--top: must be a positive integer, got '-3'", None),
    (RUN + ["--greedy", "-1"], "--greedy: must be an integer >= 0", None),
    (RUN + ["--prefill", "0"], "--prefill: must be 'auto' or a positive integer", None),
    (RUN + ["--prefill", "abc"], "--prefill: must be 'auto' or a positive integer", None),
    (RUN + ["--seed", "-1"], "--seed: must be an integer >= 0", None),
    # run: the pack
    (["run", "--pack", "{random100.gguf}"], "not a GGUF file", None),
    (["run", "--pack", "{head100.gguf}"], "corrupt or truncated GGUF file", None),
    (["run", "--pack", "{folder}"], "pack is not a file", None),
    (["run", "--pack", "{dir}/missing.gguf"], "pack not found", None),
    # run: a pack whose values are NaN, refused when it is opened, naming the tensors (their
    # scale fields are read: tests/test_nonfinite.py), before any prefill
    (["run", "--pack", "{ff.gguf}", "--prompt-tokens", "8", "--greedy", "0"],
     "{ff.gguf}: 35 tensors decode to NaN or Inf", None),
    (["run", "--pack", "{ff.gguf}", "--prompt-tokens", "8", "--greedy", "2", "--impl", "fast",
      "--backend", "sim"], "{ff.gguf}: 35 tensors decode to NaN or Inf", None),
    # make-pack
    (["make-pack", "{dir}/missing/x.gguf"], "folder {dir}/missing does not exist", "{dir}/missing"),
    (["make-pack", "{folder}"], "is a folder, not a file name", None),
    (["make-pack", "--preset", "huge", "{dir}/x.gguf"], "--preset: invalid choice: 'huge'", "{dir}/x.gguf"),
    (["make-pack", "--expert-type", "TQ2_0", "{dir}/x.gguf"], "--expert-type: invalid choice", "{dir}/x.gguf"),
    (["make-pack", "--layers", "0", "{dir}/x.gguf"], "--layers: must be a positive integer", "{dir}/x.gguf"),
    # info
    (["info", "{random100.gguf}"], "not a GGUF file", None),
    (["info", "{head100.gguf}"], "corrupt or truncated GGUF file", None),
    (["info", "{folder}"], "pack is not a file", None),
]


def _fill(text: str, files: dict) -> str:
    for name, path in files.items():
        text = text.replace("{" + name + "}", path)
    return text


@pytest.mark.parametrize("template, needle, absent", CASES, ids=[" ".join(c[0][:1] + c[0][-2:])
                                                                  for c in CASES])
def test_bad_input_gives_one_line_before_any_work(files, tmp_path, template, needle, absent):
    args = [_fill(a, files) for a in template]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.pop("STRATA_DUMP_FIRST_LOGITS", None)
    env.pop("STRATA_PREFILL_DUMP_R", None)
    proc = subprocess.run([sys.executable, "-m", "strata_prefill", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert len(err) == 1, proc.stderr
    assert err[0].startswith("strata-prefill: error: "), err[0]
    assert _fill(needle, files) in err[0], err[0]
    assert proc.stdout == ""  # nothing ran: no pack was made or opened, no prefill
    if absent is not None:
        assert not Path(_fill(absent, files)).exists()
    assert not (tmp_path / "cache").exists()  # the default pack was not made either


def test_a_dump_path_named_in_the_environment_is_checked_as_its_switch(files, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           "STRATA_PREFILL_DUMP_R": str(tmp_path / "missing" / "r.bin")}
    proc = subprocess.run([sys.executable, "-m", "strata_prefill", *OUT], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        f"strata-prefill: error: STRATA_PREFILL_DUMP_R: cannot write {tmp_path}/missing/r.bin: "
        f"folder {tmp_path}/missing does not exist"]
