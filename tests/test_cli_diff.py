"""`strata-prefill diff`: record files and folders get the first-difference report; Strata's
logits and residual dumps a byte comparison with errors, cosine and top-1."""
import numpy as np
import pytest

from strata_prefill.cli import main
from strata.dumps import write_first_logits, write_residuals


def run(pack, out, prompt, extra=()):
    out.mkdir(parents=True, exist_ok=True)  # dump files go into an existing folder
    args = ["run", "--pack", str(pack.path), "--prompt-tokens", str(prompt), "--prefill", "32", "--greedy", "1",
            "--dump-dir", str(out), "--dump-level", "ops", "--dump-first-logits", str(out / "logits.f32"),
            "--dump-r", str(out / "r.bin"), "--no-progress", *extra]
    assert main(args) == 0


def test_diff_of_two_dump_folders(make_test_pack, tmp_path, capsys):
    pack = make_test_pack("tiny", "Q8_0")
    prompt = tmp_path / "p.txt"
    prompt.write_text(" ".join(map(str, np.random.default_rng(1).integers(0, pack.config.n_vocab, 70))))
    run(pack, tmp_path / "a", prompt)
    run(pack, tmp_path / "b", prompt, ["--impl", "fast", "--backend", "sim"])
    capsys.readouterr()
    assert main(["diff", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert "layers.spd: identical records" in out and "logits.f32: identical" in out
    assert "r.bin: identical (2 positions of 256 values)" in out
    # a planted difference in the sim's router logits file copy: one op named, exit status 1
    (tmp_path / "b" / "layers.spd").write_bytes((tmp_path / "a" / "layers.spd").read_bytes())
    data = bytearray((tmp_path / "b" / "layers.spd").read_bytes())
    marker = data.find(b"L01.router_logits")
    data[marker + 200] ^= 0x01  # a byte inside the first chunk's layer 1 router logits
    (tmp_path / "b" / "layers.spd").write_bytes(bytes(data))
    assert main(["diff", str(tmp_path / "a" / "layers.spd"), str(tmp_path / "b" / "layers.spd")]) == 1
    out = capsys.readouterr().out
    assert out.startswith("first difference: L01.router_logits (router_logits, layer 1, chunk 0, position")
    assert "shape: one token" in out and "kernel: fast/cuda/kernels/mmq.cu" in out


def test_diff_of_logits_and_residual_dumps(tmp_path, capsys):
    rng = np.random.default_rng(2)
    a = rng.standard_normal(300).astype(np.float32)
    b = a.copy()
    b[7] = np.nextafter(b[7], np.float32(np.inf))
    write_first_logits(tmp_path / "a.f32", a)
    write_first_logits(tmp_path / "b.f32", b)
    assert main(["diff", str(tmp_path / "a.f32"), str(tmp_path / "b.f32")]) == 1
    out = capsys.readouterr().out
    assert "1 of 300 logits differ, first at token id 7" in out
    assert f"top-1 agrees: {int(np.argmax(a))} vs {int(np.argmax(a))}" in out and "cosine 1.0" in out
    pos = np.arange(200)
    rows = rng.standard_normal((200, 48)).astype(np.float32)
    write_residuals(tmp_path / "ra.bin", pos, rows, first_chunk=True)
    rows[128, 3] += 1.0
    write_residuals(tmp_path / "rb.bin", pos, rows, first_chunk=True)
    assert main(["diff", str(tmp_path / "ra.bin"), str(tmp_path / "rb.bin")]) == 1
    out = capsys.readouterr().out
    assert "1 of 4 positions differ, first at position 128" in out and "max abs 1" in out
    assert "top-1 (argmax of the row) agrees at" in out


def test_diff_of_missing_paths_is_one_line(tmp_path, capsys):
    assert main(["diff", str(tmp_path / "nope"), str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("strata-prefill: error: not found:") and err.count("\n") == 1


def test_dump_level_must_be_known(monkeypatch, make_test_pack, tmp_path, capsys):
    monkeypatch.setenv("STRATA_PREFILL_DUMP_LEVEL", "everything")
    pack = make_test_pack("tiny", "Q8_0")
    assert main(["run", "--pack", str(pack.path), "--prompt-tokens", "5", "--dump-dir", str(tmp_path),
                 "--no-progress"]) == 2
    assert "dump level must be one of layer, ops" in capsys.readouterr().err
