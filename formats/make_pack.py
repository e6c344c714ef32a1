"""Synthetic packs: real GGUF files of an architecture of formats/archs (a preset's), with random
but valid blocks.

`make_pack(path, preset, ...)` writes a file that gguf-py opens, with the tensor names
llama.cpp's converters write (gguf-py's own tables, strata_prefill.formats.tensor_names: `token_embd.weight`,
`blk.0.ffn_gate_exps.weight`, ...) and the shapes and metadata keys its loader of the
architecture reads (the architecture's table and `write_metadata`, formats/archs),
deterministic for a seed:

- every tensor's values come from its own generators, derived from (seed, tensor name, chunk)
  where a chunk is one expert of a stacked expert tensor or a fixed slab of rows of another
  tensor, so the bytes do not depend on write order or on anything else in the file;
- the file is written streaming: the header (metadata and tensor infos) with
  `gguf.GGUFWriter`, then each tensor's data chunk by chunk at its aligned offset. No
  tensor is ever held whole in memory.

Types. Expert gate/up/down in the chosen expert type, except where a matrix's rows (n_cols)
are not a multiple of the type's block: the K-quants and the IQ types but IQ4_NL have
256-value blocks (NVFP4 64-value ones), and a matrix whose rows are not a multiple of 256 (the
`strata` preset's down projection, rows of 640; the `small` preset's, 384) falls back to
`FALLBACK_TYPE` = Q8_0 (llama.cpp's quantizer falls back too, to IQ4_NL or Q5_x by the type
asked; a mix, below, takes its choices, a single expert type the one fallback). IQ4_NL, MXFP4
(32-value blocks) and NVFP4 fit those rows and never fall back. The fallback is recorded in the pack
(`strata.fallback`: the tensor names; `strata.fallback_type`) and `info` shows it. Float
expert types (F16, BF16, F32: EXPERT_TYPES) have no blocks and never fall back; their values
are drawn as the float dense matrices' are.
Attention matrices, shared-expert matrices, token_embd and output are in the dense type
(any registered quant type, F16, BF16 or F32; a quant type whose block does not divide a dense
matrix's rows is refused, naming them: the dense matrices never fall back); norms are F32
around 1.0. A mix (`mix="Q4_K_M"`, `"Q2_K"`, `"IQ4_XS"`, `"IQ2_XXS"` or `"IQ1_S"`: strata_prefill.formats.mixes.MIXES) instead gives every matrix the
type llama-quantize picks for that file type, its own fallbacks included (Q4_0, Q5_0, Q5_1,
Q8_0: not recorded as make-pack fallbacks, they are the mix's), and records `strata.mix`. The router (`ffn_gate_inp`) is in the
router type: F32 by default, as llama.cpp's converters keep it, BF16 for the `strata` preset
(Strata keeps its router in BF16), or Q8_0; the shared expert's gate vector
(`ffn_gate_inp_shexp`, a norm-like vector that must be float) follows a float router type and
is F32 beside a Q8_0 router. Float matrices are multiplied in their own precision
(strata_prefill.contract.dense). The pack records `strata.pack_format` (strata_prefill.contract.constants.PACK_FORMAT).

What wrote it and a digest of its data. `strata.writer` says what wrote the pack
("strata-prefill 0.1.0 make-pack": the program, its version and the command, never a time,
a host or a path, so two runs with the same arguments write the same bytes, which the gate's
kept packs and the reference cache rely on). `strata.tensor_digests` holds each tensor's
sha256 and `strata.tensor_digest` one over those (strata_prefill.formats.pack.tensor_digest_root), for
`Pack.check_digest` / `info --check`. The header precedes the data, so the digests are
reserved in it as placeholders of their exact length (64 hex digits each), computed as each
tensor's bytes are written, and patched in place in the temp file before it replaces the
target: the data is generated once.

Atomic. The pack is written to a temp of this process's own beside OUT (strata_prefill.formats.atomic) and
renamed onto OUT at the end: a reader sees the old file or the new one whole; a failure,
Ctrl-C, SIGTERM or SIGHUP removes the temp; two runs writing one OUT end with one whole pack
of one of them, and the one that finishes second says it replaced the other's.

Scales, chosen so a forward pass stays well-scaled over 48 layers: input projections have
std clip(1/sqrt(n_cols), 0.02, 0.05), output projections (attn_output, ffn_down*) half of
1/sqrt(n_cols) clipped likewise; the router std 2/sqrt(n_embd) gives router logits of std
about 2 (routing neither uniform nor one-hot); token_embd std 0.5; norms 1 + 0.1 N(0,1).
"""
from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import io
import os
import shutil
import struct
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType, GGUFWriter
from gguf.gguf_writer import WriterState

from strata_prefill.contract import dense, quants
from strata_prefill.formats import tensor_names as tn
from strata_prefill.formats.atomic import AtomicFile
from strata_prefill.formats.config import PRESETS, ModelConfig, RopeScaling
from strata_prefill.formats.progress import Progress
from strata_prefill.contract.constants import PACK_FORMAT
from strata_prefill.contract.errors import InputError
from strata_prefill.formats.mixes import MIXES, file_type, mix_types, parse_mix
from strata_prefill.formats.pack import (KEY_EXPERT_TYPE, KEY_FALLBACK, KEY_FALLBACK_TYPE, KEY_MIX, KEY_PACK_FORMAT,
                         KEY_PRESET, KEY_ROUTER_TYPE, KEY_SEED, KEY_TENSOR_DIGEST,
                         KEY_TENSOR_DIGESTS, KEY_WRITER, folded, tensor_digest_root)

FALLBACK_TYPE = QT.Q8_0
#: the routed experts' types: the quantized ones of the registry, then the float ones (multiplied
#: in float32 on their unquantized rows, docs/numerics.md section 6)
EXPERT_TYPES: tuple[QT, ...] = (*quants.SUPPORTED_TYPES, QT.F16, QT.BF16, QT.F32)
#: attention, shared-expert, token_embd and output matrices: every registered quant type (Q8_0
#: first, the default), then the float ones
DENSE_TYPES: tuple[QT, ...] = (*quants.SUPPORTED_TYPES, QT.F16, QT.BF16, QT.F32)
ROUTER_TYPES: tuple[QT, ...] = (QT.F32, QT.BF16, QT.Q8_0)
ROUTER_TYPE_DEFAULT = QT.F32
PRESET_ROUTER_TYPE = {"strata": QT.BF16}  # presets whose router is not ROUTER_TYPE_DEFAULT
#: presets whose experts are not Q8_0 by default: gpt-oss's released experts are MXFP4
PRESET_EXPERT_TYPE = {"gpt-oss-20b": QT.MXFP4, "gpt-oss-tiny": QT.MXFP4}
PROGRESS_MIN_BYTES = 50 * 1024 * 1024  # show a progress bar (on a terminal) from this size
DISK_MARGIN_BYTES = 64 * 1024 * 1024  # left free on the disk after a pack (or 2%, the larger)
SLAB_VALUES = 1 << 22  # values per generated slab of a non-expert tensor (fixed: part of the seed)
EMBD_STD = 0.5
NORM_STD = 0.1
BIAS_STD = 0.1  # biases (q/k/v/o, router, experts): small beside the products they shift
SINK_STD = 1.0  # attention sinks: logits on the scale of a head's scores
DIGEST_PLACEHOLDER = "0" * 64  # a sha256 in hex, reserved in the header until the data is written


def writer_name() -> str:
    """`strata.writer`: the program and its installed version (pyproject.toml's), the command."""
    try:
        version = importlib.metadata.version("strata-prefill")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout that is not installed
        version = "(not installed)"
    return f"strata-prefill {version} make-pack"


def parse_qtype(name: Any, allowed: tuple[QT, ...], what: str) -> QT:
    """A type name ('Q8_0', 'iq2_xs') or GGMLQuantizationType, checked against `allowed`."""
    if isinstance(name, QT):
        qt = name
    else:
        try:
            qt = QT[str(name).upper()]
        except KeyError:
            qt = None
    if qt not in allowed:
        raise InputError(
            f"unsupported {what} {getattr(name, 'name', name)} "
            f"(supported: {', '.join(t.name for t in allowed)})")
    return qt


def expert_types(cfg: ModelConfig, expert_type: Any) -> tuple[QT, QT, list[str]]:
    """(gate/up type, down type, names of the matrices that fell back) for a config."""
    qt = parse_qtype(expert_type, EXPERT_TYPES, "expert type")
    vals = 1 if dense.is_float(qt) else quants.block_size(qt)[0]  # a float row has no blocks
    gu = qt if cfg.n_embd % vals == 0 else FALLBACK_TYPE
    down = qt if cfg.n_ff_exp % vals == 0 else FALLBACK_TYPE
    fell = [n for n, t in (("ffn_gate_exps", gu), ("ffn_up_exps", gu), ("ffn_down_exps", down))
            if t != qt]
    return gu, down, fell


# ---------------------------------------------------------------------------------------
# Deterministic generators


def tensor_rng(seed: int, name: str, chunk: int) -> np.random.Generator:
    """The generator of chunk `chunk` of tensor `name`: a function of (seed, name, chunk)."""
    digest = hashlib.blake2b(name.encode("utf-8"), digest_size=16).digest()
    words = [int(w) for w in np.frombuffer(digest, dtype="<u4")]
    return np.random.default_rng(np.random.SeedSequence([int(seed), *words, int(chunk)]))


def _nbytes(qt: QT, n_values: int, n_cols: int) -> int:
    if qt in (QT.F32,):
        return 4 * n_values
    if qt in (QT.F16, QT.BF16):
        return 2 * n_values
    return n_values // n_cols * quants.row_bytes(qt, n_cols)


@dataclass
class _Plan:
    """One tensor to write: numpy shape (outer first; ggml ne reversed)."""

    name: str
    qtype: QT
    shape: tuple[int, ...]
    kind: str        # "normal" (float values N(mean, std)) or "blocks" (random valid blocks)
    std: float
    mean: float = 0.0

    @property
    def n_cols(self) -> int:
        return self.shape[-1]

    @property
    def n_values(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return _nbytes(self.qtype, self.n_values, self.n_cols)

    def chunks(self, seed: int) -> Iterator[Callable[[], np.ndarray]]:
        """The tensor's bytes as chunk makers (one expert, or one slab of rows), in order;
        each is a function of (seed, name, chunk index) only, so they may run anywhere."""
        n_rows_total = self.n_values // self.n_cols
        if len(self.shape) == 3:  # stacked experts: one chunk per expert
            rows_per_chunk = self.shape[1]
        else:
            rows_per_chunk = max(1, SLAB_VALUES // self.n_cols)
        n_chunks = -(-n_rows_total // rows_per_chunk)
        for c in range(n_chunks):
            rows = min(rows_per_chunk, n_rows_total - c * rows_per_chunk)
            yield functools.partial(self._make_chunk, seed, c, rows)

    def _make_chunk(self, seed: int, c: int, rows: int) -> np.ndarray:
        rng = tensor_rng(seed, self.name, c)
        n = rows * self.n_cols
        if self.kind == "normal" or self.qtype in (QT.F32, QT.F16, QT.BF16):
            x = rng.standard_normal(n, dtype=np.float32)
            x *= np.float32(self.std)
            x += np.float32(self.mean)
            if self.qtype == QT.Q8_0:
                return quants.quantize_q8_0(x.reshape(rows, self.n_cols)).reshape(-1)
            return dense.encode_float(x, self.qtype)
        vals, _ = quants.block_size(self.qtype)
        return quants.random_blocks(self.qtype, n // vals, rng, std=self.std).reshape(-1)


def _in_std(n_cols: int) -> float:
    return float(np.clip(1.0 / np.sqrt(n_cols), 0.02, 0.05))


def _out_std(n_cols: int) -> float:
    return float(np.clip(0.5 / np.sqrt(n_cols), 0.02, 0.05))


def plan_tensors(cfg: ModelConfig, gu_type: QT, down_type: QT, dense_type: QT,
                 tie_embeddings: bool = False, router_type: QT = ROUTER_TYPE_DEFAULT,
                 types: dict[str, QT] | None = None) -> list[_Plan]:
    """Every tensor of a pack, in file order, by logical name (tensor_names.name). types:
    {logical name: type} of the matrices whose type is their own (a mix, strata_prefill.formats.mixes); the
    others as the arguments say."""
    spec = cfg.spec
    type_of = {"embd": dense_type, "dense": dense_type, "norm": QT.F32, "bias": QT.F32, "sinks": QT.F32,
               "expert_bias": QT.F32, "router": router_type,
               "gate": router_type if router_type in (QT.F32, QT.BF16) else QT.F32,
               "expert_gu": gu_type, "expert_down": down_type}
    # the optional groups of the table (formats/archs/spec.py) written: the lm_head unless tied,
    # the shared expert where the config has one
    groups = {"output": not tie_embeddings, "shexp": cfg.has_shexp}

    def plan(t, name: str) -> _Plan:
        ne = t.shape(cfg)
        shape, n_cols = tuple(reversed(ne)), ne[0]
        kind, std, mean = {"norm": ("normal", NORM_STD, 1.0), "gate": ("normal", 2.0 / np.sqrt(n_cols), 0.0),
                           "bias": ("normal", BIAS_STD, 0.0), "sink": ("normal", SINK_STD, 0.0),
                           "embd": ("blocks", EMBD_STD, 0.0), "in": ("blocks", _in_std(n_cols), 0.0),
                           "out": ("blocks", _out_std(n_cols), 0.0)}[t.fill]
        return _Plan(name, type_of[t.role], shape, kind, std, mean)

    plans = [plan(t, t.name()) for t in spec.MODEL_TENSORS if t.group is None or groups[t.group]]
    for l in range(cfg.n_layer):
        plans += [plan(t, t.name(l)) for t in spec.BLOCK_TENSORS if t.group is None or groups[t.group]]
    for p in plans if types else ():
        p.qtype = types.get(p.name, p.qtype)
    return plans


@dataclass(frozen=True)
class PackTypes:
    """The types of a pack make_pack writes, resolved from its arguments (pack_types)."""

    expert: QT  # the experts' type asked (a mix's base type)
    dense: QT  # the dense matrices' type asked (a mix's base type)
    router: QT
    gu: QT  # layer 0's expert gate/up and down types (the latter after a fallback)
    down: QT
    fell: tuple[str, ...]  # the expert matrices that fell back to FALLBACK_TYPE, by kind
    mix: str | None = None  # the llama-quantize mix (strata_prefill.formats.mixes), or None
    per_tensor: dict | None = None  # a mix's {logical name: type}


def pack_types(config: ModelConfig, preset: str, expert_type: Any = None, dense_type: Any = None,
               router_type: Any = None, mix: Any = None, tie_embeddings: bool = False) -> PackTypes:
    """make_pack's types: the expert, dense and router types asked (None: Q8_0, Q8_0 and the
    preset's router type), or a mix, which sets every matrix's type (an expert type, if given,
    must be the mix's base type; a dense type may not be given). A dense type whose block does
    not divide a dense matrix's rows is refused, naming them (only the experts fall back, and a
    mix as llama-quantize does)."""
    rt = parse_qtype(PRESET_ROUTER_TYPE.get(preset, ROUTER_TYPE_DEFAULT) if router_type is None
                     else router_type, ROUTER_TYPES, "router type")
    if mix is not None:
        mix = parse_mix(mix)
        base = MIXES[mix]
        if dense_type is not None:
            raise InputError(f"--mix {mix} sets the dense matrices' types: give no --dense-type")
        if expert_type is not None and parse_qtype(expert_type, EXPERT_TYPES, "expert type") != base:
            raise InputError(f"--mix {mix} writes its experts in {base.name} (and its own types): "
                             f"give no other --expert-type")
        per = mix_types(config, mix, tie_embeddings)
        gu, down = per[tn.name(tn.T.FFN_GATE_EXP, 0)], per[tn.name(tn.T.FFN_DOWN_EXP, 0)]
        return PackTypes(base, base, rt, gu, down, (), mix, per)
    xt = parse_qtype(PRESET_EXPERT_TYPE.get(preset, QT.Q8_0) if expert_type is None else expert_type,
                     EXPERT_TYPES, "expert type")
    dt = parse_qtype("Q8_0" if dense_type is None else dense_type, DENSE_TYPES, "dense type")
    if not dense.is_float(dt):
        vals = quants.block_size(dt)[0]
        one = plan_tensors(config.replace(n_layer=1), xt, xt, dt, tie_embeddings, rt)  # shapes: any layer's
        bad = [p.name for p in one
               if p.qtype == dt and p.kind == "blocks" and p.n_cols % vals and not p.name.endswith("_exps")]
        if bad:
            bad = [n for n in bad if not n.startswith("blk.")] + [
                n.replace("blk.0.", f"blk.{l}.", 1) for l in range(config.n_layer) for n in bad if n.startswith("blk.")]
            raise InputError(f"dense type {dt.name}: the rows of {folded(bad)} are not a multiple of its "
                             f"{vals}-value block (a 32-value type, or --mix, fits them)")
    gu, down, fell = expert_types(config, xt)
    return PackTypes(xt, dt, rt, gu, down, tuple(fell))


# ---------------------------------------------------------------------------------------
# Writing


def _add_metadata(w: GGUFWriter, cfg: ModelConfig, preset: str, seed: int, expert_type: QT,
                  dense_type: QT, router_type: QT, fallbacks: list[str], n_tensors: int,
                  mix: str | None = None) -> None:
    w.add_name(f"strata synthetic {preset}")
    w.add_type("model")
    w.add_quantization_version(2)
    cfg.spec.write_metadata(w, cfg)  # the architecture's hyperparameters (formats/archs)
    w.add_string("tokenizer.ggml.model", "none")
    w.add_string(KEY_PRESET, preset)
    w.add_uint64(KEY_SEED, int(seed))
    w.add_string(KEY_EXPERT_TYPE, expert_type.name)
    w.add_string("strata.dense_type", dense_type.name)
    w.add_string(KEY_ROUTER_TYPE, router_type.name)
    if mix is not None:  # a pack of no mix keeps the header it always had
        w.add_string(KEY_MIX, mix)
        w.add_file_type(int(file_type(mix)))  # general.file_type, as llama-quantize records it
    w.add_uint32(KEY_PACK_FORMAT, PACK_FORMAT)
    if fallbacks:
        w.add_string(KEY_FALLBACK_TYPE, FALLBACK_TYPE.name)
        w.add_array(KEY_FALLBACK, list(fallbacks))
    w.add_string(KEY_WRITER, writer_name())
    w.add_string(KEY_TENSOR_DIGEST, DIGEST_PLACEHOLDER)
    w.add_array(KEY_TENSOR_DIGESTS, [DIGEST_PLACEHOLDER] * n_tensors)


class _HeaderSizer(GGUFWriter):
    """A GGUFWriter that writes its header into memory: the header's exact bytes, made by the
    code that writes every GGUF file (make_pack writes them to the pack itself)."""

    def open_output_file(self, path: Path | None = None) -> None:
        self.fout = [io.BytesIO()]
        self.state = WriterState.EMPTY


def _render_header(w: GGUFWriter) -> bytes:
    """The header of the pack `w` (metadata and tensor infos added) describes."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    return w.fout[0].getvalue()


def _file_size(header_bytes: int, align: int, plans: list[_Plan]) -> int:
    """Bytes of the pack: the header, then each tensor's data at its aligned offset, the last
    one padded too."""
    pos = header_bytes
    for p in plans:
        pos += -pos % align + p.nbytes
    return pos + -pos % align


def _kv_value_offset(header: bytes, key: str) -> int:
    """Offset in `header` of the value of metadata key `key` (just past its type)."""
    k = key.encode("utf-8")
    tag = struct.pack("<Q", len(k)) + k
    at = header.find(tag)
    if at < 0 or header.find(tag, at + 1) >= 0:  # pragma: no cover - the writer's layout changed
        raise AssertionError(f"metadata key {key} not found once in the header")
    return at + len(tag) + 4  # u32 value type


def digest_slots(header: bytes, n_tensors: int) -> tuple[int, list[int]]:
    """Offsets of the reserved digests in `header`: (the root's, each tensor's), each
    checked to hold DIGEST_PLACEHOLDER (a GGUF string: u64 length, then the bytes)."""
    ph = DIGEST_PLACEHOLDER.encode()
    item = 8 + len(ph)
    root = _kv_value_offset(header, KEY_TENSOR_DIGEST) + 8
    arr = _kv_value_offset(header, KEY_TENSOR_DIGESTS)
    sub, count = struct.unpack_from("<IQ", header, arr)
    if sub != GGUFValueType.STRING or count != n_tensors:  # pragma: no cover - layout changed
        raise AssertionError(f"{KEY_TENSOR_DIGESTS}: unexpected array header")
    slots = [arr + 12 + i * item + 8 for i in range(n_tensors)]
    for off in [root, *slots]:
        if header[off - 8:off + len(ph)] != struct.pack("<Q", len(ph)) + ph:  # pragma: no cover
            raise AssertionError("a reserved digest is not where the header layout puts it")
    return root, slots


def check_free_disk(path: Path, size: int) -> None:
    """Refuse (one line) a pack of `size` bytes the disk under `path` cannot hold with room to
    spare (the file is written beside its target first, so a replaced pack frees nothing)."""
    folder = path.parent
    free = shutil.disk_usage(folder).free
    margin = max(DISK_MARGIN_BYTES, size // 50)
    if free < size + margin:
        raise InputError(
            f"not enough free disk for {path}: the pack takes {size:,} bytes "
            f"({size / 2**30:.2f} GiB) and {margin / 2**20:.0f} MiB should stay free, but "
            f"{folder} has {free:,} bytes ({free / 2**30:.2f} GiB) free")


def _ahead(pool: ThreadPoolExecutor, makers: Iterator[Callable[[], np.ndarray]],
           depth: int) -> Iterator[np.ndarray]:
    """Run chunk makers on the pool, at most `depth` ahead of the consumer, in order."""
    pending: deque = deque()
    for make in makers:
        pending.append(pool.submit(make))
        if len(pending) >= depth:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


def make_pack(path: str | os.PathLike[str], preset: str = "tiny", layers: int | None = None,
              expert_type: Any = None, seed: int = 0, dense_type: Any = None,
              tie_embeddings: bool = False, progress: bool | None = None,
              config: ModelConfig | None = None, workers: int | None = None,
              on_size: Callable[[int], None] | None = None, router_type: Any = None,
              rope_scaling: RopeScaling | None = None, mix: str | None = None) -> Path:
    """Write a synthetic pack of `preset` (or of `config`, named `preset`) to `path`.

    layers: override the preset's layer count; expert_type: one of EXPERT_TYPES (by name or
    enum; None: Q8_0); dense_type: one of DENSE_TYPES (None: Q8_0); mix: a llama-quantize
    mix of strata_prefill.formats.mixes.MIXES, which sets every matrix's type (pack_types
    says which arguments it takes with it); router_type: F32, BF16 or Q8_0
    (None: BF16 for the `strata` preset, else F32); progress: a tqdm bar on stderr naming
    the tensor being written (None: for packs over 50 MB, where stderr is a terminal, else a
    line every 10 s; formats/progress.py); workers: threads
    generating chunks ahead of the writer (default: the CPU count, at most 4; the bytes do
    not depend on it); on_size: called with the file's exact size once the (empty) temp is
    open, before any byte is written. A pack the disk cannot hold (check_free_disk) is
    refused before anything is written. Written atomically (strata_prefill.formats.atomic: a temp of this
    process's beside `path`, renamed onto it at the end, removed on any failure or SIGTERM /
    SIGHUP), so no half pack is ever left at `path`. rope_scaling: a strata_prefill.formats.config.RopeScaling
    written as the pack's rope.scaling keys (None: the preset's or config's, unscaled for
    every preset). Returns the path."""
    if config is None:
        if preset not in PRESETS:
            raise InputError(f"unknown preset {preset!r} (presets: {', '.join(PRESETS)})")
        config = PRESETS[preset]
    if layers is not None:
        if int(layers) < 1:
            raise InputError(f"--layers must be at least 1, got {layers}")
        config = config.replace(n_layer=int(layers))
    if int(seed) < 0:
        raise InputError(f"--seed must be non-negative, got {seed}")
    if rope_scaling is not None:
        # written as the rope.scaling keys (_add_metadata); refused here, not when read back
        config = config.replace(rope_scaling=rope_scaling)
        bad = config.problems()
        if bad:
            raise InputError("--rope-scaling: " + "; ".join(bad))
    ty = pack_types(config, preset, expert_type, dense_type, router_type, mix, tie_embeddings)
    xt, dt, rt = ty.expert, ty.dense, ty.router
    config = config.replace(expert_gu_type=ty.gu, expert_down_type=ty.down, dense_type=dt)
    fallbacks = [f"blk.{l}.{n}" for l in range(config.n_layer) for n in ty.fell]
    plans = plan_tensors(config, ty.gu, ty.down, dt, tie_embeddings, rt, ty.per_tensor)

    workers = max(1, int(workers or min(4, os.cpu_count() or 1)))
    path = Path(path)
    total = sum(p.nbytes for p in plans)
    if progress is None and total <= PROGRESS_MIN_BYTES:
        progress = False  # None: a bar on a terminal, else a line every 10 s (formats/progress.py)

    def described(w: GGUFWriter) -> GGUFWriter:
        _add_metadata(w, config, preset, int(seed), xt, dt, rt, fallbacks, len(plans), ty.mix)
        for p in plans:
            # dtype float32 with raw_dtype set: the writer takes the shape as element counts
            w.add_tensor_info(tn.file_name(p.name), p.shape, np.dtype(np.float32), p.nbytes, raw_dtype=p.qtype)
        return w

    sizer = described(_HeaderSizer(None, config.arch))
    header = _render_header(sizer)
    align = sizer.data_alignment
    size = _file_size(len(header), align, plans)
    root_slot, slots = digest_slots(header, len(plans))
    with AtomicFile(path) as out:
        if on_size is not None:
            on_size(size)
        check_free_disk(path, size)
        fout = out.file
        fout.write(header)
        bar = Progress(total, f"writing {path.name}", "B", progress, unit_scale=True,
                       unit_divisor=1024)
        digests: list[bytes] = []
        try:
            pos = len(header)
            with ThreadPoolExecutor(max_workers=workers) as pool:
                for p in plans:
                    bar.at(p.name)
                    pad = -pos % align
                    if pad:
                        fout.write(bytes(pad))
                        pos += pad
                    written = 0
                    h = hashlib.sha256()
                    for chunk in _ahead(pool, p.chunks(seed), 2 * workers):
                        view = memoryview(np.ascontiguousarray(chunk)).cast("B")
                        fout.write(view)
                        h.update(view)
                        written += chunk.nbytes
                        bar.step(chunk.nbytes)
                    if written != p.nbytes:  # pragma: no cover - plan and generator disagree
                        raise AssertionError(f"{p.name}: wrote {written} bytes, planned {p.nbytes}")
                    digests.append(h.digest())
                    pos += written
            pad = -pos % align
            if pad:
                fout.write(bytes(pad))
        finally:
            bar.close()
        for off, hexdigest in [(root_slot, tensor_digest_root(digests)),
                               *zip(slots, (d.hex() for d in digests))]:
            fout.seek(off)
            fout.write(hexdigest.encode())
    return path


def timed_make_pack(*args: Any, **kwargs: Any) -> tuple[Path, float]:
    """make_pack, returning (path, seconds)."""
    t0 = time.perf_counter()
    out = make_pack(*args, **kwargs)
    return out, time.perf_counter() - t0
