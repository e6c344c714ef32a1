"""The first-difference report: where two runs' record files part, and what that points at.

`compare_timelines(a, b)` walks run a's chunks in the order they ran, each chunk's layers in
order and each layer's ops in the order computed (formats/records.py), and compares every
record with run b's rows at the same positions (so two runs cut into different chunks still
line up). The first record that differs comes back as a `Mismatch`: its op, layer, chunk and
position; for expert-sorted buffers the pair row, the expert and its group; the first
differing element (or q8_1 byte, named by what it holds); the shape of the whole difference
in one line; and the kernel that writes the record.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from strata_prefill.contract import q8_1
from strata_prefill.contract.constants import MMQ_GROUP
from strata_prefill.formats.records import Chunk, Op, computed_order, op_of, read_timeline, routed_groups

BLOCK = q8_1.BLOCK_BYTES


@dataclass
class Mismatch:
    record: str
    message: str  # the first differing element or byte
    where: str = ""  # op, layer, chunk, position, pair row, expert, group
    shape: str = ""  # the whole difference in one line
    kernel: str = ""

    @property
    def lines(self) -> list[str]:
        out = [f"first difference: {self.record}" + (f" ({self.where})" if self.where else "")]
        out.append(f"  {self.message}")
        if self.shape:
            out.append(f"  shape: {self.shape}")
        if self.kernel:
            out.append(f"  kernel: {self.kernel}")
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines)


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


def _k_used(chunk: Chunk, layer: int, fallback: int | None) -> int | None:
    ids = chunk.records.get(f"L{layer:02d}.topk_ids")
    return int(ids.shape[1]) if ids is not None and ids.ndim == 2 else fallback


def _row_positions(chunk: Chunk, name: str, op: Op | None, rows: int) -> np.ndarray:
    """Positions of a record's token rows (its own rows counted when the chunk has none)."""
    if op is not None and op.name == "resid":
        got = chunk.records.get(name.replace(".resid", ".resid_pos"))
        if got is not None:
            return got.astype(np.int64)
    if chunk.positions.size == rows:
        return chunk.positions
    return np.arange(rows, dtype=np.int64)


class _Rows:
    """One run's token rows of every record, joined over its chunks and found by position."""

    def __init__(self, timeline: list[Chunk], k_fallback):
        self.parts: dict[str, list] = {}
        self.index: dict[str, dict] = {}
        self.globals: dict[str, list] = {}
        for chunk in timeline:
            for name, a in chunk.records.items():
                layer, op = op_of(name)
                if op is None or op.kind == "global":
                    self.globals.setdefault(name, []).append(a)
                    continue
                rows = _token_major(a, op, _k_used(chunk, layer, k_fallback) if layer is not None else None)
                pos = _row_positions(chunk, name, op, rows.shape[0])
                self.parts.setdefault(name, []).append((pos, rows))

    def lookup(self, name: str, positions: np.ndarray):
        """b's rows of `name` at these positions, or (None, first missing position). Where b
        recorded a position twice (a chunk run again), its later row counts."""
        if name not in self.index:
            self.index[name] = self._index(name)
        found = self.index[name]
        if found is None:
            return None, int(positions[0]) if len(positions) else 0
        known, where, rows = found
        positions = np.asarray(positions, np.int64)
        at = np.minimum(np.searchsorted(known, positions), len(known) - 1)
        hit = known[at] == positions
        if not hit.all():
            return None, int(positions[np.argmin(hit)])
        return rows[where[at]], None

    def _index(self, name: str):
        """(sorted known positions, row of each in `rows`, every row joined), or None when
        b has no row of `name`."""
        parts = self.parts.get(name, [])
        if not parts or not sum(len(p) for p, _ in parts):
            return None
        pos = np.concatenate([np.asarray(p, np.int64) for p, _ in parts])
        rows = parts[0][1] if len(parts) == 1 else np.concatenate([r for _, r in parts])
        last = len(pos) - 1 - np.unique(pos[::-1], return_index=True)[1]  # the later row of a repeat
        return pos[last], last, rows

def _token_major(a: np.ndarray, op: Op, k_used: int | None) -> np.ndarray:
    """Pair-order records as [T, K, ...] so that their rows follow tokens."""
    if op.kind in ("pair", "q8pair") and k_used:
        return a.reshape(a.shape[0] // k_used, k_used, *a.shape[1:])
    return a


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _token_shape(rows: np.ndarray, cols: np.ndarray, pos: np.ndarray, width: int) -> str:
    """One line: which tokens and columns of a token-indexed record differ."""
    ur, uc = np.unique(rows), np.unique(cols)
    n = len(pos)
    if len(ur) == 1:
        return f"one token (position {int(pos[ur[0]])}): {_plural(len(uc), 'element')} of {width}"
    if len(uc) == 1:
        return f"one column (element {int(uc[0])}) across {len(ur)} of {n} tokens"
    if len(ur) < n and np.array_equal(ur, np.arange(ur[0], n)):
        return (f"every token from position {int(pos[ur[0]])} on ({len(ur)} of {n}), "
                f"{len(uc)} of {width} elements")
    if len(ur) == n:
        return f"everywhere: all {n} tokens, {len(uc)} of {width} elements"
    return f"{len(ur)} of {n} tokens, {len(uc)} of {width} elements"


def _pair_shape(rows, cols, ids, groups, width: int, col_word: str, n_pairs: int) -> str:
    """One line: which experts, groups, columns and tokens of an expert-sorted record differ."""
    k_used = ids.shape[1]
    flat = ids.reshape(-1)
    ur, uc = np.unique(rows), np.unique(cols)
    experts = sorted({int(flat[r]) for r in ur})
    grps = sorted({groups[e] for e in experts})
    tokens = np.unique(ur // k_used)
    n_groups = max(groups.values()) + 1
    cols_txt = f"{len(uc)} of {width} {col_word}s"
    if len(experts) == 1:
        e = experts[0]
        own = int((flat == e).sum())
        return (f"one expert ({e}, group {grps[0]}): {len(ur)} of its {own} pair rows, {cols_txt}")
    if len(tokens) == 1:
        return f"one token: {len(ur)} of its {k_used} pair rows (experts {experts}), {cols_txt}"
    if len(uc) == 1:
        return f"one column ({col_word} {int(uc[0])}) across {len(experts)} experts in {_plural(len(grps), 'group')}"
    if len(grps) == 1 and n_groups > 1:
        members = [e for e, g in groups.items() if g == grps[0]]
        return (f"one group ({grps[0]} of {n_groups}: experts {min(members)}..{max(members)}): "
                f"{len(experts)} experts, {len(ur)} pair rows, {cols_txt}")
    return (f"everywhere: {len(ur)} of {n_pairs} pair rows, {len(experts)} of {len(groups)} routed experts "
            f"in {len(grps)} of {n_groups} groups, {cols_txt}")


def _describe(name, op, layer, chunk, a, b, pos, k_used, layouts, group) -> Mismatch:
    """The report of a record that differs: a and b token-major, pos their positions."""
    chunk_txt = f"chunk {chunk.index}" if chunk.index >= 0 else "the run"
    kernel = op.kernel if op else ""
    if op is not None and op.kind in ("pair", "q8pair") and k_used:
        ids = chunk.records.get(f"L{layer:02d}.topk_ids")
        slot = chunk.records.get(f"L{layer:02d}.slot")
        fa, fb = a.reshape(-1, *a.shape[2:]), b.reshape(-1, *b.shape[2:])
        if op.kind == "q8pair":
            layout = (layouts or {}).get((f"L{layer:02d}", op.name))
            got = diff_q8_buffer(name, fa, fb, k_used, layout)
            neq = (fa != fb).any(axis=-1)
            width, col_word = fa.shape[1], "128-value block"
        else:
            got = diff_array(name, fa, fb)
            neq = _bits(fa).reshape(fa.shape[0], -1) != _bits(fb).reshape(fb.shape[0], -1)
            width, col_word = neq.shape[1], "column"
        rows, cols = np.nonzero(neq)
        i = int(rows[0])
        t, k = divmod(i, k_used)
        where = f"{op.name}, layer {layer}, {chunk_txt}, position {int(pos[t])} (token {t} of the chunk), pair row {i} (rank {k})"
        shape = ""
        if ids is not None:
            groups = routed_groups(ids, group)
            e = int(ids.reshape(-1)[i])
            members = [x for x, g in groups.items() if g == groups[e]]
            where += f", expert {e}, group {groups[e]} (routed experts {min(members)}..{max(members)})"
            shape = _pair_shape(rows, cols, ids, groups, width, col_word, fa.shape[0])
        if slot is not None:
            where += f", expert-sorted row {int(slot[i])}"
        message = got.message.replace(f"pair row {i} (token {t}, rank {k}), ", "").replace(f"row {i}, ", "")
        return Mismatch(name, message, where, shape, kernel)
    if op is not None and op.kind == "global":
        got = diff_array(name, a.reshape(1, -1), b.reshape(1, -1))
        return Mismatch(name, got.message.replace("row 0, ", ""), f"{op.name}, after {chunk_txt}", "", kernel)
    ra, rb = a.reshape(a.shape[0], -1), b.reshape(b.shape[0], -1)
    got = diff_array(name, ra, rb, pos)
    neq = _bits(ra) != _bits(rb)
    rows, cols = np.nonzero(neq)
    t = int(rows[0])
    label = op.name if op else name
    where = f"{label}, " + (f"layer {layer}, " if layer is not None else "") + \
        f"{chunk_txt}, position {int(pos[t])} (token {t} of the chunk)"
    return Mismatch(name, got.message.replace(f"position {int(pos[t])}, ", ""), where,
                    _token_shape(rows, cols, pos, ra.shape[1]), kernel)


def compare_timelines(ta: list[Chunk], tb: list[Chunk], layouts: dict | None = None, k_used: int | None = None,
                      group: int = MMQ_GROUP) -> Mismatch | None:
    """The first record of run a (chunks in time order, then layer, then op) whose rows
    differ from run b's at the same positions; None when every record agrees.

    layouts: {("Lnn", buffer): q8_1 layout} names q8_1 header bytes; k_used: experts per
    token where a layer recorded no top-K ids; group: experts per walk group."""
    rb = _Rows(tb, k_used)
    seen_globals: dict[str, int] = {}
    names_a = set()
    for chunk in ta:
        for name in sorted(chunk.records, key=computed_order):
            names_a.add(name)
            layer, op = op_of(name)
            if op is not None and (op.kind == "chunk" or op.name == "resid_pos"):
                continue
            a = chunk.records[name]
            if op is None or op.kind == "global":
                n = seen_globals.get(name, 0)
                seen_globals[name] = n + 1
                theirs = rb.globals.get(name, [])
                if n >= len(theirs):
                    return Mismatch(name, f"present only in the first run (occurrence {n + 1})")
                b = theirs[n]
                if a.shape != b.shape or a.dtype != b.dtype:
                    return Mismatch(name, f"shape/dtype differ: {a.shape} {a.dtype} vs {b.shape} {b.dtype}")
                if a.tobytes() != b.tobytes():
                    return _describe(name, op, layer, chunk, a, b, None, None, layouts, group)
                continue
            ku = _k_used(chunk, layer, k_used) if layer is not None else None
            a = _token_major(a, op, ku)
            pos = _row_positions(chunk, name, op, a.shape[0])
            if name not in rb.parts:
                return Mismatch(name, "present only in the first run", kernel=op.kernel)
            if len(pos) == 0:  # a sampled record with no sampled position in this chunk
                continue
            b, missing = rb.lookup(name, pos)
            if b is None:
                return Mismatch(name, f"the second run has no row at position {missing}", kernel=op.kernel)
            if a.shape != b.shape or a.dtype != b.dtype:
                return Mismatch(name, f"shape/dtype differ: {a.shape} {a.dtype} vs {b.shape} {b.dtype}",
                                kernel=op.kernel)
            if a.tobytes() != b.tobytes():
                return _describe(name, op, layer, chunk, a, b, pos, ku, layouts, group)
    only_b = sorted((set(rb.parts) | set(rb.globals)) - names_a, key=computed_order)
    if only_b:
        return Mismatch(only_b[0], "present only in the second run")
    return None


def compare_records(ra: dict, rb: dict, k_used: int, layouts: dict | None = None) -> Mismatch | None:
    """The same comparison for two runs given as joined records (strata_prefill.formats.dumps.read_records)."""
    empty = np.zeros(0, np.int64)
    return compare_timelines([Chunk(-1, empty, ra)], [Chunk(-1, empty, rb)], layouts, k_used)


def compare_dump_files(path_a, path_b, layouts: dict | None = None, k_used: int | None = None) -> Mismatch | None:
    return compare_timelines(read_timeline(path_a), read_timeline(path_b), layouts, k_used)
