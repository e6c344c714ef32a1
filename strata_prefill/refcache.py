"""Reference results kept on disk, under a key of everything that can change a byte of them.

The NumPy reference is the slow half of every parity check, and by the numerics contract
(docs/numerics.md section 9) its bytes depend only on the pack, the prompt, the greedy count,
the dump level and the code that computes them. So a result is stored once, in a folder named
by the sha256 of exactly those inputs, and read back instead of recomputed (docs/reference-cache.md).

- The code is named by `source_digest()`: the path and bytes of every module under `reference/`
  and `strata/` (all that `reference/` imports of this project), NumPy's version and gguf's.
  An edit of one character anywhere there is a new key; nothing is ever invalidated by hand.
- A pack is named by its content (`pack_digest`), not its path: the gate makes its packs
  afresh in temp folders each session, and the same bytes must find the same entries.
- An entry is a folder `<kind>/<key[:2]>/<key>/` of files plus `meta.json` (each file's size
  and sha256). Every lookup checks them all: a truncated or damaged entry is removed and
  recomputed, never trusted.
- An entry is computed in a temp folder inside the cache and renamed into place whole, so no
  reader sees half of one; a per-key `flock` makes one of several workers asking at once
  compute it while the others wait and read it (pytest-xdist workers ask for the same
  reference at the same time).

`STRATA_PREFILL_REFERENCE_CACHE=DIR` moves the cache, `=off` (or `0`, `none`) turns it off.
"""
from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from strata import atomic, nonfinite
from strata.cache_home import user_cache_dir

ENV = "STRATA_PREFILL_REFERENCE_CACHE"
OFF = ("off", "0", "none")
META = "meta.json"
SOURCE_PACKAGES = ("reference", "strata")  # what the reference's bytes are computed by
# None: each package where Python imports it from; tests point it at a copy of the tree
SOURCE_ROOT: Path | None = None

# inside the cache folder, beside the kinds (a kind never starts with "_")
_TMP, _LOCKS, _PACKS = "_tmp", "_locks", "_packs.json"
_KIND = re.compile(r"[a-z0-9][a-z0-9._-]*")
_FILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_DIGEST = re.compile(r"[0-9a-f]{64}")
_CHUNK = 1 << 22  # bytes hashed at a time

_STATS = {"hits": 0, "misses": 0, "recomputed": 0}
_SOURCE_DIGESTS: dict[tuple, str] = {}
_PACK_DIGESTS: dict[tuple[str, int, int], str] = {}


def default_dir() -> Path:
    return user_cache_dir() / "reference"


def cache_from(value: str | os.PathLike | None, default: bool = True) -> "Cache | None":
    """A setting's cache: a folder, `off`/`0`/`none` for none, unset (None or empty) for the
    default folder where `default` is true, else none."""
    if value is None or str(value) == "":
        return Cache(default_dir()) if default else None
    if str(value).strip().lower() in OFF:
        return None
    return Cache(value)


def from_env(default: bool = True) -> "Cache | None":
    """The cache STRATA_PREFILL_REFERENCE_CACHE names (the gate: default=True; `run`, which
    uses the cache only when asked: default=False)."""
    return cache_from(os.environ.get(ENV), default)


def resolve(cache) -> "Cache | None":
    """A `cache=` argument: "env" (the variable, on by default), None/False/"off" (none), a
    Cache, or a folder."""
    if isinstance(cache, Cache):
        return cache
    if cache is None or cache is False:
        return None
    if isinstance(cache, str) and cache == "env":
        return from_env(default=True)
    return cache_from(cache, default=False)


def stats() -> dict[str, int]:
    """This process's lookups: hits (served from an entry), misses (computed, recomputes
    included) and recomputed (of the misses, those that found a damaged entry)."""
    return dict(_STATS)


def reset_stats() -> None:
    for k in _STATS:
        _STATS[k] = 0


# ---- digests -------------------------------------------------------------------------
# entry folder -> its files' (name, size, mtime_ns, ctime_ns, inode) when this process last
# hashed them all and found them whole (Cache._valid)
_CHECKED: dict[str, tuple] = {}
_RACY_S = 2.0


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            h.update(block)
    return h.hexdigest()


def _package_dir(name: str) -> Path:
    if SOURCE_ROOT is not None:
        return Path(SOURCE_ROOT) / name
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:  # pragma: no cover - both ship with the project
        raise RuntimeError(f"cannot find the {name} package")
    return Path(spec.origin).parent


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - a source checkout
        return "unknown"


def source_digest(packages: tuple[str, ...] = SOURCE_PACKAGES) -> str:
    """sha256 of what computes a reference result: the package-relative path and bytes of
    every .py file under `packages` (reference/ and strata/; sorted), NumPy's version and
    gguf's. Computed once per process (per SOURCE_ROOT and packages)."""
    key = (SOURCE_ROOT, tuple(packages))
    if key not in _SOURCE_DIGESTS:
        h = hashlib.sha256()
        for name in packages:
            top = _package_dir(name)
            for path in sorted(top.rglob("*.py"), key=lambda p: p.relative_to(top).as_posix()):
                rel = f"{name}/{path.relative_to(top).as_posix()}".encode()
                data = path.read_bytes()
                h.update(len(rel).to_bytes(8, "little") + rel + len(data).to_bytes(8, "little") + data)
        h.update(f"numpy {np.__version__}; gguf {_version('gguf')}".encode())
        _SOURCE_DIGESTS[key] = h.hexdigest()
    return _SOURCE_DIGESTS[key]


def pack_digest(path: str | os.PathLike, cache="env") -> str:
    """sha256 of a pack file's bytes. Hashed once per file: remembered by (resolved path,
    size, mtime_ns) in this process and in the cache folder's index (so the next session does
    not read gigabytes again), and rehashed whenever any of the three changes."""
    p = Path(path).resolve()
    st = p.stat()
    memo = (str(p), st.st_size, st.st_mtime_ns)
    if memo in _PACK_DIGESTS:
        return _PACK_DIGESTS[memo]
    c = resolve(cache)
    digest = c._indexed_pack_digest(p, st) if c is not None else _file_sha256(p)
    _PACK_DIGESTS[memo] = digest
    return digest


def _canonical(value):
    """JSON for the key: NumPy scalars and dtypes, tuples and paths as plain values."""
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, np.dtype) or (isinstance(value, type) and issubclass(value, np.generic)):
        return np.dtype(value).str  # '<f4': the byte order decides bytes too
    raise TypeError(f"a cache key holds JSON values, not {type(value).__name__}")


# ---- the cache ----------------------------------------------------------------------
class Cache:
    """A cache folder. Entries are `<kind>/<key[:2]>/<key>/` (see the module docstring)."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root).expanduser()

    def __repr__(self) -> str:
        return f"Cache({str(self.root)!r})"

    def digest(self, kind: str, key: dict) -> str:
        """sha256 of the canonical JSON of {kind, key, source digest}."""
        if not _KIND.fullmatch(kind):
            raise ValueError(f"a cache kind is lower-case letters, digits and ._-, got {kind!r}")
        text = json.dumps({"kind": kind, "key": key, "source": source_digest()}, sort_keys=True,
                          separators=(",", ":"), default=_canonical)
        return hashlib.sha256(text.encode()).hexdigest()

    def entry(self, kind: str, key: dict) -> Path:
        """Where the entry of (kind, key) lives, whether or not it is there."""
        d = self.digest(kind, key)
        return self.root / kind / d[:2] / d

    def get_or_compute(self, kind: str, key: dict,
                       compute: Callable[[Path], None]) -> tuple[Path, bool]:
        """The entry folder of (kind, key) and whether it was there (a hit). On a miss
        `compute(folder)` writes the entry's files into an empty folder; they are
        checksummed and the folder renamed into place. Several processes asking at once: one
        computes, the others wait on the key's lock and read its entry."""
        entry = self.entry(kind, key)
        if self._valid(entry):
            _STATS["hits"] += 1
            return entry, True
        with self._lock(entry.name):
            if self._valid(entry):  # computed by the worker we waited for
                _STATS["hits"] += 1
                return entry, True
            if entry.exists():
                _STATS["recomputed"] += 1
                self._remove(entry)
            tmp_root = self.root / _TMP
            for stale in tmp_root.glob(f"{entry.name}.*"):  # left by a killed worker: we hold the lock
                shutil.rmtree(stale, ignore_errors=True)
            tmp = tmp_root / f"{entry.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
            tmp.mkdir(parents=True)
            try:
                t0 = time.perf_counter()
                compute(tmp)
                self._write_meta(tmp, kind, entry.name, key, time.perf_counter() - t0)
                entry.parent.mkdir(parents=True, exist_ok=True)
                try:
                    os.rename(tmp, entry)
                except OSError:
                    if not self._valid(entry):  # pragma: no cover - a lock the filesystem ignored
                        raise
                    # another process won (a filesystem whose flock does not lock): keep theirs
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            _STATS["misses"] += 1
            return entry, False

    # ---- entries --------------------------------------------------------------------
    @staticmethod
    def _write_meta(folder: Path, kind: str, digest: str, key: dict, seconds: float) -> None:
        files = {}
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            rel = path.relative_to(folder).as_posix()
            if rel == META:
                raise ValueError(f"a cache entry may not write its own {META}")
            files[rel] = {"size": path.stat().st_size, "sha256": _file_sha256(path)}
        meta = {"kind": kind, "digest": digest, "key": key, "source": source_digest(),
                "seconds": round(seconds, 6), "files": files}
        (folder / META).write_text(json.dumps(meta, indent=1, sort_keys=True, default=_canonical))

    @staticmethod
    def read_meta(entry: Path) -> dict | None:
        """An entry's meta.json, or None where it is missing or not the JSON it should be."""
        try:
            meta = json.loads((entry / META).read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(meta, dict) or not isinstance(meta.get("files"), dict):
            return None
        return meta

    def _valid(self, entry: Path) -> bool:
        """Every file meta.json lists is there with its size and sha256, and no other.

        An entry this process checked whole is not hashed again while every file's (size,
        mtime_ns, ctime_ns, inode) stays what it was, unless a file was written within
        _RACY_S of that check (its timestamp could then hide a later write in the same clock
        tick: git's "racily clean" rule)."""
        meta = self.read_meta(entry)
        if meta is None or meta.get("digest") != entry.name:
            return False
        try:
            present = {p.relative_to(entry).as_posix() for p in entry.rglob("*") if p.is_file()}
            if present != set(meta["files"]) | {META}:
                return False
            stats = {rel: os.stat(entry / rel) for rel in sorted(present)}
            marks = tuple((rel, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino) for rel, st in stats.items())
            if _CHECKED.get(str(entry)) == marks:
                return True
            for rel, want in meta["files"].items():
                path = entry / rel
                if stats[rel].st_size != want["size"] or _file_sha256(path) != want["sha256"]:
                    return False
        except (OSError, KeyError, TypeError):
            return False
        newest = max(st.st_mtime_ns for st in stats.values())
        if time.time_ns() - newest > _RACY_S * 1e9:
            _CHECKED[str(entry)] = marks
        return True

    def _remove(self, entry: Path) -> None:
        """Move the entry aside (one rename, so nothing sees half of it), then delete it."""
        aside = self.root / _TMP / f"{entry.name}.removed.{uuid.uuid4().hex[:8]}"
        aside.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(entry, aside)
        except FileNotFoundError:
            return
        shutil.rmtree(aside, ignore_errors=True)

    @contextlib.contextmanager
    def _lock(self, name: str):
        """An exclusive flock on `_locks/NAME.lock`, held for the block. The lock files stay
        (deleting one another process may hold would let two in)."""
        path = self.root / _LOCKS / f"{name}.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def entries(self) -> list[Path]:
        """Every entry folder in the cache (valid or not): `<kind>/<xx>/<digest starting
        xx>/`. Nothing else counts, so `clear` on a folder that is not a cache removes
        nothing of its own."""
        if not self.root.is_dir():
            return []
        return sorted(p for kind in self.root.iterdir() if kind.is_dir() and _KIND.fullmatch(kind.name)
                      for sub in kind.iterdir() if sub.is_dir()
                      for p in sub.iterdir()
                      if p.is_dir() and _DIGEST.fullmatch(p.name) and p.name[:2] == sub.name)

    # ---- the pack index -------------------------------------------------------------
    def _indexed_pack_digest(self, path: Path, st: os.stat_result) -> str:
        """The pack index (`_packs.json`: resolved path -> size, mtime_ns, sha256): read, and
        where the file is not in it as it is now, hashed and written back (atomically, under
        a lock; entries of files gone or changed are dropped; a damaged index is ignored)."""
        index_path = self.root / _PACKS
        mark = {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
        known = self._read_index(index_path).get(str(path))
        if isinstance(known, dict) and {k: known.get(k) for k in mark} == mark and "sha256" in known:
            return str(known["sha256"])
        digest = _file_sha256(path)
        try:
            with self._lock("_packs"):
                index = self._read_index(index_path)
                index[str(path)] = {**mark, "sha256": digest}
                index = {p: v for p, v in index.items() if _still(p, v)}
                atomic.write_text(index_path, json.dumps(index, indent=1, sort_keys=True))
        except OSError:  # the index only saves time; an unwritable one costs a rehash next time
            pass
        return digest

    @staticmethod
    def _read_index(path: Path) -> dict:
        try:
            index = json.loads(path.read_text())
        except (OSError, ValueError):
            return {}
        return index if isinstance(index, dict) else {}


def _still(path: str, mark) -> bool:
    """Whether an index entry still describes its file."""
    try:
        st = os.stat(path)
        return isinstance(mark, dict) and (st.st_size, st.st_mtime_ns) == (mark.get("size"), mark.get("mtime_ns"))
    except OSError:
        return False


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def info(cache: Cache) -> str:
    """What `strata-prefill cache info` prints: the folder, entries and bytes by kind, the
    total, and the source digest new entries are made under."""
    lines = [f"folder         {cache.root}" + ("" if cache.root.is_dir() else " (not made yet)")]
    by_kind: dict[str, list[int]] = {}
    for entry in cache.entries():
        n = by_kind.setdefault(entry.parent.parent.name, [0, 0])
        n[0] += 1
        n[1] += _folder_bytes(entry)
    for kind, (n, size) in sorted(by_kind.items()):
        lines.append(f"  {kind:<20} {n:,} entr{'y' if n == 1 else 'ies'}, {size:,} bytes")
    total = sum(size for _, size in by_kind.values()) + sum(
        _folder_bytes(p) if p.is_dir() else p.stat().st_size
        for p in (cache.root / _TMP, cache.root / _LOCKS, cache.root / _PACKS) if p.exists())
    n_entries = sum(n for n, _ in by_kind.values())
    lines.append(f"entries        {n_entries:,}, {total:,} bytes in all")
    lines.append(f"source digest  {source_digest()} (reference/ and strata/, numpy "
                 f"{np.__version__}, gguf {_version('gguf')})")
    return "\n".join(lines)


def clear(cache: Cache) -> tuple[int, int]:
    """Remove every entry, the pack index, leftover temp folders and lock files; return
    (entries removed, bytes freed)."""
    entries = cache.entries()
    freed = 0
    for entry in entries:
        freed += _folder_bytes(entry)
        cache._remove(entry)
        for folder in (entry.parent, entry.parent.parent):  # the kind's folders, once empty
            with contextlib.suppress(OSError):
                folder.rmdir()
    for name in (_TMP, _LOCKS, _PACKS):
        path = cache.root / name
        if path.is_dir():
            freed += _folder_bytes(path)
            shutil.rmtree(path, ignore_errors=True)
        elif path.exists():
            freed += path.stat().st_size
            path.unlink()
    return len(entries), freed


# ---- NumPy expectations of the kernel tests -------------------------------------------
def cached_arrays(kind: str, key: dict, compute: Callable[[], dict[str, np.ndarray]],
                  cache="env") -> dict[str, np.ndarray]:
    """`compute()`'s arrays, from the cache where they are there. The key must hold
    everything that decides the arrays (shapes, seeds, types, configuration); the source
    digest is added. Each array is one `NAME.npy` file; what comes back is always what was
    loaded from the entry, so a hit and a miss return the same dtypes and shapes."""
    c = resolve(cache)
    if c is None:
        return compute()

    def write(folder: Path) -> None:
        for name, array in compute().items():
            if not _FILE.fullmatch(name):
                raise ValueError(f"an array name is a file name ([A-Za-z0-9._-]), got {name!r}")
            np.save(folder / f"{name}.npy", np.asarray(array), allow_pickle=False)

    entry, _ = c.get_or_compute(kind, key, write)
    return {p.name[:-4]: np.load(p, allow_pickle=False) for p in sorted(entry.glob("*.npy"))}


# ---- reference runs ----------------------------------------------------------------
# the files of a reference-run entry
LOGITS, RESIDUALS, RECORDS, RESULT = "first_logits.f32", "r.bin", "layers.spd", "run.json"


@dataclass
class RefRun:
    logits: np.ndarray       # first-token logits, float32 [vocab]
    greedy: list[int]
    records: Path | None     # the layers.spd record file (None: dump_level None)
    residuals: bytes         # the STRATA_PREFILL_DUMP_R file
    hit: bool
    seconds: float           # compute time (prefill and greedy); 0.0 on a hit
    chunk: int               # the chunk the records were cut in (not in the key: section 9)
    entry: Path | None = None  # the cache entry (None: cache off)
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    greedy_nonfinite: int | None = None  # as strata.session.RunResult's
    nonfinite: object = None             # as strata.session.RunResult's (a Found or a Seen)


def _prompt_key(ids, n_vocab: int) -> str | None:
    """sha256 of the prompt as int32, or None where the session would refuse it (not 1-D
    integers in the vocabulary): such a prompt runs uncached, so the refusal is the session's
    own line and an id that int32 would wrap never shares a key."""
    a = np.asarray(ids)
    if a.ndim != 1 or a.size == 0 or not np.issubdtype(a.dtype, np.integer):
        return None
    if a.min() < 0 or a.max() >= n_vocab:
        return None
    return hashlib.sha256(a.astype("<i4").tobytes()).hexdigest()


def _compute_run(pack, ids, greedy: int, dump_level: str | None, chunk, folder: Path,
                 progress: bool) -> None:
    """One reference run into `folder`: the files verify/common.py:run_engine writes."""
    from reference import ReferenceEngine
    from strata.session import Session

    s = Session(ReferenceEngine(pack), chunk=chunk, dump_dir=folder if dump_level else None,
                dump_first_logits=folder / LOGITS, dump_r=folder / RESIDUALS, progress=progress,
                dump_level=dump_level)
    res = s.run(ids, greedy=greedy)
    (folder / RESULT).write_text(json.dumps({
        "greedy": [int(t) for t in res.greedy], "chunk": res.chunk, "prompt_tokens": res.prompt_tokens,
        "prefill_seconds": res.prefill_seconds, "decode_seconds": res.decode_seconds,
        "greedy_nonfinite": res.greedy_nonfinite, "nonfinite": nonfinite.to_json(res.nonfinite)}))


def _read_run(folder: Path, hit: bool, entry: Path | None) -> RefRun:
    result = json.loads((folder / RESULT).read_text())
    records = folder / RECORDS
    pre, dec = (0.0, 0.0) if hit else (result["prefill_seconds"], result["decode_seconds"])
    return RefRun(np.fromfile(folder / LOGITS, dtype="<f4"), [int(t) for t in result["greedy"]],
                  records if records.exists() else None, (folder / RESIDUALS).read_bytes(), hit,
                  pre + dec, int(result["chunk"]), entry, pre, dec, result.get("greedy_nonfinite"),
                  nonfinite.from_json(result.get("nonfinite")))


_SCRATCH: list[Path] = []


@atexit.register
def _remove_scratch() -> None:
    for folder in _SCRATCH:
        shutil.rmtree(folder, ignore_errors=True)


def reference_run(pack, ids, greedy: int = 0, dump_level: str | None = "layer", cache="env",
                  chunk="auto", progress: bool = False) -> RefRun:
    """The reference's outputs for (pack, prompt, greedy, dump_level), from the cache where
    they are there. The key holds the pack's content, the prompt, the greedy count and the
    dump level, not the chunk: chunking changes no bit (docs/numerics.md section 9), and the
    record comparison lines up runs cut differently (`RefRun.chunk` says how this one was).
    pack: a Pack or a pack file. dump_level None: no record file. With the cache off the
    files live in a temp folder removed when the process ends."""
    from strata.pack import Pack

    if not isinstance(pack, Pack):
        pack = Pack.open(pack)
    if dump_level is not None:
        from strata.records import LEVELS
        from strata.errors import InputError

        if dump_level not in LEVELS:
            raise InputError(f"dump level must be one of {', '.join(LEVELS)}, got {dump_level!r}")
    c = resolve(cache)
    prompt = _prompt_key(ids, pack.config.n_vocab)
    if c is None or prompt is None:
        folder = Path(tempfile.mkdtemp(prefix="strata-prefill-ref-"))
        _SCRATCH.append(folder)
        _compute_run(pack, ids, greedy, dump_level, chunk, folder, progress)
        return _read_run(folder, False, None)
    key = {"pack": pack_digest(pack.path, c), "prompt": prompt, "tokens": int(np.asarray(ids).size),
           "greedy": int(greedy), "dump_level": dump_level}
    entry, hit = c.get_or_compute(
        "reference-run", key,
        lambda folder: _compute_run(pack, ids, greedy, dump_level, chunk, folder, progress))
    return _read_run(entry, hit, entry)
