"""`strata-prefill make-pack`: the size it announces, the free-disk refusal, and progress bars
only on a terminal (make-pack's and the prefill's)."""
import sys
from collections import namedtuple

import pytest

from strata_prefill.formats import make_pack as make_pack_module
from strata_prefill.cli import main as cli

Usage = namedtuple("Usage", "total used free")


@pytest.mark.parametrize("args", [
    ["--preset", "tiny"],
    ["--preset", "small", "--layers", "1", "--expert-type", "IQ2_XS", "--tie-embeddings"],
    ["--mix", "q4_k_m"],
    ["--preset", "small", "--layers", "3", "--mix", "Q2_K", "--tie-embeddings"],
    ["--dense-type", "Q6_K", "--expert-type", "Q5_1"],
])
def test_the_announced_size_is_the_size_written(tmp_path, capsys, args):
    out = tmp_path / "p.gguf"
    assert cli(["make-pack", *args, str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    size = out.stat().st_size
    assert lines[0] == f"writing {out}: {size:,} bytes ({size / 2**30:.2f} GiB)"
    assert lines[1].startswith(f"wrote {out}")


def test_a_disk_that_cannot_hold_the_pack_is_refused_before_writing(tmp_path, capsys, monkeypatch):
    out = tmp_path / "p.gguf"
    assert cli(["make-pack", str(tmp_path / "sized.gguf")]) == 0
    size = (tmp_path / "sized.gguf").stat().st_size
    capsys.readouterr()
    seen = []

    def usage(folder):
        seen.append(folder)
        return Usage(10**12, 0, size + make_pack_module.DISK_MARGIN_BYTES - 1)

    monkeypatch.setattr(make_pack_module.shutil, "disk_usage", usage)
    assert cli(["make-pack", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == f"writing {out}: {size:,} bytes ({size / 2**30:.2f} GiB)\n"
    err = captured.err.splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"strata-prefill: error: not enough free disk for {out}: the pack takes {size:,} bytes")
    assert set(seen) == {tmp_path}  # by the data from the arguments first, then by the exact size
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sized.gguf"]  # nothing written

    # one byte more and it fits
    monkeypatch.setattr(make_pack_module.shutil, "disk_usage",
                        lambda folder: Usage(10**12, 0, size + make_pack_module.DISK_MARGIN_BYTES))
    assert cli(["make-pack", str(out)]) == 0 and out.stat().st_size == size


def _pretend_terminal(monkeypatch, is_terminal: bool) -> None:
    monkeypatch.setattr(sys.stderr, "isatty", lambda: is_terminal)


@pytest.mark.parametrize("is_terminal", [False, True])
def test_make_pack_bar_only_on_a_terminal(tmp_path, capsys, monkeypatch, is_terminal):
    monkeypatch.setattr(make_pack_module, "PROGRESS_MIN_BYTES", 0)
    _pretend_terminal(monkeypatch, is_terminal)
    assert cli(["make-pack", str(tmp_path / "p.gguf")]) == 0
    err = capsys.readouterr().err
    assert ("p.gguf" in err and "\r" in err) if is_terminal else err == ""


@pytest.mark.parametrize("is_terminal", [False, True])
def test_prefill_bar_only_on_a_terminal(make_test_pack, capsys, monkeypatch, is_terminal):
    pack = make_test_pack("tiny", "Q8_0")
    _pretend_terminal(monkeypatch, is_terminal)
    assert cli(["run", "--pack", str(pack.path), "--prompt-tokens", "8", "--greedy", "0"]) == 0
    err = capsys.readouterr().err
    assert ("prefill" in err and "\r" in err) if is_terminal else err == ""
