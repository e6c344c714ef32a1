"""Progress on stderr (formats/progress.py): on a terminal a bar naming the prefill's chunk and
layer, the greedy token, bench's length, rep and arm; off a terminal nothing for short work and a
line every HEARTBEAT_S of long work; the first `run` saying it made the default pack, what each
line of its output means and what to try next, once."""
import io
import re
import sys
import time

import numpy as np
import pytest

from strata_prefill.reference import ReferenceEngine
from strata_prefill.formats import progress
from strata_prefill.session import Session
from strata_prefill.cli import main


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def terminal(monkeypatch):
    """Every stream is a terminal to formats/progress.py (capsys's stderr is swapped in only
    when the test body runs, so its isatty cannot be patched here); every new step is drawn."""
    monkeypatch.setattr(progress, "_is_terminal", lambda stream: True)
    monkeypatch.setattr(progress, "MIN_INTERVAL_S", 0.0)


def steps_named(text: str, pattern: str) -> list[str]:
    return re.findall(pattern, text)


def test_the_prefill_bar_names_every_chunk_and_layer_and_the_greedy_tokens(make_test_pack, terminal, capsys):
    pack = make_test_pack("tiny", "Q8_0")
    n_layer = pack.config.n_layer
    ids = np.random.default_rng(5).integers(0, pack.config.n_vocab, 70)
    res = Session(ReferenceEngine(pack), chunk=32).run(ids, greedy=3)
    assert res.n_chunks == 3
    err = capsys.readouterr().err
    drawn = steps_named(err, r"prefill chunk (\d+)/3, layer (\d+)/(\d+)")
    want = [(str(c), str(l), str(n_layer)) for c in (1, 2, 3) for l in range(1, n_layer + 1)]
    assert sorted(set(drawn)) == sorted(want)  # every chunk's every layer, and no other
    assert "chunk-layer" in err and f"/{3 * n_layer}" in err  # what it counts: chunks x layers
    assert "layer/s" not in err.replace("chunk-layer/s", "")
    assert set(steps_named(err, r"greedy token (\d+)/3")) == {"2", "3"}  # the first is the prefill's


def test_off_a_terminal_a_short_run_prints_no_progress(make_test_pack, capsys):
    pack = make_test_pack("tiny", "Q8_0")
    assert main(["run", "--pack", str(pack.path), "--prompt-tokens", "70", "--prefill", "32",
                 "--greedy", "3"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert "70 tokens in 3 chunk(s)" in out


def test_no_progress_is_silent_on_a_terminal_too(make_test_pack, terminal, capsys):
    pack = make_test_pack("tiny", "Q8_0")
    assert main(["run", "--pack", str(pack.path), "--prompt-tokens", "70", "--prefill", "32",
                 "--greedy", "3", "--no-progress"]) == 0
    assert capsys.readouterr().err == ""


def test_off_a_terminal_long_work_is_named_every_heartbeat(make_test_pack, monkeypatch):
    """The timer thread names the step in progress while it lasts, and stops with the work."""
    monkeypatch.setattr(progress, "HEARTBEAT_S", 0.01)
    stream = io.StringIO()
    with progress.Progress(4, "prefill", "chunk-layer", stream=stream) as bar:
        bar.at("chunk 1/2, layer 2/2")
        bar.step()
        time.sleep(0.2)  # one long step: still named
    lines = stream.getvalue().splitlines()
    assert len(lines) >= 3
    named = [ln for ln in lines if not re.fullmatch(r"prefill starting \(0/4 chunk-layers, \d+ s\)", ln)]
    assert len(named) >= 3  # a 10 ms heartbeat, before the first step only if the test is slow
    assert all(re.fullmatch(r"prefill chunk 1/2, layer 2/2 \(1/4 chunk-layers, \d+ s\)", ln)
               for ln in named), lines
    time.sleep(0.1)
    assert stream.getvalue().splitlines() == lines  # nothing after the work ended
    enabled_off = io.StringIO()
    with progress.Progress(4, "prefill", "chunk-layer", enabled=False, stream=enabled_off) as bar:
        bar.at("chunk 1/1, layer 1/4")
        time.sleep(0.1)
    assert enabled_off.getvalue() == ""


def test_a_session_off_a_terminal_names_chunk_and_layer_in_its_heartbeat(make_test_pack, monkeypatch, capsys):
    monkeypatch.setattr(progress, "HEARTBEAT_S", 0.002)
    pack = make_test_pack("tiny", "Q8_0")
    ids = np.random.default_rng(6).integers(0, pack.config.n_vocab, 70)
    Session(ReferenceEngine(pack), chunk=32).prefill(ids)
    lines = capsys.readouterr().err.splitlines()
    n = pack.config.n_layer
    assert any("chunk" in ln for ln in lines), lines
    assert all(re.fullmatch(rf"prefill (starting|chunk [123]/3, layer [1-{n}]/{n}) "
                            rf"\(\d+/{3 * n} chunk-layers, \d+ s\)", ln) for ln in lines), lines


BENCH = ["--backend", "sim", "--a", "default", "--b", "STRATA_PREFILL_IN_PLACE=0",
         "--tokens", "16,24", "--reps", "2"]


def test_bench_names_each_length_rep_and_arm_on_a_terminal(make_test_pack, terminal, tmp_path, capsys):
    pack = make_test_pack("tiny", "Q8_0")
    assert main(["bench", "--pack", str(pack.path), *BENCH, "--json", str(tmp_path / "b.json")]) == 0
    err = capsys.readouterr().err
    for n in (16, 24):
        for arm in "AB":
            assert f"bench {n} tokens, warm-up, arm {arm}" in err
            for rep in (1, 2):
                assert f"bench {n} tokens, rep {rep}/2, arm {arm}" in err
        assert f"bench: {n} tokens: A " in err  # each length's medians, a line of their own
    assert "/12 " in err and "prefill" in err  # 2 lengths x 2 arms x (2 reps + a warm-up)


def test_bench_off_a_terminal_or_with_no_progress_prints_only_its_length_lines(make_test_pack, terminal,
                                                                               tmp_path, capsys, monkeypatch):
    pack = make_test_pack("tiny", "Q8_0")
    assert main(["bench", "--pack", str(pack.path), *BENCH, "--json", str(tmp_path / "b.json"),
                 "--no-progress"]) == 0
    quiet = capsys.readouterr().err.splitlines()
    monkeypatch.setattr(progress, "_is_terminal", lambda stream: False)
    assert main(["bench", "--pack", str(pack.path), *BENCH, "--json", str(tmp_path / "c.json")]) == 0
    piped = capsys.readouterr().err.splitlines()
    for lines in (quiet, piped):
        assert [ln.split(":")[1] for ln in lines] == [" 16 tokens", " 24 tokens"], lines


def explained_labels(err: str) -> set[str]:
    return {m.group(1) for m in re.finditer(r"^  (\w+) {2,}\S", err, re.M)}


def test_the_first_run_says_it_made_the_pack_explains_its_lines_and_what_next_once(cache_home, capsys):
    assert main(["run", "--prompt-tokens", "20", "--greedy", "2"]) == 0
    out, err = capsys.readouterr()
    packs = list((cache_home / "strata-prefill").glob("*.gguf"))
    assert len(packs) == 1
    made = [ln for ln in err.splitlines() if ln.startswith("made the default pack")]
    assert len(made) == 1
    assert re.fullmatch(rf"made the default pack \(tiny preset, seed 0\) at {re.escape(str(packs[0]))} "
                        r"in \d+\.\d s", made[0])
    labels = {ln.split()[0] for ln in out.splitlines()}
    assert {"next", "greedy"} <= labels
    assert explained_labels(err) == labels  # every line it printed, once each, and no other
    assert err.count("  next ") == 1 and err.count("  greedy ") == 1
    assert err.splitlines()[-1].startswith("try next: strata-prefill run --impl fast --backend sim")

    assert main(["run", "--prompt-tokens", "20", "--greedy", "2"]) == 0  # the pack is there now
    out2, err2 = capsys.readouterr()
    assert err2 == "" and out2.splitlines()[3:5] == out.splitlines()[3:5]  # same next, greedy

    assert main(["run", "--prompt-tokens", "20", "--greedy", "2", "--explain"]) == 0
    err3 = capsys.readouterr().err
    assert "made the default pack" not in err3
    assert explained_labels(err3) == labels and "try next: " in err3


def test_explain_on_the_fast_path_names_its_counters_and_suggests_info(make_test_pack, capsys):
    pack = make_test_pack("tiny", "Q8_0")
    assert main(["run", "--pack", str(pack.path), "--prompt-tokens", "20", "--greedy", "2",
                 "--impl", "fast", "--backend", "sim", "--explain"]) == 0
    out, err = capsys.readouterr()
    labels = {ln.split()[0] for ln in out.splitlines()}
    assert "counters" in labels and explained_labels(err) == labels
    assert err.splitlines()[-1].startswith(f"try next: strata-prefill info {pack.path}")
    assert "made the default pack" not in err


def test_a_stderr_that_is_a_terminal_gets_the_bar(make_test_pack, capsys, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # capsys's, patched in the test body
    pack = make_test_pack("tiny", "Q8_0")
    Session(ReferenceEngine(pack), chunk=32).prefill(np.arange(40) % pack.config.n_vocab)
    err = capsys.readouterr().err
    assert "prefill chunk 1/2, layer 1/" in err and "chunk-layer" in err


def test_make_pack_off_a_terminal_names_the_tensor_it_writes(tmp_path, monkeypatch, capsys):
    from strata_prefill.formats import make_pack as mp

    mp.make_pack(tmp_path / "quiet.gguf", "tiny", seed=3)  # under PROGRESS_MIN_BYTES: nothing
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(progress, "HEARTBEAT_S", 0.001)
    monkeypatch.setattr(mp, "PROGRESS_MIN_BYTES", 0)
    mp.make_pack(tmp_path / "p.gguf", "tiny", seed=3)
    lines = capsys.readouterr().err.splitlines()
    assert any("blk." in ln for ln in lines), lines
    assert all(re.fullmatch(r"writing p\.gguf (starting|token_embd|output|output_norm|blk\.\d+\.\w+) "
                                      r"\(\d+\.\d\d of \d+\.\d\d GiB, \d+ s\)", ln) for ln in lines), lines


def test_the_host_tier_fill_names_its_layer_off_a_terminal(monkeypatch, capsys):
    """fast/cuda/tiers.py's fill of page-locked memory (no GPU needed for the fill itself:
    the object is made without its constructor, with a host array and a fake pack)."""
    from strata_prefill.fast.cuda import tiers

    monkeypatch.setattr(progress, "HEARTBEAT_S", 0.001)
    t = object.__new__(tiers.ExpertTiers)

    class Placement:
        resident = np.zeros((2, 3), bool)

        def streamed(self, layer):
            return np.arange(3)

    class Pack:
        def expert_parts(self, layer, expert):  # gate, up, down of 400, 400 and 200 bytes
            time.sleep(0.01)
            v = 3 * layer + expert + 1
            return tuple(np.full(n, v + 10 * i, np.uint8) for i, n in enumerate((400, 400, 200)))

    t.placement = Placement()
    t.host_offset = np.arange(6).reshape(2, 3) * 1000
    t.host, t.host_bytes, t.blob_bytes = np.zeros(6000, np.uint8), 6000, [1000, 1000]
    t._fill_host(Pack(), None)
    blobs = t.host.reshape(6, 1000)
    assert (blobs[:, 0] == np.arange(1, 7)).all() and (blobs[:, 400] == np.arange(11, 17)).all()
    assert (blobs[:, 999] == np.arange(21, 27)).all()
    lines = capsys.readouterr().err.splitlines()
    assert lines[-1].startswith("host tier: 6 experts")
    beats = lines[:-1]
    assert any("layer 2/2" in ln for ln in beats), lines
    assert all(re.fullmatch(r"host tier (starting|layer [12]/2) \(0\.00 of 0\.00 GiB, \d+ s\)", ln)
               for ln in beats), lines
