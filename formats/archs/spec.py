"""What an architecture module (formats/archs/<name>.py) declares, as data the shared code reads.

An architecture is a GGUF `general.architecture` value with its own metadata keys, tensors and
attention, over the steps every architecture shares (norms, dense products, the MoE half, the
layer walk). Its module in formats/archs/ holds:

- `NAME`: the `general.architecture` value;
- `KEYS`, `ROPE_KEYS`, `ROPE_FACTOR_OLD_KEY`, `ROPE_UNREAD_KEYS`, `VALUE_LENGTH_KEY`: the
  metadata keys formats/config.py reads (ModelConfig field -> key; `llama_keys`, `rope_keys`
  and `rope_unread_keys` give the ones llama.cpp's loaders share);
- `MODEL_TENSORS`, `BLOCK_TENSORS`: its tensor table (`TensorSpec`), the one list the loader,
  make-pack and both implementations' per-layer weights are built from;
- `Layer`: the dataclass of one block's weights, a field per block tensor, named as the tensor
  is less `blk.N.` (`layer_names` fills it from the table: the reference fills it with the
  pack's matrices and vectors, the fast engine with its backend's handles);
- `ATTENTION` (`AttentionParams`) and `MOE` (`MoeParams`): its attention's and its MoE half's
  parameters;
- `write_metadata(writer, cfg)`: the hyperparameter keys make-pack writes (`write_metadata`
  here writes them in the order the architecture lists).

reference/archs/<module>.py and fast/archs/<module>.py hold its attention half in each
implementation (docs/architectures.md).
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Callable

from gguf.constants import MODEL_TENSOR

from strata_prefill.contract.moe import SwigluOai
from strata_prefill.formats import tensor_names as tn


def llama_keys(prefix: str) -> dict[str, str]:
    """ModelConfig field -> metadata key, as llama.cpp's loaders name them under `prefix`
    (`<architecture>.`): an architecture's KEYS starts from these and adds its own."""
    p = prefix
    return {
        "n_layer": p + "block_count", "n_embd": p + "embedding_length",
        "n_head": p + "attention.head_count", "n_head_kv": p + "attention.head_count_kv",
        "head_dim": p + "attention.key_length", "n_expert": p + "expert_count",
        "n_expert_used": p + "expert_used_count", "n_ff_exp": p + "expert_feed_forward_length",
        "n_ff_shexp": p + "expert_shared_feed_forward_length", "n_vocab": p + "vocab_size",
        "rms_eps": p + "attention.layer_norm_rms_epsilon", "rope_base": p + "rope.freq_base",
        "context_length": p + "context_length",
    }


def rope_keys(prefix: str) -> dict[str, str]:
    """RopeScaling field -> metadata key (llama.cpp's generic rope keys under `prefix`)."""
    return {
        "type": prefix + "rope.scaling.type", "factor": prefix + "rope.scaling.factor",
        "original_context": prefix + "rope.scaling.original_context_length",
        "attn_factor": prefix + "rope.scaling.attn_factor",
    }


def rope_unread_keys(prefix: str) -> dict[str, float | None]:
    """The rope keys llama.cpp's loaders do not read, with the value they use instead (None: 1
    for yarn, else 0): a pack that sets one to another value would run differently there."""
    p = prefix + "rope.scaling."
    return {p + "yarn_beta_fast": 32.0, p + "yarn_beta_slow": 1.0, p + "yarn_ext_factor": None,
            p + "yarn_attn_factor": 1.0, p + "yarn_log_multiplier": 0.0}


#: ModelConfig fields written as float32 (the others as uint32)
_FLOAT_FIELDS = ("rope_base", "rms_eps")


def write_metadata(arch, w, cfg, order: tuple[str, ...], attn_factor_always: bool = True) -> None:
    """Write architecture `arch`'s hyperparameter keys for ModelConfig `cfg` to gguf.GGUFWriter
    `w`, in `order`: each entry a field of arch.KEYS (n_ff_shexp only where cfg has a shared
    expert), "value_length" (arch.VALUE_LENGTH_KEY: head_dim), "feed_forward" (arch.FEED_FORWARD_KEY:
    n_ff_exp) or "rope_scaling" (arch.ROPE_KEYS, where the scaling is not the default one: an
    unscaled pack keeps the header it always had; attn_factor written always, or only where not
    1 when attn_factor_always is false)."""
    for entry in order:
        if entry == "rope_scaling":
            r = cfg.rope_scaling
            if r != type(r)():
                w.add_string(arch.ROPE_KEYS["type"], r.type)
                w.add_float32(arch.ROPE_KEYS["factor"], float(r.factor))
                if attn_factor_always or r.attn_factor != 1.0:
                    w.add_float32(arch.ROPE_KEYS["attn_factor"], float(r.attn_factor))
                if r.type == "yarn":
                    w.add_uint32(arch.ROPE_KEYS["original_context"], int(r.original_context))
            continue
        if entry == "n_ff_shexp" and not cfg.has_shexp:
            continue
        if entry == "value_length":
            key, field = arch.VALUE_LENGTH_KEY, "head_dim"
        elif entry == "feed_forward":
            key, field = arch.FEED_FORWARD_KEY, "n_ff_exp"
        else:
            key, field = arch.KEYS[entry], entry
        value = getattr(cfg, field)
        if field in _FLOAT_FIELDS:
            w.add_float32(key, float(value))
        else:
            w.add_uint32(key, value)


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of an architecture's table.

    shape: the ggml ne (fastest dimension first) of the tensor for a ModelConfig.
    role: what it is, for the loader and make-pack: "norm" (a float32 vector, read whole),
    "bias" (a float32 vector added after a product), "sinks" (a float32 vector: a logit per
    attention head), "expert_bias" (float32 [n_expert, n]: each expert's bias row), "gate" (a
    float one-row matrix: a scalar gate's weights), "dense" (a matrix in the dense type),
    "router" (the router, in the router type), "embd" (the token embedding, in the dense type),
    "expert_gu" and "expert_down" (stacked experts in the expert types).
    fill: how make-pack draws its values: "norm" (N(1, NORM_STD)), "gate" (N(0, 2/sqrt(n_cols))),
    "bias" (N(0, BIAS_STD)), "sink" (N(0, SINK_STD)), "embd", "in" or "out" (random valid
    blocks of the std make-pack gives inputs and outputs).
    group: None for a tensor every block (or the model) holds; else the name of a group of
    tensors a block holds all of or none of (the shared expert's: "shexp").
    suffix: the file name's suffix: ".weight", or ".bias" for a bias (one gguf-py kind holds a
    weight and its bias).
    field_name: the Layer field where it is not the name less `blk.N.` (a bias's: that of its
    weight plus `_b`), for a tensor that plays a shared role under another name (gpt-oss's
    post_attention_norm is the MoE half's ffn_norm).
    """

    kind: MODEL_TENSOR
    shape: Callable[[Any], list[int]]
    role: str
    fill: str
    group: str | None = None
    suffix: str = tn.SUFFIX
    field_name: str | None = None

    def name(self, bid: int | None = None) -> str:
        """The logical name (formats/tensor_names.py) of this tensor of block `bid`."""
        return tn.name(self.kind, bid, self.suffix)

    @property
    def part(self) -> str:
        """The logical name less `blk.N.` (`attn_q.bias`): what names it within a block."""
        return self.name(0).removeprefix("blk.0.")

    @property
    def is_vector(self) -> bool:
        """Read as float32 values (Pack.vector): norms, biases, sinks."""
        return self.role in ("norm", "bias", "sinks", "expert_bias")

    @property
    def float_only(self) -> bool:
        """Held in a float type only (norms, biases, sinks and gates: never quantized)."""
        return self.is_vector or self.role == "gate"

    @property
    def field(self) -> str:
        """The Layer field: field_name, else the logical name less `blk.N.` (`_b` for a bias)."""
        if self.field_name is not None:
            return self.field_name
        base = tn.name(self.kind, 0).removeprefix("blk.0.")
        return base + "_b" if self.suffix == tn.BIAS else base


#: the whole-model tensors every architecture here holds, in file order: the token embedding,
#: the output norm and the output (absent where the embeddings are tied)
MODEL_TENSORS: tuple[TensorSpec, ...] = (
    TensorSpec(tn.T.TOKEN_EMBD, lambda c: [c.n_embd, c.n_vocab], "embd", "embd"),
    TensorSpec(tn.T.OUTPUT_NORM, lambda c: [c.n_embd], "norm", "norm"),
    TensorSpec(tn.T.OUTPUT, lambda c: [c.n_embd, c.n_vocab], "dense", "in", group="output"),
)


@dataclass(frozen=True)
class AttentionParams:
    """An architecture's attention, as its attention half (reference/archs, fast/archs) runs it."""

    qk_norm: bool            # RMSNorm per head of q and k (attn_q_norm, attn_k_norm)
    rope: str                # the RoPE rotation: "neox" (halves) or "norm" (pairs)
    qkvo_bias: bool = False  # biases on the q, k, v and o projections (float32, after each product)
    sinks: bool = False      # a learned sink logit per head in the softmax (attn_sinks)
    swa_every: int = 0       # 0: every layer sees the whole prefix; else of each run of swa_every
                             # layers all but the last attend through ModelConfig.sliding_window

    def is_sliding(self, layer: int) -> bool:
        """Whether block `layer` attends through the sliding window (llama.cpp's swa pattern:
        layer % swa_every < swa_every - 1)."""
        return self.swa_every > 0 and layer % self.swa_every < self.swa_every - 1

    def window(self, cfg, layer: int) -> int | None:
        """The window block `layer` of a pack of config `cfg` attends through, None for the
        whole prefix (strata_prefill.contract.attention.attend's window)."""
        return cfg.sliding_window if self.is_sliding(layer) else None


@dataclass(frozen=True)
class MoeParams:
    """An architecture's MoE half, as the shared MoE half reads it (reference/moe_half.py,
    fast/engine.py with fast/walk.py): the values it computes are
    `strata_prefill.contract.moe.IMPLEMENTED`; a pack asking for another is refused when it is opened."""

    scoring: str          # strata_prefill.contract.routing.GATINGS: "softmax" (over all experts, then
                          # top-k) or "softmax_selected" (top-k on the logits, softmax over those k)
    renormalize: bool     # top-k weights divided by their sum (softmax's; the selected softmax sums to 1)
    shared_expert: str    # "never", "optional" (a block may hold the shexp group) or "always"
    router_bias: bool     # ffn_gate_inp has a bias (ffn_gate_inp_b), added to the logits first
    expert_bias: bool     # gate, up and down experts have biases (ffn_*_exps_b)
    activation: str       # "swiglu": silu(gate) * up; "swiglu_oai": the clamped form (SwigluOai)

    @property
    def act(self):
        """strata_prefill.contract.moe.glu's act for `activation`: None (swiglu) or the SwigluOai of
        llama.cpp's constants (alpha 1.702, limit 7.0: SwigluOai's defaults)."""
        return SwigluOai() if self.activation == "swiglu_oai" else None


def layer_names(arch, layer: int, present: Callable[[str], bool]) -> dict[str, str]:
    """Layer field -> logical name of block `layer`'s tensors in `arch`'s table; a group's
    tensors only where `present` says its first tensor is held."""
    groups: dict[str, bool] = {}
    out = {}
    for t in arch.BLOCK_TENSORS:
        name = t.name(layer)
        if t.group is not None:
            if t.group not in groups:
                groups[t.group] = present(name)
            if not groups[t.group]:
                continue
        out[t.field] = name
    return out


def check_layer_class(arch) -> None:
    """Fail at import if an architecture's Layer dataclass and its tensor table disagree."""
    have = [f.name for f in fields(arch.Layer) if f.name != "index"]
    want = [t.field for t in arch.BLOCK_TENSORS]
    assert have == want, f"{arch.NAME}: Layer fields {have} differ from the tensor table {want}"
    optional = {f.name for f in fields(arch.Layer) if f.default is None}
    assert optional == {t.field for t in arch.BLOCK_TENSORS if t.group}, \
        f"{arch.NAME}: Layer's optional fields differ from the table's groups"


@dataclass(frozen=True)
class SharedExpert:
    gate_inp: Any  # 1 row of n_embd values: the shared expert's gate
    gate: Any      # [n_ff_shexp rows, n_embd]
    up: Any        # [n_ff_shexp rows, n_embd]
    down: Any      # [n_embd rows, n_ff_shexp]


class MoeLayer:
    """What the shared MoE half asks of any architecture's Layer (its fields ffn_norm,
    ffn_gate_inp, ffn_gate_exps, ffn_up_exps, ffn_down_exps and, where its table has them,
    the shared expert's)."""

    @property
    def has_shexp(self) -> bool:
        return getattr(self, "ffn_gate_shexp", None) is not None

    @property
    def shexp(self) -> SharedExpert | None:
        if not self.has_shexp:
            return None
        return SharedExpert(self.ffn_gate_inp_shexp, self.ffn_gate_shexp,
                            self.ffn_up_shexp, self.ffn_down_shexp)
