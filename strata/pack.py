"""The pack loader: a qwen3moe GGUF file read in place.

`Pack.open(path)` memory-maps the file with `gguf.GGUFReader`, validates it (architecture,
every tensor present with the shape and a type the project supports, every tensor's data
inside the file) and exposes it as `QMatrix` views into the map: quantized tensors are never
copied. Float matrices (F32/F16/BF16) are converted once to Q8_0 with
`strata.quants.quantize_q8_0`, the same way for both implementations, and cached; norms stay
float32.

Shapes follow ggml: a tensor with ne = [n_cols, n_rows(, E)] holds rows of n_cols values;
its `QMatrix.data` is uint8 [n_rows, row_bytes] ([E, n_rows, row_bytes] for stacked experts).

Every problem a user can cause is a one-line `PackError` naming it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader

from strata import quants
from strata.config import ARCH, ModelConfig
from strata.errors import InputError, PackError

FLOAT_TYPES: tuple[QT, ...] = (QT.F32, QT.F16, QT.BF16)

# metadata keys of strata's own (written by make-pack)
KEY_FALLBACK = "strata.fallback"            # [str]: tensors written in the fallback type
KEY_FALLBACK_TYPE = "strata.fallback_type"  # str: that type
KEY_EXPERT_TYPE = "strata.expert_type"      # str: the expert type asked for
KEY_PRESET = "strata.preset"
KEY_SEED = "strata.seed"

_CONVERT_ROWS = 4096  # rows converted per slab (float -> Q8_0)


def _type_name(t: Any) -> str:
    try:
        return QT(t).name
    except (ValueError, TypeError):
        return str(t)


@dataclass(frozen=True)
class QMatrix:
    """A quantized matrix: `n_rows` rows of `n_cols` values in `qtype`.

    `data` is uint8 [n_rows, row_bytes], or [E, n_rows, row_bytes] for stacked experts; for
    quantized tensors it is a read-only view into the pack's memory map."""

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

    def dequantize(self) -> np.ndarray:
        """float32 [(E,) n_rows, n_cols]: codes times scales (strata.quants.dequantize)."""
        return quants.dequantize(self.qtype, self.data)


@dataclass(frozen=True)
class SharedExpert:
    gate_inp: QMatrix  # 1 row of n_embd values: the shared expert's gate
    gate: QMatrix      # [n_ff_shexp rows, n_embd]
    up: QMatrix        # [n_ff_shexp rows, n_embd]
    down: QMatrix      # [n_embd rows, n_ff_shexp]


@dataclass(frozen=True)
class Layer:
    """The tensors of block `index`. Matrices are QMatrix, norms float32 vectors."""

    index: int
    attn_norm: np.ndarray      # [n_embd]
    attn_q: QMatrix            # [n_head*head_dim rows, n_embd]
    attn_k: QMatrix            # [n_head_kv*head_dim rows, n_embd]
    attn_v: QMatrix            # [n_head_kv*head_dim rows, n_embd]
    attn_output: QMatrix       # [n_embd rows, n_head*head_dim]
    attn_q_norm: np.ndarray    # [head_dim]
    attn_k_norm: np.ndarray    # [head_dim]
    ffn_norm: np.ndarray       # [n_embd]
    ffn_gate_inp: QMatrix      # router: [n_expert rows, n_embd]
    ffn_gate_exps: QMatrix     # [E, n_ff_exp rows, n_embd]
    ffn_up_exps: QMatrix       # [E, n_ff_exp rows, n_embd]
    ffn_down_exps: QMatrix     # [E, n_embd rows, n_ff_exp]
    ffn_gate_inp_shexp: QMatrix | None = None  # 1 row of n_embd
    ffn_gate_shexp: QMatrix | None = None
    ffn_up_shexp: QMatrix | None = None
    ffn_down_shexp: QMatrix | None = None

    @property
    def has_shexp(self) -> bool:
        return self.ffn_gate_shexp is not None

    @property
    def shexp(self) -> SharedExpert | None:
        if not self.has_shexp:
            return None
        return SharedExpert(self.ffn_gate_inp_shexp, self.ffn_gate_shexp,
                            self.ffn_up_shexp, self.ffn_down_shexp)


# ---------------------------------------------------------------------------------------
# Reading


class _Truncated(Exception):
    def __init__(self, name: str, end: int, size: int):
        super().__init__(name, end, size)
        self.name, self.end, self.size = name, end, size


class _CheckedReader(GGUFReader):
    """GGUFReader that checks every tensor's data lies inside the file before it maps it
    (so a truncated pack is reported as such, not as a reshape error)."""

    def _build_tensors(self, start_offs, fields):  # noqa: D401 - gguf internal hook
        size = int(self.data.shape[0])
        for field in fields:
            try:
                _nl, name_data, _nd, dims, raw_dtype, offset_tensor = field.parts
                qt = QT(int(raw_dtype[0]))
                vals, nbytes = _gguf_sizes(qt)
                n_elems = int(np.prod(dims.astype(np.uint64), dtype=np.uint64))
                end = int(start_offs) + int(offset_tensor[0]) + n_elems * nbytes // vals
                name = bytes(name_data).decode("utf-8", "replace")
            except Exception:  # layout of gguf internals changed: fall back to gguf's checks
                break
            if end > size:
                raise _Truncated(name, end, size)
            if len(dims) and int(dims[0]) % vals:
                raise PackError(
                    f"tensor {name} ({qt.name}): rows of {int(dims[0])} values are not a "
                    f"multiple of the {qt.name} block size ({vals})")
        return super()._build_tensors(start_offs, fields)


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
    except PackError:
        raise
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


def _float_values(t) -> np.ndarray:
    """float32 values of an F32/F16/BF16 reader tensor, numpy shape (outer first)."""
    ne = _ne(t)
    shape = tuple(reversed(ne))
    qt = QT(t.tensor_type)
    if qt == QT.F32:
        return np.asarray(t.data, dtype=np.float32).reshape(shape)
    if qt == QT.F16:
        return np.asarray(t.data).view(np.float16).astype(np.float32).reshape(shape)
    if qt == QT.BF16:
        u16 = np.ascontiguousarray(t.data).view("<u2").astype(np.uint32)
        return (u16 << np.uint32(16)).view(np.float32).reshape(shape)
    raise AssertionError(qt)


# ---------------------------------------------------------------------------------------
# The pack


class Pack:
    """A validated qwen3moe pack, read in place. Use `Pack.open(path)`."""

    def __init__(self, path: Path, reader: GGUFReader, config: ModelConfig,
                 tensors: dict[str, Any], file_size: int):
        self.path = path
        self.reader = reader
        self.config = config
        self.file_size = file_size
        self._tensors = tensors
        self._matrices: dict[str, QMatrix] = {}
        self._vectors: dict[str, np.ndarray] = {}
        self._layers: dict[int, Layer] = {}

    # ---- opening -------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> "Pack":
        path = Path(path)
        reader = _open_reader(path)
        file_size = int(reader.data.shape[0])
        tensors = {t.name: t for t in reader.tensors}
        for t in reader.tensors:  # belt and braces: every tensor's data inside the file
            if t.data_offset + t.n_bytes > file_size:
                raise PackError(
                    f"truncated pack {path}: tensor {t.name} ends at byte "
                    f"{t.data_offset + t.n_bytes} but the file has {file_size} bytes")
        config = ModelConfig.from_metadata(reader.fields)
        config = _validate(config, tensors)
        return cls(path, reader, config, tensors, file_size)

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
        return default if f is None else f.contents()

    @property
    def fallbacks(self) -> list[str]:
        """Tensors make-pack wrote in the fallback type (`strata.fallback`), else []."""
        v = self.field(KEY_FALLBACK)
        return list(v) if v else []

    @property
    def fallback_type(self) -> str | None:
        return self.field(KEY_FALLBACK_TYPE)

    @property
    def tied_embeddings(self) -> bool:
        return "output" not in self._tensors

    def tensor_names(self) -> list[str]:
        return list(self._tensors)

    def tensor_type(self, name: str) -> QT:
        return QT(self._tensor(name).tensor_type)

    def tensor_offset(self, name: str) -> int:
        """Absolute file offset of a tensor's data."""
        return int(self._tensor(name).data_offset)

    def tensor(self, name: str):
        """The gguf ReaderTensor of `name` (its `.data` is the raw map view)."""
        return self._tensor(name)

    def _tensor(self, name: str):
        try:
            return self._tensors[name]
        except KeyError:
            raise PackError(f"missing tensor {name} in {self.path}") from None

    # ---- tensors -------------------------------------------------------------------
    def matrix(self, name: str) -> QMatrix:
        """A matrix (or stacked expert tensor) as QMatrix: a view into the map for
        quantized tensors; F32/F16/BF16 converted once to Q8_0 (quants.quantize_q8_0) and
        cached. A 1-D tensor is a 1-row matrix."""
        m = self._matrices.get(name)
        if m is not None:
            return m
        t = self._tensor(name)
        ne = _ne(t)
        n_cols = ne[0]
        n_rows = ne[1] if len(ne) > 1 else 1
        qt = QT(t.tensor_type)
        if qt in FLOAT_TYPES:
            vals = _float_values(t).reshape(-1, n_cols)
            out = np.empty((vals.shape[0], quants.row_bytes(QT.Q8_0, n_cols)), np.uint8)
            for r in range(0, vals.shape[0], _CONVERT_ROWS):
                out[r:r + _CONVERT_ROWS] = quants.quantize_q8_0(vals[r:r + _CONVERT_ROWS])
            out.flags.writeable = False
            shape = (*tuple(reversed(ne[2:])), n_rows, out.shape[-1])
            m = QMatrix(QT.Q8_0, n_rows, n_cols, out.reshape(shape))
        else:
            rb = quants.row_bytes(qt, n_cols)
            data = np.asarray(t.data).view(np.ndarray)
            shape = (*tuple(reversed(ne[2:])), n_rows, rb)
            m = QMatrix(qt, n_rows, n_cols, data.reshape(shape))
        self._matrices[name] = m
        return m

    def vector(self, name: str) -> np.ndarray:
        """float32 [n] of a 1-D float tensor (norms); read-only."""
        v = self._vectors.get(name)
        if v is None:
            t = self._tensor(name)
            v = np.array(_float_values(t).reshape(-1), dtype=np.float32)
            v.flags.writeable = False
            self._vectors[name] = v
        return v

    def embedding_rows(self, ids) -> np.ndarray:
        """float32 [T, n_embd]: rows `ids` of token_embd, dequantized exactly (codes times
        scales, strata.quants.dequantize); float embeddings are returned as stored (F16/BF16
        widened to float32), without the Q8_0 conversion `matrix` applies."""
        ids = np.asarray(ids)
        if ids.ndim != 1 or (ids.size and not np.issubdtype(ids.dtype, np.integer)):
            raise InputError(f"token ids must be a 1-D integer array, got {ids.dtype} {ids.shape}")
        ids = ids.astype(np.int64)
        n_vocab = self.config.n_vocab
        bad = (ids < 0) | (ids >= n_vocab)
        if bad.any():
            raise InputError(f"token id {int(ids[bad][0])} out of range [0, {n_vocab})")
        t = self._tensor("token_embd")
        qt = QT(t.tensor_type)
        if qt in FLOAT_TYPES:
            return np.ascontiguousarray(_float_values(t)[ids], dtype=np.float32)
        m = self.matrix("token_embd")
        return quants.dequantize(qt, m.data[ids]).astype(np.float32, copy=False)

    def output(self) -> QMatrix:
        """The lm_head: `output`, or `token_embd` when tied (no `output` tensor)."""
        return self.matrix("output" if "output" in self._tensors else "token_embd")

    def output_norm(self) -> np.ndarray:
        return self.vector("output_norm")

    def layer(self, l: int) -> Layer:
        """Block l's tensors (cached)."""
        l = self._check_layer(l)
        lay = self._layers.get(l)
        if lay is not None:
            return lay
        p = f"blk.{l}."
        m, v = self.matrix, self.vector
        kw: dict[str, Any] = {}
        if p + "ffn_gate_shexp" in self._tensors:
            kw = dict(
                ffn_gate_inp_shexp=m(p + "ffn_gate_inp_shexp"),
                ffn_gate_shexp=m(p + "ffn_gate_shexp"),
                ffn_up_shexp=m(p + "ffn_up_shexp"),
                ffn_down_shexp=m(p + "ffn_down_shexp"),
            )
        lay = Layer(
            index=l,
            attn_norm=v(p + "attn_norm"),
            attn_q=m(p + "attn_q"),
            attn_k=m(p + "attn_k"),
            attn_v=m(p + "attn_v"),
            attn_output=m(p + "attn_output"),
            attn_q_norm=v(p + "attn_q_norm"),
            attn_k_norm=v(p + "attn_k_norm"),
            ffn_norm=v(p + "ffn_norm"),
            ffn_gate_inp=m(p + "ffn_gate_inp"),
            ffn_gate_exps=m(p + "ffn_gate_exps"),
            ffn_up_exps=m(p + "ffn_up_exps"),
            ffn_down_exps=m(p + "ffn_down_exps"),
            **kw,
        )
        self._layers[l] = lay
        return lay

    def layers(self) -> Iterator[Layer]:
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

    def expert_offsets(self, l: int, e: int) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
        """((gate_off, gate_len), (up_off, up_len), (down_off, down_len)): absolute file
        offsets and lengths of expert e's three slices in layer l."""
        l, e = self._check_layer(l), self._check_expert(e)
        gu, d = self.expert_blob_bytes(l)
        p = f"blk.{l}."
        return ((self.tensor_offset(p + "ffn_gate_exps") + e * gu, gu),
                (self.tensor_offset(p + "ffn_up_exps") + e * gu, gu),
                (self.tensor_offset(p + "ffn_down_exps") + e * d, d))

    def expert_blob(self, l: int, e: int) -> np.ndarray:
        """uint8 [2*gu_bytes + d_bytes]: expert e's bytes [gate | up | down] (a copy)."""
        l, e = self._check_layer(l), self._check_expert(e)
        p = f"blk.{l}."
        parts = [self.matrix(p + n).data[e].reshape(-1)
                 for n in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")]
        return np.concatenate(parts)


# ---------------------------------------------------------------------------------------
# Validation


def _expected_shapes(cfg: ModelConfig, has_output: bool, shexp_layers: set[int]) -> dict[str, list[int]]:
    """name -> ggml ne of every tensor a pack of this config must hold."""
    E, D, F = cfg.n_expert, cfg.n_embd, cfg.n_ff_exp
    ex: dict[str, list[int]] = {
        "token_embd": [D, cfg.n_vocab],
        "output_norm": [D],
    }
    if has_output:
        ex["output"] = [D, cfg.n_vocab]
    for l in range(cfg.n_layer):
        p = f"blk.{l}."
        ex.update({
            p + "attn_norm": [D],
            p + "attn_q": [D, cfg.n_q],
            p + "attn_k": [D, cfg.n_kv],
            p + "attn_v": [D, cfg.n_kv],
            p + "attn_output": [cfg.n_q, D],
            p + "attn_q_norm": [cfg.head_dim],
            p + "attn_k_norm": [cfg.head_dim],
            p + "ffn_norm": [D],
            p + "ffn_gate_inp": [D, E],
            p + "ffn_gate_exps": [D, F, E],
            p + "ffn_up_exps": [D, F, E],
            p + "ffn_down_exps": [F, D, E],
        })
        if l in shexp_layers:
            S = cfg.n_ff_shexp
            ex.update({
                p + "ffn_gate_inp_shexp": [D],
                p + "ffn_gate_shexp": [D, S],
                p + "ffn_up_shexp": [D, S],
                p + "ffn_down_shexp": [S, D],
            })
    return ex


_VECTOR_SUFFIXES = ("_norm", "ffn_gate_inp_shexp")
_EXPERT_SUFFIXES = ("_exps",)


def _validate(cfg: ModelConfig, tensors: dict[str, Any]) -> ModelConfig:
    """Check names, shapes and types; return the config completed from the tensors."""
    if "token_embd" not in tensors:
        raise PackError("missing tensor token_embd")
    n_vocab = cfg.n_vocab or _ne(tensors["token_embd"])[-1]
    shexp_layers = {l for l in range(cfg.n_layer)
                    if any(f"blk.{l}.{n}" in tensors for n in
                           ("ffn_gate_inp_shexp", "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"))}
    n_ff_shexp = cfg.n_ff_shexp
    if shexp_layers and n_ff_shexp == 0:
        t = tensors.get(f"blk.{min(shexp_layers)}.ffn_gate_shexp")
        if t is None:
            raise PackError(f"missing tensor blk.{min(shexp_layers)}.ffn_gate_shexp")
        n_ff_shexp = _ne(t)[-1]
    cfg = cfg.replace(n_vocab=n_vocab, n_ff_shexp=n_ff_shexp if shexp_layers else 0)
    expected = _expected_shapes(cfg, "output" in tensors, shexp_layers)
    quant_ok = tuple(quants.SUPPORTED_TYPES)

    for name, ne in expected.items():
        t = tensors.get(name)
        if t is None:
            raise PackError(f"missing tensor {name}")
        got = _ne(t)
        if got != ne:
            raise PackError(f"tensor {name} has the wrong shape: expected {ne}, got {got}")
        try:
            qt = QT(int(t.tensor_type))
        except ValueError:
            qt = None
        is_vector = name.endswith(_VECTOR_SUFFIXES)
        is_expert = name.endswith(_EXPERT_SUFFIXES)
        if is_vector:
            allowed = FLOAT_TYPES
        elif is_expert:
            allowed = quant_ok
        else:
            allowed = quant_ok + FLOAT_TYPES
        if qt not in allowed:
            what = ("norms/vectors" if is_vector else "expert tensors" if is_expert else "matrices")
            raise PackError(
                f"tensor {name} has unsupported type {_type_name(t.tensor_type)} "
                f"(supported for {what}: {', '.join(a.name for a in allowed)})")
        if qt in quant_ok:
            vals, _ = quants.block_size(qt)
            if ne[0] % vals:
                raise PackError(
                    f"tensor {name}: rows of {ne[0]} values are not a multiple of the "
                    f"{qt.name} block size ({vals})")
        elif not is_vector and ne[0] % 32:
            raise PackError(
                f"tensor {name}: rows of {ne[0]} values cannot be converted to Q8_0 "
                f"(not a multiple of 32)")
    for l in range(cfg.n_layer):
        g, u = tensors[f"blk.{l}.ffn_gate_exps"], tensors[f"blk.{l}.ffn_up_exps"]
        if int(g.tensor_type) != int(u.tensor_type):
            raise PackError(
                f"blk.{l}: ffn_gate_exps ({_type_name(g.tensor_type)}) and ffn_up_exps "
                f"({_type_name(u.tensor_type)}) must have the same type")
    return cfg.replace(
        expert_gu_type=QT(int(tensors["blk.0.ffn_gate_exps"].tensor_type)),
        expert_down_type=QT(int(tensors["blk.0.ffn_down_exps"].tensor_type)),
        dense_type=QT(int(tensors["blk.0.attn_q"].tensor_type)),
    )
