"""Atomic, unique, cleaned-up writes (formats/atomic.py) and the pack's digests:

- two processes writing one pack path at once end with one whole pack, byte for byte one
  writer's own, and the writer whose file stayed says it replaced the other's;
- SIGTERM / SIGHUP in the middle of `make-pack` leaves neither a temp nor a target, one line,
  status 128 + the signal;
- a write that fails leaves no temp and the old target as it was; an OSError names the target;
- the dumps of a run appear whole at its end, and not at all after a failed one;
- `info --check`: ok on a fresh pack, one line naming the tensor of a flipped byte, "none" for
  a pack that records no digest.
"""
from __future__ import annotations

import contextlib
import errno
import io
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from strata_prefill.formats import atomic, dumps
from strata_prefill.formats import make_pack as make_pack_module
from strata_prefill.formats.make_pack import make_pack
from strata_prefill.formats.pack import Pack
from strata_prefill.cli import main as cli

REPO = Path(__file__).resolve().parents[1]


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".part"))


# ---------------------------------------------------------------------------------------
# two writers


def _write_pack_when_both_are_open(out: str, seed: int, barrier, results) -> None:
    """A spawned writer: waits (in make_pack's on_size, called once its temp is open and
    before any byte is written) until the other writer is open too, so both begin before
    either ends; reports what it printed on stderr."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        make_pack(out, "tiny", seed=seed, progress=False, on_size=lambda size: barrier.wait(120))
    results.put((seed, err.getvalue()))


def test_two_writers_end_with_one_whole_pack_of_one_writer(tmp_path):
    seeds = (11, 12)
    alone = {s: make_pack(tmp_path / f"alone-{s}.gguf", "tiny", seed=s, progress=False).read_bytes()
             for s in seeds}
    assert alone[11] != alone[12]
    out = tmp_path / "shared" / "p.gguf"
    out.parent.mkdir()
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_write_pack_when_both_are_open, args=(str(out), s, barrier, results))
             for s in seeds]
    for p in procs:
        p.start()
    said = dict(results.get(timeout=300) for _ in procs)
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    data = out.read_bytes()
    kept = [s for s in seeds if data == alone[s]]
    assert len(kept) == 1, "the pack is neither writer's own bytes"
    other = [s for s in seeds if s != kept[0]][0]
    # the writer that finished second replaced the first's file, and said so; the first
    # found the path as it was when it began, and said nothing
    assert said[kept[0]] == (f"strata-prefill: {out} was written by another process meanwhile; "
                             "this run's file replaced it\n")
    assert said[other] == ""
    assert sorted(p.name for p in out.parent.iterdir()) == ["p.gguf"]
    with Pack.open(out) as pack:
        assert pack.field("strata.seed") == kept[0]
        assert pack.check_digest().ok


def test_same_arguments_write_the_same_bytes(tmp_path):
    a = make_pack(tmp_path / "a.gguf", "tiny", seed=5, progress=False, workers=1)
    b = make_pack(tmp_path / "b.gguf", "tiny", seed=5, progress=False, workers=3)
    assert a.read_bytes() == b.read_bytes()
    with Pack.open(a) as pack:
        assert pack.writer == make_pack_module.writer_name()
        assert str(tmp_path) not in pack.writer and "make-pack" in pack.writer


# ---------------------------------------------------------------------------------------
# signals


@pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="POSIX signals")
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
def test_a_signal_mid_write_removes_the_partial_pack(tmp_path, sig):
    out = tmp_path / "big.gguf"
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(
        [sys.executable, "-m", "strata_prefill", "make-pack", "--preset", "small", "--layers", "12",
         "--no-progress", str(out)],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        # the signal at its default in the child: under nohup (SIGHUP ignored, and inherited so)
        # make-pack rightly keeps writing through a hangup, which is not what this test asks
        preexec_fn=lambda: signal.signal(getattr(signal, sig), signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 120
        while True:  # until the temp exists and holds tensor data (past the header)
            parts = [p for p in tmp_path.iterdir() if p.name.endswith(".part")]
            if parts and parts[0].stat().st_size > 4 << 20:
                break
            assert proc.poll() is None, f"make-pack ended before it was signalled: {proc.communicate()}"
            assert time.monotonic() < deadline, "no temp file appeared"
            time.sleep(0.005)
        assert parts[0].name.startswith(f".big.gguf.{proc.pid}.")
        proc.send_signal(getattr(signal, sig))
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    signum = int(getattr(signal, sig))
    assert proc.returncode == 128 + signum, stderr
    assert stderr == f"strata-prefill: interrupted ({sig}): removed the partial {out}\n"
    assert stdout.startswith(f"writing {out}: ") and "wrote" not in stdout
    assert list(tmp_path.iterdir()) == []  # no temp, no target


def test_handlers_are_installed_only_while_a_write_is_open(tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    w = atomic.AtomicFile(tmp_path / "x")
    assert signal.getsignal(signal.SIGTERM) is atomic._on_signal
    w.file.write(b"x")
    w.commit()
    assert signal.getsignal(signal.SIGTERM) is before
    assert atomic.open_writes() == []


# ---------------------------------------------------------------------------------------
# failures


def test_a_failing_write_leaves_no_temp_and_the_old_file(tmp_path):
    target = tmp_path / "t.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="boom"):
        with atomic.atomic_write(target) as f:
            f.write(np.random.default_rng(1).bytes(1000))
            assert _leftovers(tmp_path)  # the temp exists while the write is open
            raise RuntimeError("boom")
    assert target.read_bytes() == b"old" and _leftovers(tmp_path) == []


def test_a_pack_that_fails_midway_leaves_no_temp(tmp_path, monkeypatch):
    target = tmp_path / "p.gguf"
    target.write_bytes(b"an older pack")
    calls = []
    real = make_pack_module._Plan._make_chunk

    def failing(self, seed, c, rows):
        calls.append(self.name)
        if len(calls) == 20:
            raise MemoryError("out of memory in a generator")
        return real(self, seed, c, rows)

    monkeypatch.setattr(make_pack_module._Plan, "_make_chunk", failing)
    with pytest.raises(MemoryError):
        make_pack(target, "tiny", progress=False, workers=1)
    assert target.read_bytes() == b"an older pack" and _leftovers(tmp_path) == []


def test_an_os_error_names_the_target_not_the_temp(tmp_path, monkeypatch, capsys):
    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(atomic.os, "fsync", full)
    out = tmp_path / "p.gguf"
    assert cli(["make-pack", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == f"strata-prefill: error: {out}: {os.strerror(errno.ENOSPC)}\n"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX fork")
def test_a_forked_child_leaves_its_parents_write_alone(tmp_path):
    data = np.random.default_rng(5).bytes(1000)
    w = atomic.AtomicFile(tmp_path / "x.bin")
    w.file.write(data)  # still in the buffer when the child is forked
    pid = os.fork()
    if pid == 0:  # the child: what its exit would do to an open write
        try:
            w.discard()
        finally:
            os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    w.commit()
    assert (tmp_path / "x.bin").read_bytes() == data and _leftovers(tmp_path) == []


def test_a_symlinked_target_keeps_its_link(tmp_path):
    real = tmp_path / "real.bin"
    real.write_bytes(b"old")
    link = tmp_path / "link.bin"
    link.symlink_to(real)
    atomic.write_bytes(link, b"new")
    assert link.is_symlink() and real.read_bytes() == b"new"


# ---------------------------------------------------------------------------------------
# dumps over a run


def test_a_growing_dump_appears_whole_at_close(tmp_path):
    rng = np.random.default_rng(3)
    path = tmp_path / "layers.spd"
    path.write_bytes(b"the last run's")
    w = dumps.RecordWriter(path)
    a, b = rng.standard_normal((3, 5), dtype=np.float32), rng.integers(0, 9, 7)
    w.write("a", a)
    w.write("b", b)
    assert path.read_bytes() == b"the last run's"  # nothing of this run is visible yet
    w.close()
    got = dumps.read_records(path)
    assert np.array_equal(got["a"], a) and np.array_equal(got["b"], b)
    w.write("a", a)  # after close: continues the committed file
    w.close()
    assert dumps.read_records(path)["a"].shape == (6, 5)
    assert _leftovers(tmp_path) == []

    r = dumps.ResidualWriter(tmp_path / "r.bin")
    pos = np.arange(0, 200, dtype=np.int64)
    rows = rng.standard_normal((200, 4), dtype=np.float32)
    r.write(pos[:100], rows[:100])
    r.write(pos[100:], rows[100:])
    r.discard()
    assert not (tmp_path / "r.bin").exists() and _leftovers(tmp_path) == []
    with dumps.ResidualWriter(tmp_path / "r.bin") as r:
        r.write(pos[:100], rows[:100])
        r.write(pos[100:], rows[100:])
    got_pos, got_rows = dumps.read_residuals(tmp_path / "r.bin", 4)
    keep = pos % 64 == 0
    assert np.array_equal(got_pos, pos[keep]) and np.array_equal(got_rows, rows[keep])


def test_a_failed_run_leaves_no_dump(make_test_pack, tmp_path, monkeypatch):
    from strata_prefill.reference import ReferenceEngine
    from strata_prefill.session import Session

    pack = make_test_pack("tiny", "Q8_0")
    engine = ReferenceEngine(pack)
    real = engine.layer

    def failing(layer, x, positions, dump):
        if int(positions[0]) >= 64:  # the second chunk
            raise FloatingPointError("a failure in the second chunk")
        return real(layer, x, positions, dump)

    monkeypatch.setattr(engine, "layer", failing)
    d = tmp_path / "d"
    s = Session(engine, chunk=64, dump_dir=d, dump_r=tmp_path / "r.bin",
                dump_first_logits=tmp_path / "l.f32", progress=False)
    ids = np.random.default_rng(4).integers(0, pack.config.n_vocab, 100)
    with pytest.raises(FloatingPointError):
        s.run(ids)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["d"]


# ---------------------------------------------------------------------------------------
# info --check


def _info_check(path, capsys) -> tuple[int, str, str]:
    rc = cli(["info", "--check", str(path)])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_info_check_ok_then_one_flipped_byte_named(tmp_path, capsys):
    path = make_pack(tmp_path / "p.gguf", "tiny", seed=3, expert_type="Q2_K", progress=False)
    rc, out, err = _info_check(path, capsys)
    assert rc == 0 and err == ""
    with Pack.open(path) as pack:
        n = len(pack.reader.tensors)
        assert out.splitlines()[-1] == f"tensor data digest: ok ({n} tensors, sha256)"
        rng = np.random.default_rng(7)
        t = pack.reader.tensors[int(rng.integers(1, n))]
        name, off = str(t.name), int(t.data_offset) + int(rng.integers(0, int(t.n_bytes)))
    data = bytearray(path.read_bytes())
    data[off] ^= 1 << int(np.random.default_rng(8).integers(0, 8))
    path.write_bytes(bytes(data))
    rc, out, err = _info_check(path, capsys)
    assert rc == 2
    assert err == (f"strata-prefill: error: {path}: tensor data does not match the digest in its "
                   f"header (first bad tensor: {name})\n")
    assert cli(["info", str(path)]) == 0  # without --check nothing is read beyond the header


def test_info_check_of_a_pack_without_a_digest(tmp_path, capsys):
    from test_gguf_names import write_converter_style

    path = tmp_path / "converted.gguf"
    write_converter_style(path, np.random.default_rng(2))
    rc, out, err = _info_check(path, capsys)
    assert rc == 0 and err == ""
    last = out.splitlines()[-1]
    assert last.startswith("tensor data digest: none") and "nothing to check" in last
    assert "written by:     not recorded" in out
