"""Reference results kept on disk, under a key of everything that can change a byte of them.

The NumPy reference is the slow half of every parity check, and by the numerics contract
(docs/numerics.md section 9) its bytes depend only on the pack, the prompt, the greedy count,
the dump level and the code that computes them. So a result is stored once, in a folder named
by the sha256 of exactly those inputs, and read back instead of recomputed (docs/reference-cache.md).

- The code is named by `source_digest()`: the path and bytes of every module under `reference/`
  `contract/` and `formats/` (all that `reference/` imports of this project), NumPy's version and gguf's.
  An edit of one character anywhere there is a new key; nothing is ever invalidated by hand.
- A pack is named by its content (`content_digest`), not its path. A digest is never taken
  from a file alone: the pack index (`_packs.json`: a file's path, inode, size, mtime and ctime
  -> its digest) only names a candidate, and the candidate entry must itself record that very
  file, in that very state, among the packs it was computed from or checked against (the
  `packs` of its meta.json); else the pack is hashed. An edited, stale or foreign index record
  costs a hash, never another pack's result.
- An entry is a folder `<kind>/<key[:2]>/<key>/` of files plus `meta.json` (its kind, its key,
  each file's size and sha256). Every lookup checks them all: an entry that is damaged, or
  whose meta.json names another key, is removed and recomputed, never trusted.
- An entry is computed in a temp folder inside the cache and renamed into place whole, so no
  reader sees half of one. Two flocks per key: `_locks/KEY.use`, held shared by every process
  that reads or computes the entry for as long as it does (so `clear`, which takes it
  exclusively without waiting, passes over an entry in use), and `_locks/KEY.lock`, held
  exclusively by the one process computing it while the others wait and then read its entry
  (pytest-xdist workers ask for the same reference at the same time).

`STRATA_PREFILL_REFERENCE_CACHE=DIR` moves the cache, `=off` (or `0`, `none`) turns it off.
"""
from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import hashlib
import importlib.metadata
import importlib.util
import json
import mmap
import os
import re
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from strata_prefill.formats import nonfinite
from strata_prefill.formats.cache_home import user_cache_dir

ENV = "STRATA_PREFILL_REFERENCE_CACHE"
OFF = ("off", "0", "none")
META = "meta.json"
SOURCE_PACKAGES = ("reference", "contract", "formats")  # what the reference's bytes are computed by
# None: each package where Python imports it from; tests point it at a copy of the tree
SOURCE_ROOT: Path | None = None

# inside the cache folder, beside the kinds (a kind never starts with "_" or a capital)
_TMP, _LOCKS = "_tmp", "_locks"
_PACKS = "_packs.json"  # the pack index: a hint of a file's digest, vouched for by the entry (vouched_digest)
_PACKS_KEPT = 8  # the pack files an entry records
#: the Cache Directory Tagging Specification's file (https://bford.info/cachedir/): it tells
#: backup tools to skip the folder, and tells `clear` that the folder is a cache
TAG = "CACHEDIR.TAG"
TAG_SIGNATURE = "Signature: 8a477f597d28d172789f06886806bc55"
_KIND = re.compile(r"[a-z0-9][a-z0-9._-]*")
_FILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_DIGEST = re.compile(r"[0-9a-f]{64}")
_CHUNK = 1 << 22  # bytes hashed at a time
#: a pack's bytes are hashed in pieces of this size, on as many threads as there are pieces
#: and CPUs (pack_digest)
PIECE = 1 << 26

_STATS = {"hits": 0, "misses": 0, "recomputed": 0}
_SOURCE_DIGESTS: dict[tuple, str] = {}
_PACK_DIGESTS: dict[tuple, str] = {}  # _frozen(mark) -> digest, hashed here


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
    included) and recomputed (of the misses, those that found a damaged or foreign entry)."""
    return dict(_STATS)


def reset_stats() -> None:
    for k in _STATS:
        _STATS[k] = 0


# ---- digests -------------------------------------------------------------------------
# entry folder -> its files' (name, size, mtime_ns, ctime_ns, inode) when this process last
# hashed them all and found them whole (Cache._problem)
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
    spec = importlib.util.find_spec(f"strata_prefill.{name}")
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
    every .py file under `packages` (reference/, contract/ and formats/; sorted), NumPy's version and
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


def content_digest(path: str | os.PathLike) -> str:
    """sha256 over the file's size and the sha256 of each PIECE bytes of it, in order: the
    pieces are independent, so they are hashed on several threads (hashlib lets go of the GIL
    while it hashes), and the digest is the same whatever their number."""
    from strata_prefill.contract import parallel

    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            pieces: list[bytes] = []
        else:
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                def piece(offset: int) -> bytes:
                    with memoryview(mm) as view:
                        return hashlib.sha256(view[offset:offset + PIECE]).digest()
                pieces = parallel.map_ordered(piece, range(0, size, PIECE))
    h = hashlib.sha256(b"strata-prefill pack content: size, then sha256 of each 64 MiB piece\n")
    h.update(size.to_bytes(8, "little"))
    for d in pieces:
        h.update(d)
    return h.hexdigest()


def _stat_mark(path: Path) -> dict:
    """What says a file is still the file it was: its resolved path, device, inode, size, mtime
    and ctime. ctime moves on every write and no call sets it back (mtime can be set), so with the
    inode it tells a file apart from one that was rewritten, replaced or copied in its place."""
    st = os.stat(path)
    return {"path": str(path), "dev": st.st_dev, "ino": st.st_ino, "size": st.st_size,
            "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns}


def _settled(mark: dict) -> bool:
    """Whether a mark may vouch for the bytes hashed under it: no write within _RACY_S of now,
    so a later write in the same clock tick (which could leave both times as they are) would
    have come after the hash (git's "racily clean" rule)."""
    return time.time_ns() - max(mark["mtime_ns"], mark["ctime_ns"]) > _RACY_S * 1e9


def _frozen(mark: dict) -> tuple:
    return tuple(sorted(mark.items()))


def pack_digest(path: str | os.PathLike) -> str:
    """The content digest of a pack file (content_digest), computed from its bytes by this
    process: once per process and state of the file (its _stat_mark), again whenever it moves."""
    return _hashed(Path(path).resolve())[0]


def _hashed(p: Path) -> tuple[str, dict | None]:
    """(the digest, the mark it was hashed under where that mark vouches for it (_settled,
    unchanged while hashed), else None)."""
    mark = _stat_mark(p)
    if _frozen(mark) in _PACK_DIGESTS:
        return _PACK_DIGESTS[_frozen(mark)], mark
    settled = _settled(mark)
    digest = content_digest(p)
    if _stat_mark(p) != mark:  # written while hashed: neither remembered nor vouched for
        return digest, None
    if settled:
        _PACK_DIGESTS[_frozen(mark)] = digest
    return digest, mark if settled else None


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


def _key_json(key) -> str:
    return json.dumps(key, sort_keys=True, separators=(",", ":"), default=_canonical)


# ---- locks ---------------------------------------------------------------------------
class _Held:
    """A flock this process holds on a lock file (see _acquire)."""

    def __init__(self, fd: int | None):
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the last descriptor drops the flock
            self.fd = None


def _acquire(path: Path, mode: int, wait: bool = True) -> _Held | None:
    """Hold flock `mode` (LOCK_SH or LOCK_EX) on `path`, made if missing; None where `wait` is
    false and another process holds it. The path is checked to still name the file locked
    once the lock is had: `clear` deletes a lock file while it holds it, and a process that
    waited on the deleted file must lock the new one. An OSError where the folder cannot be
    written (a read-only cache)."""
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        except FileNotFoundError:  # its folder is gone (cleared): made again
            path.parent.mkdir(parents=True, exist_ok=True)
            continue
        try:
            fcntl.flock(fd, mode | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        try:
            st, now = os.fstat(fd), os.stat(path)
            same = (st.st_dev, st.st_ino) == (now.st_dev, now.st_ino)
        except FileNotFoundError:
            same = False
        if same:
            return _Held(fd)
        os.close(fd)


# ---- the cache ----------------------------------------------------------------------
@dataclass
class Lookup:
    """What Cache.held found: the entry's folder, whether it was there (a hit), a phrase saying
    what was wrong with an entry found there and recomputed, and, where the result could not be
    stored, why (the folder is then a scratch folder outside the cache)."""

    entry: Path
    hit: bool
    recomputed: str | None = None
    not_stored: str | None = None


_SCRATCH: list[Path] = []


@atexit.register
def _remove_scratch() -> None:
    for folder in _SCRATCH:
        shutil.rmtree(folder, ignore_errors=True)


def _scratch() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="strata-prefill-ref-"))
    _SCRATCH.append(folder)
    return folder


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

    def _use(self, name: str) -> Path:
        return self.root / _LOCKS / f"{name}.use"

    def _compute_lock(self, name: str) -> Path:
        return self.root / _LOCKS / f"{name}.lock"

    def get_or_compute(self, kind: str, key: dict,
                       compute: Callable[[Path], None]) -> tuple[Path, bool]:
        """The entry folder of (kind, key) and whether it was there (a hit), as `held` finds
        it, no longer held once returned (`held` keeps it while its block reads it)."""
        with self.held(kind, key, compute) as found:
            return found.entry, found.hit

    @contextlib.contextmanager
    def held(self, kind: str, key: dict, compute: Callable[[Path], None],
             extra: dict | None = None) -> Iterator[Lookup]:
        """The entry of (kind, key), held for the block (`clear` passes over it). On a miss
        `compute(folder)` writes the entry's files into an empty folder; they are checksummed
        and the folder renamed into place. Several processes asking at once: one computes, the
        others wait on the key's lock and read its entry. A cache that cannot be written (or
        an entry that cannot be stored) costs the caching, not the result: it is computed in
        a scratch folder, and Lookup.not_stored says why. `extra`: more of meta.json (a
        reference run's `packs`)."""
        entry = self.entry(kind, key)
        try:
            use = _acquire(self._use(entry.name), fcntl.LOCK_SH)
        except OSError as exc:  # a read-only cache: its entries cannot be cleared under us either
            use, unlocked = None, exc
        try:
            if self._problem(entry, kind, key) is None:
                _STATS["hits"] += 1
                yield Lookup(entry, True)
                return
            if use is None:
                yield self._compute_aside(compute, f"the cache folder cannot be locked ({_why(unlocked)})")
                return
            yield self._compute(entry, kind, key, compute, extra)
        finally:
            if use is not None:
                use.release()

    def _compute(self, entry: Path, kind: str, key: dict, compute, extra: dict | None = None) -> Lookup:
        """The miss of `held` (its key's use lock held): wait for the compute lock, look
        again, else compute and store."""
        try:
            lock = _acquire(self._compute_lock(entry.name), fcntl.LOCK_EX)
        except OSError as exc:
            return self._compute_aside(compute, f"the cache folder cannot be locked ({_why(exc)})")
        try:
            problem = self._problem(entry, kind, key)
            if problem is None:  # computed by the worker we waited for
                _STATS["hits"] += 1
                return Lookup(entry, True)
            found = None
            if problem != "missing":
                found = problem
                _STATS["recomputed"] += 1
                self._remove(entry)
            tmp_root = self.root / _TMP
            for stale in tmp_root.glob(f"{entry.name}.*"):  # left by a killed worker: we hold the lock
                shutil.rmtree(stale, ignore_errors=True)
            try:
                self._tag()
                tmp_root.mkdir(parents=True, exist_ok=True)
                tmp = tmp_root / f"{entry.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
                tmp.mkdir()
            except OSError as exc:
                return self._compute_aside(compute, f"cannot write in {self.root} ({_why(exc)})", found)
            try:
                t0 = time.perf_counter()
                compute(tmp)
                seconds = time.perf_counter() - t0
                _STATS["misses"] += 1
                try:
                    self._write_meta(tmp, kind, entry.name, key, seconds, extra)
                    self._place(tmp, entry)
                except OSError as exc:  # the result is kept, outside the cache
                    aside = _scratch() / entry.name
                    shutil.move(str(tmp), str(aside))
                    return Lookup(aside, False, found, f"it could not be stored ({_why(exc)})")
                return Lookup(entry, False, found)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        finally:
            lock.release()

    def _compute_aside(self, compute, why: str, found: str | None = None) -> Lookup:
        folder = _scratch() / "entry"
        folder.mkdir()
        compute(folder)
        _STATS["misses"] += 1
        return Lookup(folder, False, found, why)

    def _place(self, tmp: Path, entry: Path) -> None:
        """Rename the computed folder into place (its parent made again where a `clear` of
        other entries removed it meanwhile)."""
        for _ in range(5):
            entry.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.rename(tmp, entry)
                return
            except FileNotFoundError:  # the kind's folder was removed between the two calls
                continue
            except OSError as exc:
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST) or self._problem(entry, None, None) is not None:
                    raise
                return  # another process won (a filesystem whose flock does not lock): keep theirs
        raise OSError(errno.ENOENT, f"{entry.parent} kept disappearing")

    def _tag(self) -> None:
        """CACHEDIR.TAG in the cache folder (made with it)."""
        tag = self.root / TAG
        if not tag.exists():
            self.root.mkdir(parents=True, exist_ok=True)
            tag.write_text(f"{TAG_SIGNATURE}\n# the reference cache of strata-prefill "
                           "(docs/reference-cache.md): strata-prefill cache clear empties it\n")

    # ---- entries --------------------------------------------------------------------
    @staticmethod
    def _write_meta(folder: Path, kind: str, digest: str, key: dict, seconds: float,
                    extra: dict | None = None) -> None:
        files = {}
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            rel = path.relative_to(folder).as_posix()
            if rel == META:
                raise ValueError(f"a cache entry may not write its own {META}")
            files[rel] = {"size": path.stat().st_size, "sha256": _file_sha256(path)}
        meta = {**(extra or {}), "kind": kind, "digest": digest, "key": key, "source": source_digest(),
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
        """Whether the entry is whole (its files as meta.json lists them)."""
        return self._problem(entry, None, None) is None

    def _problem(self, entry: Path, kind: str | None, key: dict | None) -> str | None:
        """None where the entry is whole and is (kind, key)'s, else what is wrong, in a few
        words ("missing" where there is none). Whole: every file meta.json lists is there with
        its size and sha256, and no other. (kind, key)'s: meta.json names that kind, that key
        and the source digest of this code (a foreign entry, planted under this key's name, is
        not served).

        An entry this process checked whole is not hashed again while every file's (size,
        mtime_ns, ctime_ns, inode) stays what it was, unless a file was written within
        _RACY_S of that check (its timestamp could then hide a later write in the same clock
        tick: git's "racily clean" rule)."""
        if not entry.exists():
            return "missing"
        meta = self.read_meta(entry)
        if meta is None:
            return "damaged (its meta.json is missing or not JSON)"
        if meta.get("digest") != entry.name:
            return "another key's (its meta.json names another digest)"
        if kind is not None and (meta.get("kind") != kind or meta.get("source") != source_digest()
                                 or _key_json(meta.get("key")) != _key_json(json.loads(_key_json(key)))):
            return "another key's (its meta.json names another kind, key or source)"
        try:
            present = {p.relative_to(entry).as_posix() for p in entry.rglob("*") if p.is_file()}
            if present != set(meta["files"]) | {META}:
                return "damaged (files missing or added)"
            stats = {rel: os.stat(entry / rel) for rel in sorted(present)}
            marks = tuple((rel, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino) for rel, st in stats.items())
            if _CHECKED.get(str(entry)) == marks:
                return None
            for rel, want in meta["files"].items():
                path = entry / rel
                if stats[rel].st_size != want["size"] or _file_sha256(path) != want["sha256"]:
                    return f"damaged ({rel} differs from its checksum)"
        except (OSError, KeyError, TypeError):
            return "damaged (unreadable)"
        newest = max(st.st_mtime_ns for st in stats.values())
        if time.time_ns() - newest > _RACY_S * 1e9:
            _CHECKED[str(entry)] = marks
        return None

    def _remove(self, entry: Path) -> None:
        """Move the entry aside (one rename, so nothing sees half of it), then delete it."""
        aside = self.root / _TMP / f"{entry.name}.removed.{uuid.uuid4().hex[:8]}"
        aside.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(entry, aside)
        except FileNotFoundError:
            return
        shutil.rmtree(aside, ignore_errors=True)

    def entries(self) -> list[Path]:
        """Every entry folder in the cache (valid or not): `<kind>/<xx>/<digest starting
        xx>/`. Nothing else counts."""
        if not self.root.is_dir():
            return []
        return sorted(p for kind in self.root.iterdir() if kind.is_dir() and _KIND.fullmatch(kind.name)
                      for sub in kind.iterdir() if sub.is_dir()
                      for p in sub.iterdir()
                      if p.is_dir() and _DIGEST.fullmatch(p.name) and p.name[:2] == sub.name)


    # ---- the pack index: a hint, vouched for by the entry ------------------------------
    def pack_hint(self, mark: dict) -> str | None:
        """The digest the pack index records for the file of `mark` in exactly that state, or
        None. A hint only: vouched_digest checks it against the entry it leads to."""
        try:
            index = json.loads((self.root / _PACKS).read_text())
            record = index.get(mark["path"]) if isinstance(index, dict) else None
        except (OSError, ValueError):
            return None
        if not isinstance(record, dict) or {k: record.get(k) for k in mark if k != "path"} != {
                k: v for k, v in mark.items() if k != "path"}:
            return None
        digest = record.get("sha256")
        return digest if isinstance(digest, str) and _DIGEST.fullmatch(digest) else None

    def remember_pack(self, mark: dict, digest: str) -> None:
        """Record the file of `mark` (hashed here, _settled) in the pack index, dropping the
        records of files gone or changed. The index only saves a hash: one it cannot write costs
        a hash next time."""
        try:
            lock = _acquire(self._compute_lock("_packs"), fcntl.LOCK_EX)
        except OSError:
            return
        try:
            path = self.root / _PACKS
            try:
                index = json.loads(path.read_text())
            except (OSError, ValueError):
                index = {}
            index = {p: r for p, r in (index.items() if isinstance(index, dict) else ()) if _still(p, r)}
            index[mark["path"]] = {**{k: v for k, v in mark.items() if k != "path"}, "sha256": digest}
            from strata_prefill.formats import atomic

            atomic.write_text(path, json.dumps(index, indent=1, sort_keys=True))
        except OSError:
            pass
        finally:
            lock.release()

    def vouch(self, entry: Path, mark: dict) -> None:
        """Add the file of `mark` (hashed here, _settled, its digest the entry's) to the packs
        the entry records, so that the next lookup from that file takes the index's hint without
        hashing. meta.json is replaced whole (readers see the old one or the new one), under the
        key's compute lock; nothing is lost where it cannot be written."""
        try:
            lock = _acquire(self._compute_lock(entry.name), fcntl.LOCK_EX)
        except OSError:
            return
        try:
            meta = self.read_meta(entry)
            if meta is None or mark in meta.get("packs", []):
                return
            meta["packs"] = [*meta.get("packs", []), mark][-_PACKS_KEPT:]
            tmp = self.root / _TMP / f"{entry.name}.meta.{uuid.uuid4().hex[:8]}"
            tmp.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(meta, indent=1, sort_keys=True, default=_canonical))
            os.replace(tmp, entry / META)
        except OSError:
            pass
        finally:
            lock.release()


def _still(path: str, record) -> bool:
    """Whether a pack index record still describes its file."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    return isinstance(record, dict) and (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns) == tuple(
        record.get(k) for k in ("dev", "ino", "size", "mtime_ns", "ctime_ns"))


def _why(exc: OSError) -> str:
    return exc.strerror or str(exc)


def _folder_bytes(folder: Path) -> int:
    total = 0
    for p in folder.rglob("*"):
        with contextlib.suppress(OSError):
            if p.is_file():
                total += p.stat().st_size
    return total


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
        for p in (cache.root / _TMP, cache.root / _LOCKS, cache.root / _PACKS, cache.root / TAG) if p.exists())
    n_entries = sum(n for n, _ in by_kind.values())
    lines.append(f"entries        {n_entries:,}, {total:,} bytes in all")
    lines.append(f"source digest  {source_digest()} (reference/, contract/ and formats/, numpy "
                 f"{np.__version__}, gguf {_version('gguf')})")
    return "\n".join(lines)


def not_a_cache(root: Path) -> str | None:
    """Why `clear` must leave `root` alone, or None: a folder is a cache where its CACHEDIR.TAG
    says so, or where it holds nothing a cache does not (an empty folder, or a cache of an
    earlier version, made before the tag); a folder not there yet holds nothing to clear."""
    if not root.exists():
        return None
    if not root.is_dir():
        return "it is a file"
    with contextlib.suppress(OSError):
        if (root / TAG).read_text().startswith(TAG_SIGNATURE):
            return None
    for child in sorted(root.iterdir()):
        if child.name in (_TMP, _LOCKS, _PACKS) or _cache_kind_folder(child):
            continue
        return (f"it holds {child.name}{'/' if child.is_dir() else ''}, which a reference cache does not "
                f"(and no {TAG} says it is one)")
    return None


def _cache_kind_folder(folder: Path) -> bool:
    """A kind's folder as a cache holds it: `xx/<digest starting xx>/` folders and nothing else."""
    if not folder.is_dir() or not _KIND.fullmatch(folder.name):
        return False
    for sub in folder.iterdir():
        if not (sub.is_dir() and re.fullmatch(r"[0-9a-f]{2}", sub.name)):
            return False
        if any(not (p.is_dir() and _DIGEST.fullmatch(p.name) and p.name[:2] == sub.name) for p in sub.iterdir()):
            return False
    return True


@dataclass
class Cleared:
    removed: int  # entries removed
    freed: int  # bytes
    in_use: int  # entries (or computations under way) passed over: a running process holds them


def clear(cache: Cache) -> Cleared:
    """Remove every entry no running process holds, with its lock files and temp folders, and
    the pack index. An entry is removed only while this process holds its
    use lock exclusively, taken without waiting: an entry being read or computed is passed
    over (counted in `in_use`), and so are the temp folders of a computation under way. The
    caller checks first that the folder is a cache (not_a_cache)."""
    removed = freed = in_use = 0
    busy: set[str] = set()
    for entry in cache.entries():
        held = _try_exclusive(cache, entry.name)
        if held is None:
            in_use += 1
            busy.add(entry.name)
            continue
        try:
            freed += _folder_bytes(entry)
            cache._remove(entry)
            removed += 1
            for folder in (entry.parent, entry.parent.parent):  # the kind's folders, once empty
                with contextlib.suppress(OSError):
                    folder.rmdir()
            freed += _drop_key_files(cache, entry.name)
        finally:
            held.release()
    tmp = cache.root / _TMP
    if tmp.is_dir():  # a computation's folder (`<key>.<pid>.<tag>`) or one left by a killed worker
        for item in sorted(tmp.iterdir()):
            name = item.name.split(".", 1)[0]
            if name in busy or not _DIGEST.fullmatch(name):
                continue
            held = _try_exclusive(cache, name)
            if held is None:
                in_use += 1
                busy.add(name)
                continue
            try:
                freed += _drop_key_files(cache, name)
            finally:
                held.release()
    index = cache.root / _PACKS
    try:
        held = _acquire(cache._compute_lock("_packs"), fcntl.LOCK_EX, wait=False)
    except OSError:
        held = None
    if held is not None:  # the pack index (a hint only) and its lock, where no process writes it now
        try:
            if index.is_file():
                freed += index.stat().st_size
                index.unlink()
            with contextlib.suppress(FileNotFoundError):
                cache._compute_lock("_packs").unlink()
        finally:
            held.release()
    locks = cache.root / _LOCKS
    if locks.is_dir():  # lock files of keys with no entry any more
        for name in sorted({p.name.split(".", 1)[0] for p in locks.iterdir()} - busy - {"_packs"}):
            held = _try_exclusive(cache, name)
            if held is not None:
                try:
                    freed += _drop_key_files(cache, name)
                finally:
                    held.release()
    for folder in (tmp, locks):
        with contextlib.suppress(OSError):
            folder.rmdir()  # once empty
    return Cleared(removed, freed, in_use)


def _try_exclusive(cache: Cache, name: str) -> _Held | None:
    """The key's use lock, held exclusively, or None where a running process holds it (or the
    lock cannot be had at all: the folder is read-only, so nothing can be removed anyway)."""
    try:
        return _acquire(cache._use(name), fcntl.LOCK_EX, wait=False)
    except OSError:
        return None


def _drop_key_files(cache: Cache, name: str) -> int:
    """The key's temp folders and lock files (its use lock held exclusively by the caller, so
    no process computes it): the bytes freed."""
    freed = 0
    tmp = cache.root / _TMP
    if tmp.is_dir():
        for stale in tmp.glob(f"{name}.*"):
            freed += _folder_bytes(stale) if stale.is_dir() else 0
            shutil.rmtree(stale, ignore_errors=True)
    for path in (cache._compute_lock(name), cache._use(name)):  # the held use lock last
        with contextlib.suppress(FileNotFoundError):
            freed += path.stat().st_size
            path.unlink()
    return freed


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

    with c.held(kind, key, write) as found:
        return {p.name[:-4]: np.load(p, allow_pickle=False) for p in sorted(found.entry.glob("*.npy"))}


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
    entry: Path | None = None  # the cache entry (None: cache off, or not stored)
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    recomputed: str | None = None  # what was wrong with the entry found, recomputed (Lookup)
    not_stored: str | None = None  # why the result is not in the cache (Lookup)
    pack_index: str | None = None  # what was wrong with the pack index's record of the pack, if anything
    greedy_nonfinite: int | None = None  # as strata_prefill.session.RunResult's
    nonfinite: object = None             # as strata_prefill.session.RunResult's (a Found or a Seen)


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
    from strata_prefill.reference import ReferenceEngine
    from strata_prefill.session import Session

    s = Session(ReferenceEngine(pack), chunk=chunk, dump_dir=folder if dump_level else None,
                dump_first_logits=folder / LOGITS, dump_r=folder / RESIDUALS, progress=progress,
                dump_level=dump_level)
    res = s.run(ids, greedy=greedy)
    (folder / RESULT).write_text(json.dumps({
        "greedy": [int(t) for t in res.greedy], "chunk": res.chunk, "prompt_tokens": res.prompt_tokens,
        "prefill_seconds": res.prefill_seconds, "decode_seconds": res.decode_seconds,
        "greedy_nonfinite": res.greedy_nonfinite, "nonfinite": nonfinite.to_json(res.nonfinite)}))


def _read_run(folder: Path, found: Lookup | None) -> RefRun:
    result = json.loads((folder / RESULT).read_text())
    records = folder / RECORDS
    hit = found is not None and found.hit
    stored = found is not None and found.not_stored is None
    pre, dec = (0.0, 0.0) if hit else (result["prefill_seconds"], result["decode_seconds"])
    return RefRun(np.fromfile(folder / LOGITS, dtype="<f4"), [int(t) for t in result["greedy"]],
                  records if records.exists() else None, (folder / RESIDUALS).read_bytes(), hit,
                  pre + dec, int(result["chunk"]), folder if stored else None, pre, dec,
                  found.recomputed if found else None, found.not_stored if found else None,
                  greedy_nonfinite=result.get("greedy_nonfinite"),
                  nonfinite=nonfinite.from_json(result.get("nonfinite")))


def _vouched_digest(c: Cache, path: Path, key_of) -> tuple[str, dict | None, str | None]:
    """The pack's content digest for a lookup in `c`: (the digest; the file's mark where this
    process hashed it and the mark may vouch for it, to be recorded in the pack index and the
    entry; a phrase where the index named a wrong digest for this file as it is). The index's
    hint is taken without hashing only where the entry it leads to (key_of(hint)) records this
    file, in this state, among its `packs`: an index edited, stale or copied from elsewhere leads
    to an entry that does not, and the pack is hashed."""
    mark = _stat_mark(path)
    if _frozen(mark) in _PACK_DIGESTS:  # hashed (or vouched for) by this process, the file as it was then
        return _PACK_DIGESTS[_frozen(mark)], mark if _settled(mark) else None, None
    hint = c.pack_hint(mark)
    if hint is not None:
        meta = c.read_meta(c.entry("reference-run", key_of(hint)))
        if meta is not None and mark in meta.get("packs", []):
            _PACK_DIGESTS[_frozen(mark)] = hint
            return hint, mark, None
    digest, settled = _hashed(path)
    wrong = None
    if hint is not None and hint != digest:
        wrong = (f"the pack index named another pack's digest for {path} (an edited, stale or copied "
                 "index): its bytes were hashed")
    if settled is not None:
        c.remember_pack(settled, digest)
    return digest, settled, wrong


@contextlib.contextmanager
def open_reference_run(pack, ids, greedy: int = 0, dump_level: str | None = "layer", cache="env",
                       chunk="auto", progress: bool = False) -> Iterator[RefRun]:
    """reference_run's RefRun, its cache entry held for the block: a `cache clear` meanwhile
    passes over it, so `records` (read by the caller, copied to --dump-dir) stays there."""
    from strata_prefill.formats.pack import Pack

    if not isinstance(pack, Pack):
        pack = Pack.open(pack)
    if dump_level is not None:
        from strata_prefill.formats.records import LEVELS
        from strata_prefill.contract.errors import InputError

        if dump_level not in LEVELS:
            raise InputError(f"dump level must be one of {', '.join(LEVELS)}, got {dump_level!r}")
    c = resolve(cache)
    prompt = _prompt_key(ids, pack.config.n_vocab)
    if c is None or prompt is None:
        folder = _scratch()
        _compute_run(pack, ids, greedy, dump_level, chunk, folder, progress)
        yield _read_run(folder, None)
        return
    def key_of(digest: str) -> dict:
        return {"pack": digest, "prompt": prompt, "tokens": int(np.asarray(ids).size),
                "greedy": int(greedy), "dump_level": dump_level}

    digest, mark, wrong_hint = _vouched_digest(c, Path(pack.path).resolve(), key_of)
    extra = {"packs": [mark]} if mark is not None else None
    with c.held("reference-run", key_of(digest),
                lambda folder: _compute_run(pack, ids, greedy, dump_level, chunk, folder, progress), extra) as found:
        if mark is not None and found.hit and found.not_stored is None:
            c.vouch(found.entry, mark)  # the next lookup from this file takes the index's hint
        r = _read_run(found.entry, found)
        r.pack_index = wrong_hint
        yield r


def reference_run(pack, ids, greedy: int = 0, dump_level: str | None = "layer", cache="env",
                  chunk="auto", progress: bool = False) -> RefRun:
    """The reference's outputs for (pack, prompt, greedy, dump_level), from the cache where
    they are there. The key holds the pack's content (pack_digest, computed here from its
    bytes), the prompt, the greedy count and the dump level, not the chunk: chunking changes
    no bit (docs/numerics.md section 9), and the record comparison lines up runs cut
    differently (`RefRun.chunk` says how this one was). pack: a Pack or a pack file.
    dump_level None: no record file. With the cache off (or a result it could not store) the
    files live in a temp folder removed when the process ends. The entry is not held once
    this returns: open_reference_run holds it while its block reads `records`."""
    with open_reference_run(pack, ids, greedy, dump_level, cache, chunk, progress) as r:
        return r
