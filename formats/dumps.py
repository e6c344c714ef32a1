"""Dump files: Strata's two formats, and the project's own record file.

Strata's formats, shared with the Strata engine (docs/dumps.md):
- first-token logits (`STRATA_DUMP_FIRST_LOGITS`): the raw float32 logits, no header.
- residuals (`STRATA_PREFILL_DUMP_R`): for each position with pos % 64 == 0, an int64
  position then the final residual row as float32; truncated on a run's first chunk and
  appended after.

The project's record file (`*.spd`, docs/dumps.md): the magic `SPDUMP01`, then records

    u32 name length, name (utf-8), u32 dtype length, dtype (numpy `dtype.str`, e.g. '<f4'),
    u32 ndim, ndim x u64 shape, the array's bytes (C order)

Records of the same name written by later chunks continue the earlier ones along axis 0;
`read_records` concatenates them.

Writes are atomic (strata_prefill.formats.atomic): the logits are written whole to a temp and renamed onto
the target. The record file and the residual dump grow chunk by chunk, so their writers
(`RecordWriter`, `ResidualWriter`) append to one temp for the whole run and rename it onto
the target at `close()` (strata_prefill.session.Session.run closes them at its end): until then the
target keeps what it held before the run, and a failed, interrupted or killed run (SIGTERM,
SIGHUP) leaves no part of a dump behind. A writer dropped without `close()` removes its temp.
Writing again after `close()` continues the committed file in a fresh temp (a second run of
one Session appends, as a Session's dumps always have). Readers see the same formats.
"""
from __future__ import annotations

import shutil
import struct
import weakref
from collections import defaultdict
from pathlib import Path

import numpy as np

from strata_prefill.formats.atomic import AtomicFile, write_bytes
from strata_prefill.contract.constants import RESIDUAL_STRIDE
from strata_prefill.contract.errors import InputError

MAGIC = b"SPDUMP01"
RECORD_FILE = "layers.spd"  # the record file's name in a --dump-dir folder


class _GrowingFile:
    """A file written in pieces over a run: appended to one temp (strata_prefill.formats.atomic.AtomicFile),
    renamed onto the target by `close()`; `discard()` (or the writer's garbage collection, or
    the process's exit, without a close) removes the temp and leaves the target as it was."""

    def __init__(self, path: str | Path, first: bytes = b""):
        self.path = Path(path)
        self._first = first
        self._out: AtomicFile | None = None
        self._committed = False
        self._finalizer = None
        self._open()

    def _open(self) -> None:
        out = AtomicFile(self.path)
        if self._committed:  # continue what the last close() put in place
            with open(self.path, "rb") as f:
                shutil.copyfileobj(f, out.file)
        else:
            out.file.write(self._first)
        self._out = out
        self._finalizer = weakref.finalize(self, out.discard)

    def append(self, data: bytes) -> None:
        if self._out is None:
            self._open()
        self._out.file.write(data)

    def close(self) -> None:
        """Rename the temp onto the target (nothing to do where nothing is open)."""
        out, self._out = self._out, None
        if out is not None:
            self._finalizer.detach()
            out.commit()
            self._committed = True

    def discard(self) -> None:
        out, self._out = self._out, None
        if out is not None:
            self._finalizer.detach()
            out.discard()

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb) -> None:
        if kind is None:
            self.close()
        else:
            self.discard()


class RecordWriter(_GrowingFile):
    """Appends named arrays to a record file (its magic first); the file appears, whole, at
    `close()` (module docstring)."""

    def __init__(self, path: str | Path):
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        super().__init__(path, MAGIC)

    def write(self, name: str, array: np.ndarray) -> None:
        a = np.ascontiguousarray(array)
        name_b = name.encode()
        dtype_b = a.dtype.str.encode()
        self.append(struct.pack("<I", len(name_b)) + name_b
                    + struct.pack("<I", len(dtype_b)) + dtype_b
                    + struct.pack("<I", a.ndim) + struct.pack(f"<{a.ndim}Q", *a.shape))
        self.append(a.tobytes())


def iter_records(path: str | Path):
    """(name, array) of every record of a file, in file order (the order they were written)."""
    data = Path(path).read_bytes()
    if not data.startswith(MAGIC):
        raise InputError(f"{path}: not a strata-prefill dump (bad magic)")
    pos = len(MAGIC)
    try:
        while pos < len(data):
            (n,) = struct.unpack_from("<I", data, pos)
            name = data[pos + 4 : pos + 4 + n].decode()
            pos += 4 + n
            (n,) = struct.unpack_from("<I", data, pos)
            dtype = np.dtype(data[pos + 4 : pos + 4 + n].decode())
            pos += 4 + n
            (ndim,) = struct.unpack_from("<I", data, pos)
            shape = struct.unpack_from(f"<{ndim}Q", data, pos + 4)
            pos += 4 + 8 * ndim
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            if pos + nbytes > len(data):
                raise InputError(f"{path}: truncated record {name!r}")
            yield name, np.frombuffer(data, dtype, int(np.prod(shape)), pos).reshape(shape)
            pos += nbytes
    except (struct.error, UnicodeDecodeError, TypeError, ValueError) as exc:
        raise InputError(f"{path}: truncated or damaged record header") from exc


def read_records(path: str | Path) -> dict[str, np.ndarray]:
    """All records of a file, same-named ones concatenated along axis 0, in file order."""
    parts: dict[str, list[np.ndarray]] = defaultdict(list)
    for name, array in iter_records(path):
        parts[name].append(array)
    return {k: (v[0] if len(v) == 1 else np.concatenate(v, axis=0)) for k, v in parts.items()}


def write_first_logits(path: str | Path, logits: np.ndarray) -> None:
    """Strata's first-token logits dump, written whole (atomically)."""
    write_bytes(path, np.ascontiguousarray(logits, dtype=np.float32).tobytes())


def read_first_logits(path: str | Path) -> np.ndarray:
    return np.fromfile(path, dtype=np.float32)


def residual_records(positions: np.ndarray, residual: np.ndarray) -> bytes:
    """The residual dump's records of one chunk: (int64 position, float32 row) for each
    position with pos % RESIDUAL_STRIDE == 0."""
    keep = positions % RESIDUAL_STRIDE == 0
    parts = []
    for p, row in zip(positions[keep], residual[keep]):
        parts.append(np.int64(p).tobytes())
        parts.append(np.ascontiguousarray(row, dtype=np.float32).tobytes())
    return b"".join(parts)


class ResidualWriter(_GrowingFile):
    """Strata's residual dump over a run: each chunk's sampled rows appended; the file
    appears, whole, at `close()` (module docstring)."""

    def write(self, positions: np.ndarray, residual: np.ndarray) -> None:
        self.append(residual_records(positions, residual))


def write_residuals(path: str | Path, positions: np.ndarray, residual: np.ndarray, first_chunk: bool) -> None:
    """Strata's residual dump of one chunk: the whole file (atomically) for the first chunk,
    appended in place for a later one. A run uses ResidualWriter, whose file appears whole
    at the end; this is for a file of one chunk, or a caller appending its own chunks."""
    data = residual_records(positions, residual)
    if first_chunk:
        write_bytes(path, data)
    else:
        with open(path, "ab") as f:
            f.write(data)


def read_residuals(path: str | Path, n_embd: int) -> tuple[np.ndarray, np.ndarray]:
    """(positions int64 [n], rows float32 [n, n_embd]) of a Strata residual dump."""
    rec = np.dtype([("pos", "<i8"), ("row", "<f4", (n_embd,))])
    data = np.fromfile(path, dtype=np.uint8)
    if data.size % rec.itemsize:
        raise InputError(f"{path}: size is not a whole number of records for n_embd={n_embd}")
    recs = data.view(rec)
    return recs["pos"].copy(), recs["row"].copy()
