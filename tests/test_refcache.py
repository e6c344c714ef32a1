"""The reference cache (strata_prefill/refcache.py): a hit gives the bytes a fresh compute
gives; every input that can change a byte is in the key (a planted change misses); a damaged
entry is recomputed, never trusted; parallel workers compute a key once; the CLI's lines."""
from __future__ import annotations

import hashlib
import multiprocessing
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from strata.make_pack import make_pack
from strata_prefill import refcache
from strata_prefill.cli import main

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.delenv(refcache.ENV, raising=False)
    refcache.reset_stats()
    return refcache.Cache(tmp_path / "cache")


@pytest.fixture
def pack(make_test_pack):
    return make_test_pack("tiny", "Q8_0")


def prompt(pack, n=40, seed=3):
    return np.random.default_rng(seed).integers(0, pack.config.n_vocab, n)


def same(a: refcache.RefRun, b: refcache.RefRun) -> None:
    assert a.logits.dtype == b.logits.dtype == np.float32
    assert a.logits.tobytes() == b.logits.tobytes()
    assert a.greedy == b.greedy
    assert a.residuals == b.residuals
    assert (a.records is None) == (b.records is None)
    if a.records is not None:
        assert a.records.read_bytes() == b.records.read_bytes()


def test_a_hit_gives_the_bytes_of_a_fresh_compute(pack, cache):
    ids = prompt(pack)
    fresh = refcache.reference_run(pack, ids, greedy=2, cache=None)
    first = refcache.reference_run(pack, ids, greedy=2, cache=cache)
    again = refcache.reference_run(pack, ids, greedy=2, cache=cache)
    assert not fresh.hit and not first.hit and again.hit
    assert first.seconds > 0 and again.seconds == 0.0
    assert again.entry == first.entry and again.records.parent == again.entry
    same(fresh, first)
    same(fresh, again)
    assert len(again.greedy) == 2 and again.logits.shape == (pack.config.n_vocab,)
    assert refcache.stats() == {"hits": 1, "misses": 1, "recomputed": 0}


def test_the_outputs_are_the_gates_own_files(pack, cache, tmp_path):
    """The same files verify/common.py:run_engine writes with a Session of its own."""
    from reference import ReferenceEngine
    from strata.session import Session

    ids = prompt(pack, 70)
    out = tmp_path / "own"
    res = Session(ReferenceEngine(pack), chunk=32, dump_dir=out, dump_r=out / "r.bin",
                  progress=False, dump_level="layer").run(ids, greedy=3)
    r = refcache.reference_run(pack, ids, greedy=3, cache=cache, chunk=32)
    assert r.records.read_bytes() == (out / "layers.spd").read_bytes()
    assert r.residuals == (out / "r.bin").read_bytes()
    assert r.logits.tobytes() == res.logits.tobytes() and r.greedy == res.greedy
    assert r.chunk == 32


def test_the_chunk_is_not_in_the_key(pack, cache):
    ids = prompt(pack, 70)
    a = refcache.reference_run(pack, ids, greedy=1, cache=cache, chunk=32)
    b = refcache.reference_run(pack, ids, greedy=1, cache=cache, chunk="auto")
    assert b.hit and b.chunk == 32 and b.entry == a.entry


@pytest.mark.parametrize("change", [
    {"greedy": 3}, {"dump_level": "ops"}, {"dump_level": None}, {"token": True},
])
def test_each_input_in_the_key_misses_when_changed(pack, cache, change):
    ids = prompt(pack)
    base = dict(greedy=2, dump_level="layer")
    a = refcache.reference_run(pack, ids, cache=cache, **base)
    if change.pop("token", False):
        ids = ids.copy()
        ids[17] = (ids[17] + 1) % pack.config.n_vocab
    b = refcache.reference_run(pack, ids, cache=cache, **{**base, **change})
    assert not a.hit and not b.hit and b.entry != a.entry
    assert refcache.reference_run(pack, ids, cache=cache, **{**base, **change}).hit
    if "dump_level" in change:
        assert (b.records is None) == (change["dump_level"] is None)


def test_a_prompt_of_another_integer_type_is_the_same_prompt(pack, cache):
    ids = prompt(pack)
    refcache.reference_run(pack, ids.astype(np.int64), cache=cache)
    assert refcache.reference_run(pack, ids.astype(np.int32), cache=cache).hit


def test_a_one_character_source_change_misses(pack, cache, tmp_path, monkeypatch):
    tree = tmp_path / "tree"
    for name in refcache.SOURCE_PACKAGES:
        shutil.copytree(ROOT / name, tree / name, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(refcache, "_SOURCE_DIGESTS", {})
    monkeypatch.setattr(refcache, "SOURCE_ROOT", None)
    real = refcache.source_digest()
    monkeypatch.setattr(refcache, "SOURCE_ROOT", tree)
    assert refcache.source_digest() == real  # the copy is the tree the digest names
    ids = prompt(pack)
    a = refcache.reference_run(pack, ids, cache=cache)
    assert refcache.reference_run(pack, ids, cache=cache).hit

    numerics = tree / "strata" / "numerics.py"
    text = numerics.read_text()
    numerics.write_text(text.replace("the", "thE", 1))  # one character, in a docstring
    monkeypatch.setattr(refcache, "_SOURCE_DIGESTS", {})  # a new process would see it
    assert refcache.source_digest() != real
    b = refcache.reference_run(pack, ids, cache=cache)
    assert not b.hit and b.entry != a.entry
    same(a, b)


def test_a_new_numpy_version_misses(pack, cache, monkeypatch):
    ids = prompt(pack)
    a = refcache.reference_run(pack, ids, cache=cache)
    monkeypatch.setattr(refcache, "_SOURCE_DIGESTS", {})
    monkeypatch.setattr(np, "__version__", np.__version__ + ".post1")
    b = refcache.reference_run(pack, ids, cache=cache)
    assert not b.hit and b.entry != a.entry


def flip_tensor_byte(path: Path, tensor: str = "blk.0.ffn_down_exps.weight") -> None:
    """Flip one bit of an int8 quant of the tensor's first Q8_0 block (past its f16 scale)."""
    from gguf import GGUFReader

    t = next(t for t in GGUFReader(path).tensors if t.name == tensor)
    offset = int(t.data_offset) + 2 + 5
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([b ^ 0x01]))


def test_the_pack_is_named_by_its_content(pack, cache, tmp_path):
    from strata.pack import Pack

    ids = prompt(pack)
    a = refcache.reference_run(pack, ids, cache=cache)
    copy = tmp_path / "copy.gguf"
    shutil.copyfile(pack.path, copy)
    assert refcache.reference_run(copy, ids, cache=cache).hit  # same bytes, another path

    flip_tensor_byte(copy)
    b = refcache.reference_run(Pack.open(copy), ids, cache=cache)
    assert not b.hit and b.entry != a.entry
    assert b.logits.tobytes() != a.logits.tobytes()  # the byte reached the output


def test_a_pack_is_hashed_once_and_rehashed_when_it_changes(cache, tmp_path, monkeypatch):
    path = tmp_path / "blob.gguf"
    path.write_bytes(np.random.default_rng(0).bytes(5000))
    want = hashlib.sha256(path.read_bytes()).hexdigest()
    assert refcache.pack_digest(path, cache) == want
    index = (cache.root / "_packs.json").read_text()
    assert want in index and str(path.resolve()) in index

    reads = []
    real = refcache._file_sha256
    monkeypatch.setattr(refcache, "_file_sha256", lambda p: reads.append(p) or real(p))
    monkeypatch.setattr(refcache, "_PACK_DIGESTS", {})  # a new process: the index answers
    assert refcache.pack_digest(path, cache) == want and reads == []

    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF  # same size; the mtime moves
    path.write_bytes(bytes(data))
    os.utime(path, ns=(time.time_ns(), path.stat().st_mtime_ns + 1_000_000))
    changed = refcache.pack_digest(path, cache)
    assert changed == hashlib.sha256(bytes(data)).hexdigest() != want and len(reads) == 1

    (cache.root / "_packs.json").write_text("{ not json")  # a damaged index is ignored
    monkeypatch.setattr(refcache, "_PACK_DIGESTS", {})
    assert refcache.pack_digest(path, cache) == changed


def damage_truncate(entry: Path) -> None:
    p = entry / "layers.spd"
    p.write_bytes(p.read_bytes()[:-7])


def damage_flip(entry: Path) -> None:
    p = entry / "r.bin"
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0x10
    p.write_bytes(bytes(data))


def damage_meta(entry: Path) -> None:
    (entry / "meta.json").write_text('{"files": ')


def damage_missing(entry: Path) -> None:
    (entry / "first_logits.f32").unlink()


@pytest.mark.parametrize("damage", [damage_truncate, damage_flip, damage_meta, damage_missing])
def test_a_damaged_entry_is_recomputed_never_trusted(pack, cache, damage):
    ids = prompt(pack)
    a = refcache.reference_run(pack, ids, greedy=1, cache=cache)
    good = {p.name: p.read_bytes() for p in a.entry.iterdir()}
    damage(a.entry)
    b = refcache.reference_run(pack, ids, greedy=1, cache=cache)
    assert not b.hit and b.entry == a.entry
    assert refcache.stats() == {"hits": 0, "misses": 2, "recomputed": 1}
    same(a, b)
    assert {p.name: p.read_bytes() for p in b.entry.iterdir()}.keys() == good.keys()
    for name in ("layers.spd", "r.bin", "first_logits.f32"):  # run.json holds the timings
        assert (b.entry / name).read_bytes() == good[name]
    assert refcache.reference_run(pack, ids, greedy=1, cache=cache).hit


def _age(entry: Path, seconds: float) -> None:
    """Set every file of the entry `seconds` into the past (older than the racy window)."""
    then = time.time() - seconds
    for p in entry.iterdir():
        os.utime(p, (then, then))


@pytest.mark.parametrize("damage", [damage_truncate, damage_flip, damage_missing])
def test_a_checked_entry_is_not_hashed_again_until_a_file_changes(pack, cache, damage, monkeypatch):
    ids = prompt(pack)
    a = refcache.reference_run(pack, ids, greedy=1, cache=cache)
    _age(a.entry, 60)
    hashed = []
    real = refcache._file_sha256
    monkeypatch.setattr(refcache, "_file_sha256", lambda p: hashed.append(p) or real(p))
    assert refcache.reference_run(pack, ids, greedy=1, cache=cache).hit  # hashed whole, remembered
    n = len(hashed)
    assert n >= 3
    assert refcache.reference_run(pack, ids, greedy=1, cache=cache).hit
    assert len(hashed) == n  # nothing hashed again
    damage(a.entry)  # the same size for a flip: the timestamps and the check say so
    b = refcache.reference_run(pack, ids, greedy=1, cache=cache)
    assert not b.hit and len(hashed) > n
    same(a, b)


def test_an_entry_written_just_now_is_hashed_at_every_check(pack, cache, monkeypatch):
    """Within the racy window a write in the same clock tick could keep a file's timestamps:
    such an entry is never remembered as checked."""
    ids = prompt(pack)
    refcache.reference_run(pack, ids, greedy=1, cache=cache)
    monkeypatch.setattr(refcache, "_RACY_S", 1e6)
    hashed = []
    real = refcache._file_sha256
    monkeypatch.setattr(refcache, "_file_sha256", lambda p: hashed.append(p) or real(p))
    for _ in range(2):
        assert refcache.reference_run(pack, ids, greedy=1, cache=cache).hit
    assert len(hashed) >= 6 and len(hashed) % 2 == 0


def test_off_computes_every_time(pack, tmp_path, monkeypatch):
    for value in ("off", "0", "none", "OFF"):
        monkeypatch.setenv(refcache.ENV, value)
        assert refcache.from_env() is None
    refcache.reset_stats()
    ids = prompt(pack, 20)
    a = refcache.reference_run(pack, ids, greedy=1)  # cache="env": the variable, off
    b = refcache.reference_run(pack, ids, greedy=1, cache="off")
    assert not a.hit and not b.hit and a.entry is None and a.seconds > 0 and b.seconds > 0
    same(a, b)
    assert refcache.stats() == {"hits": 0, "misses": 0, "recomputed": 0}
    calls = []
    arrays = refcache.cached_arrays("k", {"n": 1}, lambda: calls.append(1) or {"a": np.ones(2)})
    refcache.cached_arrays("k", {"n": 1}, lambda: calls.append(1) or {"a": np.ones(2)})
    assert len(calls) == 2 and arrays["a"].tolist() == [1.0, 1.0]


def test_the_variable_names_the_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv(refcache.ENV, raising=False)
    assert refcache.default_dir() == tmp_path / "xdg" / "strata-prefill" / "reference"
    assert refcache.from_env().root == refcache.default_dir()
    assert refcache.from_env(default=False) is None
    monkeypatch.setenv(refcache.ENV, str(tmp_path / "mine"))
    assert refcache.from_env(default=False).root == tmp_path / "mine"


def test_cached_arrays(cache):
    calls = []

    def compute(n=1000, seed=7):
        calls.append(1)
        rng = np.random.default_rng(seed)
        return {"out": rng.standard_normal((n, 4)).astype(np.float32),
                "rows": rng.integers(0, 9, n).astype(np.int16)}

    key = {"op": "attention", "tokens": 1000, "seed": 7, "dtype": np.float32}
    a = refcache.cached_arrays("kernel-expect", key, compute, cache=cache)
    b = refcache.cached_arrays("kernel-expect", key, compute, cache=cache)
    assert len(calls) == 1
    want = compute()
    for name in want:
        assert a[name].dtype == b[name].dtype == want[name].dtype
        assert a[name].tobytes() == b[name].tobytes() == want[name].tobytes()
    refcache.cached_arrays("kernel-expect", {**key, "seed": 8}, lambda: compute(seed=8), cache=cache)
    assert len(calls) == 3  # the hit, the reference compute above, the new seed
    assert refcache.stats()["hits"] == 1 and refcache.stats()["misses"] == 2
    with pytest.raises(ValueError, match="file name"):
        refcache.cached_arrays("kernel-expect", {"bad": 1}, lambda: {"../x": np.ones(1)}, cache=cache)


def _worker(root: str, count_file: str, barrier, results) -> None:
    """One of two processes asking for one key at once (spawned: a fresh interpreter)."""
    c = refcache.Cache(root)

    def compute(folder: Path) -> None:
        with open(count_file, "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(0.5)  # long enough that the other worker arrives while this one computes
        (folder / "data.bin").write_bytes(np.random.default_rng(1).bytes(1 << 20))

    barrier.wait()
    entry, hit = c.get_or_compute("race", {"n": 1}, compute)
    data = (entry / "data.bin").read_bytes()
    results.put((hit, len(data), hashlib.sha256(data).hexdigest()))


def test_two_processes_asking_at_once_compute_once(cache, tmp_path):
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    results = ctx.Queue()
    count = tmp_path / "computes.txt"
    procs = [ctx.Process(target=_worker, args=(str(cache.root), str(count), barrier, results))
             for _ in range(2)]
    for p in procs:
        p.start()
    got = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert len(count.read_text().split()) == 1
    assert sorted(hit for hit, _, _ in got) == [False, True]
    want = hashlib.sha256(np.random.default_rng(1).bytes(1 << 20)).hexdigest()
    assert all(n == 1 << 20 and digest == want for _, n, digest in got)
    assert not list((cache.root / "_tmp").iterdir())


def test_two_makes_of_the_tiny_pack_are_the_same_bytes(tmp_path):
    """The cache keys packs by content: the gate's fresh packs must be byte-identical."""
    a = make_pack(tmp_path / "one.gguf", "tiny", progress=False)
    b = make_pack(tmp_path / "other-name.gguf", "tiny", progress=False, workers=1)
    assert a.read_bytes() == b.read_bytes()


# ---- the CLI ------------------------------------------------------------------------
def run_args(pack, out: Path, *extra):
    out.mkdir(parents=True, exist_ok=True)
    return ["run", "--pack", str(pack.path), "--prompt-tokens", "70", "--prefill", "32",
            "--greedy", "2", "--no-progress", "--dump-dir", str(out / "d"),
            "--dump-first-logits", str(out / "logits.f32"), "--dump-r", str(out / "r.bin"), *extra]


def outputs(out: Path) -> dict:
    return {n: (out / n).read_bytes() for n in ("d/layers.spd", "logits.f32", "r.bin")}


def test_run_through_the_cache_says_hit_or_miss(pack, cache, tmp_path, capsys):
    assert main(run_args(pack, tmp_path / "plain")) == 0
    plain = capsys.readouterr()
    assert "reference cache" not in plain.err  # only when asked

    flag = ["--reference-cache", str(cache.root)]
    assert main(run_args(pack, tmp_path / "miss", *flag)) == 0
    miss = capsys.readouterr()
    assert "reference cache: miss, computed in " in miss.err and f"stored {cache.root}" in miss.err
    assert main(run_args(pack, tmp_path / "hit", *flag)) == 0
    hit = capsys.readouterr()
    line = [ln for ln in hit.err.splitlines() if ln.startswith("reference cache:")]
    assert len(line) == 1 and line[0].startswith(f"reference cache: hit (nothing computed or timed) {cache.root}")
    assert "speed     nothing timed" in hit.out and "tokens/s" not in hit.out
    assert "tokens/s" in miss.out
    # everything but the speed line as a computed run prints it, and the same files
    strip = lambda text: [ln for ln in text.splitlines() if not ln.startswith("speed")]
    assert strip(hit.out) == strip(miss.out) == strip(plain.out)
    assert outputs(tmp_path / "hit") == outputs(tmp_path / "miss") == outputs(tmp_path / "plain")


def test_run_uses_the_variable_and_off_turns_it_off(pack, cache, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(refcache.ENV, str(cache.root))
    assert main(run_args(pack, tmp_path / "a")) == 0
    assert "reference cache: miss" in capsys.readouterr().err
    assert main(run_args(pack, tmp_path / "b")) == 0
    assert "reference cache: hit" in capsys.readouterr().err
    assert main(run_args(pack, tmp_path / "c", "--reference-cache", "off")) == 0
    assert "reference cache" not in capsys.readouterr().err


def test_run_refuses_the_cache_for_the_fast_path(pack, cache, capsys):
    assert main(["run", "--pack", str(pack.path), "--impl", "fast", "--backend", "sim",
                 "--reference-cache", str(cache.root)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs --impl reference" in err[0]
    assert not cache.root.exists()


def test_cache_info_and_clear(pack, cache, capsys):
    refcache.reference_run(pack, prompt(pack), cache=cache)
    refcache.cached_arrays("kernel-expect", {"n": 2}, lambda: {"a": np.arange(5)}, cache=cache)
    assert main(["cache", "info", "--dir", str(cache.root)]) == 0
    out = capsys.readouterr().out
    assert str(cache.root) in out and refcache.source_digest() in out
    assert "reference-run        1 entry" in out and "kernel-expect        1 entry" in out
    assert "entries        2," in out
    assert main(["cache", "clear", "--dir", str(cache.root)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("removed 2 entries (") and str(cache.root) in out
    assert cache.entries() == []
    assert not refcache.reference_run(pack, prompt(pack), cache=cache).hit
    assert main(["cache"]) == 2
    assert "info or clear" in capsys.readouterr().err


def test_clear_on_a_folder_that_is_not_a_cache_removes_nothing_of_it(tmp_path, capsys):
    own = tmp_path / "mine"
    for rel in ("docs/notes.txt", "ab/cd/file", "reference-run/zz/not-a-digest/x"):
        (own / rel).parent.mkdir(parents=True, exist_ok=True)
        (own / rel).write_text("keep")
    assert main(["cache", "clear", "--dir", str(own)]) == 0
    assert "removed 0 entries" in capsys.readouterr().out
    assert sorted(p.relative_to(own).as_posix() for p in own.rglob("*") if p.is_file()) == [
        "ab/cd/file", "docs/notes.txt", "reference-run/zz/not-a-digest/x"]
