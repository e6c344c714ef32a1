"""`strata-prefill diff A B`: two files of one kind, or two dump folders file by file.

What a file holds is read from its content (`kind_of`), or said with `--kind`, which is then
checked against the content:

- record files (`layers.spd`, the magic `SPDUMP01`): the first-difference report
  (strata_prefill/report.py);
- GGUF packs (the magic `GGUF`): metadata key by key, then tensor by tensor (type, shape,
  bytes), naming the first difference;
- Strata's residual dumps (formats/dumps.py: records of an int64 position and a float32 row,
  positions 0, 64, 128, ... as a prefill writes them): told by that layout, the row width the
  one that makes every record's position 64 times its index;
- Strata's first-token logits (raw float32): any other file of whole float32 values.

Logits and residual dumps are compared by bytes, and where bytes differ by the max absolute
and relative error, the cosine and top-1 agreement. `--pack P` gives the sizes they must have
(the vocabulary, the row width); without it the two must have the same size. A file that is
empty, of no kind, or of another kind or size than its partner is refused in one line
(InputError), never called identical.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFValueType

from strata_prefill.contract.constants import RESIDUAL_STRIDE
from strata_prefill.formats.dumps import MAGIC, read_residuals
from strata_prefill.contract.errors import InputError
from strata_prefill.report import compare_dump_files

GGUF_MAGIC = b"GGUF"
KINDS = ("records", "logits", "residuals", "pack")
#: how a message names each kind
WHAT = {"records": f"a record file (magic {MAGIC.decode()})", "logits": "first-token logits (float32)",
        "residuals": "a residual dump", "pack": "a GGUF pack"}
_CHUNK = 1 << 24  # bytes compared at once in a pack's tensors


@dataclass(frozen=True)
class Sizes:
    """What `--pack` says the dumps of a run of it hold."""

    pack: Path
    n_vocab: int  # logits per file
    n_embd: int   # values per residual row


def sizes_of(pack: str | Path) -> Sizes:
    """The vocabulary and width of a pack (opened, and so checked, by strata_prefill.formats.pack)."""
    from strata_prefill.formats.pack import Pack

    with Pack.open(pack, check_values=False) as p:  # its shape only: no value is read
        return Sizes(Path(pack), p.config.n_vocab, p.config.n_embd)


# ---------------------------------------------------------------------------------------
# What a file holds


def _head(path: Path, n: int) -> bytes:
    with open(path, "rb") as f:
        return f.read(n)


def _residual_width(path: Path, size: int, n_embd: int | None = None) -> int | None:
    """The row width of a residual dump of `size` bytes (n_embd given: checked to be it), or
    None where the file is not one: size a whole number of (8 + 4 n)-byte records whose
    positions are 0, 64, 128, ... The smallest such n is taken (one record always fits)."""
    if size < 12 or size % 4 or _head(path, 8) != bytes(8):
        return None
    if n_embd is not None:
        widths = [n_embd]
    else:
        recs = {d for i in range(1, int(size ** 0.5) + 1) if size % i == 0 for d in (i, size // i)}
        widths = [(r - 8) // 4 for r in sorted(recs) if r >= 12 and r % 4 == 0]
    data = np.memmap(path, np.uint8, "r", shape=(size,))
    for n in widths:
        rec = 8 + 4 * n
        if n < 1 or size % rec:
            continue
        count = size // rec
        if count > 1 and data[rec:rec + 8].view("<i8")[0] != RESIDUAL_STRIDE:
            continue  # the quick test first: the second record's position
        pos = data.reshape(count, rec)[:, :8].copy().view("<i8").reshape(-1)
        if np.array_equal(pos, RESIDUAL_STRIDE * np.arange(count)):
            return n
    return None


def _size(path: Path) -> int:
    size = path.stat().st_size
    if size == 0:
        raise InputError(f"{path}: empty file (0 bytes): nothing to compare")
    return size


def kind_of(path: Path, sizes: Sizes | None = None) -> str:
    """The kind of a file, from its content (with `sizes`: logits must hold the pack's
    vocabulary and residual rows its width); InputError for an empty file or one of no kind."""
    size = _size(path)
    head = _head(path, len(MAGIC))
    if head == MAGIC:
        return "records"
    if head.startswith(GGUF_MAGIC):
        return "pack"
    if _residual_width(path, size, sizes and sizes.n_embd) is not None:
        return "residuals"
    if sizes is not None:
        if size == 4 * sizes.n_vocab:
            return "logits"
        raise InputError(
            f"{path} ({size:,} bytes) is no dump of {sizes.pack}: neither its first-token logits "
            f"({sizes.n_vocab} float32, {4 * sizes.n_vocab:,} bytes) nor a residual dump of its "
            f"width {sizes.n_embd}, nor a record file or pack")
    if size % 4 == 0:
        return "logits"
    raise InputError(f"{path} ({size:,} bytes) is no file diff reads: no record-file or GGUF magic, "
                     "not a residual dump, not whole float32 logits")


def check_kind(path: Path, kind: str, sizes: Sizes | None = None) -> None:
    """InputError unless the file's content can be `kind` (what `--kind` says)."""
    size = _size(path)
    head = _head(path, len(MAGIC))
    found = ("records" if head == MAGIC else "pack" if head.startswith(GGUF_MAGIC) else None)
    if kind in ("records", "pack"):
        if found != kind:
            magic = MAGIC if kind == "records" else GGUF_MAGIC
            raise InputError(f"{path}: --kind {kind}, but the file does not start with {magic!r}")
        return
    if found is not None:
        raise InputError(f"{path}: --kind {kind}, but the file is {WHAT[found]}")
    if kind == "residuals":
        if _residual_width(path, size, sizes and sizes.n_embd) is None:
            width = f" of width {sizes.n_embd} ({sizes.pack})" if sizes else ""
            raise InputError(f"{path} ({size:,} bytes): --kind residuals, but it is not a residual "
                             f"dump{width}: records of an int64 position (0, 64, 128, ...) and a "
                             "float32 row")
    elif sizes is not None and size != 4 * sizes.n_vocab:
        raise InputError(f"{path}: --kind logits, but it holds {size:,} bytes and the logits of "
                         f"{sizes.pack} are {sizes.n_vocab} float32 ({4 * sizes.n_vocab:,} bytes)")
    elif size % 4:
        raise InputError(f"{path}: --kind logits, but its {size:,} bytes are not whole float32 values")
    elif sizes is None and (width := _residual_width(path, size)) is not None and size > 8 + 4 * width:
        # two records or more, positions 0, 64, ...: a residual dump, which compared as logits
        # would be one row of positions and values. One record (8 zero bytes, then floats) may
        # be either: there --kind decides, and with --pack a file of the vocabulary's size is logits
        raise InputError(f"{path} ({size:,} bytes): --kind logits, but it is a residual dump ("
                         f"{size // (8 + 4 * width)} records of an int64 position 0, 64, ... and "
                         f"{width} float32 values each): --kind residuals")


# ---------------------------------------------------------------------------------------
# Logits and residual dumps


def _errors(a: np.ndarray, b: np.ndarray) -> str:
    """max abs / relative error and cosine of two float32 arrays (float64 arithmetic)."""
    with np.errstate(all="ignore"):  # inf - inf, NaN: the numbers say so, not a warning
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        d = np.abs(a64 - b64)
        tiny = np.finfo(np.float64).tiny
        rel = float(d.max() / max(np.abs(a64).max(), tiny))
        cos = float(a64 @ b64 / max(np.linalg.norm(a64) * np.linalg.norm(b64), tiny))
    return f"max abs {d.max():.6g}, max rel {rel:.6g} (of max |A|), cosine {cos:.9f}"


def diff_logits(pa: Path, pb: Path) -> list[str]:
    a, b = np.fromfile(pa, "<f4"), np.fromfile(pb, "<f4")
    if a.size != b.size:
        raise InputError(f"logits of different sizes: {pa} holds {a.size}, {pb} {b.size} "
                         "(dumps of packs of different vocabularies)")
    neq = a.view(np.uint32) != b.view(np.uint32)
    if not neq.any():
        return [f"identical ({a.size} logits, {a.nbytes} bytes)"]
    ta, tb = int(np.argmax(a)), int(np.argmax(b))
    return [f"{int(neq.sum())} of {a.size} logits differ, first at token id {int(np.argmax(neq))}",
            _errors(a, b),
            f"top-1 {'agrees' if ta == tb else 'differs'}: {ta} vs {tb}"]


def residual_width(path: Path, n_embd: int | None = None) -> int:
    """n_embd of a residual dump (InputError where the file is not one)."""
    path = Path(path)
    n = _residual_width(path, _size(path), n_embd)
    if n is None:
        raise InputError(f"{path}: not a residual dump")
    return n


def diff_residuals(pa: Path, pb: Path, sizes: Sizes | None = None) -> list[str]:
    n_a = residual_width(pa, sizes and sizes.n_embd)
    n_b = residual_width(pb, sizes and sizes.n_embd)
    if n_a != n_b:
        raise InputError(f"residual dumps of different widths: {pa} has rows of {n_a} values, "
                         f"{pb} of {n_b} (dumps of packs of different widths)")
    pos_a, ra = read_residuals(pa, n_a)
    pos_b, rb = read_residuals(pb, n_a)
    if pos_a.size != pos_b.size:
        raise InputError(f"residual dumps of different lengths: {pa} holds {pos_a.size} positions "
                         f"(0 to {int(pos_a[-1])}), {pb} {pos_b.size} (0 to {int(pos_b[-1])}): "
                         "prompts of different lengths")
    neq = (ra.view(np.uint32) != rb.view(np.uint32)).any(axis=1)
    if not neq.any():
        return [f"identical ({len(pos_a)} positions of {n_a} values)"]
    with np.errstate(all="ignore"):
        cos = [float(x @ y / max(np.linalg.norm(x) * np.linalg.norm(y), 1e-300))
               for x, y in zip(ra.astype(np.float64), rb.astype(np.float64))]
    top = int((ra.argmax(axis=1) == rb.argmax(axis=1)).sum())
    return [f"{int(neq.sum())} of {len(pos_a)} positions differ, first at position {int(pos_a[np.argmax(neq)])}",
            _errors(ra.reshape(-1), rb.reshape(-1)) + f"; lowest row cosine {min(cos):.9f}",
            f"top-1 (argmax of the row) agrees at {top} of {len(pos_a)} positions"]


# ---------------------------------------------------------------------------------------
# Packs


def _show(value, types: tuple) -> str:
    if isinstance(value, float) and types == (int(GGUFValueType.FLOAT32),):
        value = np.float32(value)  # the stored float32's shortest decimal: 1e-06, not 9.99e-07
    text = str(value) if isinstance(value, np.floating) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _fields(reader) -> dict:
    """key -> (GGUF value types, contents) of a reader's metadata; of the reader's own
    `GGUF.*` entries only the version (the counts are the keys and tensors themselves)."""
    out = {}
    for key, f in reader.fields.items():
        if key.startswith("GGUF.") and key != "GGUF.version":
            continue
        try:
            value = f.contents()
        except UnicodeDecodeError:  # not UTF-8 text: compared as its bytes
            value = b"".join(bytes(f.parts[i]) for i in f.data)
        out[key] = (tuple(int(t) for t in f.types), value)
    return out


def _first_byte(a: np.ndarray, b: np.ndarray) -> int | None:
    """The first index where two uint8 arrays of one size differ, None where they agree."""
    for at in range(0, a.size, _CHUNK):
        neq = np.flatnonzero(a[at:at + _CHUNK] != b[at:at + _CHUNK])
        if neq.size:
            return at + int(neq[0])
    return None


def _names(names: list[str]) -> str:
    return ", ".join(names[:4]) + (f", ... ({len(names) - 4} more)" if len(names) > 4 else "")


def diff_packs(pa: Path, pb: Path) -> tuple[bool, list[str]]:
    """Two GGUF packs: metadata key by key (in A's order, then B's own), then tensors by name
    (type, ggml shape, bytes). The first line names the first difference."""
    from strata_prefill.formats.pack import _open_reader  # the reader with the loader's one-line errors

    ra, rb = _open_reader(pa), _open_reader(pb)
    fa, fb = _fields(ra), _fields(rb)
    meta_diff, first = [], None
    for key in list(fa) + [k for k in fb if k not in fa]:
        if key not in fb or key not in fa:
            what = f"only in {pa if key in fa else pb}"
        elif fa[key] != fb[key]:
            what = f"{_show(fa[key][1], fa[key][0])} vs {_show(fb[key][1], fb[key][0])}"
        else:
            continue
        meta_diff.append(key)
        first = first or f"first difference: metadata key {key}: {what}"
    ta = {t.name: t for t in ra.tensors}
    tb = {t.name: t for t in rb.tensors}
    tensor_diff, n_bytes = [], 0
    for name in list(ta) + [n for n in tb if n not in ta]:
        a, b = ta.get(name), tb.get(name)
        if a is None or b is None:
            what = f"only in {pa if a is not None else pb}"
        else:
            sa = (a.tensor_type.name, [int(d) for d in a.shape])
            sb = (b.tensor_type.name, [int(d) for d in b.shape])
            if sa != sb:
                what = f"{sa[0]} {sa[1]} vs {sb[0]} {sb[1]}"
            else:
                da = ra.data[a.data_offset:a.data_offset + a.n_bytes]
                db = rb.data[b.data_offset:b.data_offset + b.n_bytes]
                n_bytes += int(a.n_bytes)
                at = _first_byte(da, db)
                if at is None:
                    continue
                what = f"bytes differ from byte {at:,} of {int(a.n_bytes):,} ({sa[0]} {sa[1]})"
        tensor_diff.append(name)
        first = first or f"first difference: tensor {name}: {what}"
    n_keys, n_tensors = len(set(fa) | set(fb)), len(set(ta) | set(tb))
    if first is None:
        return True, [f"identical packs ({n_keys} metadata keys, {n_tensors} tensors, "
                      f"{n_bytes:,} bytes of tensor data)"]
    return False, [first,
                   f"metadata: {len(meta_diff)} of {n_keys} keys differ"
                   + (f" ({_names(meta_diff)})" if meta_diff else ""),
                   f"tensors: {len(tensor_diff)} of {n_tensors} differ"
                   + (f" ({_names(tensor_diff)})" if tensor_diff else "")]


# ---------------------------------------------------------------------------------------
# Files and folders


def diff_files(pa: Path, pb: Path, kind: str | None = None,
               sizes: Sizes | None = None) -> tuple[bool, list[str]]:
    """(same, report lines) of two files of one kind (read from each file's content when
    not given, checked against it when given); InputError for files of two kinds."""
    if kind is not None:
        check_kind(pa, kind, sizes)
        check_kind(pb, kind, sizes)
        ka = kb = kind
    else:
        ka, kb = kind_of(pa, sizes), kind_of(pb, sizes)
    if ka != kb:
        raise InputError(f"{pa} is {WHAT[ka]} and {pb} is {WHAT[kb]}: diff compares two files "
                         "of one kind (--kind says which where the content does not)")
    if ka == "records":
        for p in (pa, pb):
            if p.stat().st_size == len(MAGIC):
                raise InputError(f"{p}: a record file that holds no records: nothing to compare")
        miss = compare_dump_files(pa, pb)
        return miss is None, (["identical records"] if miss is None else miss.lines)
    if ka == "pack":
        return diff_packs(pa, pb)
    lines = diff_logits(pa, pb) if ka == "logits" else diff_residuals(pa, pb, sizes)
    return lines[0].startswith("identical"), lines


def _kind_for_pack(pa: Path, pb: Path, kind: str | None) -> str | None:
    """The kind of a file pair, where it can be told without a pack's sizes, else None."""
    if kind is not None:
        return kind
    heads = {_head(p, len(MAGIC)) for p in (pa, pb)}
    if heads == {MAGIC}:
        return "records"
    if all(h.startswith(GGUF_MAGIC) for h in heads):
        return "pack"
    return None


def diff_paths(a: str | Path, b: str | Path, kind: str | None = None,
               pack: str | Path | None = None) -> tuple[bool, list[str]]:
    """Two files, or two folders file by file (names in common, in sorted order). pack: the
    pack the dumps came from, whose vocabulary and width logits and residual dumps must have."""
    pa, pb = Path(a), Path(b)
    for p in (pa, pb):
        if not p.exists():
            raise InputError(f"not found: {p}")
    if pa.is_dir() != pb.is_dir():
        raise InputError(f"compare a folder with a folder and a file with a file: {pa}, {pb}")
    if kind is not None and kind not in KINDS:
        raise InputError(f"--kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if not pa.is_dir():
        pairs = [(pa, pb)]
    else:
        names_a = {p.name for p in pa.iterdir() if p.is_file()}
        names_b = {p.name for p in pb.iterdir() if p.is_file()}
        common = sorted(names_a & names_b)
        if not common:
            raise InputError(f"{pa} and {pb} hold no file of the same name")
        pairs = [(pa / n, pb / n) for n in common]
    sizes = sizes_of(pack) if pack is not None else None
    if sizes is not None and all(_kind_for_pack(x, y, kind) in ("records", "pack") for x, y in pairs):
        which = f"{pa} and {pb} are" if len(pairs) == 1 else f"the files {pa} and {pb} share are all"
        raise InputError(f"--pack gives the sizes of logits and residual dumps; {which} record "
                         "files or packs, which carry their own")
    if not pa.is_dir():
        return diff_files(pa, pb, kind, sizes)
    same, out = True, []
    for x, y in pairs:
        ok, lines = diff_files(x, y, kind, sizes)
        same &= ok
        out += [f"{x.name}: {lines[0]}"] + lines[1:]
    for name in sorted(names_a ^ names_b):
        out.append(f"{name}: only in {pa if name in names_a else pb}")
    return same, out
