"""gpt-oss as llama.cpp's converter writes it (convert_hf_to_gguf.py, GptOssModel; llama.cpp's
`gpt-oss` architecture, src/models/openai-moe.cpp): its metadata keys, its tensor table, the
MoE half's parameters as data, and the presets `make-pack` will write. Data only; nothing here
reads or writes a pack.

Tensors (numpy shapes, outer first: ggml's ne reversed), per block b and for the model:

    token_embd.weight            [n_vocab, n_embd]          dense
    output_norm.weight           [n_embd]                   F32
    output.weight                [n_vocab, n_embd]          dense
    blk.b.attn_norm.weight       [n_embd]                   F32  (before attention)
    blk.b.attn_q.weight / .bias  [n_head*hd, n_embd] / [n_head*hd]
    blk.b.attn_k.weight / .bias  [n_kv*hd, n_embd] / [n_kv*hd]
    blk.b.attn_v.weight / .bias  [n_kv*hd, n_embd] / [n_kv*hd]
    blk.b.attn_output.weight / .bias  [n_embd, n_head*hd] / [n_embd]
    blk.b.attn_sinks.weight      [n_head]                   F32  (one sink logit per head)
    blk.b.post_attention_norm.weight [n_embd]               F32  (before the MoE half: its ffn norm)
    blk.b.ffn_gate_inp.weight / .bias [n_expert, n_embd] / [n_expert]   F32 router, F32 bias
    blk.b.ffn_gate_exps.weight / .bias [n_expert, n_ff, n_embd] / [n_expert, n_ff]
    blk.b.ffn_up_exps.weight / .bias   [n_expert, n_ff, n_embd] / [n_expert, n_ff]
    blk.b.ffn_down_exps.weight / .bias [n_expert, n_embd, n_ff] / [n_expert, n_embd]

The converter stores every 1-D tensor, every `.bias`, the norms and the router in F32 (its
rule: n_dims <= 1, a name not ending in `.weight`, or FFN_GATE_INP), the expert matrices as
MXFP4 where the checkpoint holds them so (gpt-oss's released weights) and every other matrix
in the --outtype. gpt-oss has no shared expert and no q/k norms; `post_attention_norm` plays
qwen3moe's `ffn_norm`.

Metadata (`gpt-oss.` + ...): the keys of KEYS and ROPE_KEYS below. There is no vocab-size key
(n_vocab is token_embd's row count; the tokenizer's keys are `tokenizer.ggml.*`), no
sliding-window pattern key (llama.cpp's loader fixes the pattern: block b attends through the
window where b % 2 == 0, every other block attends to every key; SWA_PERIOD) and no key for the
SwiGLU's alpha and limit (llama.cpp's constants; MOE below).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from gguf import GGMLQuantizationType as QT

from strata_prefill.contract.moe import SwigluOai
from strata_prefill.contract.routing import SOFTMAX_SELECTED

ARCH = "gpt-oss"
_P = ARCH + "."

#: config field -> the metadata key the converter writes it under
KEYS = {
    "n_layer": _P + "block_count",
    "context_length": _P + "context_length",
    "n_embd": _P + "embedding_length",
    "n_ff": _P + "feed_forward_length",  # HF intermediate_size: the expert width again
    "n_head": _P + "attention.head_count",
    "n_head_kv": _P + "attention.head_count_kv",
    "rope_base": _P + "rope.freq_base",
    "rms_eps": _P + "attention.layer_norm_rms_epsilon",
    "n_expert": _P + "expert_count",
    "n_expert_used": _P + "expert_used_count",
    "head_dim": _P + "attention.key_length",
    "head_dim_v": _P + "attention.value_length",
    "sliding_window": _P + "attention.sliding_window",
    "n_ff_exp": _P + "expert_feed_forward_length",
}
#: YarnScaling field -> the metadata key (written when the checkpoint's rope_scaling is yarn)
ROPE_KEYS = {
    "type": _P + "rope.scaling.type",
    "factor": _P + "rope.scaling.factor",
    "original_context": _P + "rope.scaling.original_context_length",
    "beta_fast": _P + "rope.scaling.yarn_beta_fast",
    "beta_slow": _P + "rope.scaling.yarn_beta_slow",
}

#: block b attends within the sliding window where b % SWA_PERIOD == 0 (llama.cpp's
#: load_swa_pattern(ml, 2); transformers' layer_types alternate from "sliding_attention")
SWA_PERIOD = 2


def is_sliding(block: int) -> bool:
    """Whether block `block` attends through the sliding window (the others see every key)."""
    return block % SWA_PERIOD < SWA_PERIOD - 1


@dataclass(frozen=True)
class MoeForm:
    """The MoE half's parameters as data (docs/numerics.md sections 4, 6, 7): the router's
    scoring (strata_prefill.contract.routing.GATINGS) and whether it has a bias, whether the experts' products
    have biases, the gated activation (strata_prefill.contract.moe.glu's act), whether there is a shared expert."""

    gating: str
    router_bias: bool
    expert_bias: bool
    act: SwigluOai | None
    shared_expert: bool


#: gpt-oss's MoE half: llama.cpp's build_moe_ffn with LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT,
#: ffn_gate_inp_b and the three ffn_*_exps_b, LLM_FFN_SWIGLU_OAI_MOE (alpha 1.702, limit 7.0)
MOE = MoeForm(gating=SOFTMAX_SELECTED, router_bias=True, expert_bias=True, act=SwigluOai(1.702, 7.0),
              shared_expert=False)


@dataclass(frozen=True)
class YarnScaling:
    """gpt-oss's rope scaling (HF rope_scaling, rope_type "yarn")."""

    type: str = "yarn"
    factor: float = 32.0
    original_context: int = 4096
    beta_fast: float = 32.0
    beta_slow: float = 1.0


@dataclass(frozen=True)
class GptOssConfig:
    """A gpt-oss model's shape, in the field names of strata_prefill.formats.config.ModelConfig where it has them."""

    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_expert: int
    n_expert_used: int
    n_ff_exp: int
    n_vocab: int
    sliding_window: int
    context_length: int
    rms_eps: float = 1e-5
    rope_base: float = 150000.0
    rope_scaling: YarnScaling = field(default_factory=YarnScaling)
    expert_gu_type: QT = QT.MXFP4    # ffn_gate_exps / ffn_up_exps
    expert_down_type: QT = QT.MXFP4  # ffn_down_exps
    dense_type: QT = QT.Q8_0         # attention matrices, token_embd, output (as make-pack writes them)

    @property
    def n_q(self) -> int:
        return self.n_head * self.head_dim

    @property
    def n_kv(self) -> int:
        return self.n_head_kv * self.head_dim


PRESETS: dict[str, GptOssConfig] = {
    # openai/gpt-oss-20b's shape (its config.json)
    "gpt-oss-20b": GptOssConfig(
        n_layer=24, n_embd=2880, n_head=64, n_head_kv=8, head_dim=64,
        n_expert=32, n_expert_used=4, n_ff_exp=2880, n_vocab=201088,
        sliding_window=128, context_length=131072),
    # the CPU tier's: GQA (2 query heads a KV head), a window of 16 keys in a context of 256
    # (the even block slides, the odd one sees every key), MXFP4 rows of 256 (a multiple of 32)
    "gpt-oss-tiny": GptOssConfig(
        n_layer=2, n_embd=256, n_head=4, n_head_kv=2, head_dim=64,
        n_expert=8, n_expert_used=4, n_ff_exp=256, n_vocab=512,
        sliding_window=16, context_length=256),
}


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of the table: its name template (gguf-py's, `{bid}` for a block's), suffix
    (`.weight` or `.bias`), whether it is per block, and its role: "norm", "bias", "sinks",
    "router" (F32 in the converter's files), "dense" or "expert" (the config's types)."""

    template: str
    suffix: str
    per_block: bool
    role: str

    def name(self, bid: int | None = None) -> str:
        base = self.template.format(bid=bid) if self.per_block else self.template
        return base + self.suffix


def _t(template: str, suffix: str, role: str) -> TensorSpec:
    return TensorSpec(template, suffix, "{bid}" in template, role)


#: the table, in the order the converter's files list a block's tensors by name kind
TENSORS: tuple[TensorSpec, ...] = (
    _t("token_embd", ".weight", "dense"),
    _t("output_norm", ".weight", "norm"),
    _t("output", ".weight", "dense"),
    _t("blk.{bid}.attn_norm", ".weight", "norm"),
    _t("blk.{bid}.attn_q", ".weight", "dense"),
    _t("blk.{bid}.attn_q", ".bias", "bias"),
    _t("blk.{bid}.attn_k", ".weight", "dense"),
    _t("blk.{bid}.attn_k", ".bias", "bias"),
    _t("blk.{bid}.attn_v", ".weight", "dense"),
    _t("blk.{bid}.attn_v", ".bias", "bias"),
    _t("blk.{bid}.attn_output", ".weight", "dense"),
    _t("blk.{bid}.attn_output", ".bias", "bias"),
    _t("blk.{bid}.attn_sinks", ".weight", "sinks"),
    _t("blk.{bid}.post_attention_norm", ".weight", "norm"),
    _t("blk.{bid}.ffn_gate_inp", ".weight", "router"),
    _t("blk.{bid}.ffn_gate_inp", ".bias", "bias"),
    _t("blk.{bid}.ffn_gate_exps", ".weight", "expert"),
    _t("blk.{bid}.ffn_gate_exps", ".bias", "bias"),
    _t("blk.{bid}.ffn_up_exps", ".weight", "expert"),
    _t("blk.{bid}.ffn_up_exps", ".bias", "bias"),
    _t("blk.{bid}.ffn_down_exps", ".weight", "expert"),
    _t("blk.{bid}.ffn_down_exps", ".bias", "bias"),
)


def shape(spec: TensorSpec, c: GptOssConfig) -> tuple[int, ...]:
    """The numpy shape (outer first) of `spec` in a model of config `c`."""
    base = spec.template.split(".")[-1]
    bias = spec.suffix == ".bias"
    table = {
        "token_embd": (c.n_vocab, c.n_embd),
        "output_norm": (c.n_embd,),
        "output": (c.n_vocab, c.n_embd),
        "attn_norm": (c.n_embd,),
        "post_attention_norm": (c.n_embd,),
        "attn_q": (c.n_q,) if bias else (c.n_q, c.n_embd),
        "attn_k": (c.n_kv,) if bias else (c.n_kv, c.n_embd),
        "attn_v": (c.n_kv,) if bias else (c.n_kv, c.n_embd),
        "attn_output": (c.n_embd,) if bias else (c.n_embd, c.n_q),
        "attn_sinks": (c.n_head,),
        "ffn_gate_inp": (c.n_expert,) if bias else (c.n_expert, c.n_embd),
        "ffn_gate_exps": (c.n_expert, c.n_ff_exp) if bias else (c.n_expert, c.n_ff_exp, c.n_embd),
        "ffn_up_exps": (c.n_expert, c.n_ff_exp) if bias else (c.n_expert, c.n_ff_exp, c.n_embd),
        "ffn_down_exps": (c.n_expert, c.n_embd) if bias else (c.n_expert, c.n_embd, c.n_ff_exp),
    }
    return table[base]


def tensor_type(spec: TensorSpec, c: GptOssConfig, outtype: QT | None = None) -> QT:
    """The type of `spec`'s tensor: F32 for norms, biases, sinks and the router (the
    converter's rule); the config's expert types; `outtype` (default the config's dense_type)
    for the other matrices. (A converter run on float experts writes them in outtype too.)"""
    if spec.role in ("norm", "bias", "sinks", "router"):
        return QT.F32
    if spec.role == "expert":
        return c.expert_down_type if "down" in spec.template else c.expert_gu_type
    return c.dense_type if outtype is None else outtype


def tensors(c: GptOssConfig) -> list[tuple[str, tuple[int, ...], TensorSpec]]:
    """Every tensor of a model of config `c`: (file name, numpy shape, spec), the model's
    first, then block by block."""
    out = [(s.name(), shape(s, c), s) for s in TENSORS if not s.per_block]
    for b in range(c.n_layer):
        out += [(s.name(b), shape(s, c), s) for s in TENSORS if s.per_block]
    return out


def metadata(c: GptOssConfig) -> dict[str, object]:
    """The architecture's keys the converter writes for a checkpoint of config `c`, with their
    values (general.*, tokenizer.* and file-type keys aside)."""
    fields = {f: getattr(c, f) for f in KEYS if hasattr(c, f)}
    fields["n_ff"] = c.n_ff_exp
    fields["head_dim_v"] = c.head_dim
    out = {KEYS[f]: v for f, v in fields.items()}
    out.update({ROPE_KEYS[f]: getattr(c.rope_scaling, f) for f in ROPE_KEYS})
    return out


def hf_config(c: GptOssConfig) -> dict[str, object]:
    """transformers' GptOssConfig arguments for a model of config `c` (the checkpoint the
    converter reads): its field names and gpt-oss's fixed choices (q/k/v/o biases, the
    alternating layer types, the SwiGLU limit)."""
    return {
        "num_hidden_layers": c.n_layer, "hidden_size": c.n_embd, "intermediate_size": c.n_ff_exp,
        "num_attention_heads": c.n_head, "num_key_value_heads": c.n_head_kv, "head_dim": c.head_dim,
        "num_local_experts": c.n_expert, "num_experts_per_tok": c.n_expert_used, "vocab_size": c.n_vocab,
        "sliding_window": c.sliding_window, "max_position_embeddings": c.context_length,
        "rms_norm_eps": c.rms_eps, "rope_theta": c.rope_base, "attention_bias": True,
        "layer_types": ["sliding_attention" if is_sliding(b) else "full_attention" for b in range(c.n_layer)],
        "rope_scaling": {"rope_type": c.rope_scaling.type, "factor": c.rope_scaling.factor,
                         "original_max_position_embeddings": c.rope_scaling.original_context,
                         "beta_fast": c.rope_scaling.beta_fast, "beta_slow": c.rope_scaling.beta_slow,
                         "truncate": False},
        "swiglu_limit": MOE.act.limit, "tie_word_embeddings": False,
    }
