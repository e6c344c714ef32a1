"""`strata-prefill diff A B`: two record files, two dump folders, or two of Strata's own dumps.

- record files (`layers.spd`, the magic `SPDUMP01`): the first-difference report
  (strata/report.py);
- Strata's first-token logits (raw float32) and residual dumps (int64 position + float32
  row, positions pos % 64 == 0 from 0): a byte comparison, and where bytes differ the max
  absolute and relative error, the cosine and top-1 agreement;
- folders: every file name the two hold in common, each as above.

A residual dump is told from a logits file by its first record (int64 position 0); its row
width comes from its second record's position 64, or from the size of a single record.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from strata.constants import RESIDUAL_STRIDE
from strata.dumps import MAGIC, read_residuals
from strata.errors import InputError
from strata.report import compare_dump_files

KINDS = ("records", "logits", "residuals")


def kind_of(path: Path) -> str:
    head = path.open("rb").read(len(MAGIC))
    if head == MAGIC:
        return "records"
    if len(head) == 8 and np.frombuffer(head, "<i8")[0] == 0:
        return "residuals"
    return "logits"


def residual_width(path: Path) -> int:
    """n_embd of a residual dump: the second record starts with position 64."""
    data = np.fromfile(path, np.uint8)
    for at in range(12, data.size - 7, 4):
        if (data.size % at == 0 and (at - 8) % 4 == 0
                and data[at:at + 8].view("<i8")[0] == RESIDUAL_STRIDE):
            return (at - 8) // 4
    if (data.size - 8) % 4 or data.size <= 8:
        raise InputError(f"{path}: not a residual dump (size {data.size})")
    return (data.size - 8) // 4


def _errors(a: np.ndarray, b: np.ndarray) -> str:
    """max abs / relative error and cosine of two float32 arrays (float64 arithmetic)."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    d = np.abs(a64 - b64)
    rel = float(d.max() / max(np.abs(a64).max(), np.finfo(np.float64).tiny))
    cos = float(a64 @ b64 / max(np.linalg.norm(a64) * np.linalg.norm(b64), np.finfo(np.float64).tiny))
    return f"max abs {d.max():.6g}, max rel {rel:.6g} (of max |A|), cosine {cos:.9f}"


def diff_logits(pa: Path, pb: Path) -> list[str]:
    a, b = np.fromfile(pa, "<f4"), np.fromfile(pb, "<f4")
    if a.size != b.size:
        return [f"sizes differ: {a.size} vs {b.size} logits"]
    neq = a.view(np.uint32) != b.view(np.uint32)
    if not neq.any():
        return [f"identical ({a.size} logits, {a.nbytes} bytes)"]
    ta, tb = int(np.argmax(a)), int(np.argmax(b))
    return [f"{int(neq.sum())} of {a.size} logits differ, first at token id {int(np.argmax(neq))}",
            _errors(a, b),
            f"top-1 {'agrees' if ta == tb else 'differs'}: {ta} vs {tb}"]


def diff_residuals(pa: Path, pb: Path) -> list[str]:
    n_embd = residual_width(pa)
    pos_a, ra = read_residuals(pa, n_embd)
    pos_b, rb = read_residuals(pb, n_embd)
    if not np.array_equal(pos_a, pos_b):
        return [f"positions differ: {pos_a.tolist()} vs {pos_b.tolist()}"]
    neq = (ra.view(np.uint32) != rb.view(np.uint32)).any(axis=1)
    if not neq.any():
        return [f"identical ({len(pos_a)} positions of {n_embd} values)"]
    cos = [float(x @ y / max(np.linalg.norm(x) * np.linalg.norm(y), 1e-300))
           for x, y in zip(ra.astype(np.float64), rb.astype(np.float64))]
    top = int((ra.argmax(axis=1) == rb.argmax(axis=1)).sum())
    return [f"{int(neq.sum())} of {len(pos_a)} positions differ, first at position {int(pos_a[np.argmax(neq)])}",
            _errors(ra.reshape(-1), rb.reshape(-1)) + f"; lowest row cosine {min(cos):.9f}",
            f"top-1 (argmax of the row) agrees at {top} of {len(pos_a)} positions"]


def diff_files(pa: Path, pb: Path, kind: str | None = None) -> tuple[bool, list[str]]:
    """(same, report lines) of two files of one kind (detected from A when not given)."""
    kind = kind or kind_of(pa)
    if kind == "records":
        miss = compare_dump_files(pa, pb)
        return miss is None, (["identical records"] if miss is None else miss.lines)
    lines = diff_logits(pa, pb) if kind == "logits" else diff_residuals(pa, pb)
    return lines[0].startswith("identical"), lines


def diff_paths(a: str | Path, b: str | Path, kind: str | None = None) -> tuple[bool, list[str]]:
    """Two files, or two folders file by file (names in common, in sorted order)."""
    pa, pb = Path(a), Path(b)
    for p in (pa, pb):
        if not p.exists():
            raise InputError(f"not found: {p}")
    if pa.is_dir() != pb.is_dir():
        raise InputError(f"compare a folder with a folder and a file with a file: {pa}, {pb}")
    if not pa.is_dir():
        return diff_files(pa, pb, kind)
    names_a = {p.name for p in pa.iterdir() if p.is_file()}
    names_b = {p.name for p in pb.iterdir() if p.is_file()}
    common = sorted(names_a & names_b)
    if not common:
        raise InputError(f"{pa} and {pb} hold no file of the same name")
    same, out = True, []
    for name in common:
        ok, lines = diff_files(pa / name, pb / name, kind)
        same &= ok
        out += [f"{name}: {lines[0]}"] + lines[1:]
    for name in sorted(names_a ^ names_b):
        out.append(f"{name}: only in {pa if name in names_a else pb}")
    return same, out
