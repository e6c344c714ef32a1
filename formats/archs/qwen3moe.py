"""qwen3moe: Qwen3's MoE models (Qwen3-30B-A3B and its kin), as llama.cpp's qwen3moe loader
reads them (formats/archs/spec.py says what an architecture module holds).

Attention: grouped-query, RMSNorm per head on q and k, NEOX RoPE, no biases. MoE: softmax
over every expert's logit, top-k, the k weights renormalized, SwiGLU experts; an optional
shared expert gated by a sigmoid (qwen3moe itself has none: its four `_shexp` tensors are
qwen3next's, the architecture with qwen3moe's layout that defines them; qwen2moe lists the
same names).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from gguf.constants import MODEL_ARCH
from gguf.constants import MODEL_TENSORS as GGUF_TENSORS

from strata_prefill.formats import tensor_names as tn
from strata_prefill.formats.archs import spec
from strata_prefill.formats.archs.spec import AttentionParams, MoeLayer, MoeParams, TensorSpec, check_layer_class

NAME = "qwen3moe"
_P = NAME + "."

#: ModelConfig field -> the metadata key it is read from (llama.cpp's qwen3moe names)
KEYS = spec.llama_keys(_P)
#: RopeScaling field -> the metadata key it is read from (llama.cpp's generic rope keys)
ROPE_KEYS = spec.rope_keys(_P)
ROPE_FACTOR_OLD_KEY = _P + "rope.scale_linear"  # the factor's older name, read when it is absent
#: keys llama.cpp's qwen3moe loader does not read, with the value it uses instead: a pack
#: that sets one to another value would run differently there, so it is refused (None: 1 for
#: yarn, else 0)
ROPE_UNREAD_KEYS = spec.rope_unread_keys(_P)
VALUE_LENGTH_KEY = _P + "attention.value_length"  # V's head size: this project has one head size
FEED_FORWARD_KEY = _P + "feed_forward_length"     # written (the expert width again), never read

ATTENTION = AttentionParams(qk_norm=True, rope="neox")
MOE = MoeParams(scoring="softmax", renormalize=True, shared_expert="optional", router_bias=False,
                expert_bias=False, activation="swiglu")

T = tn.T
#: the whole-model tensors, in file order (llama.cpp's embedding, output norm and output)
MODEL_TENSORS = spec.MODEL_TENSORS
#: a block's tensors, in file order; the shared expert's group last
BLOCK_TENSORS: tuple[TensorSpec, ...] = (
    TensorSpec(T.ATTN_NORM, lambda c: [c.n_embd], "norm", "norm"),
    TensorSpec(T.ATTN_Q, lambda c: [c.n_embd, c.n_q], "dense", "in"),
    TensorSpec(T.ATTN_K, lambda c: [c.n_embd, c.n_kv], "dense", "in"),
    TensorSpec(T.ATTN_V, lambda c: [c.n_embd, c.n_kv], "dense", "in"),
    TensorSpec(T.ATTN_OUT, lambda c: [c.n_q, c.n_embd], "dense", "out"),
    TensorSpec(T.ATTN_Q_NORM, lambda c: [c.head_dim], "norm", "norm"),
    TensorSpec(T.ATTN_K_NORM, lambda c: [c.head_dim], "norm", "norm"),
    TensorSpec(T.FFN_NORM, lambda c: [c.n_embd], "norm", "norm"),
    TensorSpec(T.FFN_GATE_INP, lambda c: [c.n_embd, c.n_expert], "router", "gate"),
    TensorSpec(T.FFN_GATE_EXP, lambda c: [c.n_embd, c.n_ff_exp, c.n_expert], "expert_gu", "in"),
    TensorSpec(T.FFN_UP_EXP, lambda c: [c.n_embd, c.n_ff_exp, c.n_expert], "expert_gu", "in"),
    TensorSpec(T.FFN_DOWN_EXP, lambda c: [c.n_ff_exp, c.n_embd, c.n_expert], "expert_down", "out"),
    TensorSpec(T.FFN_GATE_INP_SHEXP, lambda c: [c.n_embd], "gate", "gate", group="shexp"),
    TensorSpec(T.FFN_GATE_SHEXP, lambda c: [c.n_embd, c.n_ff_shexp], "dense", "in", group="shexp"),
    TensorSpec(T.FFN_UP_SHEXP, lambda c: [c.n_embd, c.n_ff_shexp], "dense", "in", group="shexp"),
    TensorSpec(T.FFN_DOWN_SHEXP, lambda c: [c.n_ff_shexp, c.n_embd], "dense", "out", group="shexp"),
)
#: the architecture whose gguf-py list holds the shared expert's tensors
SHEXP_ARCH = MODEL_ARCH.QWEN3NEXT

# fail at import, not in a pack, if an installed gguf-py no longer lists one of them
for _arch, _wanted in ((MODEL_ARCH.QWEN3MOE, [t for t in MODEL_TENSORS + BLOCK_TENSORS if t.group != "shexp"]),
                       (SHEXP_ARCH, [t for t in BLOCK_TENSORS if t.group == "shexp"])):
    _missing = [t.kind.name for t in _wanted if t.kind not in GGUF_TENSORS[_arch]]
    assert not _missing, f"gguf-py's {_arch.name} lists no {_missing}"


@dataclass(frozen=True)
class Layer(MoeLayer):
    """Block `index`'s weights, a field per tensor of BLOCK_TENSORS: the pack's QMatrix and
    float32 vectors (norms) in the reference, the backend's handles in the fast engine."""

    index: int
    attn_norm: Any      # [n_embd]
    attn_q: Any         # [n_head*head_dim rows, n_embd]
    attn_k: Any         # [n_head_kv*head_dim rows, n_embd]
    attn_v: Any         # [n_head_kv*head_dim rows, n_embd]
    attn_output: Any    # [n_embd rows, n_head*head_dim]
    attn_q_norm: Any    # [head_dim]
    attn_k_norm: Any    # [head_dim]
    ffn_norm: Any       # [n_embd]
    ffn_gate_inp: Any   # router: [n_expert rows, n_embd]
    ffn_gate_exps: Any  # [E, n_ff_exp rows, n_embd]
    ffn_up_exps: Any    # [E, n_ff_exp rows, n_embd]
    ffn_down_exps: Any  # [E, n_embd rows, n_ff_exp]
    ffn_gate_inp_shexp: Any = None  # 1 row of n_embd
    ffn_gate_shexp: Any = None
    ffn_up_shexp: Any = None
    ffn_down_shexp: Any = None


check_layer_class(sys.modules[__name__])


def write_metadata(w, cfg) -> None:
    """The hyperparameter keys make-pack writes, in its order (a gguf.GGUFWriter); an unscaled
    pack keeps the header it always had, a scaled one carries rope.scaling.attn_factor always."""
    spec.write_metadata(sys.modules[__name__], w, cfg, (
        "n_layer", "context_length", "n_embd", "feed_forward", "n_head", "n_head_kv", "head_dim",
        "value_length", "rope_base", "rope_scaling", "rms_eps", "n_expert", "n_expert_used", "n_ff_exp",
        "n_ff_shexp", "n_vocab"))
