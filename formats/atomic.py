"""Atomic writes: every file the project writes whole goes through here.

    with atomic_write(path) as f:      # mode "wb" (default) or "w" (UTF-8 text)
        f.write(...)

The bytes go to a temp file of this process's own beside the target,
`.NAME.<pid>.<random>.part` (same folder, so the final `os.replace` is a rename on one file
system, atomic), which is flushed, fsynced and renamed onto `path` when the block ends. A
reader of `path` sees the old file or the new one whole, never a part.

Cleaned up on every exit:
- an exception in the block (or in the commit) removes the temp and leaves the target as it
  was; an OSError that names the temp or no file at all is raised again naming the target
  (the user never heard of the temp);
- SIGTERM or SIGHUP while a write is open removes the temps of every open write, prints one
  line, `strata-prefill: interrupted (SIGTERM): removed the partial OUT`, and ends the process
  with status 128 + the signal (by SystemExit, so `finally` blocks and atexit still run). The
  handlers are installed while at least one write is open and the previous ones restored
  after; only from the main thread (Python allows no other); a signal that was ignored stays
  ignored (`nohup` keeps its meaning); a previous Python handler is called after the cleanup.
  A forked child never removes its parent's temps.

Two writers to one path. Each has its own temp, and `os.replace` is atomic, so the target ends
as one whole file of one writer. Just before replacing, a writer compares the target's
identity (device, inode, mtime, size) with what it was when its write began; if another
process replaced (or made, or removed) it meanwhile, it still replaces it, and says so on
stderr: `strata-prefill: OUT was written by another process meanwhile; this run's file
replaced it` (`AtomicFile.raced` is True). Why the last writer wins rather than the first:
it is what two runs one after the other do (an output is "replaced if it exists"), the file
in place then matches what the last command printed and what its caller will read next, and
the only process left to tell is the one still running. Keeping the first would leave a
command that exits 0 with somebody else's file at the path it was asked to write.

Symlinks: a target that is a symlink is resolved first, so the link stays and the file it
points to is replaced (the temp lives in that file's folder). New files get the usual
permissions (0o666 less the umask), not a replaced file's.
"""
from __future__ import annotations

import contextlib
import fcntl
import io
import os
import secrets
import signal
import sys
import threading
from pathlib import Path
from typing import IO, Any

PROG = "strata-prefill"
SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))
_MAX_NAME = 200  # of the target's name kept in the temp's (the whole stays under 255 bytes)

# every write open in this process, in the order opened: the signal handler removes their temps
_OPEN: dict[int, "AtomicFile"] = {}
_LOCK = threading.Lock()
_SAVED: dict[int, Any] = {}  # signal -> the handler ours replaced (while ours is installed)


def temp_name(path: Path) -> Path:
    """A fresh temp name for `path`, in its folder: `.NAME.<pid>.<random>.part`."""
    return path.with_name(f".{path.name[:_MAX_NAME]}.{os.getpid()}.{secrets.token_hex(4)}.part")


def _identity(path: Path) -> tuple[int, int, int, int] | None:
    """What tells one version of a file from another: (device, inode, mtime ns, size)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)


def _resolved(path: str | os.PathLike[str]) -> Path:
    p = Path(path)
    return Path(os.path.realpath(p)) if p.is_symlink() else p


class AtomicFile:
    """One open atomic write of `path`: `file` is the temp's file object; `commit()` renames it
    onto `path`, `discard()` removes it. As a context manager: commit at the end of the block,
    discard if it raises. For writes that span many calls (a dump appended per chunk), keep the
    object and call `commit()` at the end."""

    def __init__(self, path: str | os.PathLike[str], mode: str = "wb"):
        if mode not in ("wb", "w"):
            raise ValueError(f"atomic writes take mode 'wb' or 'w', not {mode!r}")
        self.shown = Path(path)           # the name the user gave: what messages say
        self.path = _resolved(path)       # the file replaced at the end
        self.raced = False
        self._pid = os.getpid()
        self._before = _identity(self.path)
        self.temp = temp_name(self.path)
        fd = os.open(self.temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0),
                     0o666)
        try:
            raw = os.fdopen(fd, "wb")
        except BaseException:
            os.close(fd)
            self._remove_temp()
            raise
        self.file: IO[Any] = io.TextIOWrapper(raw, encoding="utf-8", newline="") if mode == "w" else raw
        self.done = False
        _register(self)

    # ---- ending --------------------------------------------------------------------
    def commit(self) -> Path:
        """Flush, fsync and rename the temp onto the target; say so if another process wrote
        the target meanwhile (module docstring). Returns the target."""
        if self.done:
            raise ValueError(f"{self.shown}: this write has already ended")
        try:
            with _named(self):
                self.file.flush()
                os.fsync(self.file.fileno())
                self.file.close()
                # the folder locked while a writer looks at the target and renames onto it: without
                # it two writers could each look before either renamed, and neither would be told
                with flocked(self.path.parent):  # the look and the rename as one step
                    now = _identity(self.path)
                    if now != self._before:
                        self.raced = True
                        print(f"{PROG}: {self.shown} was written by another process meanwhile; "
                              "this run's file replaced it", file=sys.stderr, flush=True)
                    os.replace(self.temp, self.path)
                self.done = True
                _fsync_folder(self.path.parent)
        except BaseException:
            self.discard()
            raise
        finally:
            _unregister(self)
        return self.path

    def discard(self) -> None:
        """Remove the temp (the target is left as it was). Safe to call more than once."""
        if os.getpid() != self._pid:  # a forked child's copy: closing it would flush the
            return                    # parent's buffered bytes into the parent's temp
        try:
            self.file.close()
        except Exception:  # a failed flush of a write that is being thrown away
            pass
        if not self.done:
            self.done = True
            self._remove_temp()
        _unregister(self)

    def _remove_temp(self) -> bool:
        """Unlink the temp; True where there was one to remove (by this process)."""
        if os.getpid() != self._pid:  # a forked child: the temp is its parent's
            return False
        try:
            os.unlink(self.temp)
            return True
        except FileNotFoundError:
            return False
        except OSError:
            return False

    def __enter__(self) -> "AtomicFile":
        return self

    def __exit__(self, kind, exc, tb) -> None:
        if kind is None:
            self.commit()
            return
        self.discard()
        renamed = _renamed_error(exc, self)
        if renamed is not None:
            raise renamed from exc


class atomic_write:
    """`with atomic_write(path, mode="wb") as f:` the temp's file object, committed at the end
    of the block, removed if it raises (AtomicFile; module docstring)."""

    def __init__(self, path: str | os.PathLike[str], mode: str = "wb"):
        self._path, self._mode = path, mode
        self.atomic: AtomicFile | None = None

    def __enter__(self) -> IO[Any]:
        self.atomic = AtomicFile(self._path, self._mode)
        return self.atomic.file

    def __exit__(self, kind, exc, tb) -> None:
        assert self.atomic is not None
        self.atomic.__exit__(kind, exc, tb)


def write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """`path` replaced atomically by `data`."""
    with atomic_write(path) as f:
        f.write(data)
    return Path(path)


def write_text(path: str | os.PathLike[str], text: str) -> Path:
    """`path` replaced atomically by `text` (UTF-8)."""
    with atomic_write(path, "w") as f:
        f.write(text)
    return Path(path)


# ---------------------------------------------------------------------------------------
# errors that name the target


class _named:
    """Inside: an OSError naming the temp, or no file, is raised again naming the target."""

    def __init__(self, af: AtomicFile):
        self.af = af

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, exc, tb) -> None:
        renamed = _renamed_error(exc, self.af) if kind is not None else None
        if renamed is not None:
            raise renamed from exc


def _renamed_error(exc: BaseException | None, af: AtomicFile) -> OSError | None:
    """The same error naming the target, where `exc` names the temp or no file at all."""
    if not isinstance(exc, OSError) or exc.errno is None:
        return None
    if exc.filename is not None and os.fsdecode(exc.filename) != os.fsdecode(af.temp):
        return None
    return type(exc)(exc.errno, exc.strerror, str(af.shown))


@contextlib.contextmanager
def flocked(path, create: bool = False):
    """An exclusive flock on ``path`` held for the block: a folder or existing file (opened
    read-only), or with ``create`` a lock file, made if missing. flock belongs to the open file,
    so two threads of one process exclude each other as two processes do; closing the
    descriptor releases the lock. The atomic writer's folder lock (a lock on the folder itself
    leaves no lock file behind) and the cubin folder's per-cubin lock files
    (fast/cuda/kernel_cache.py) both take it."""
    fd = os.open(path, (os.O_RDWR | os.O_CREAT) if create else os.O_RDONLY, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _fsync_folder(folder: Path) -> None:
    """Make the rename itself durable (where the platform lets a folder be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------------
# the signal handlers, installed while a write is open


def _register(af: AtomicFile) -> None:
    with _LOCK:
        _OPEN[id(af)] = af
        if _SAVED or threading.current_thread() is not threading.main_thread():
            return
        for sig in SIGNALS:
            prev = signal.getsignal(sig)
            if prev is signal.SIG_IGN or prev is _on_signal:
                continue
            _SAVED[sig] = prev
            signal.signal(sig, _on_signal)


def _unregister(af: AtomicFile) -> None:
    with _LOCK:
        _OPEN.pop(id(af), None)
        if _OPEN or not _SAVED or threading.current_thread() is not threading.main_thread():
            return  # the last write to end off the main thread leaves ours in place: harmless
        for sig, prev in _SAVED.items():
            signal.signal(sig, prev if prev is not None else signal.SIG_DFL)
        _SAVED.clear()


def _on_signal(signum: int, frame) -> None:
    # no lock here: the handler runs on the main thread, which may hold it
    removed = [af.shown for af in list(_OPEN.values()) if not af.done and af._remove_temp()]
    name = signal.Signals(signum).name
    line = f"{PROG}: interrupted ({name})"
    if removed:
        line += ": removed the partial " + ", ".join(str(p) for p in removed)
    print(line, file=sys.stderr, flush=True)
    prev = _SAVED.get(signum)
    if callable(prev):
        prev(signum, frame)
    raise SystemExit(128 + signum)


def open_writes() -> list[Path]:
    """Targets of the writes open in this process (for tests and diagnostics)."""
    return [af.shown for af in list(_OPEN.values())]
