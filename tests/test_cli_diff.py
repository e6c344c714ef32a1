"""`strata-prefill diff`: record files and folders get the first-difference report; Strata's
logits and residual dumps a byte comparison with errors, cosine and top-1; packs a comparison
key by key and tensor by tensor. What a file holds is read from its content (or `--kind`, then
checked): files of two kinds or sizes, empty files and files of no kind are refused in one line,
exit 2, before any comparison."""
import hashlib
import shutil
import struct
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader

from strata_prefill.cli import main
from strata_prefill.formats.dumps import write_first_logits, write_residuals


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
    err = capsys.readouterr().err
    assert "must be one of layer, ops" in err and "'everything'" in err


# ---------------------------------------------------------------------------------------
# What diff reads: every pair of kinds, empty files, sizes, --kind, --pack


def _flip(src, dst, at: int) -> None:
    data = bytearray(src.read_bytes())
    data[at] ^= 0x01
    dst.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def files(make_test_pack, tmp_path_factory):
    """The inputs of the rows: {name: path} (and "cfg": the pack's config)."""
    from strata_prefill.formats.dumps import MAGIC

    d = tmp_path_factory.mktemp("diff-kinds")
    pack = make_test_pack("tiny", "Q8_0")
    cfg = pack.config
    rng = np.random.default_rng(24)
    la = rng.standard_normal(cfg.n_vocab).astype(np.float32)
    lb = la.copy()
    lb[7] = np.nextafter(lb[7], np.float32(np.inf))
    write_first_logits(d / "la.f32", la)
    write_first_logits(d / "lb.f32", lb)
    write_first_logits(d / "l600.f32", rng.standard_normal(600).astype(np.float32))
    lz = la.copy()
    lz[:2] = 0.0  # its first 8 bytes read as the int64 position 0 of a residual dump
    write_first_logits(d / "lza.f32", lz)
    lz[9] += 1.0
    write_first_logits(d / "lzb.f32", lz)
    pos = np.arange(200)
    rows = rng.standard_normal((200, cfg.n_embd)).astype(np.float32)
    write_residuals(d / "ra.bin", pos, rows, first_chunk=True)
    rows[128, 3] += 1.0
    write_residuals(d / "rb.bin", pos, rows, first_chunk=True)
    write_residuals(d / "r-short.bin", pos[:100], rows[:100], first_chunk=True)
    write_residuals(d / "r48.bin", pos, rows[:, :48], first_chunk=True)
    run_dir = d / "run"
    run_dir.mkdir()
    assert main(["run", "--pack", str(pack.path), "--prompt-tokens", "40", "--prefill", "32",
                 "--greedy", "0", "--dump-dir", str(run_dir), "--no-progress"]) == 0
    shutil.copy(run_dir / "layers.spd", d / "rec-a.spd")
    data = (d / "rec-a.spd").read_bytes()
    _flip(d / "rec-a.spd", d / "rec-b.spd", data.find(b"L01.resid") + 200)
    (d / "rec-none.spd").write_bytes(MAGIC)
    p = d / "p.gguf"
    shutil.copy(pack.path, p)
    reader = GGUFReader(p)
    down = next(t for t in reader.tensors if t.name == "blk.1.ffn_down_exps.weight")
    _flip(p, d / "p-tensor.gguf", int(down.data_offset) + 1000)
    head = bytearray(p.read_bytes())
    at = head.find(b"strata.seed") + len(b"strata.seed")
    assert struct.unpack_from("<I", head, at)[0] == 10  # GGUF UINT64
    seed = struct.unpack_from("<Q", head, at + 4)[0]
    struct.pack_into("<Q", head, at + 4, seed + 1)
    (d / "p-meta.gguf").write_bytes(bytes(head))
    (d / "p-cut.gguf").write_bytes(p.read_bytes()[: p.stat().st_size // 2])
    (d / "empty").write_bytes(b"")
    (d / "odd").write_bytes(b"abcde")
    for name, f in (("A", "la.f32"), ("B", "lb.f32")):  # folders: a logits file and a record file
        (d / name).mkdir()
        shutil.copy(d / f, d / name / "logits.f32")
        shutil.copy(d / "rec-a.spd", d / name / "layers.spd")
    (d / "C").mkdir()
    (d / "C" / "logits.f32").write_bytes(b"")
    shutil.copy(d / "rec-a.spd", d / "C" / "layers.spd")
    out = {p.name: str(p) for p in d.iterdir()}
    out.update(seed=str(seed), seed1=str(seed + 1), down_at=f"{1000:,}")
    return out


# (arguments, exit status, text of the output (status 0, 1) or of the one error line (2))
KIND_ROWS = [
    # logits
    (["{la.f32}", "{la.f32}"], 0, "identical (512 logits, 2048 bytes)"),
    (["{la.f32}", "{lb.f32}"], 1, "1 of 512 logits differ, first at token id 7"),
    (["--pack", "{p.gguf}", "{la.f32}", "{lb.f32}"], 1, "1 of 512 logits differ"),
    (["{la.f32}", "{l600.f32}"], 2, "logits of different sizes: {la.f32} holds 512, {l600.f32} 600"),
    (["--pack", "{p.gguf}", "{l600.f32}", "{l600.f32}"], 2,
     "{l600.f32} (2,400 bytes) is no dump of {p.gguf}: neither its first-token logits (512 float32"),
    (["odd", "odd"], 2, "odd (5 bytes) is no file diff reads"),
    # residual dumps
    (["{ra.bin}", "{ra.bin}"], 0, "identical (4 positions of 256 values)"),
    (["{ra.bin}", "{rb.bin}"], 1, "1 of 4 positions differ, first at position 128"),
    (["--pack", "{p.gguf}", "{ra.bin}", "{rb.bin}"], 1, "1 of 4 positions differ"),
    (["{ra.bin}", "{r-short.bin}"], 2, "residual dumps of different lengths: {ra.bin} holds 4 positions"),
    (["{ra.bin}", "{r48.bin}"], 2, "residual dumps of different widths: {ra.bin} has rows of 256 values, "
                                   "{r48.bin} of 48"),
    (["--pack", "{p.gguf}", "{r48.bin}", "{r48.bin}"], 2, "{r48.bin} (800 bytes) is no dump of {p.gguf}"),
    # record files
    (["{rec-a.spd}", "{rec-a.spd}"], 0, "identical records"),
    (["{rec-a.spd}", "{rec-b.spd}"], 1, "first difference: L01.resid"),
    (["{rec-none.spd}", "{rec-a.spd}"], 2, "{rec-none.spd}: a record file that holds no records"),
    (["--pack", "{p.gguf}", "{rec-a.spd}", "{rec-a.spd}"], 2,
     "--pack gives the sizes of logits and residual dumps; {rec-a.spd} and {rec-a.spd} are record files"),
    # packs
    (["{p.gguf}", "{p.gguf}"], 0, "identical packs ("),
    (["{p.gguf}", "{p-tensor.gguf}"], 1,
     "first difference: tensor blk.1.ffn_down_exps.weight: bytes differ from byte {down_at} of"),
    (["{p.gguf}", "{p-meta.gguf}"], 1, "first difference: metadata key strata.seed: {seed} vs {seed1}"),
    (["{p.gguf}", "{p-cut.gguf}"], 2, "truncated pack {p-cut.gguf}"),
    # kinds against kinds
    (["{p.gguf}", "{la.f32}"], 2, "{p.gguf} is a GGUF pack and {la.f32} is first-token logits (float32): "
                                  "diff compares two files of one kind"),
    (["{la.f32}", "{p.gguf}"], 2, "{la.f32} is first-token logits (float32) and {p.gguf} is a GGUF pack"),
    (["{p.gguf}", "{rec-a.spd}"], 2, "{p.gguf} is a GGUF pack and {rec-a.spd} is a record file"),
    (["{p.gguf}", "{ra.bin}"], 2, "{p.gguf} is a GGUF pack and {ra.bin} is a residual dump"),
    (["{rec-a.spd}", "{la.f32}"], 2, "{rec-a.spd} is a record file (magic SPDUMP01) and {la.f32} is first-token"),
    (["{rec-a.spd}", "{ra.bin}"], 2, "is a record file (magic SPDUMP01) and {ra.bin} is a residual dump"),
    (["{ra.bin}", "{la.f32}"], 2, "{ra.bin} is a residual dump and {la.f32} is first-token logits"),
    # empty files
    (["{empty}", "{empty}"], 2, "{empty}: empty file (0 bytes): nothing to compare"),
    (["{la.f32}", "{empty}"], 2, "{empty}: empty file (0 bytes)"),
    (["--kind", "logits", "{empty}", "{empty}"], 2, "{empty}: empty file (0 bytes)"),
    (["{A}", "{C}"], 2, "{C}/logits.f32: empty file (0 bytes)"),
    # --kind says it outright, and is checked against the content
    (["{lza.f32}", "{lzb.f32}"], 1, "1 of 1 positions differ"),  # read as a one-record dump...
    (["--kind", "logits", "{lza.f32}", "{lzb.f32}"], 1, "1 of 512 logits differ, first at token id 9"),
    (["--pack", "{p.gguf}", "{lza.f32}", "{lzb.f32}"], 1, "1 of 512 logits differ"),  # ...or sized
    (["--kind", "logits", "{p.gguf}", "{p.gguf}"], 2, "{p.gguf}: --kind logits, but the file is a GGUF pack"),
    (["--kind", "logits", "{ra.bin}", "{rb.bin}"], 2, "{ra.bin} (4,128 bytes): --kind logits, but it is a residual "
                                                      "dump (4 records of an int64 position 0, 64, ... and 256"),
    (["--kind", "logits", "{la.f32}", "{ra.bin}"], 2, "{ra.bin} (4,128 bytes): --kind logits, but it is a residual"),
    (["", "{la.f32}"], 2, "diff: argument A: '' is an empty path: name a file"),
    (["{la.f32}", " "], 2, "diff: argument B: ' ' is an empty path: name a file"),
    (["--pack", "", "{la.f32}", "{la.f32}"], 2, "diff: argument --pack: '' is an empty path"),
    (["--kind", "logits", "--pack", "{p.gguf}", "{l600.f32}", "{l600.f32}"], 2,
     "{l600.f32}: --kind logits, but it holds 2,400 bytes and the logits of {p.gguf} are 512 float32"),
    (["--kind", "residuals", "{la.f32}", "{la.f32}"], 2, "{la.f32} (2,048 bytes): --kind residuals, but it "
                                                         "is not a residual dump"),
    (["--kind", "residuals", "--pack", "{p.gguf}", "{r48.bin}", "{r48.bin}"], 2,
     "not a residual dump of width 256 ({p.gguf})"),
    (["--kind", "records", "{la.f32}", "{la.f32}"], 2, "{la.f32}: --kind records, but the file does not "
                                                       "start with b'SPDUMP01'"),
    (["--kind", "pack", "{rec-a.spd}", "{rec-a.spd}"], 2, "--kind pack, but the file does not start with b'GGUF'"),
    (["--kind", "pack", "{p.gguf}", "{p-meta.gguf}"], 1, "first difference: metadata key strata.seed"),
    (["--kind", "records", "{rec-a.spd}", "{rec-b.spd}"], 1, "first difference: L01.resid"),
    (["--kind", "residuals", "{ra.bin}", "{rb.bin}"], 1, "1 of 4 positions differ"),
    (["--kind", "packs", "{p.gguf}", "{p.gguf}"], 2, "--kind: invalid choice: 'packs'"),
    # folders
    (["{A}", "{A}"], 0, "layers.spd: identical records\nlogits.f32: identical (512 logits"),
    (["{A}", "{B}"], 1, "logits.f32: 1 of 512 logits differ"),
]


def _fill(text: str, files: dict) -> str:
    for name, path in files.items():
        text = text.replace("{" + name + "}", path)
    return text


@pytest.mark.parametrize("template, status, needle", KIND_ROWS,
                         ids=[" ".join(r[0]) for r in KIND_ROWS])
def test_diff_knows_what_it_reads(files, monkeypatch, capsys, template, status, needle):
    monkeypatch.chdir(files["odd"].rsplit("/", 1)[0])
    args = ["diff", *(_fill(a, files) for a in template)]
    inputs = [a for a in args[1:] if a in files.values() and not a.endswith(("/A", "/B", "/C"))]
    before = {p: hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in inputs}
    capsys.readouterr()
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no NumPy warning reaches the user
        assert main(args) == status
    seconds = time.perf_counter() - t0
    out, err = capsys.readouterr()
    if status == 2:
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("strata-prefill: error: "), err
        assert _fill(needle, files) in lines[0], lines[0]
        assert out == "" and seconds < 1.0  # refused before any comparison
    else:
        assert err == "" and _fill(needle, files) in out, out
    for p, digest in before.items():
        assert hashlib.sha256(Path(p).read_bytes()).hexdigest() == digest
