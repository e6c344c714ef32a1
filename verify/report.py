"""The first-difference report: where two runs' dumps part, named down to the byte.

`compare_runs(a, b)` walks the records of two dump directories (layers.spd) plus the
first-token logits, in an order that puts the earliest layer first, and returns a
`Mismatch` for the first record that differs, or None. A q8_1 buffer mismatch names the
buffer, layer, pair row (token, rank), its 128-value block and 32-value sub-block, the byte
offset inside the 144-byte block and what that byte is (header scale/sum or a code), both
values, and how many blocks differ in all.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from strata import q8_1
from strata.dumps import read_records

BLOCK = q8_1.BLOCK_BYTES


@dataclass
class Mismatch:
    record: str
    message: str

    def __str__(self) -> str:
        return f"{self.record}: {self.message}"


def _layer_key(name: str):
    m = re.match(r"L(\d+)\.(.*)", name)
    # per layer, in the order the layer computes them
    order = ["resid_pos", "topk_ids", "topk_w", "slot", "moe_in_q8_1", "down_in_q8_1", "resid"]
    if m:
        what = m.group(2)
        return (int(m.group(1)), order.index(what) if what in order else len(order), what)
    return (10**6, 0, name)


def _float_text(v) -> str:
    return f"{float(v)!r} (0x{np.float32(v).view(np.uint32):08x})"


def describe_q8_byte(offset: int, layout) -> str:
    """What byte `offset` of a 144-byte block_q8_1_mmq holds."""
    if offset >= q8_1.HEADER_BYTES:
        i = offset - q8_1.HEADER_BYTES
        return f"code {i} of the block: value {i % 32} of its sub-block {i // 32}"
    layout = q8_1.Layout(int(layout)) if layout is not None else None
    if layout == q8_1.Layout.D4:
        return f"header: d{offset // 4} (float32 scale of 32-value block {offset // 4}), byte {offset % 4}"
    if layout == q8_1.Layout.DS4:
        j, half = offset // 4, (offset // 2) % 2
        return f"header: {'s' if half else 'd'}{j} (half {'sum' if half else 'scale'} of 32-value block {j})"
    if layout == q8_1.Layout.D2S6:
        j = offset // 2
        return f"header: d{j} (half scale of 64 values)" if j < 2 else f"header: s{j - 2} (half sum of 16 values)"
    return f"header byte {offset}"


def diff_q8_buffer(name: str, a: np.ndarray, b: np.ndarray, k_used: int, layout=None) -> Mismatch | None:
    """a, b: uint8 [rows, n_blocks, 144] in pair order (row i = token i // K, rank i % K)."""
    if a.shape != b.shape:
        return Mismatch(name, f"shapes differ: {a.shape} vs {b.shape}")
    neq = a != b
    if not neq.any():
        return None
    blocks = neq.any(axis=-1)
    row, blk = map(int, np.argwhere(blocks)[0])
    off = int(np.flatnonzero(neq[row, blk])[0])
    token, rank = divmod(row, k_used)
    sub = f", 32-value block {blk * 4 + (off - q8_1.HEADER_BYTES) // 32}" if off >= q8_1.HEADER_BYTES else ""
    return Mismatch(name, (
        f"first difference at pair row {row} (token {token}, rank {rank}), 128-value block {blk}{sub}, "
        f"byte {off} of the block ({describe_q8_byte(off, layout)}): {a[row, blk, off]:#04x} vs "
        f"{b[row, blk, off]:#04x}; {int(blocks.sum())} of {blocks.size} blocks differ"))


def _bits(a: np.ndarray) -> np.ndarray:
    """The array's elements as unsigned integers of the same width (bitwise equality)."""
    a = np.ascontiguousarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def diff_array(name: str, a: np.ndarray, b: np.ndarray, positions: np.ndarray | None = None) -> Mismatch | None:
    """Bitwise comparison of two arrays of the same dtype and shape; names the first element."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return Mismatch(name, f"shape/dtype differ: {a.shape} {a.dtype} vs {b.shape} {b.dtype}")
    rows = a.shape[0] if a.ndim > 1 else 1
    ba, bb = _bits(a).reshape(rows, -1), _bits(b).reshape(rows, -1)
    neq = ba != bb
    if not neq.any():
        return None
    row, col = map(int, np.argwhere(neq)[0])
    va, vb = a.reshape(rows, -1)[row, col], b.reshape(rows, -1)[row, col]
    where = f"row {row}" if positions is None else f"position {int(positions[row])}"
    vals = f"{_float_text(va)} vs {_float_text(vb)}" if a.dtype.kind == "f" else f"{va} vs {vb}"
    return Mismatch(name, f"first difference at {where}, element {col} (32-value block {col // 32}): "
                          f"{vals}; {int(neq.sum())} of {neq.size} elements differ")


def compare_records(ra: dict, rb: dict, k_used: int, layouts: dict | None = None,
                    skip=(".slot",)) -> Mismatch | None:
    """First mismatching record of two record dicts (see strata.dumps.read_records)."""
    names = sorted(set(ra) | set(rb), key=_layer_key)
    for name in names:
        if any(name.endswith(s) for s in skip):
            continue
        if name not in ra or name not in rb:
            return Mismatch(name, f"present only in the {'first' if name in ra else 'second'} run")
        a, b = ra[name], rb[name]
        if name.endswith("_q8_1"):
            layer = name.split(".")[0]
            layout = (layouts or {}).get((layer, name.split(".")[1]))
            got = diff_q8_buffer(name, a, b, k_used, layout)
        else:
            pos = ra.get(name.replace(".resid", ".resid_pos")) if name.endswith(".resid") else None
            got = diff_array(name, a, b, pos)
        if got is not None:
            return got
    return None


def compare_dump_dirs(dir_a, dir_b, k_used: int, layouts: dict | None = None) -> Mismatch | None:
    return compare_records(read_records(f"{dir_a}/layers.spd"), read_records(f"{dir_b}/layers.spd"),
                           k_used, layouts)
