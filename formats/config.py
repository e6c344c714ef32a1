"""Model configuration of a pack: its architecture, dimensions, expert counts, types.

`ModelConfig.from_metadata` picks the pack's architecture (`general.architecture`) from the
registry (formats/archs), reads the metadata keys its module names (those llama.cpp's loader of
that architecture reads) and refuses, in one line, every value no path of the project can run (`ModelConfig.problems`, the
limits of contract/limits.py) and, given the file's tensor shapes, a layer count or vocabulary
the tensors contradict. `PRESETS` are the shapes `make-pack` writes.
"""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
from gguf import GGMLQuantizationType as QT

from strata_prefill.formats import archs
from strata_prefill.contract import limits, moe
from strata_prefill.contract.errors import PackError

ARCH_KEY = "general.architecture"
ROPE_SCALING_TYPES = ("none", "linear", "yarn")
TOKENS_KEY = "tokenizer.ggml.tokens"
_BLOCK = re.compile(r"blk\.(\d+)\.")


@dataclass(frozen=True)
class RopeScaling:
    """How the RoPE table is scaled (contract/numerics.py:rope_table, docs/numerics.md "RoPE
    scaling"), as llama.cpp runs it for the architectures of formats/archs. Fields a type does
    not use hold their defaults: factor is 1 for ``none``, original_context 0 unless ``yarn``.
    ext_factor and the betas are llama.cpp's fixed values (1 for yarn, 32 and 1)."""
    type: str = "none"
    factor: float = 1.0
    original_context: int = 0
    attn_factor: float = 1.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0

    @property
    def ext_factor(self) -> float:
        return 1.0 if self.type == "yarn" else 0.0

    def __str__(self) -> str:
        """make-pack --rope-scaling's spelling: none, linear:FACTOR or yarn:FACTOR:ORIG_CTX (plus
        :attn_factor when it is not 1)."""
        if self.type == "none":
            return "none"
        bits = [self.type, f"{self.factor:g}"] + ([str(self.original_context)] if self.type == "yarn" else [])
        return ":".join(bits + ([f"{self.attn_factor:g}"] if self.attn_factor != 1.0 else []))


@dataclass(frozen=True)
class ModelConfig:
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_expert: int
    n_expert_used: int
    n_ff_exp: int
    n_ff_shexp: int  # 0: no shared expert
    n_vocab: int
    rms_eps: float = 1e-6
    rope_base: float = 1e6
    context_length: int = 32768
    rope_scaling: RopeScaling = RopeScaling()
    expert_gu_type: QT = QT.Q8_0    # type of ffn_gate_exps / ffn_up_exps (layer 0)
    expert_down_type: QT = QT.Q8_0  # type of ffn_down_exps (layer 0)
    dense_type: QT = QT.Q8_0        # type of the attention matrices (layer 0) as stored
    arch: str = archs.DEFAULT       # general.architecture: its module is `spec` (formats/archs)
    sliding_window: int = 0         # keys a windowed block sees (its ATTENTION's swa pattern); 0: none

    @property
    def spec(self):
        """The architecture's module (formats/archs/<name>.py): its keys, tensors, attention
        and MoE parameters."""
        return archs.get(self.arch)

    # ---- derived sizes -------------------------------------------------------------
    @property
    def n_q(self) -> int:
        """Width of the query projection, n_head * head_dim."""
        return self.n_head * self.head_dim

    @property
    def n_kv(self) -> int:
        """Width of the key/value projections, n_head_kv * head_dim."""
        return self.n_head_kv * self.head_dim

    @property
    def has_shexp(self) -> bool:
        return self.n_ff_shexp > 0

    def replace(self, **changes: Any) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    # ---- limits ---------------------------------------------------------------------
    def problems(self) -> list[str]:
        """What in this configuration no path of the project can run, one phrase each naming
        the metadata key, its value and the limit (contract/limits.py); [] when it runs.
        n_vocab 0 is allowed here (the loader takes the vocabulary from token_embd)."""
        k, out = self.spec.KEYS, []
        for field in ("n_layer", "n_embd", "n_head", "n_expert", "n_ff_exp", "context_length"):
            value = getattr(self, field)
            if value < 1:
                out.append(f"{k[field]} {value}: must be at least 1")
        if self.n_head_kv < 1 or (self.n_head >= 1 and self.n_head % self.n_head_kv):
            out.append(f"{k['n_head_kv']} {self.n_head_kv} does not divide {k['n_head']} "
                       f"{self.n_head} (each KV head serves a whole group of query heads)")
        if self.head_dim < 1 or self.head_dim % limits.HEAD_DIM_MULTIPLE:
            out.append(f"{k['head_dim']} (the head size) {self.head_dim}: must be a positive "
                       f"multiple of {limits.HEAD_DIM_MULTIPLE} (the head sizes attention is stated for)")
        if not 1 <= self.n_expert_used <= max(self.n_expert, 1):
            out.append(f"{k['n_expert_used']} {self.n_expert_used}: must be in [1, "
                       f"{k['n_expert']} {self.n_expert}]")
        if self.n_ff_shexp < 0:
            out.append(f"{k['n_ff_shexp']} {self.n_ff_shexp}: must be 0 (none) or more")
        if self.spec.ATTENTION.swa_every and self.sliding_window < 1:
            out.append(f"{k['sliding_window']} {self.sliding_window}: must be at least 1")
        if self.n_vocab < 0:
            out.append(f"{k['n_vocab']} {self.n_vocab}: must be at least 1")
        for field in ("rms_eps", "rope_base"):
            value = getattr(self, field)
            if not (math.isfinite(value) and value > 0):
                out.append(f"{k[field]} {value}: must be a finite number > 0")
        out += rope_problems(self.rope_scaling, self.rope_base, self.arch)
        out += [f"{self.arch}: {p}" for p in moe.unsupported(self.spec.MOE)]
        return out

    def cuda_problems(self) -> list[str]:
        """What in this configuration the CUDA kernels cannot run (contract/limits.py), beyond
        `problems()`: for the fast path's cuda backend to check before it loads anything."""
        k, out = self.spec.KEYS, []
        if self.head_dim not in limits.CUDA_HEAD_DIMS:
            out.append(f"{k['head_dim']} (the head size) {self.head_dim}: the CUDA attention "
                       f"kernels are built for {' and '.join(map(str, limits.CUDA_HEAD_DIMS))}")
        if self.n_expert_used > limits.CUDA_TOP_K_MAX:
            out.append(f"{k['n_expert_used']} {self.n_expert_used}: the CUDA router picks at most "
                       f"{limits.CUDA_TOP_K_MAX}")
        if self.n_expert > limits.CUDA_ROUTER_MAX_EXPERTS:
            out.append(f"{k['n_expert']} {self.n_expert}: the CUDA router holds at most "
                       f"{limits.CUDA_ROUTER_MAX_EXPERTS} in shared memory")
        return out

    # ---- from GGUF metadata --------------------------------------------------------
    @classmethod
    def from_metadata(cls, fields: Mapping[str, Any],
                      shapes: Mapping[str, list[int]] | None = None,
                      where: str = "") -> "ModelConfig":
        """Build from GGUF metadata: `GGUFReader.fields` (ReaderField values) or a plain
        mapping of key -> value. The vocabulary size is taken from `{arch}.vocab_size` or the
        tokenizer's token list when present, else 0 (the loader fills it in from
        `token_embd`). Types are left at their defaults; the loader sets them from tensors.

        shapes (logical tensor name -> ggml ne, as the file holds them) adds the checks of
        the metadata against the tensors: the layer count, the vocabulary and the width of
        token_embd. Every problem found is listed in one PackError (`where`: a prefix naming
        the file), so a pack is refused before any work."""

        # a key missing or of the wrong kind is noted and read as a stand-in, so that one
        # refusal names every such key (the values' own checks follow only where all were read)
        unread: list[str] = []

        def get(key: str, default: Any = ..., kind: type = int) -> Any:
            if key not in fields:
                if default is ...:
                    unread.append(f"missing metadata key {key}")
                    return _STAND_IN[kind]
                return default
            value = fields[key]
            try:
                if hasattr(value, "contents"):
                    value = value.contents()
            except UnicodeDecodeError:  # GGUF's strings are UTF-8
                unread.append(f"metadata key {key}: its value is not UTF-8 text")
                return _STAND_IN[kind] if default is ... else default
            try:
                if kind is str:
                    if not isinstance(value, str):
                        raise TypeError
                    return value
                if isinstance(value, (list, tuple, str, bytes)):
                    raise TypeError
                if kind is int:
                    # a count stored as a float or a bool is a broken writer, not a count
                    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
                        raise TypeError
                    return int(value)
                # GGUF stores these as float32: take the shortest decimal that rounds to the
                # same float32 (1e-06, not 9.99999997e-07), so presets compare equal
                with np.errstate(over="ignore"):
                    return float(np.format_float_scientific(np.float32(value), unique=True))
            except (TypeError, ValueError):
                what = "an integer" if kind is int else "a number" if kind is float else "a string"
                unread.append(f"metadata key {key} must be {what}, got {value!r}")
                return _STAND_IN[kind] if default is ... else default

        arch = get(ARCH_KEY, kind=str)
        if unread:  # the other keys are named after the architecture: nothing else is read
            raise PackError(where + unread[0])
        try:
            spec = archs.get(arch)  # an unknown one is refused, naming the known ones
        except PackError as exc:
            raise PackError(where + str(exc)) from None
        k = spec.KEYS
        n_embd = get(k["n_embd"])
        n_head = get(k["n_head"])
        vocab_key = k["n_vocab"] if k["n_vocab"] in fields else None
        n_vocab = get(k["n_vocab"], 0)
        n_tokens = None
        if TOKENS_KEY in fields:
            tokens = fields[TOKENS_KEY]
            n_tokens = len(tokens.data) if hasattr(tokens, "data") else len(tokens)
            if vocab_key is None:
                vocab_key, n_vocab = TOKENS_KEY, n_tokens
        cfg = cls(
            n_layer=get(k["n_layer"]),
            n_embd=n_embd,
            n_head=n_head,
            n_head_kv=get(k["n_head_kv"], n_head),
            head_dim=get(k["head_dim"], n_embd // n_head if n_head > 0 else 0),
            n_expert=get(k["n_expert"]),
            n_expert_used=get(k["n_expert_used"]),
            n_ff_exp=get(k["n_ff_exp"]),
            n_ff_shexp=get(k["n_ff_shexp"], 0),
            n_vocab=n_vocab,
            rms_eps=get(k["rms_eps"], kind=float),
            rope_base=get(k["rope_base"], 10000.0, kind=float),
            context_length=get(k["context_length"]),
            rope_scaling=_rope_scaling(get, fields, get(k["context_length"]), unread, spec),
            arch=arch,
            # llama.cpp's loader requires the window's key of an architecture with windowed layers
            sliding_window=get(k["sliding_window"]) if spec.ATTENTION.swa_every else 0,
        )
        if unread:
            raise PackError(where + "; ".join(unread))
        problems = cfg.problems()
        if k["head_dim"] not in fields and n_head > 0 and n_embd % n_head:
            problems.append(f"{k['head_dim']} absent and {k['n_embd']} {n_embd} is not a "
                            f"multiple of {k['n_head']} {n_head} (the head size it implies)")
        value_length = get(spec.VALUE_LENGTH_KEY, cfg.head_dim)
        if value_length != cfg.head_dim:
            problems.append(f"{spec.VALUE_LENGTH_KEY} {value_length} differs from {k['head_dim']} "
                            f"{cfg.head_dim} (one head size for K and V)")
        if n_tokens is not None and vocab_key != TOKENS_KEY and n_tokens != n_vocab:
            problems.append(f"{vocab_key} {n_vocab} but {TOKENS_KEY} lists {n_tokens} tokens")
        if shapes is not None:
            problems += _layout_problems(cfg, shapes, vocab_key)
        if problems:
            raise PackError(where + "; ".join(problems))
        return cfg


#: what a missing or malformed key reads as while the others are read (never used: its
#: refusal follows)
_STAND_IN = {int: 1, float: 1.0, str: ""}


def _rope_scaling(get, fields: Mapping[str, Any], context_length: int, unread: list, spec) -> RopeScaling:
    """The RoPE scaling keys as llama.cpp reads them: an absent type is ``linear`` (``none``
    when the factor is absent too: the same table), a factor of 0 or absent is 1, the original
    context defaults to the context length. A type outside ROPE_SCALING_TYPES, and a key the
    loader would ignore with a value other than the one it uses, are added to `unread`; the
    values' ranges are `rope_problems`'. spec: the architecture's module (its keys)."""
    rk = spec.ROPE_KEYS
    factor_key = rk["factor"] if rk["factor"] in fields or spec.ROPE_FACTOR_OLD_KEY not in fields \
        else spec.ROPE_FACTOR_OLD_KEY
    factor = get(factor_key, 0.0, kind=float) or 1.0
    kind = get(rk["type"], "none" if factor == 1.0 else "linear", kind=str)
    if kind not in ROPE_SCALING_TYPES:
        unread.append(f"{rk['type']} {kind!r} is not supported (supported: {', '.join(ROPE_SCALING_TYPES)})")
        kind = "none"
    for key, default in spec.ROPE_UNREAD_KEYS.items():
        if key in fields:
            value = get(key, kind=float)
            used = (1.0 if kind == "yarn" else 0.0) if default is None else default
            if value != used:
                unread.append(f"{key} {value:g}: llama.cpp's {spec.NAME} loader does not read it "
                              f"(it uses {used:g}); only {used:g} is accepted")
    return RopeScaling(
        type=kind, factor=1.0 if kind == "none" else factor,
        original_context=get(rk["original_context"], context_length) if kind == "yarn" else 0,
        attn_factor=get(rk["attn_factor"], 1.0, kind=float))


def rope_problems(r: RopeScaling, base: float | None = None, arch: str = archs.DEFAULT) -> list[str]:
    """What in a RoPE scaling no table can be built from, or the pack's header cannot hold,
    one phrase each (as problems()); base: the rope base it scales (None: not checked); arch:
    the architecture whose keys name the values."""
    spec = archs.get(arch)
    rk, out = spec.ROPE_KEYS, []
    if r.type == "yarn" and base is not None and not base > 1:
        # the correction dimensions divide by ln(base)
        out.append(f"{spec.KEYS['rope_base']} {base}: yarn needs a base > 1")
    if r.type not in ROPE_SCALING_TYPES:
        out.append(f"{rk['type']} {r.type!r} is not supported (supported: "
                   f"{', '.join(ROPE_SCALING_TYPES)})")
    # yarn's factor below 1 is refused: llama.cpp's releases disagree on its magnitude there;
    # the header holds the factors as float32: one that is 0 or infinite there is refused too
    least = 1.0 if r.type == "yarn" else 0.0
    if not (_finite_f32(r.factor) and r.factor > 0 and r.factor >= least):
        out.append(f"{rk['factor']} {r.factor}: must be a finite float32 number "
                   + (">= 1 for yarn" if r.type == "yarn" else "> 0"))
    if not (_finite_f32(r.attn_factor) and r.attn_factor > 0):
        out.append(f"{rk['attn_factor']} {r.attn_factor}: must be a finite float32 number > 0")
    if r.type == "yarn" and not 1 <= r.original_context <= 2**32 - 1:
        out.append(f"{rk['original_context']} {r.original_context}: must be 1 to 4,294,967,295 "
                   "(a uint32 in the header)")
    return out


def _finite_f32(x: float) -> bool:
    """Whether x is finite and nonzero or zero alike once rounded to float32 (as the header
    stores it): 1e39 is infinite there, 1e-46 zero."""
    with np.errstate(over="ignore", under="ignore"):
        y = np.float32(x)
    return bool(np.isfinite(y)) and (y != 0) == (x != 0)


def _layout_problems(cfg: ModelConfig, shapes: Mapping[str, list[int]],
                     vocab_key: str | None) -> list[str]:
    """The metadata against the file's tensors (logical name -> ggml ne): the layers present,
    token_embd's rows (the vocabulary) and width. Missing tensors and every other shape are
    the loader's (formats/pack.py:_validate), which names them."""
    out, keys = [], cfg.spec.KEYS
    layers = sorted({int(m.group(1)) for n in shapes if (m := _BLOCK.match(n))})
    # compared without a list of n_layer entries: block_count may be 2**32 - 1
    if (len(layers) != cfg.n_layer or layers != list(range(len(layers)))) and cfg.n_layer >= 1:
        if not layers:
            held = "no layer tensors (blk.N.*)"
        elif layers == list(range(len(layers))):
            held = f"{len(layers)} layer{'s' * (len(layers) > 1)} (blk.0 to blk.{layers[-1]})"
        else:
            shown = ", ".join(f"blk.{i}" for i in layers[:8]) + (", ..." if len(layers) > 8 else "")
            held = f"layers {shown}, not numbered 0 to N-1"
        out.append(f"{keys['n_layer']} {cfg.n_layer} but the file holds {held}")
    embd = shapes.get("token_embd")
    if embd is not None and len(embd) == 2:
        width, rows = embd
        if width != cfg.n_embd:
            out.append(f"{keys['n_embd']} {cfg.n_embd} but token_embd.weight rows hold {width} values")
        if vocab_key is not None and rows != cfg.n_vocab:
            out.append(f"{vocab_key} {cfg.n_vocab} but token_embd.weight has {rows} rows")
        elif rows < 1:
            out.append("token_embd.weight has 0 rows: the vocabulary is empty")
    return out


PRESETS: dict[str, ModelConfig] = {
    # the whole model runs in seconds on 2 cores
    "tiny": ModelConfig(
        n_layer=2, n_embd=256, n_head=4, n_head_kv=2, head_dim=64,
        n_expert=16, n_expert_used=4, n_ff_exp=256, n_ff_shexp=256, n_vocab=512),
    # expert width 384 is not a multiple of 256: the down projection falls back to Q8_0
    # for the 256-value types
    "small": ModelConfig(
        n_layer=4, n_embd=512, n_head=8, n_head_kv=4, head_dim=64,
        n_expert=64, n_expert_used=8, n_ff_exp=384, n_ff_shexp=0, n_vocab=2048),
    "qwen3-30b-a3b": ModelConfig(
        n_layer=48, n_embd=2048, n_head=32, n_head_kv=4, head_dim=128,
        n_expert=128, n_expert_used=8, n_ff_exp=768, n_ff_shexp=0, n_vocab=151936),
    # the seeds' MoE shape; its down projection (rows of 640) falls back for 256-value types
    "strata": ModelConfig(
        n_layer=4, n_embd=2560, n_head=32, n_head_kv=4, head_dim=128,
        n_expert=512, n_expert_used=10, n_ff_exp=640, n_ff_shexp=640, n_vocab=151936),
    # openai/gpt-oss-20b's shape (its config.json): YaRN by 32 from 4,096 positions, a window of
    # 128 keys on the even blocks; make-pack writes its experts in MXFP4, as the released file is
    "gpt-oss-20b": ModelConfig(
        n_layer=24, n_embd=2880, n_head=64, n_head_kv=8, head_dim=64,
        n_expert=32, n_expert_used=4, n_ff_exp=2880, n_ff_shexp=0, n_vocab=201088,
        rms_eps=1e-5, rope_base=150000.0, context_length=131072,
        rope_scaling=RopeScaling("yarn", 32.0, 4096), arch="gpt-oss", sliding_window=128),
    # the CPU tier's gpt-oss: the released models' rope (YaRN by 32 from 4,096) and GQA; a window
    # of 16 keys (the even block slides, the odd one sees every key), rows of 256 (MXFP4's 32)
    "gpt-oss-tiny": ModelConfig(
        n_layer=2, n_embd=256, n_head=4, n_head_kv=2, head_dim=64,
        n_expert=8, n_expert_used=4, n_ff_exp=256, n_ff_shexp=0, n_vocab=512,
        rms_eps=1e-5, rope_base=150000.0, context_length=256,
        rope_scaling=RopeScaling("yarn", 32.0, 4096), arch="gpt-oss", sliding_window=16),
}
