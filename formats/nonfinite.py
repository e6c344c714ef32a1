"""Where NaN or Inf first appear: in a run's logits, its residual dump, its record file, or a
pack's tensors.

A run that computes a NaN or an Inf carries it on to the logits (RMSNorm of an Inf row is
NaN), so the value a user sees says only that something went wrong. The record file says
where: `in_records` walks it in the order the run computed it (chunk by chunk, then the
chunk's embedding, its layers in order and each layer's ops in `strata_prefill.formats.records.OPS` order,
then the logits) and names the first record holding a non-finite value, with the first
position and element in it.

Pack tensors: a quantized block's values are its integer codes times its float fields (the
scale, a min: `QuantFormat.scale_values`; the half fields of most formats, IQ1_M's d spread over
four nibbles, MXFP4's and NVFP4's scale bytes): the codes and sub-scales are small integers, so
a block decodes to a non-finite value exactly when one of those fields is NaN or Inf, and then
every value of the block is (Inf times a code is Inf, times 0 is NaN), or, for MXFP4 alone,
when a finite scale of 2^125 or more times a code overflows (`QuantFormat.finite_blocks` says
which blocks decode finite). `in_tensor` reads only those fields, which is what makes the check
cheap enough for `run` to make whenever it opens a pack (`Pack.open`) and `info --check` on
the large packs; tests/test_nonfinite.py holds it equal to a full `strata_prefill.contract.quants.dequantize`
for every type. A float tensor (F32, F16, BF16) is read whole.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
from gguf import GGMLQuantizationType as QT

from strata_prefill.formats import dumps
from strata_prefill.contract import q8_1, qformats
from strata_prefill.contract.dense import FLOAT_TYPES, decode_float
from strata_prefill.formats.records import OPS, ORDER, computed_order, op_of, q8_layouts, read_timeline  # noqa: F401 - q8_layouts for callers

SLAB_BYTES = 32 << 20  # a pack tensor is scanned this much at a time (its decode is 4x that)



@dataclass(frozen=True)
class Found:
    """The first non-finite value of something: `what` names it (a record, "the logits", a
    tensor), `index` is the element's index in the array, `value` its value; `count` of
    `size` elements are non-finite. Records add their chunk, layer and op, and the position
    (and top-K rank, for pair rows) of the row."""

    what: str
    index: tuple
    value: float
    count: int
    size: int
    chunk: int | None = None
    layer: int | None = None
    op: str | None = None
    position: int | None = None
    rank: int | None = None
    element: str = "element"  # what index[-1] counts (a q8_1 record's: its header values)

    @property
    def kind(self) -> str:
        """"NaN", "Inf" or "-Inf"."""
        return "NaN" if np.isnan(self.value) else ("Inf" if self.value > 0 else "-Inf")

    def where(self) -> str:
        """e.g. "layer 1, op y (L01.y) of chunk 0, position 5 (rank 2), element 17"."""
        if self.op is not None and self.layer is not None:
            head = f"layer {self.layer}, op {self.op} ({self.what})"
        elif self.op == "embed":
            head = "the token embeddings (embed)"
        elif self.op == "first_logits":
            head = "the first-token logits (first_logits)"
        else:
            head = self.what
        parts = [head]
        if self.chunk is not None and self.chunk >= 0:
            parts.append(f" of chunk {self.chunk}")
        if self.position is not None:
            parts.append(f", position {self.position}")
            if self.rank is not None:
                parts.append(f" (top-K rank {self.rank})")
        parts.append(f", {self.element} {self.index[-1] if self.index else 0}")
        return "".join(parts)

    def summary(self) -> str:
        """e.g. "NaN first in layer 1, op y (L01.y) ..., element 17 (3,072 of 71,680 values
        non-finite)"."""
        return f"{self.kind} first in {self.where()} ({self.count:,} of {self.size:,} values non-finite)"


def first_nonfinite(a) -> tuple | None:
    """The index (C order) of the first NaN or Inf of a float array; None when every value
    is finite or the array holds no floats."""
    a = np.asarray(a)
    if a.dtype.kind not in "fc" or a.size == 0:
        return None
    bad = ~np.isfinite(a)
    if not bad.any():
        return None
    return tuple(int(i) for i in np.unravel_index(int(np.argmax(bad.reshape(-1))), a.shape))


def _found(what: str, a: np.ndarray, **where) -> Found | None:
    idx = first_nonfinite(a)
    if idx is None:
        return None
    a = np.asarray(a)
    return Found(what, idx, float(a[idx]), int((~np.isfinite(a)).sum()), int(a.size), **where)


def in_logits(logits) -> Found | None:
    """The first non-finite value of first-token logits (index: the token id)."""
    return _found("the logits", np.asarray(logits).reshape(-1))


def in_residual_dump(path: str | Path, n_embd: int) -> Found | None:
    """The first non-finite value of a Strata residual dump (the last layer's residual at the
    positions pos % 64 == 0), with its position."""
    positions, rows = dumps.read_residuals(path, n_embd)
    f = _found("the residual dump (the last layer's output)", rows)
    if f is None:
        return None
    return Found(f.what, f.index, f.value, f.count, f.size, position=int(positions[f.index[0]]))


def _q8_scales(rows: np.ndarray, layout) -> np.ndarray:
    """float32 [rows, values] of a q8_1 record's header floats (scales and sums): NaN or Inf
    there is where a non-finite input went."""
    dec = q8_1.decode_rows(rows, None, layout)
    parts = [dec.d] + [s for s in (dec.s, dec.s16) if s is not None]
    return np.concatenate(parts, axis=-1)


def in_records(path: str | Path, layouts: dict | None = None,
               k_used: int | None = None) -> Found | None:
    """The first record of a record file, in the order the run computed it, holding a NaN
    or an Inf (module docstring); None when all are finite. layouts (q8_layouts): read the
    q8_1 buffers' headers too (without it they are skipped; the quantize zeroes a block
    holding a NaN, contract/blockquant.py, so the float records before it are where that NaN
    shows, an Inf makes the scale +inf); k_used: experts per token where
    a layer recorded no top-K ids (pair rows name their position through it)."""
    for chunk in read_timeline(path):
        for name in sorted(chunk.records, key=computed_order):
            a = chunk.records[name]
            layer, op = op_of(name)
            if op is not None and op.kind == "q8pair":
                layout = (layouts or {}).get((f"L{layer:02d}", op.name))
                if layout is None:
                    continue
                a = _q8_scales(a, layout)
            idx = first_nonfinite(a)
            if idx is None:
                continue
            position = rank = None
            rows = a.shape[0] if a.ndim else 0
            if op is not None and op.kind in ("token", "pair", "q8pair", "sampled"):
                pos = chunk.positions
                row = idx[0] if idx else 0
                if op.kind == "sampled":
                    pos = chunk.records.get(name.replace(".resid", ".resid_pos"), pos)
                elif op.kind != "token":
                    ids = chunk.records.get(f"L{layer:02d}.topk_ids")
                    k = int(ids.shape[1]) if ids is not None and ids.ndim == 2 else k_used
                    if k:
                        row, rank = divmod(row, k)
                if pos is not None and row < len(pos) and (op.kind != "token" or len(pos) == rows):
                    position = int(pos[row])
            f = _found(name, a)
            return Found(name, idx, f.value, f.count, f.size, chunk=chunk.index, layer=layer,
                         op=None if op is None else op.name, position=position, rank=rank,
                         element="header value" if op is not None and op.kind == "q8pair" else "element")
    return None


# ---- the watch: every run, every engine --------------------------------------------------
# A NaN can vanish on its way to the logits: an int8 block quantization stores a block holding
# one as zeros (contract/blockquant.py; a kernel's fmaxf drops it), and RMSNorm of a row holding
# an Inf gives zeros beside a NaN. So `run` does not trust the logits alone: each engine
# watches the outputs of the ops that feed those steps and the residual at each layer's end
# (docs/numerics.md section 10 argues why these are enough), on every run, and says at the end
# which of them first held a NaN or an Inf. The CUDA backend keeps the answer on the device
# (fast/cuda/kernels/nonfinite.cu, this module's `mark`), read once when the run has its
# logits, so no op waits for the host.

#: the ops watched on every run, record names of strata_prefill.formats.records.OPS ("shexp": the shared
#: expert's gate and up products, which its quantize of H would hide, are watched under its name)
WATCHED = ("q", "k", "v", "attn_out", "router_logits", "gate", "up", "shexp", "moe_out")
#: the watch's value while nothing was seen: the largest uint64, above every code
NOTHING = 2**64 - 1


def mark(first: int, x, code: int) -> int:
    """`code` where x holds a NaN or an Inf and code is below `first`, else `first`: the
    definition of fast/cuda/kernels/nonfinite.cu's `nonfinite_mark`, and of the mark the SwiGLU
    kernels (swiglu.cu, swiglu_q8_1.cu) make over the gate and up rows they read (this, of the
    gate rows, then of the up rows). A code at or above `first` does not read x (an earlier op
    already holds the watch)."""
    if code >= first:
        return first
    return code if not np.isfinite(np.asarray(x)).all() else first


@dataclass(frozen=True)
class Seen:
    """The first watched op that held a NaN or an Inf: its unit (the record file's chunk
    index: a chunk, a window, or a greedy step), layer and op (a name of WATCHED)."""

    unit: int
    layer: int
    op: str

    def where(self) -> str:
        return f"layer {self.layer}, op {self.op} (L{self.layer:02d}.{self.op}) of chunk {self.unit}"


def to_json(found) -> dict | None:
    """A run's answer (a Found, a Seen or None) as JSON-able values: a cached run keeps it."""
    if found is None:
        return None
    d = {k: getattr(found, k) for k in found.__dataclass_fields__}
    if isinstance(found, Found):
        d["value"] = repr(float(found.value))  # nan, inf, -inf: JSON has no word for them
    return {"kind": type(found).__name__, **d}


def from_json(d: dict | None):
    """to_json's inverse."""
    if not d:
        return None
    d = dict(d)
    kind = d.pop("kind")
    if kind == "Found":
        return Found(**{**d, "index": tuple(d["index"]), "value": float(d["value"])})
    return Seen(**d)


class Watch:
    """Where a run first computed a NaN or an Inf among the WATCHED ops. The session sets
    `unit` before each unit (a chunk, a window, a greedy step) and `reset()`s it before a run;
    the engine calls `see(layer, op, array)` after each watched op; `first()` answers at the
    end. A code orders (unit, layer, op) as the record file does (units, then layers, then
    strata_prefill.formats.records.OPS), so the first in that order wins whatever order the ops ran in."""

    def __init__(self, n_layer: int):
        self.n_layer = int(n_layer)
        self.unit = 0
        self._first = NOTHING

    def reset(self) -> None:
        self.unit = 0
        self._first = NOTHING

    def code(self, layer: int, op: str) -> int:
        return (self.unit * self.n_layer + int(layer)) * len(OPS) + ORDER[op]

    def see(self, layer: int, op: str, array) -> None:
        """A host array (the reference's)."""
        self._first = mark(self._first, array, self.code(layer, op))

    def _read(self) -> int:
        return self._first

    def first(self) -> Seen | None:
        c = int(self._read())
        if c == NOTHING:
            return None
        unit, rest = divmod(c, self.n_layer * len(OPS))
        layer, i = divmod(rest, len(OPS))
        return Seen(unit, layer, OPS[i].name)


# ---- pack tensors ------------------------------------------------------------------------


def in_tensor(qtype, raw: np.ndarray) -> tuple[int, int] | None:
    """(row, value index in the row) of the first value of raw rows uint8 [..., row_bytes]
    (leading dims flattened into rows) that decodes to NaN or Inf; None when all are
    finite. Quantized types by their half scales only (module docstring)."""
    qt = QT(qtype)
    raw = np.asarray(raw, dtype=np.uint8)
    rows = raw.reshape(-1, raw.shape[-1])
    if qt in FLOAT_TYPES:
        idx = first_nonfinite(decode_float(qt, rows))
        return None if idx is None else (idx[0], idx[1])
    fmt = qformats.lookup(qt)
    blocks = rows.reshape(-1, fmt.block_bytes)
    # the block's float fields (QuantFormat.finite_blocks): one non-finite, the block is
    bad = ~fmt.finite_blocks(blocks)
    bad = bad.reshape(rows.shape[0], -1)
    values = fmt.block_values
    if not bad.any():
        return None
    row, blk = (int(i) for i in np.unravel_index(int(np.argmax(bad.reshape(-1))), bad.shape))
    return row, blk * values


@dataclass(frozen=True)
class BadTensor:
    name: str          # the file's name (blk.1.ffn_down_exps.weight)
    expert: int | None  # stacked expert tensors: the first expert holding one
    row: int
    value: int          # the value's index in the row


def in_pack(pack, progress: Callable[[int, int, str], None] | None = None) -> Iterator[BadTensor]:
    """Every tensor of a pack that decodes to a NaN or an Inf, in file order, with the first
    such value. Read in slabs of SLAB_BYTES (memory stays bounded; a stacked tensor's experts
    one after another), as many at a time as contract/parallel.py has threads (each slab says
    what it says alone); progress(bytes done, bytes in all, the tensor's name) is called after
    each round of them. A tensor's slabs after its first bad one are not read."""
    from strata_prefill.contract import parallel

    pieces = []  # (logical name, first row, end row) of the tensor's rows, experts one after another
    for logical in pack.tensor_names():
        m = pack.matrix(logical)
        n = m.n_rows * (m.n_expert or 1)
        step = max(1, SLAB_BYTES // m.row_bytes)
        pieces += [(logical, r0, min(r0 + step, n)) for r0 in range(0, n, step)]

    def rows(piece):
        logical, r0, r1 = piece
        m = pack.matrix(logical)
        return m.data.reshape(-1, m.row_bytes)[r0:r1]  # a stacked tensor's experts are contiguous

    def scan(piece):
        return in_tensor(pack.matrix(piece[0]).qtype, rows(piece))

    total = sum(int(t.n_bytes) for t in pack.reader.tensors)
    done, hits = 0, {}
    at_once = 2 * parallel.workers()
    for i in range(0, len(pieces), at_once):
        todo = [p for p in pieces[i:i + at_once] if p[0] not in hits]
        for piece, got in zip(todo, parallel.map_ordered(scan, todo)):
            if got is not None and piece[0] not in hits:  # the tensor's first, in row order
                m = pack.matrix(piece[0])
                expert, row = divmod(piece[1] + got[0], m.n_rows)
                hits[piece[0]] = BadTensor(str(pack.tensor(piece[0]).name), expert if m.n_expert else None,
                                           row, got[1])
        done += sum(int(rows(p).nbytes) for p in pieces[i:i + at_once])
        if progress is not None:
            progress(done, total, str(pack.tensor(pieces[min(i + at_once, len(pieces)) - 1][0]).name))
    for logical in pack.tensor_names():
        if logical in hits:
            yield hits[logical]
