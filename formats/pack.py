"""The pack loader: a GGUF file of an architecture of formats/archs, read in place.

`Pack.open(path)` memory-maps the file with `gguf.GGUFReader`, validates it (architecture,
which picks its module from formats/archs: its keys and tensor table; every tensor present with the shape and a type the project supports, every tensor's data
inside the file) and exposes it as `QMatrix` views into the map: tensors are never copied.
Float matrices (F32/F16/BF16), stacked experts included, keep their type (`strata_prefill.contract.dense`
multiplies them in float32); norms are read as float32 vectors.

Names: the file holds llama.cpp's names (`blk.0.attn_q.weight`, strata_prefill.formats.tensor_names); callers
ask for logical names without the suffix (`pack.matrix("blk.0.attn_q")`). A pack of the old
spelling (no `.weight`) is refused with a line saying to remake it.

Shapes follow ggml: a tensor with ne = [n_cols, n_rows(, E)] holds rows of n_cols values;
its `QMatrix.data` is uint8 [n_rows, row_bytes] ([E, n_rows, row_bytes] for stacked experts).

Every problem a user can cause is a one-line `PackError` naming it.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader

from strata_prefill.formats import archs
from strata_prefill.contract import dense, qformats, quants
from strata_prefill.formats import tensor_names as tn
from strata_prefill.formats.archs.spec import SharedExpert, TensorSpec, layer_names  # noqa: F401 - SharedExpert: Layer.shexp's
from strata_prefill.formats.config import ARCH_KEY, ModelConfig
from strata_prefill.contract.dense import FLOAT_TYPES
from strata_prefill.contract.errors import InputError, PackError

# metadata keys of strata's own (written by make-pack)
KEY_FALLBACK = "strata.fallback"            # [str]: tensors written in the fallback type
KEY_FALLBACK_TYPE = "strata.fallback_type"  # str: that type
KEY_EXPERT_TYPE = "strata.expert_type"      # str: the expert type asked for
KEY_PRESET = "strata.preset"
KEY_SEED = "strata.seed"
KEY_PACK_FORMAT = "strata.pack_format"  # uint32: strata_prefill.contract.constants.PACK_FORMAT when written
KEY_ROUTER_TYPE = "strata.router_type"  # str: the router type asked for
KEY_MIX = "strata.mix"                  # str: the llama-quantize mix make-pack mirrored (strata_prefill.formats.mixes)
KEY_WRITER = "strata.writer"            # str: what wrote the pack ("strata-prefill 0.1.0 make-pack")
# The digests a loader checks on demand (Pack.check_digest, `info --check`), lowercase sha256
# hex: one per tensor, in the order of the tensor infos (which is the data's file order), and
# one over those (tensor_digest_root), so one value names the whole data region's content.
# The alignment padding between tensors (zeros no reader reads) is outside them.
KEY_TENSOR_DIGESTS = "strata.tensor_digests"  # [str]
KEY_TENSOR_DIGEST = "strata.tensor_digest"    # str


def tensor_digest_root(digests: list[bytes]) -> str:
    """The pack's one digest: sha256 over its tensors' sha256 digests (raw bytes) in order."""
    return hashlib.sha256(b"".join(digests)).hexdigest()


@dataclass(frozen=True)
class DigestCheck:
    """What Pack.check_digest found: `present` False for a pack with no digests (llama.cpp's,
    or make-pack's before pack format 3); else `bad` names what differs (None: all match)."""

    present: bool
    n_tensors: int = 0
    bad: str | None = None        # the file's name of the first tensor whose bytes differ
    header_bad: str | None = None  # the digests themselves are inconsistent: what is wrong

    @property
    def ok(self) -> bool:
        return self.present and self.bad is None and self.header_bad is None


def _type_name(t: Any) -> str:
    try:
        return QT(t).name
    except (ValueError, TypeError):
        return str(t)


@dataclass(frozen=True)
class QMatrix:
    """A matrix: `n_rows` rows of `n_cols` values in `qtype` (a quantized or a float type).

    `data` is uint8 [n_rows, row_bytes], or [E, n_rows, row_bytes] for stacked experts: a
    read-only view into the pack's memory map."""

    qtype: QT
    n_rows: int
    n_cols: int
    data: np.ndarray

    @property
    def row_bytes(self) -> int:
        return int(self.data.shape[-1])

    @property
    def n_expert(self) -> int | None:
        """Number of stacked experts, None for a plain matrix."""
        return int(self.data.shape[0]) if self.data.ndim == 3 else None

    @property
    def matrix_bytes(self) -> int:
        """Bytes of one matrix (one expert's slice for stacked experts)."""
        return self.n_rows * self.row_bytes

    def expert(self, e: int) -> "QMatrix":
        """The 2-D slice of expert e (a view)."""
        if self.data.ndim != 3:
            raise ValueError("not a stacked expert tensor")
        return QMatrix(self.qtype, self.n_rows, self.n_cols, self.data[e])

    @property
    def is_float(self) -> bool:
        """F32, F16 or BF16: multiplied in float32 (strata_prefill.contract.dense), never quantized."""
        return self.qtype in FLOAT_TYPES

    def dequantize(self) -> np.ndarray:
        """float32 [(E,) n_rows, n_cols]: codes times scales (strata_prefill.contract.quants.dequantize), or
        the float values widened exactly (strata_prefill.contract.dense.decode_float)."""
        if self.is_float:
            return dense.decode_float(self.qtype, self.data)
        return quants.dequantize(self.qtype, self.data)


# ---------------------------------------------------------------------------------------
# Reading


class _Truncated(Exception):
    def __init__(self, name: str, end: int, size: int):
        super().__init__(name, end, size)
        self.name, self.end, self.size = name, end, size


class _Layout(Exception):
    """The tensor table's problems, one phrase each (_CheckedReader)."""

    def __init__(self, problems: list[str]):
        super().__init__(problems)
        self.problems = problems


#: ggml's tensors have at most 4 dimensions and names of at most 63 bytes (GGML_MAX_DIMS,
#: GGML_MAX_NAME with its NUL): llama.cpp's GGUF reader refuses a table past either
GGML_MAX_DIMS = 4
GGML_NAME_BYTES = 63
LAYOUT_SHOWN = 3  # layout problems named in the one line; the rest are counted


class _CheckedReader(GGUFReader):
    """GGUFReader that checks the tensor table before it maps any tensor: every name once and
    of at most GGML_NAME_BYTES; at most GGML_MAX_DIMS dimensions; a type id ggml knows, rows of
    whole blocks; and the data laid out as the format lays it (`_layout_problems`). A
    truncated pack is reported as such, not as a reshape error."""

    def _build_tensors(self, start_offs, fields):  # noqa: D401 - gguf internal hook
        size = int(self.data.shape[0])
        problems, misfit, spans, seen = [], [], [], {}
        for i, field in enumerate(fields):
            try:
                _nl, name_data, n_dims, dims, raw_dtype, offset_tensor = field.parts
            except Exception:  # layout of gguf internals changed: fall back to gguf's checks
                return super()._build_tensors(start_offs, fields)
            if not (len(n_dims) == len(raw_dtype) == len(offset_tensor) == 1 and len(dims) == int(n_dims[0])):
                # the entry was read past the end of the file (gguf-py's views come back short)
                raise _Layout([f"the tensor table is cut short or corrupt at tensor #{i} (of {len(fields)})"])
            raw_name = bytes(name_data)
            if len(dims) > GGML_MAX_DIMS:
                problems.append(f"tensor #{i} ({raw_name[:40].decode('utf-8', 'replace')}): {len(dims)} "
                                f"dimensions (ggml's tensors have at most {GGML_MAX_DIMS})")
                continue
            dims = [int(d) for d in dims]
            type_id, rel = int(raw_dtype[0]), int(offset_tensor[0])
            name = raw_name.decode("utf-8", "replace")  # gguf-py has refused one not UTF-8 (_open_reader)
            if name in seen:
                problems.append(f"tensor name {name} appears twice (tensors #{seen[name]} and #{i})")
                continue
            seen[name] = i
            if len(raw_name) > GGML_NAME_BYTES:
                problems.append(f"tensor {name[:40]}...: a name of {len(raw_name)} bytes (ggml's "
                                f"hold at most {GGML_NAME_BYTES})")
            try:
                qt = QT(type_id)
                vals, nbytes = _gguf_sizes(qt)
            except (ValueError, KeyError):
                problems.append(f"tensor {name}: unknown GGML type id {type_id}")
                continue
            if dims and dims[0] % vals:
                misfit.append(f"tensor {name} ({qt.name}): rows of {dims[0]} values are not a "
                              f"multiple of the {qt.name} block size ({vals})")
                continue
            n_bytes = int(np.prod(dims, dtype=object)) * nbytes // vals
            spans.append((name, rel, rel + n_bytes))
        if not problems and not misfit:
            problems = _layout_problems(spans, int(self.alignment))
            past = [(name, int(start_offs) + end) for name, _rel, end in spans if int(start_offs) + end > size]
            if past and not problems:  # laid out as the format says, the file cut short
                raise _Truncated(*past[0], size)
            problems = [f"tensor {name} ends at byte {end:,}, past the end of the file ({size:,} bytes)"
                        for name, end in past[:LAYOUT_SHOWN]] + problems
        if problems:
            raise _Layout(problems)
        if misfit:
            raise PackError("; ".join(misfit))
        return super()._build_tensors(start_offs, fields)


def _layout_problems(spans: list[tuple[str, int, int]], alignment: int) -> list[str]:
    """What breaks GGUF's data layout, one phrase each (LAYOUT_SHOWN of them, then a count),
    [] if nothing. spans: (name, start, end) of each tensor's bytes, offsets into the data
    section, in table order. The format (llama.cpp's reader, ggml/src/gguf.cpp) lays the
    tensors one after another in table order, each starting at a multiple of the alignment: the
    first at 0, each next at the end of the one before rounded up to the alignment. So two
    tensors whose bytes overlap (a changed type id or dimension makes a tensor's bytes run into
    the next), a tensor off the alignment, a gap beyond the padding and data out of table order
    are each refused, named."""
    out, overlapping = [], set()
    by_start = sorted(spans, key=lambda s: (s[1], s[2]))
    for (a, a0, a1), (b, b0, _b1) in zip(by_start, by_start[1:]):
        if b0 < a1:
            out.append(f"tensor {a} (data bytes {a0:,} to {a1:,}) overlaps tensor {b} (from byte {b0:,})")
            overlapping |= {a, b}
    at, before = 0, None  # where the format puts the next tensor, and the tensor before it
    for name, start, end in spans:
        if start % alignment:
            out.append(f"tensor {name} starts at data byte {start:,}, not a multiple of the "
                       f"alignment ({alignment})")
        elif start > at:
            after = f"after tensor {before}'s end (padded)" if before else "at the start of the data"
            out.append(f"a gap of {start - at:,} bytes {after}, before tensor {name} (GGUF lays tensors "
                       f"one after another, each padded to {alignment} bytes)")
        elif start < at and name not in overlapping:
            out.append(f"tensor {name} lies before tensor {before}'s end, listed before it (GGUF "
                       f"keeps the data in table order)")
        at = -(-end // alignment) * alignment
        before = name
    if len(out) > LAYOUT_SHOWN:
        out = out[:LAYOUT_SHOWN] + [f"{len(out) - LAYOUT_SHOWN} more"]
    return out


def _gguf_sizes(qt: QT) -> tuple[int, int]:
    from gguf import GGML_QUANT_SIZES

    vals, nbytes = GGML_QUANT_SIZES[qt]
    return int(vals), int(nbytes)


_GGUF_HEADER_BYTES = 24  # magic, version, tensor count, metadata count
_GGUF_VERSIONS = (2, 3)  # the versions gguf-py's reader accepts


def _open_reader(path: Path) -> GGUFReader:
    if not path.exists():
        raise PackError(f"pack not found: {path}")
    if not path.is_file():
        raise PackError(f"pack is not a file: {path}")
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as exc:
        raise PackError(f"cannot read pack {path}: {exc.strerror or exc}") from None
    if magic != b"GGUF":
        raise PackError(f"not a GGUF file (bad magic {magic!r}, {size} bytes): {path}")
    if size < _GGUF_HEADER_BYTES:
        raise PackError(f"truncated GGUF file {path}: {size} bytes, the fixed header alone "
                        f"takes {_GGUF_HEADER_BYTES}")
    with open(path, "rb") as f:
        f.seek(4)
        version = int.from_bytes(f.read(4), "little")
    if version not in _GGUF_VERSIONS:
        raise PackError(f"unsupported GGUF version {version} (this reads versions "
                        f"{', '.join(map(str, _GGUF_VERSIONS))}): {path}")
    try:
        return _CheckedReader(path, "r")
    except _Truncated as t:
        raise PackError(
            f"truncated pack {path}: tensor {t.name} ends at byte {t.end} but the file has "
            f"{t.size} bytes") from None
    except _Layout as bad:
        raise PackError(f"{path}: its tensor table does not describe its data: "
                        + "; ".join(bad.problems)) from None
    except PackError:
        raise
    except UnicodeDecodeError as exc:  # gguf-py decodes keys and tensor names as it reads them
        raise PackError(f"{path}: a metadata key or tensor name is not UTF-8 text: "
                        f"{bytes(exc.object)[:48]!r}") from None
    except KeyError as exc:  # gguf-py's reader on a metadata key the file holds twice
        if "Duplicate" not in str(exc):
            raise PackError(f"corrupt or truncated GGUF file {path} ({size:,} bytes): its metadata "
                            "and tensor list do not parse") from None
        key = str(exc).split("Duplicate ", 1)[1].split(" already", 1)[0]
        raise PackError(f"{path}: metadata key {key[:80]} appears twice") from None
    except MemoryError:
        raise PackError(f"corrupt GGUF header (implausible sizes): {path}") from None
    except Exception:  # gguf raises ValueError, IndexError, KeyError, ... on corrupt files,
        # with messages about numpy views rather than about the file: say what is wrong instead
        raise PackError(
            f"corrupt or truncated GGUF file {path} ({size:,} bytes): its metadata and tensor "
            "list do not parse") from None


def _ne(t) -> list[int]:
    """ggml ne (fastest dimension first) of a reader tensor."""
    return [int(d) for d in t.shape]


def _raw_rows(t) -> np.ndarray:
    """A reader tensor's bytes as uint8 [(outer dims...,) n_rows, row_bytes] (a view)."""
    ne = _ne(t)
    n_cols = ne[0]
    qt = QT(t.tensor_type)
    rb = dense.row_bytes(qt, n_cols) if qt in FLOAT_TYPES else quants.row_bytes(qt, n_cols)
    data = np.asarray(t.data).view(np.ndarray).reshape(-1).view(np.uint8)
    return data.reshape((*tuple(reversed(ne[2:])), ne[1] if len(ne) > 1 else 1, rb))


def _float_values(t) -> np.ndarray:
    """float32 values of an F32/F16/BF16 reader tensor, numpy shape (outer first)."""
    return dense.decode_float(QT(t.tensor_type), _raw_rows(t)).reshape(tuple(reversed(_ne(t))))


def _logical_tensors(path: Path, reader: GGUFReader) -> dict[str, Any]:
    """The file's tensors by logical name (llama.cpp's names without `.weight`); a pack of
    the old spelling is refused."""
    by_file = {t.name: t for t in reader.tensors}
    embd = tn.name(tn.T.TOKEN_EMBD)
    if embd in by_file and tn.file_name(embd) not in by_file:
        raise PackError(
            f"{path} names its tensors without llama.cpp's .weight suffix ({embd}, not "
            f"{tn.file_name(embd)}): an old pack; remake it with `strata-prefill make-pack`")
    out = {}
    for fname, t in by_file.items():
        logical = tn.logical_name(fname)
        if logical is not None:
            out[logical] = t
    return out


# ---------------------------------------------------------------------------------------
# The pack

#: rows a thread dequantizes at least (Pack.embedding_rows); fewer rows than two parts: one thread
EMBED_ROWS_PER_THREAD = 256


def _rows_in_parts(ids: np.ndarray, rows) -> np.ndarray:
    """rows(ids) computed in parts of consecutive ids on a pool of threads and stacked in order.
    Each row is a function of its id alone, so the parts give the bytes of one call; NumPy's
    array work releases the GIL, so a long prompt's embedding (the host work before the first
    kernel) takes a fraction of one thread's time."""
    n_parts = min(os.cpu_count() or 1, 16, ids.size // EMBED_ROWS_PER_THREAD)
    if n_parts < 2:
        return rows(ids)
    from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415

    parts = np.array_split(ids, n_parts)
    with ThreadPoolExecutor(max_workers=n_parts, thread_name_prefix="embed") as pool:
        return np.concatenate(list(pool.map(rows, parts)), axis=0)


class Pack:
    """A validated pack, read in place. Use `Pack.open(path)`. Its architecture's module is
    `config.spec` (formats/archs)."""

    def __init__(self, path: Path, reader: GGUFReader, config: ModelConfig,
                 tensors: dict[str, Any], file_size: int):
        self.path = path
        self.reader = reader
        self.config = config
        self.file_size = file_size
        self._tensors = tensors
        self._matrices: dict[str, QMatrix] = {}
        self._vectors: dict[str, np.ndarray] = {}
        self._layers: dict[int, Any] = {}

    # ---- opening -------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | os.PathLike[str], check_values: bool = True,
             progress: bool | None = None) -> "Pack":
        """Open and validate a pack (module docstring). check_values: also refuse a pack any
        tensor of which decodes to NaN or Inf (`refuse_nonfinite`: the scale fields of the
        quantized tensors, the float ones whole), as every command that computes on it does;
        `info` and `diff`, which only describe, pass False. progress: that scan's progress
        (formats/progress.py: None a bar on a terminal, else a line every 10 s of a long scan)."""
        path = Path(path)
        reader = _open_reader(path)
        file_size = int(reader.data.shape[0])
        for t in reader.tensors:  # belt and braces: every tensor's data inside the file
            if t.data_offset + t.n_bytes > file_size:
                raise PackError(
                    f"truncated pack {path}: tensor {t.name} ends at byte "
                    f"{t.data_offset + t.n_bytes} but the file has {file_size} bytes")
        tensors = _logical_tensors(path, reader)
        # one refusal for every reason: the tensors of types this loader does not read, all
        # of them, beside every problem of the metadata (its values and counts against the
        # limits and the tensors present, each key named: formats/config.py, contract/limits.py)
        # or, where the metadata is sound, of the tensors' names and shapes. The tensors are
        # judged by the architecture's table; an unknown architecture is refused alone.
        spec = _arch_of(reader)
        unread = (_unknown_tensors(reader, spec) + _type_problems(tensors, spec)) if spec else []
        try:
            config = ModelConfig.from_metadata(reader.fields, {n: _ne(t) for n, t in tensors.items()})
        except PackError as exc:
            raise PackError(f"{path}: " + "; ".join([str(exc), *unread])) from None
        config = _validate(config, tensors, unread, where=f"{path}: ")
        pack = cls(path, reader, config, tensors, file_size)
        if check_values:
            pack.refuse_nonfinite(progress)
        return pack

    def refuse_nonfinite(self, progress: bool | None = None) -> None:
        """A PackError in one line naming every tensor that decodes to NaN or Inf (grouped by
        type, layers folded), or nothing. Quantized tensors are read by their scale fields only
        (`QuantFormat.scale_values`, formats/nonfinite.py): a block decodes to a non-finite
        value exactly when one of them is NaN or Inf. Float tensors are read whole.
        docs/numerics.md section 10 gives what it costs."""
        from strata_prefill.formats import nonfinite
        from strata_prefill.formats.progress import Progress

        total = sum(int(t.n_bytes) for t in self.reader.tensors)
        with Progress(total, "checking the pack's scales", "B", progress, unit_scale=True) as bar:
            def step(done: int, _total: int, name: str) -> None:
                bar.at(name)
                bar.step(done - bar.done)

            bad = [(tn.logical_name(b.name) or b.name, self.tensor_type(tn.logical_name(b.name)).name)
                   for b in nonfinite.in_pack(self, step)]
        if bad:
            raise PackError(
                f"{self.path}: {len(bad)} tensor{'s decode' if len(bad) > 1 else ' decodes'} to NaN or Inf (a scale "
                f"or float value is NaN or Inf): {by_type(bad)}; `strata-prefill info --check` names "
                "the first row of each")

    def close(self) -> None:
        """Drop the caches and the map (views handed out keep their own reference)."""
        self._matrices.clear()
        self._vectors.clear()
        self._layers.clear()
        self.reader = None  # type: ignore[assignment]

    def __enter__(self) -> "Pack":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- metadata ------------------------------------------------------------------
    def field(self, key: str, default: Any = None) -> Any:
        """A metadata value (python scalar, str or list), or default."""
        f = self.reader.fields.get(key)
        if f is None:
            return default
        try:
            return f.contents()
        except UnicodeDecodeError:  # GGUF's strings are UTF-8
            raise PackError(f"{self.path}: metadata key {key}: its value is not UTF-8 text") from None

    @property
    def fallbacks(self) -> list[str]:
        """Tensors make-pack wrote in the fallback type (`strata.fallback`), else []."""
        v = self.field(KEY_FALLBACK)
        return list(v) if v else []

    @property
    def fallback_type(self) -> str | None:
        return self.field(KEY_FALLBACK_TYPE)

    @property
    def pack_format(self) -> int | None:
        """`strata.pack_format` of a pack make-pack wrote, else None."""
        v = self.field(KEY_PACK_FORMAT)
        return None if v is None else int(v)

    @property
    def writer(self) -> str | None:
        """`strata.writer`: what wrote the pack (make-pack's own packs), else None."""
        return self.field(KEY_WRITER)

    def check_digest(self) -> DigestCheck:
        """Recompute every tensor's sha256 and compare it with the header's digests
        (KEY_TENSOR_DIGESTS): reads the whole data region once, in file order."""
        stored = self.field(KEY_TENSOR_DIGESTS)
        root = self.field(KEY_TENSOR_DIGEST)
        if stored is None and root is None:
            return DigestCheck(False)
        tensors = list(self.reader.tensors)
        n = len(tensors)
        stored = list(stored or [])
        if root is None or len(stored) != n:
            return DigestCheck(True, n, header_bad=(
                f"the header lists {len(stored)} tensor digests for {n} tensors"
                if root is not None else "the header has tensor digests but no digest over them"))
        try:
            raw = [bytes.fromhex(str(d)) for d in stored]
        except ValueError:
            raw = None
        if raw is None or any(len(r) != 32 for r in raw) or tensor_digest_root(raw) != str(root):
            return DigestCheck(True, n, header_bad="its tensor digests do not match the digest "
                                                   f"over them ({KEY_TENSOR_DIGEST})")
        data = self.reader.data
        for t, want in zip(tensors, raw):
            start = int(t.data_offset)
            got = hashlib.sha256(memoryview(data[start:start + int(t.n_bytes)])).digest()
            if got != want:
                return DigestCheck(True, n, bad=str(t.name))
        return DigestCheck(True, n)

    @property
    def tied_embeddings(self) -> bool:
        return "output" not in self._tensors

    def tensor_names(self) -> list[str]:
        """Logical names (without `.weight`) of the file's weights."""
        return list(self._tensors)

    def cuda_type_problems(self) -> list[str]:
        """One phrase naming, grouped by type, the matrices whose type has no CUDA MMQ kernel
        (strata_prefill.contract.qformats: mmq_kernel None), or [] if every one has: for the cuda backend to
        refuse the pack before it loads anything. An untied token_embd is only looked up
        (decoded on the host, strata_prefill.contract.quants), so any type serves it."""
        bad = []
        for name in self.tensor_names():
            qt = self.tensor_type(name)
            fmt = qformats.lookup(qt)
            kind = tensor_kind(name, self.config.spec)
            if fmt is None or fmt.mmq_kernel is not None or kind is None or kind.float_only:
                continue
            if name == tn.name(tn.T.TOKEN_EMBD) and not self.tied_embeddings:
                continue
            bad.append((name, qt.name))
        if not bad:
            return []
        return [f"no CUDA MMQ kernel decodes {by_type(bad)}"]

    def is_vector(self, name: str) -> bool:
        """Whether logical `name` is read as a float32 vector (`vector`: a norm) rather than a
        matrix, by its architecture's table (formats/archs)."""
        kind = tensor_kind(name, self.config.spec)
        return kind is not None and kind.is_vector

    def tensor_type(self, name: str) -> QT:
        return QT(self._tensor(name).tensor_type)

    def tensor_offset(self, name: str) -> int:
        """Absolute file offset of a tensor's data."""
        return int(self._tensor(name).data_offset)

    def tensor(self, name: str):
        """The gguf ReaderTensor of logical `name` (its `.data` is the raw map view, its
        `.name` the file's name)."""
        return self._tensor(name)

    def _tensor(self, name: str):
        try:
            return self._tensors[name]
        except KeyError:
            raise PackError(f"missing tensor {tn.file_name(name)} in {self.path}") from None

    # ---- tensors -------------------------------------------------------------------
    def matrix(self, name: str) -> QMatrix:
        """A matrix (or stacked expert tensor) as QMatrix, in its own type: a view into the
        map (F32/F16/BF16 included: `QMatrix.dequantize` widens them exactly). A 1-D tensor
        is a 1-row matrix. Cached."""
        m = self._matrices.get(name)
        if m is not None:
            return m
        t = self._tensor(name)
        ne = _ne(t)
        data = _raw_rows(t)
        m = QMatrix(QT(t.tensor_type), data.shape[-2], ne[0], data)
        self._matrices[name] = m
        return m

    def vector(self, name: str) -> np.ndarray:
        """float32 values of a float tensor the table reads whole (norms, biases, sinks): [n]
        for a 1-D one, [E, n] for stacked experts' biases (numpy shape, outer first); read-only."""
        v = self._vectors.get(name)
        if v is None:
            t = self._tensor(name)
            v = np.array(_float_values(t), dtype=np.float32)  # the shape the table checked
            v.flags.writeable = False
            self._vectors[name] = v
        return v

    def embedding_rows(self, ids) -> np.ndarray:
        """float32 [T, n_embd]: rows `ids` of token_embd, dequantized exactly (codes times
        scales, strata_prefill.contract.quants.dequantize); float embeddings as stored (F16/BF16 widened to
        float32 exactly)."""
        ids = np.asarray(ids)
        if ids.ndim != 1 or (ids.size and not np.issubdtype(ids.dtype, np.integer)):
            raise InputError(f"token ids must be a 1-D integer array, got {ids.dtype} {ids.shape}")
        ids = ids.astype(np.int64)
        n_vocab = self.config.n_vocab
        bad = (ids < 0) | (ids >= n_vocab)
        if bad.any():
            raise InputError(f"token id {int(ids[bad][0])} out of range [0, {n_vocab})")
        m = self.matrix("token_embd")
        if m.is_float:
            return np.ascontiguousarray(dense.decode_float(m.qtype, m.data[ids]), dtype=np.float32)
        return _rows_in_parts(ids, lambda part: quants.dequantize(m.qtype, m.data[part]).astype(np.float32, copy=False))

    def output(self) -> QMatrix:
        """The lm_head: `output`, or `token_embd` when tied (no `output` tensor)."""
        return self.matrix("output" if "output" in self._tensors else "token_embd")

    def output_norm(self) -> np.ndarray:
        return self.vector("output_norm")

    def layer(self, l: int):
        """Block l's tensors (cached): the architecture's Layer (formats/archs), a field per
        tensor of its table, matrices as QMatrix and norms, biases and sinks as float32 arrays
        (`vector`); a group the block does not hold (the shared expert's) None."""
        l = self._check_layer(l)
        lay = self._layers.get(l)
        if lay is not None:
            return lay
        spec = self.config.spec
        vectors = {t.field for t in spec.BLOCK_TENSORS if t.is_vector}
        kw: dict[str, Any] = {field: (self.vector if field in vectors else self.matrix)(name)
                              for field, name in layer_names(spec, l, self._tensors.__contains__).items()}
        lay = spec.Layer(index=l, **kw)
        self._layers[l] = lay
        return lay

    def layers(self) -> Iterator[Any]:
        for l in range(self.config.n_layer):
            yield self.layer(l)

    # ---- experts -------------------------------------------------------------------
    def _check_layer(self, l: int) -> int:
        l = int(l)
        if not 0 <= l < self.config.n_layer:
            raise InputError(f"layer {l} out of range [0, {self.config.n_layer})")
        return l

    def _check_expert(self, e: int) -> int:
        e = int(e)
        if not 0 <= e < self.config.n_expert:
            raise InputError(f"expert {e} out of range [0, {self.config.n_expert})")
        return e

    def expert_types(self, l: int) -> tuple[QT, QT]:
        """(gate/up type, down type) of layer l's experts."""
        l = self._check_layer(l)
        return (self.tensor_type(f"blk.{l}.ffn_gate_exps"),
                self.tensor_type(f"blk.{l}.ffn_down_exps"))

    def expert_blob_bytes(self, l: int) -> tuple[int, int]:
        """(gu_bytes, d_bytes): bytes of one expert's gate (= up) matrix and down matrix in
        layer l; the blob is gu_bytes + gu_bytes + d_bytes."""
        l = self._check_layer(l)
        gate = self.matrix(f"blk.{l}.ffn_gate_exps")
        down = self.matrix(f"blk.{l}.ffn_down_exps")
        return gate.matrix_bytes, down.matrix_bytes

    def expert_blob_size(self, l: int) -> int:
        """Bytes of one expert's blob [gate | up | down] in layer l: 2 * gu_bytes + d_bytes."""
        gu, d = self.expert_blob_bytes(l)
        return 2 * gu + d

    def expert_offsets(self, l: int, e: int) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
        """((gate_off, gate_len), (up_off, up_len), (down_off, down_len)): absolute file
        offsets and lengths of expert e's three slices in layer l."""
        l, e = self._check_layer(l), self._check_expert(e)
        gu, d = self.expert_blob_bytes(l)
        p = f"blk.{l}."
        return ((self.tensor_offset(p + "ffn_gate_exps") + e * gu, gu),
                (self.tensor_offset(p + "ffn_up_exps") + e * gu, gu),
                (self.tensor_offset(p + "ffn_down_exps") + e * d, d))

    def expert_parts(self, l: int, e: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Expert e's three matrices in layer l as uint8 views of the file (gate, up, down; no
        copy): what expert_blob joins, for callers that write them where they go directly."""
        l, e = self._check_layer(l), self._check_expert(e)
        p = f"blk.{l}."
        return tuple(self.matrix(p + n).data[e].reshape(-1) for n in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"))

    def expert_blob(self, l: int, e: int) -> np.ndarray:
        """uint8 [2*gu_bytes + d_bytes]: expert e's bytes [gate | up | down] (a copy)."""
        return np.concatenate(self.expert_parts(l, e))


# ---------------------------------------------------------------------------------------
# Validation


def _expected_shapes(cfg: ModelConfig, present: set[str], groups_of: dict[int, set[str]]) -> dict[str, list[int]]:
    """logical name -> ggml ne of every tensor a pack of this config must hold: the
    architecture's table (formats/archs), a model tensor of a group only where `present` holds
    its name (`output`: absent where the embeddings are tied), a block's group only where
    groups_of[layer] names it."""
    spec = cfg.spec
    ex: dict[str, list[int]] = {}
    for t in spec.MODEL_TENSORS:
        if t.group is None or t.name() in present:
            ex[t.name()] = t.shape(cfg)
    for l in range(cfg.n_layer):
        for t in spec.BLOCK_TENSORS:
            if t.group is None or t.group in groups_of.get(l, ()):
                ex[t.name(l)] = t.shape(cfg)
    return ex


def _arch_of(reader) -> Any:
    """The module of the file's architecture (formats/archs), None where it is absent, not a
    string or unknown (ModelConfig.from_metadata refuses it, named)."""
    f = reader.fields.get(ARCH_KEY)
    try:
        return archs.ARCHS.get(f.contents()) if f is not None else None
    except (UnicodeDecodeError, TypeError, ValueError, IndexError):
        return None


def tensor_kind(logical: str, spec) -> TensorSpec | None:
    """The table entry (formats/archs) of a logical name (`blk.3.attn_q`: ATTN_Q's weight,
    `blk.3.attn_q.bias` its bias), None for a tensor a pack of the architecture `spec` does not
    hold."""
    if logical.startswith("blk."):
        layer, _, rest = logical[4:].partition(".")
        if not layer.isdigit():
            return None
        return next((t for t in spec.BLOCK_TENSORS if t.part == rest), None)
    return next((t for t in spec.MODEL_TENSORS if t.name() == logical), None)


def allowed_types(kind: TensorSpec) -> tuple[QT, ...]:
    """The types the loader reads for a tensor of this kind: a float type for a vector (norms
    and gates), any registered quant type or a float type for a matrix (stacked experts
    included)."""
    return FLOAT_TYPES if kind.float_only else tuple(quants.SUPPORTED_TYPES) + FLOAT_TYPES


def folded(names: list[str]) -> str:
    """File names of logical names, a block tensor's layers folded into one name
    (`token_embd.weight, blk.{0,2,5..9}.attn_v.weight`), in the order they first appear."""
    layers: dict[str, list[int]] = {}
    for name in names:
        layer, _, rest = name[4:].partition(".")
        if name.startswith("blk.") and layer.isdigit():
            layers.setdefault("blk.{}." + rest, []).append(int(layer))
        else:
            layers.setdefault(name, [])
    return ", ".join(tn.file_name(pattern.format(_layer_set(ids)) if ids else pattern)
                     for pattern, ids in layers.items())


def by_type(named: list[tuple[str, str]]) -> str:
    """'Q6_K: token_embd.weight, blk.{0..47}.ffn_down_exps.weight; Q3_K: ...' from (logical
    name, type name) pairs: one group per type, in the order the types first appear, each
    group's names folded (:func:`folded`)."""
    groups: dict[str, list[str]] = {}
    for name, typ in named:
        groups.setdefault(typ, []).append(name)
    return "; ".join(f"{typ}: {folded(names)}" for typ, names in groups.items())


def _layer_set(ids: list[int]) -> str:
    """'3' for one layer, else '{0..47}' or '{0,2,5..9}' (runs of three or more as a..b)."""
    ids = sorted(set(ids))
    if len(ids) == 1:
        return str(ids[0])
    runs, start = [], 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or ids[i] != ids[i - 1] + 1:
            run = ids[start:i]
            runs += [f"{run[0]}..{run[-1]}"] if len(run) >= 3 else [str(x) for x in run]
            start = i
    return "{" + ",".join(runs) + "}"


def _type_problems(tensors: dict[str, Any], spec) -> list[str]:
    """The tensors of types the loader does not read, all of them, in one phrase grouped by
    type with the types each kind takes ([] if none): from the names and types alone, so it
    stands beside the metadata's problems whatever they are."""
    bad, kinds = [], set()
    for name, t in tensors.items():
        kind = tensor_kind(name, spec)
        if kind is None:
            continue  # not a tensor of the architecture: never read
        try:
            qt = QT(int(t.tensor_type))
        except ValueError:
            qt = None
        if qt not in allowed_types(kind):
            bad.append((name, _type_name(t.tensor_type)))
            kinds.add(kind.float_only)
    if not bad:
        return []
    takes = [f"{what} {', '.join(a.name for a in (FLOAT_TYPES if vec else tuple(quants.SUPPORTED_TYPES) + FLOAT_TYPES))}"
             for vec, what in ((False, "matrices"), (True, "norms and vectors")) if vec in kinds]
    return [f"{len(bad)} tensor{'s' * (len(bad) > 1)} of unsupported types ({by_type(bad)}); "
            f"supported: {'; '.join(takes)}"]


def _unknown_tensors(reader, spec) -> list[str]:
    """One phrase naming the file's tensors that a pack of the architecture `spec` does not
    hold ([] if none):
    a writer's mistake or a renamed tensor (an `output.weight` renamed would otherwise make
    the pack one of tied embeddings), refused as llama.cpp's loader refuses a tensor it does
    not create."""
    odd = [str(t.name) for t in reader.tensors
           if (logical := tn.logical_name(str(t.name))) is None or tensor_kind(logical, spec) is None]
    if not odd:
        return []
    shown = ", ".join(n[:64] for n in odd[:LAYOUT_SHOWN]) + (f" and {len(odd) - LAYOUT_SHOWN} more" if len(odd) > LAYOUT_SHOWN else "")
    return [f"{len(odd)} tensor{'s' * (len(odd) > 1)} a {spec.NAME} pack does not hold ({shown}; "
            f"formats/archs/{spec.__name__.rsplit('.', 1)[-1]}.py lists those it does)"]


def _validate(cfg: ModelConfig, tensors: dict[str, Any], unread: list[str] = (),
              where: str = "") -> ModelConfig:
    """Check names, shapes and block sizes; return the config completed from the tensors.
    Every problem found is listed in one PackError with `unread` (the tensors of unsupported
    types, _type_problems), `where` prefixed. Messages name tensors as the file does (with
    `.weight`)."""
    T, f, spec = tn.T, tn.file_name, cfg.spec
    embd = tn.name(T.TOKEN_EMBD)
    if embd not in tensors:
        raise PackError(where + "; ".join([f"missing tensor {f(embd)}", *unread]))
    n_vocab = cfg.n_vocab or _ne(tensors[embd])[-1]
    groups_of: dict[int, set[str]] = {}  # layer -> the groups of the table it holds a tensor of
    for l in range(cfg.n_layer):
        held = {t.group for t in spec.BLOCK_TENSORS if t.group and t.name(l) in tensors}
        if held:
            groups_of[l] = held
    shexp_layers = {l for l, held in groups_of.items() if "shexp" in held}
    n_ff_shexp = cfg.n_ff_shexp
    if shexp_layers and n_ff_shexp == 0:
        gate = tn.name(T.FFN_GATE_SHEXP, min(shexp_layers))
        if gate not in tensors:
            raise PackError(where + "; ".join([f"missing tensor {f(gate)}", *unread]))
        n_ff_shexp = _ne(tensors[gate])[-1]
    cfg = cfg.replace(n_vocab=n_vocab, n_ff_shexp=n_ff_shexp if shexp_layers else 0)
    expected = _expected_shapes(cfg, set(tensors), groups_of)
    quant_ok = tuple(quants.SUPPORTED_TYPES)
    missing, problems = [], []
    for name, ne in expected.items():
        t = tensors.get(name)
        if t is None:
            missing.append(name)
            continue
        got = _ne(t)
        if got != ne:
            problems.append(f"tensor {f(name)} has the wrong shape: expected {ne}, got {got}")
            continue
        try:
            qt = QT(int(t.tensor_type))
        except ValueError:
            qt = None
        if qt in quant_ok and qt in allowed_types(tensor_kind(name, spec)):
            vals, _ = quants.block_size(qt)
            if ne[0] % vals:
                problems.append(
                    f"tensor {f(name)}: rows of {ne[0]} values are not a multiple of the "
                    f"{qt.name} block size ({vals})")
    for l in range(cfg.n_layer):
        g, u = tensors.get(tn.name(T.FFN_GATE_EXP, l)), tensors.get(tn.name(T.FFN_UP_EXP, l))
        if g is not None and u is not None and int(g.tensor_type) != int(u.tensor_type):
            problems.append(
                f"blk.{l}: {g.name} ({_type_name(g.tensor_type)}) and {u.name} "
                f"({_type_name(u.tensor_type)}) must have the same type")
    if missing:
        problems.insert(0, f"missing tensor{'s' * (len(missing) > 1)} {folded(missing)}")
    problems += unread
    if problems:
        raise PackError(where + "; ".join(problems))
    first = {t: tensors[tn.name(t, 0)] for t in (T.FFN_GATE_EXP, T.FFN_DOWN_EXP, T.ATTN_Q)}
    return cfg.replace(
        expert_gu_type=QT(int(first[T.FFN_GATE_EXP].tensor_type)),
        expert_down_type=QT(int(first[T.FFN_DOWN_EXP].tensor_type)),
        dense_type=QT(int(first[T.ATTN_Q].tensor_type)),
    )
