"""`strata-prefill run`: the built-in default, options, and one-line errors for bad input."""
import numpy as np
import pytest

from strata_prefill.contract.constants import PACK_FORMAT
from strata_prefill.cli import main


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_default_run_makes_and_caches_the_tiny_pack(cache_home, capsys):
    assert main(["run", "--prompt-tokens", "40", "--greedy", "3", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "prompt    40 tokens in 1 chunk(s)" in out
    assert "greedy    " in out and "tokens/s" in out
    cached = list((cache_home / "strata-prefill").glob("*.gguf"))
    assert len(cached) == 1
    stamp = cached[0].stat().st_mtime_ns
    assert main(["run", "--prompt-tokens", "10", "--greedy", "0", "--no-progress"]) == 0
    assert cached[0].stat().st_mtime_ns == stamp  # reused, not rewritten


def test_a_cached_default_pack_of_another_format_is_remade(cache_home, capsys):
    cache = cache_home / "strata-prefill"
    cache.mkdir(parents=True)
    stale = [cache / "tiny-seed0.gguf", cache / f"tiny-seed0-f{PACK_FORMAT - 1}.gguf"]
    for path in stale:
        path.write_bytes(b"GGUF" + bytes(96))  # would fail to open if it were reused
    assert main(["run", "--prompt-tokens", "5", "--greedy", "0", "--no-progress"]) == 0
    assert f"tiny-seed0-f{PACK_FORMAT}.gguf" in capsys.readouterr().out
    assert sorted(p.name for p in cache.iterdir()) == [f"tiny-seed0-f{PACK_FORMAT}.gguf"]


def test_run_on_a_pack_with_a_prompt_file_and_dumps(make_test_pack, tmp_path, capsys):
    pack = make_test_pack("tiny", "Q4_1")
    ids = np.random.default_rng(2).integers(0, pack.config.n_vocab, 70)
    prompt = tmp_path / "prompt.txt"
    prompt.write_text(" ".join(map(str, ids)))
    logits = tmp_path / "logits.f32"
    args = ["run", "--pack", str(pack.path), "--prompt-tokens", str(prompt), "--prefill", "32",
            "--greedy", "2", "--dump-dir", str(tmp_path / "d"), "--dump-first-logits", str(logits),
            "--dump-r", str(tmp_path / "r.bin"), "--no-progress"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "70 tokens in 3 chunk(s) of up to 32" in out
    assert logits.stat().st_size == 4 * pack.config.n_vocab
    assert (tmp_path / "d" / "layers.spd").exists()
    # the residual dump holds positions 0 and 64 of the prompt
    assert (tmp_path / "r.bin").stat().st_size == 2 * (8 + 4 * pack.config.n_embd)


def test_env_switches_name_the_dump_files(make_test_pack, tmp_path, monkeypatch):
    pack = make_test_pack("tiny", "Q8_0")
    monkeypatch.setenv("STRATA_DUMP_FIRST_LOGITS", str(tmp_path / "env-logits.f32"))
    monkeypatch.setenv("STRATA_PREFILL_DUMP_R", str(tmp_path / "env-r.bin"))
    assert main(["run", "--pack", str(pack.path), "--prompt-tokens", "65", "--greedy", "0",
                 "--no-progress"]) == 0
    assert (tmp_path / "env-logits.f32").stat().st_size == 4 * pack.config.n_vocab
    assert (tmp_path / "env-r.bin").stat().st_size == 2 * (8 + 4 * pack.config.n_embd)


@pytest.mark.parametrize("content, message", [
    ("1 2 99999", "token id 99999 at prompt position 2 is out of range"),
    ("", "the prompt is empty"),
    ("1 two 3", "not a token id: 'two'"),
])
def test_bad_prompts_give_one_line(make_test_pack, tmp_path, capsys, content, message):
    pack = make_test_pack("tiny", "Q8_0")
    prompt = tmp_path / "p.txt"
    prompt.write_text(content)
    assert main(["run", "--pack", str(pack.path), "--prompt-tokens", str(prompt)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


@pytest.mark.parametrize("args, message", [
    (["--pack", "/nonexistent/x.gguf"], "x.gguf"),
    (["--prompt-tokens", "/nonexistent/prompt.txt"], "prompt file not found"),
    (["--prompt-tokens", "0"], "'0' is not a token count"),
    (["--prefill", "-3"], "--prefill: must be 'auto' or a positive integer, got '-3'"),
    (["--prefill", "lots"], "--prefill: must be 'auto' or a positive integer, got 'lots'"),
])
def test_bad_options_give_one_line(make_test_pack, capsys, args, message):
    pack = make_test_pack("tiny", "Q8_0")
    full = ["run", "--pack", str(pack.path), *args] if "--pack" not in args else ["run", *args]
    assert main(full) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_fast_impl_without_gpu_says_so_in_one_line(make_test_pack, capsys):
    pytest.importorskip("numpy")
    try:
        import pycuda.driver  # noqa: F401
        pytest.skip("PyCUDA is installed here; this checks the machine without it")
    except ImportError:
        pass
    pack = make_test_pack("tiny", "Q8_0")
    assert main(["run", "--pack", str(pack.path), "--impl", "fast", "--prompt-tokens", "8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fast path" in err[0]
