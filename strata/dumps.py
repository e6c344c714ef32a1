"""Dump files: Strata's two formats, and the project's own record file.

Strata's formats (DESIGN.md section 7):
- first-token logits (`STRATA_DUMP_FIRST_LOGITS`): the raw float32 logits, no header.
- residuals (`STRATA_PREFILL_DUMP_R`): for each position with pos % 64 == 0, an int64
  position then the final residual row as float32; truncated on a run's first chunk and
  appended after.

The project's record file (`*.spd`, docs/dumps.md): the magic `SPDUMP01`, then records

    u32 name length, name (utf-8), u32 dtype length, dtype (numpy `dtype.str`, e.g. '<f4'),
    u32 ndim, ndim x u64 shape, the array's bytes (C order)

Records of the same name written by later chunks continue the earlier ones along axis 0;
`read_records` concatenates them.
"""
from __future__ import annotations

import struct
from collections import defaultdict
from pathlib import Path

import numpy as np

from strata.constants import RESIDUAL_STRIDE
from strata.errors import InputError

MAGIC = b"SPDUMP01"


class RecordWriter:
    """Appends named arrays to a record file (created, with its magic, on first use)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "wb") as f:
            f.write(MAGIC)

    def write(self, name: str, array: np.ndarray) -> None:
        a = np.ascontiguousarray(array)
        name_b = name.encode()
        dtype_b = a.dtype.str.encode()
        with open(self.path, "ab") as f:
            f.write(struct.pack("<I", len(name_b)) + name_b)
            f.write(struct.pack("<I", len(dtype_b)) + dtype_b)
            f.write(struct.pack("<I", a.ndim) + struct.pack(f"<{a.ndim}Q", *a.shape))
            f.write(a.tobytes())


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
    Path(path).write_bytes(np.ascontiguousarray(logits, dtype=np.float32).tobytes())


def read_first_logits(path: str | Path) -> np.ndarray:
    return np.fromfile(path, dtype=np.float32)


def write_residuals(path: str | Path, positions: np.ndarray, residual: np.ndarray, first_chunk: bool) -> None:
    """Strata's residual dump: the sampled positions of this chunk, appended."""
    keep = positions % RESIDUAL_STRIDE == 0
    with open(path, "wb" if first_chunk else "ab") as f:
        for p, row in zip(positions[keep], residual[keep]):
            f.write(np.int64(p).tobytes())
            f.write(np.ascontiguousarray(row, dtype=np.float32).tobytes())


def read_residuals(path: str | Path, n_embd: int) -> tuple[np.ndarray, np.ndarray]:
    """(positions int64 [n], rows float32 [n, n_embd]) of a Strata residual dump."""
    rec = np.dtype([("pos", "<i8"), ("row", "<f4", (n_embd,))])
    data = np.fromfile(path, dtype=np.uint8)
    if data.size % rec.itemsize:
        raise InputError(f"{path}: size is not a whole number of records for n_embd={n_embd}")
    recs = data.view(rec)
    return recs["pos"].copy(), recs["row"].copy()
