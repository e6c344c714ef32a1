"""The reference cache (strata_prefill/refcache.py): a hit gives the bytes a fresh compute
gives; every input that can change a byte is in the key (a planted change misses); a damaged
entry is recomputed, never trusted; parallel workers compute a key once; the CLI's lines."""
from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from strata_prefill.formats.make_pack import make_pack
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
    from strata_prefill.reference import ReferenceEngine
    from strata_prefill.session import Session

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

    numerics = tree / "contract" / "numerics.py"
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
    from strata_prefill.formats.pack import Pack

    ids = prompt(pack)
    a = refcache.reference_run(pack, ids, cache=cache)
    copy = tmp_path / "copy.gguf"
    shutil.copyfile(pack.path, copy)
    assert refcache.reference_run(copy, ids, cache=cache).hit  # same bytes, another path

    flip_tensor_byte(copy)
    b = refcache.reference_run(Pack.open(copy), ids, cache=cache)
    assert not b.hit and b.entry != a.entry
    assert b.logits.tobytes() != a.logits.tobytes()  # the byte reached the output


def by_hand(data: bytes, piece: int) -> str:
    """The content digest as docs/reference-cache.md defines it, computed here on its own."""
    h = hashlib.sha256(b"strata-prefill pack content: size, then sha256 of each 64 MiB piece\n")
    h.update(len(data).to_bytes(8, "little"))
    for i in range(0, len(data), piece):
        h.update(hashlib.sha256(data[i:i + piece]).digest())
    return h.hexdigest()


@pytest.mark.parametrize("threads", ["1", "3"])
def test_the_pack_digest_is_its_pieces_digest_whatever_the_threads(tmp_path, monkeypatch, threads):
    monkeypatch.setattr(refcache, "PIECE", 4096)
    monkeypatch.setenv("STRATA_PREFILL_THREADS", threads)
    for size in (0, 1, 4096, 4097, 50_000):
        path = tmp_path / f"blob{size}.gguf"
        data = np.random.default_rng(size).bytes(size)
        path.write_bytes(data)
        assert refcache.content_digest(path) == by_hand(data, 4096)
    with pytest.raises(FileNotFoundError):
        refcache.content_digest(tmp_path / "none.gguf")


def test_a_pack_is_hashed_once_a_process_and_again_when_it_changes(tmp_path, monkeypatch):
    """Remembered by this process by the file's mark (path, device, inode, size, mtime, ctime):
    a write that keeps the size and sets the mtime back still moves the ctime, and is hashed
    again. A file written within the racy window is hashed at every call."""
    monkeypatch.setattr(refcache, "_PACK_DIGESTS", {})
    path = tmp_path / "blob.gguf"
    data = bytearray(np.random.default_rng(0).bytes(5000))
    path.write_bytes(bytes(data))
    hashed = []
    real = refcache.content_digest
    monkeypatch.setattr(refcache, "content_digest", lambda p: hashed.append(p) or real(p))
    want = by_hand(bytes(data), refcache.PIECE)
    assert refcache.pack_digest(path) == want and refcache.pack_digest(path) == want and len(hashed) == 2  # racy
    monkeypatch.setattr(refcache, "_RACY_S", 0.0)
    assert refcache.pack_digest(path) == want and refcache.pack_digest(path) == want and len(hashed) == 3
    st = path.stat()
    data[100] ^= 0xFF
    time.sleep(0.01)
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # the same size and mtime
    assert refcache.pack_digest(path) == by_hand(bytes(data), refcache.PIECE) != want and len(hashed) == 4
    monkeypatch.setattr(refcache, "_PACK_DIGESTS", {})  # a new process hashes again
    assert refcache.pack_digest(path) != want and len(hashed) == 5


@pytest.fixture
def counted(monkeypatch):
    """The packs hashed (content_digest calls), with marks out of the racy window at once."""
    monkeypatch.setattr(refcache, "_RACY_S", 0.0)
    monkeypatch.setattr(refcache, "_PACK_DIGESTS", {})
    hashed = []
    real = refcache.content_digest
    monkeypatch.setattr(refcache, "content_digest", lambda p: hashed.append(Path(p).name) or real(p))
    return hashed


def new_process(monkeypatch) -> None:
    monkeypatch.setattr(refcache, "_PACK_DIGESTS", {})


def test_a_hit_from_the_file_an_entry_records_hashes_nothing(pack, cache, counted, monkeypatch, tmp_path):
    """The index's hint is taken where the entry it leads to records this very file as it is;
    a copy (another file, the same bytes) is hashed, hits, and is recorded in turn."""
    ids = prompt(pack)
    a = refcache.reference_run(pack, ids, greedy=2, cache=cache)
    assert counted == [Path(pack.path).name] and not a.hit
    assert refcache.Cache.read_meta(a.entry)["packs"] == [refcache._stat_mark(Path(pack.path).resolve())]
    new_process(monkeypatch)
    assert refcache.reference_run(pack, ids, greedy=2, cache=cache).hit and len(counted) == 1  # nothing hashed
    copy = tmp_path / "copy.gguf"
    shutil.copyfile(pack.path, copy)
    new_process(monkeypatch)
    b = refcache.reference_run(copy, ids, greedy=2, cache=cache)
    assert b.hit and b.entry == a.entry and counted[-1] == "copy.gguf" and len(counted) == 2
    assert len(refcache.Cache.read_meta(a.entry)["packs"]) == 2
    new_process(monkeypatch)
    assert refcache.reference_run(copy, ids, greedy=2, cache=cache).hit and len(counted) == 2
    assert refcache.reference_run(pack, ids, greedy=2, cache=cache).hit and len(counted) == 2
    refcache.reference_run(pack, ids, greedy=3, cache=cache)  # another key: the hint's entry is not there yet
    assert len(counted) == 2  # this process hashed the file already


def test_an_index_that_names_another_packs_digest_costs_a_hash_not_a_wrong_result(pack, cache, make_test_pack,
                                                                                   counted, monkeypatch):
    """The index could name another pack's digest for this file (edited, stale, copied from
    another machine): the entry it leads to records another file, so the pack is hashed, and
    its own entry (here none yet) is what the lookup finds; the RefRun says what was wrong."""
    other = make_test_pack("small", "Q8_0")
    ids = prompt(pack)
    fresh = refcache.reference_run(pack, ids, greedy=2, cache=None)
    b = refcache.reference_run(other, ids, greedy=2, cache=cache)
    mark = refcache._stat_mark(Path(pack.path).resolve())
    index = json.loads((cache.root / "_packs.json").read_text())
    index[mark["path"]] = {**{k: v for k, v in mark.items() if k != "path"}, "sha256": refcache.pack_digest(other.path)}
    (cache.root / "_packs.json").write_text(json.dumps(index))
    new_process(monkeypatch)
    n = len(counted)
    a = refcache.reference_run(pack, ids, greedy=2, cache=cache)
    assert not a.hit and a.entry != b.entry and len(counted) == n + 1
    assert a.pack_index.startswith("the pack index named another pack's digest for ")
    same(fresh, a)
    assert max(a.greedy) < pack.config.n_vocab and a.logits.shape == (pack.config.n_vocab,)
    new_process(monkeypatch)  # the index was set right: the next lookup takes its hint
    again = refcache.reference_run(pack, ids, greedy=2, cache=cache)
    assert again.hit and again.pack_index is None and len(counted) == n + 1


def test_a_pack_rewritten_in_place_with_its_size_and_mtime_is_hashed_again(pack, cache, counted, monkeypatch,
                                                                          tmp_path):
    copy = tmp_path / "copy.gguf"
    shutil.copyfile(pack.path, copy)
    ids = prompt(pack)
    a = refcache.reference_run(copy, ids, cache=cache)
    st = copy.stat()
    flip_tensor_byte(copy)
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns))
    new_process(monkeypatch)
    b = refcache.reference_run(copy, ids, cache=cache)
    assert not b.hit and b.entry != a.entry and b.pack_index is None and counted[-1] == "copy.gguf"
    assert b.logits.tobytes() != a.logits.tobytes()


def plant(src: Path, dst: Path, digest_too: bool) -> None:
    """Put a copy of entry `src` where entry `dst` lives (its meta.json's digest made dst's
    name where `digest_too`: only its key and kind then say whose it is)."""
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    if digest_too:
        meta = json.loads((dst / "meta.json").read_text())
        meta["digest"] = dst.name
        (dst / "meta.json").write_text(json.dumps(meta))


@pytest.mark.parametrize("digest_too", [False, True])
def test_a_foreign_entry_planted_under_this_key_is_recomputed(pack, cache, make_test_pack, digest_too):
    other = make_test_pack("small", "Q8_0")
    ids = prompt(pack)
    a = refcache.reference_run(pack, ids, greedy=2, cache=cache)
    b = refcache.reference_run(other, ids, greedy=2, cache=cache)
    plant(b.entry, a.entry, digest_too)
    refcache.reset_stats()
    again = refcache.reference_run(pack, ids, greedy=2, cache=cache)
    assert not again.hit and again.entry == a.entry and again.recomputed.startswith("another key's")
    same(a, again)
    assert refcache.stats() == {"hits": 0, "misses": 1, "recomputed": 1}
    assert refcache.reference_run(pack, ids, greedy=2, cache=cache).hit


def test_run_says_the_pack_index_was_wrong(pack, cache, make_test_pack, capsys, monkeypatch):
    other = make_test_pack("small", "Q8_0")
    args = lambda p: ["run", "--pack", str(p.path), "--prompt-tokens", "40", "--greedy", "4", "--no-progress",
                      "--reference-cache", str(cache.root)]
    assert main(args(other)) == 0
    capsys.readouterr()
    monkeypatch.setattr(refcache, "_RACY_S", 0.0)
    mark = refcache._stat_mark(Path(pack.path).resolve())
    (cache.root / "_packs.json").write_text(json.dumps({mark["path"]: {
        **{k: v for k, v in mark.items() if k != "path"}, "sha256": refcache.pack_digest(other.path)}}))
    monkeypatch.setattr(refcache, "_PACK_DIGESTS", {})
    assert main(args(pack)) == 0
    line = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("reference cache:")]
    assert len(line) == 1 and line[0].startswith("reference cache: miss, computed in ")
    assert line[0].endswith("(an edited, stale or copied index): its bytes were hashed")


def test_run_with_a_foreign_entry_prints_this_packs_tokens(pack, cache, make_test_pack, tmp_path, capsys):
    """`run --reference-cache` on a pack whose entry was replaced by another pack's (a 2,048-
    token vocabulary, this one's 512): the line says what it found, the tokens are this pack's."""
    other = make_test_pack("small", "Q8_0")
    args = lambda p: ["run", "--pack", str(p.path), "--prompt-tokens", "40", "--greedy", "4", "--no-progress"]
    assert main(args(pack)) == 0
    plain = capsys.readouterr().out
    flag = ["--reference-cache", str(cache.root)]
    assert main(args(pack) + flag) == 0 and main(args(other) + flag) == 0
    capsys.readouterr()
    ids = np.random.default_rng(0).integers(0, pack.config.n_vocab, size=40, dtype=np.int32)
    entry_a = cache.entry("reference-run", {"pack": refcache.pack_digest(pack.path), "prompt": refcache._prompt_key(
        ids, pack.config.n_vocab), "tokens": 40, "greedy": 4, "dump_level": None})
    (entry_b,) = [e for e in cache.entries() if e != entry_a]
    plant(entry_b, entry_a, True)
    assert main(args(pack) + flag) == 0
    out, err = capsys.readouterr()
    line = [ln for ln in err.splitlines() if ln.startswith("reference cache:")]
    assert len(line) == 1 and line[0].startswith("reference cache: miss (the entry there was another key's")
    strip = lambda text: [ln for ln in text.splitlines() if not ln.startswith("speed")]
    assert strip(out) == strip(plain)
    greedy = [int(t) for t in next(ln for ln in out.splitlines() if ln.startswith("greedy")).split()[1:]]
    assert len(greedy) == 4 and max(greedy) < pack.config.n_vocab


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


def tree(folder: Path) -> dict:
    """{relative path: bytes (None for a folder)} of everything under `folder`."""
    return {p.relative_to(folder).as_posix(): (p.read_bytes() if p.is_file() else None)
            for p in sorted(folder.rglob("*"))}


def refused(args: list[str], capsys) -> str:
    """main(args) refuses in one line with exit 2; the line."""
    assert main(args) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("strata-prefill: error: ")
    return err.strip()


def test_clear_on_a_folder_that_is_not_a_cache_is_refused(tmp_path, capsys):
    own = tmp_path / "mine"
    for rel in ("docs/notes.txt", "ab/cd/file", "reference-run/zz/not-a-digest/x"):
        (own / rel).parent.mkdir(parents=True, exist_ok=True)
        (own / rel).write_text("keep")
    before = tree(own)
    line = refused(["cache", "clear", "--dir", str(own)], capsys)
    assert f"{own} is not a reference cache: it holds ab/, which a reference cache does not" in line
    assert "nothing removed" in line and tree(own) == before
    for rel in ("ab/cd/file", "docs/notes.txt"):  # a cache's shape, but one folder holds a stray
        (own / rel).unlink()
        (own / rel).parent.rmdir()
    (own / "ab").rmdir()
    before = tree(own)
    assert "it holds reference-run/" in refused(["cache", "clear", "--dir", str(own)], capsys)
    assert tree(own) == before
    (own / "notes.txt").write_text("a file")
    assert "is a file" in refused(["cache", "clear", "--dir", str(own / "notes.txt")], capsys)


@pytest.fixture
def default_cache(tmp_path, monkeypatch, pack):
    """The default cache under a cache home of the test's own, with one entry."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home-cache"))
    monkeypatch.delenv(refcache.ENV, raising=False)
    c = refcache.Cache(refcache.default_dir())
    refcache.reference_run(pack, prompt(pack, 20), greedy=1, cache=c)
    assert len(c.entries()) == 1
    return c


@pytest.mark.parametrize("words, needle", [
    (["--dir", ""], "argument --dir: '' is an empty path: name a folder"),
    (["--dir", "  "], "is an empty path: name a folder"),
    (["--dir", "reference"], "--dir reference is relative to nothing named"),
    (["--dir", "/"], "--dir / is the filesystem root"),
    (["--dir", "/.."], "--dir /.. is the filesystem root"),
])
def test_clear_refuses_a_folder_that_names_nothing(default_cache, tmp_path, capsys, monkeypatch, words, needle):
    """`cache clear --dir "$UNSET"` emptied the default cache: an empty word, a relative
    folder written without ./ and the root are refused, and nothing anywhere is removed."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "reference").mkdir()  # what the relative word would have named: a cache-shaped, empty folder
    before = tree(tmp_path)
    line = refused(["cache", "clear", *words], capsys)
    assert line == f"strata-prefill: error: cache clear: {needle}" or needle in line, line
    assert tree(tmp_path) == before and len(default_cache.entries()) == 1


def test_clear_refuses_the_variable_as_it_refuses_the_flag(default_cache, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(refcache.ENV, "cache")
    assert "STRATA_PREFILL_REFERENCE_CACHE cache is relative to nothing named" in refused(["cache", "clear"], capsys)
    monkeypatch.setenv("HOME", "")
    monkeypatch.setenv(refcache.ENV, "~/cache")
    line = refused(["cache", "clear"], capsys)
    assert "~/cache" in line and len(default_cache.entries()) == 1


def test_info_refuses_an_empty_dir_and_clear_takes_a_relative_one_written_with_dot(default_cache, tmp_path,
                                                                                   capsys, monkeypatch):
    assert "argument --dir: '' is an empty path" in refused(["cache", "info", "--dir", ""], capsys)
    monkeypatch.chdir(default_cache.root.parent)
    assert main(["cache", "clear", "--dir", "./reference"]) == 0
    assert capsys.readouterr().out.startswith(f"removed 1 entry (")
    assert default_cache.entries() == []


def test_clear_keeps_what_is_not_the_caches_in_a_tagged_cache_and_clears_an_untagged_one(pack, cache, capsys):
    refcache.reference_run(pack, prompt(pack, 20), greedy=1, cache=cache)
    assert (cache.root / refcache.TAG).read_text().startswith(refcache.TAG_SIGNATURE)
    (cache.root / "notes.txt").write_text("mine")
    assert main(["cache", "clear", "--dir", str(cache.root)]) == 0
    assert capsys.readouterr().out.startswith("removed 1 entry (")
    assert sorted(p.name for p in cache.root.iterdir()) == [refcache.TAG, "notes.txt"]
    # a cache made before the tag: entries, temp and lock folders, the old pack index, nothing else
    refcache.reference_run(pack, prompt(pack, 20), greedy=1, cache=cache)
    (cache.root / refcache.TAG).unlink()
    (cache.root / "notes.txt").unlink()
    (cache.root / "_packs.json").write_text("{}")
    assert main(["cache", "clear", "--dir", str(cache.root)]) == 0
    assert capsys.readouterr().out.startswith("removed 1 entry (")
    assert list(cache.root.iterdir()) == []


# ---- a cache in use: the use lock, with real processes ------------------------------------
def _holder(root: str, ready, done) -> None:
    """Hold one entry (computed here) until told to let go (spawned: a process of its own)."""
    c = refcache.Cache(root)
    with c.held("held", {"n": 1}, lambda folder: (folder / "x.bin").write_bytes(b"held")) as found:
        assert found.entry.is_dir()
        ready.set()
        done.wait(timeout=120)


def test_clear_passes_over_an_entry_a_running_process_holds(cache, capsys):
    refcache.cached_arrays("free", {"n": 2}, lambda: {"a": np.arange(5)}, cache=cache)
    ctx = multiprocessing.get_context("spawn")
    ready, done = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_holder, args=(str(cache.root), ready, done))
    proc.start()
    try:
        assert ready.wait(timeout=120)
        held = cache.entry("held", {"n": 1})
        assert main(["cache", "clear", "--dir", str(cache.root)]) == 0
        out = capsys.readouterr().out
        assert out.startswith("removed 1 entry (") and "kept 1 in use by a running process" in out
        assert cache.entries() == [held] and (held / "x.bin").read_bytes() == b"held"
        assert cache._valid(held)
    finally:
        done.set()
        proc.join(timeout=60)
    assert proc.exitcode == 0
    assert main(["cache", "clear", "--dir", str(cache.root)]) == 0  # let go: removed
    assert capsys.readouterr().out.startswith("removed 1 entry (")
    assert cache.entries() == [] and sorted(p.name for p in cache.root.iterdir()) == [refcache.TAG]


def test_a_clear_during_a_run_costs_the_run_nothing(make_test_pack, tmp_path):
    """`cache clear` while `run --reference-cache` computes (two processes of their own): the
    clear passes over the computation, the run prints its result, stores it and exits 0."""
    pack = make_test_pack("small", "Q8_0")
    cache = tmp_path / "cache"
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRATA_")}
    env["PYTHONPATH"] = str(ROOT)
    env["XDG_CACHE_HOME"] = str(tmp_path / "home")
    args = [sys.executable, "-m", "strata_prefill", "run", "--pack", str(pack.path), "--prompt-tokens", "1000",
            "--greedy", "2", "--no-progress"]
    run = subprocess.Popen(args + ["--reference-cache", str(cache)], cwd=ROOT, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not (cache / "_tmp").is_dir() or not any((cache / "_tmp").iterdir()):
            assert run.poll() is None and time.monotonic() < deadline, "the run ended before its compute was seen"
            time.sleep(0.01)
        clear = subprocess.run([sys.executable, "-m", "strata_prefill", "cache", "clear", "--dir", str(cache)],
                               cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert run.poll() is None, "the run ended before the clear: a longer prompt is needed"
        assert clear.returncode == 0, clear.stderr
        assert "removed 0 entries" in clear.stdout and "kept 1 in use by a running process" in clear.stdout
        out, err = run.communicate(timeout=600)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == 0, err
    line = [ln for ln in err.splitlines() if ln.startswith("reference cache:")]
    assert len(line) == 1 and line[0].startswith("reference cache: miss, computed in ") and "stored" in line[0]
    assert len(refcache.Cache(cache).entries()) == 1
    again = subprocess.run(args + ["--reference-cache", str(cache)], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=600)
    assert again.returncode == 0 and "reference cache: hit" in again.stderr, again.stderr
    strip = lambda text: [ln for ln in text.splitlines() if not ln.startswith("speed")]
    assert strip(out) == strip(again.stdout) and len(strip(out)) == 5


def test_a_result_that_cannot_be_stored_is_printed_all_the_same(pack, tmp_path, capsys, monkeypatch):
    """A cache folder that cannot take the entry: the run keeps its result, prints it as an
    uncached run does and says in its one line that it was not kept."""
    args = ["run", "--pack", str(pack.path), "--prompt-tokens", "40", "--greedy", "2", "--no-progress"]
    assert main(args) == 0
    plain = capsys.readouterr().out
    strip = lambda text: [ln for ln in text.splitlines() if not ln.startswith("speed")]
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "_tmp").write_text("a file where the temp folder goes")
    assert main(args + ["--reference-cache", str(broken)]) == 0
    out, err = capsys.readouterr()
    assert strip(out) == strip(plain)
    line = [ln for ln in err.splitlines() if ln.startswith("reference cache:")]
    assert len(line) == 1 and line[0].startswith("reference cache: miss, computed in ")
    assert f"not kept: cannot write in {broken}" in line[0]

    def no_room(self, tmp, entry):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(refcache.Cache, "_place", no_room)
    cache = tmp_path / "cache"
    assert main(args + ["--reference-cache", str(cache)]) == 0
    out, err = capsys.readouterr()
    assert strip(out) == strip(plain)
    assert "not kept: it could not be stored (No space left on device)" in err
    assert refcache.Cache(cache).entries() == [] and not any((cache / "_tmp").iterdir())
