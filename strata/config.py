"""Model configuration of a qwen3moe pack: dimensions, expert counts, types.

`ModelConfig.from_metadata` reads the metadata keys llama.cpp's qwen3moe loader reads;
`PRESETS` are the shapes `make-pack` writes.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
from gguf import GGMLQuantizationType as QT

from strata.errors import PackError

ARCH = "qwen3moe"


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
    expert_gu_type: QT = QT.Q8_0    # type of ffn_gate_exps / ffn_up_exps (layer 0)
    expert_down_type: QT = QT.Q8_0  # type of ffn_down_exps (layer 0)
    dense_type: QT = QT.Q8_0        # type of the attention matrices (layer 0) as stored

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

    # ---- from GGUF metadata --------------------------------------------------------
    @classmethod
    def from_metadata(cls, fields: Mapping[str, Any]) -> "ModelConfig":
        """Build from GGUF metadata: `GGUFReader.fields` (ReaderField values) or a plain
        mapping of key -> value. The vocabulary size is taken from `{arch}.vocab_size` or the
        tokenizer's token list when present, else 0 (the loader fills it in from
        `token_embd`). Types are left at their defaults; the loader sets them from tensors."""

        def get(key: str, default: Any = ..., kind: type = int) -> Any:
            if key not in fields:
                if default is ...:
                    raise PackError(f"missing metadata key {key}")
                return default
            value = fields[key]
            if hasattr(value, "contents"):
                value = value.contents()
            try:
                if kind is str:
                    if not isinstance(value, str):
                        raise TypeError
                    return value
                if isinstance(value, (list, tuple, str, bytes)):
                    raise TypeError
                if kind is float:
                    # GGUF stores these as float32: take the shortest decimal that rounds to
                    # the same float32 (1e-06, not 9.99999997e-07), so presets compare equal
                    return float(np.format_float_scientific(np.float32(value), unique=True))
                return kind(value)
            except (TypeError, ValueError):
                raise PackError(f"metadata key {key} has a bad value: {value!r}") from None

        arch = get("general.architecture", kind=str)
        if arch != ARCH:
            raise PackError(f"wrong architecture: expected {ARCH}, got {arch}")
        p = f"{ARCH}."
        n_embd = get(p + "embedding_length")
        n_head = get(p + "attention.head_count")
        if n_head <= 0 or n_embd <= 0:
            raise PackError(f"bad dimensions: embedding_length {n_embd}, head_count {n_head}")
        n_vocab = get(p + "vocab_size", 0)
        if n_vocab == 0 and "tokenizer.ggml.tokens" in fields:
            tokens = fields["tokenizer.ggml.tokens"]
            n_vocab = len(tokens.data) if hasattr(tokens, "data") else len(tokens)
        cfg = cls(
            n_layer=get(p + "block_count"),
            n_embd=n_embd,
            n_head=n_head,
            n_head_kv=get(p + "attention.head_count_kv", n_head),
            head_dim=get(p + "attention.key_length", n_embd // n_head),
            n_expert=get(p + "expert_count"),
            n_expert_used=get(p + "expert_used_count"),
            n_ff_exp=get(p + "expert_feed_forward_length"),
            n_ff_shexp=get(p + "expert_shared_feed_forward_length", 0),
            n_vocab=n_vocab,
            rms_eps=get(p + "attention.layer_norm_rms_epsilon", kind=float),
            rope_base=get(p + "rope.freq_base", 10000.0, kind=float),
            context_length=get(p + "context_length"),
        )
        if cfg.n_layer <= 0 or cfg.n_expert <= 0 or not 0 < cfg.n_expert_used <= cfg.n_expert:
            raise PackError(
                f"bad expert metadata: block_count {cfg.n_layer}, expert_count {cfg.n_expert}, "
                f"expert_used_count {cfg.n_expert_used}")
        return cfg


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
}
