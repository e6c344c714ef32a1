"""gpt-oss: OpenAI's open-weight MoE models (gpt-oss-20b, gpt-oss-120b), as llama.cpp's converter
writes them (convert_hf_to_gguf.py, GptOssModel) and its `gpt-oss` loader reads them
(src/models/openai-moe.cpp); formats/archs/spec.py says what an architecture module holds.

Attention: grouped-query, q/k/v/o biases (float32, added after each product; q and k before
RoPE), NEOX RoPE (YaRN as the file's rope.scaling keys say: the released models scale by 32
from an original context of 4,096), no q/k norm, a learned sink logit per head in the
softmax, and a sliding window on every other block (the even ones: llama.cpp fixes the pattern,
load_swa_pattern(ml, 2); the window's length is the file's `attention.sliding_window`).
MoE: a router bias, top-k on the biased logits then a softmax over the k picked ones (llama.cpp's
SOFTMAX_WEIGHT gating; no renormalizing), gate/up biases before the clamped SwiGLU
`swiglu_oai` (llama.cpp's constants: alpha 1.702, limit 7.0), a down bias per expert, no
shared expert. `post_attention_norm` is the MoE half's input norm: the Layer's `ffn_norm`.

The converter stores every 1-D tensor, every `.bias`, the norms and the router in F32 (its
rule: n_dims <= 1, a name not ending in `.weight`, or FFN_GATE_INP), the expert matrices as
MXFP4 where the checkpoint holds them so (the released weights; a float checkpoint's experts
come out in the --outtype), the other matrices in the --outtype. There is no vocab-size key
(the vocabulary is token_embd's rows, or the tokenizer's token list), no window-pattern key
and no key for the SwiGLU's constants.
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

NAME = "gpt-oss"
_P = NAME + "."

#: ModelConfig field -> the metadata key it is read from (llama.cpp's gpt-oss names). The
#: converter writes no vocab_size and no shared expert's width: both keys are read where a
#: file has them (n_vocab otherwise from the token list or token_embd; no shared expert).
KEYS = {**spec.llama_keys(_P), "sliding_window": _P + "attention.sliding_window"}
#: RopeScaling field -> the metadata key it is read from (llama.cpp's generic rope keys)
ROPE_KEYS = spec.rope_keys(_P)
ROPE_FACTOR_OLD_KEY = _P + "rope.scale_linear"  # the factor's older name, read when it is absent
#: keys llama.cpp's gpt-oss loader does not read, with the value it uses instead (None: 1 for
#: yarn, else 0). The converter writes the betas from the checkpoint's rope_scaling (32 and 1,
#: the values used): such a file opens; another value is refused.
ROPE_UNREAD_KEYS = spec.rope_unread_keys(_P)
VALUE_LENGTH_KEY = _P + "attention.value_length"  # V's head size: this project has one head size
FEED_FORWARD_KEY = _P + "feed_forward_length"     # written (the expert width again), never read

#: of each 2 blocks the first attends through the window (llama.cpp's load_swa_pattern(ml, 2);
#: transformers' layer_types alternate from "sliding_attention")
ATTENTION = AttentionParams(qk_norm=False, rope="neox", qkvo_bias=True, sinks=True, swa_every=2)
MOE = MoeParams(scoring="softmax_selected", renormalize=False, shared_expert="never", router_bias=True,
                expert_bias=True, activation="swiglu_oai")


def is_sliding(block: int) -> bool:
    """Whether block `block` attends through the sliding window (the others see every key)."""
    return ATTENTION.is_sliding(block)


T = tn.T
B = tn.BIAS
#: the whole-model tensors, in file order (llama.cpp's embedding, output norm and output)
MODEL_TENSORS = spec.MODEL_TENSORS
#: a block's tensors, in file order
BLOCK_TENSORS: tuple[TensorSpec, ...] = (
    TensorSpec(T.ATTN_NORM, lambda c: [c.n_embd], "norm", "norm"),
    TensorSpec(T.ATTN_Q, lambda c: [c.n_embd, c.n_q], "dense", "in"),
    TensorSpec(T.ATTN_Q, lambda c: [c.n_q], "bias", "bias", suffix=B),
    TensorSpec(T.ATTN_K, lambda c: [c.n_embd, c.n_kv], "dense", "in"),
    TensorSpec(T.ATTN_K, lambda c: [c.n_kv], "bias", "bias", suffix=B),
    TensorSpec(T.ATTN_V, lambda c: [c.n_embd, c.n_kv], "dense", "in"),
    TensorSpec(T.ATTN_V, lambda c: [c.n_kv], "bias", "bias", suffix=B),
    TensorSpec(T.ATTN_OUT, lambda c: [c.n_q, c.n_embd], "dense", "out"),
    TensorSpec(T.ATTN_OUT, lambda c: [c.n_embd], "bias", "bias", suffix=B),
    TensorSpec(T.ATTN_SINKS, lambda c: [c.n_head], "sinks", "sink"),
    TensorSpec(T.ATTN_POST_NORM, lambda c: [c.n_embd], "norm", "norm", field_name="ffn_norm"),
    TensorSpec(T.FFN_GATE_INP, lambda c: [c.n_embd, c.n_expert], "router", "gate"),
    TensorSpec(T.FFN_GATE_INP, lambda c: [c.n_expert], "bias", "bias", suffix=B),
    TensorSpec(T.FFN_GATE_EXP, lambda c: [c.n_embd, c.n_ff_exp, c.n_expert], "expert_gu", "in"),
    TensorSpec(T.FFN_GATE_EXP, lambda c: [c.n_ff_exp, c.n_expert], "expert_bias", "bias", suffix=B),
    TensorSpec(T.FFN_UP_EXP, lambda c: [c.n_embd, c.n_ff_exp, c.n_expert], "expert_gu", "in"),
    TensorSpec(T.FFN_UP_EXP, lambda c: [c.n_ff_exp, c.n_expert], "expert_bias", "bias", suffix=B),
    TensorSpec(T.FFN_DOWN_EXP, lambda c: [c.n_ff_exp, c.n_embd, c.n_expert], "expert_down", "out"),
    TensorSpec(T.FFN_DOWN_EXP, lambda c: [c.n_embd, c.n_expert], "expert_bias", "bias", suffix=B),
)

# fail at import, not in a pack, if an installed gguf-py no longer lists one of them
_missing = [t.kind.name for t in MODEL_TENSORS + BLOCK_TENSORS if t.kind not in GGUF_TENSORS[MODEL_ARCH.GPT_OSS]]
assert not _missing, f"gguf-py's GPT_OSS lists no {_missing}"


@dataclass(frozen=True)
class Layer(MoeLayer):
    """Block `index`'s weights, a field per tensor of BLOCK_TENSORS: the pack's QMatrix and
    float32 arrays (norms, biases, sinks) in the reference, the backend's handles in the fast
    engine. A bias's field is its weight's plus `_b`."""

    index: int
    attn_norm: Any        # [n_embd]
    attn_q: Any           # [n_head*head_dim rows, n_embd]
    attn_q_b: Any         # [n_head*head_dim]
    attn_k: Any           # [n_head_kv*head_dim rows, n_embd]
    attn_k_b: Any         # [n_head_kv*head_dim]
    attn_v: Any           # [n_head_kv*head_dim rows, n_embd]
    attn_v_b: Any         # [n_head_kv*head_dim]
    attn_output: Any      # [n_embd rows, n_head*head_dim]
    attn_output_b: Any    # [n_embd]
    attn_sinks: Any       # [n_head]: each head's sink logit
    ffn_norm: Any         # [n_embd]: blk.N.post_attention_norm
    ffn_gate_inp: Any     # router: [n_expert rows, n_embd]
    ffn_gate_inp_b: Any   # [n_expert]
    ffn_gate_exps: Any    # [E, n_ff_exp rows, n_embd]
    ffn_gate_exps_b: Any  # [E, n_ff_exp]
    ffn_up_exps: Any      # [E, n_ff_exp rows, n_embd]
    ffn_up_exps_b: Any    # [E, n_ff_exp]
    ffn_down_exps: Any    # [E, n_embd rows, n_ff_exp]
    ffn_down_exps_b: Any  # [E, n_embd]


check_layer_class(sys.modules[__name__])


def write_metadata(w, cfg) -> None:
    """The hyperparameter keys make-pack writes, in the converter's order (a gguf.GGUFWriter);
    rope.scaling.attn_factor only where it is not 1. make-pack writes no vocabulary: llama.cpp's
    loader then takes n_vocab from its key (the converter's files carry the token list instead)."""
    spec.write_metadata(sys.modules[__name__], w, cfg, (
        "n_layer", "context_length", "n_embd", "feed_forward", "n_head", "n_head_kv", "rope_base",
        "rms_eps", "n_expert", "n_expert_used", "head_dim", "value_length", "rope_scaling",
        "sliding_window", "n_ff_exp", "n_vocab"), attn_factor_always=False)


def hf_config(cfg) -> dict[str, object]:
    """transformers' GptOssConfig arguments for a model of ModelConfig `cfg` (the checkpoint
    llama.cpp's converter reads; tests/test_gpt_oss_transformers.py builds one): its field names
    and gpt-oss's fixed choices (q/k/v/o biases, the alternating layer types, the SwiGLU limit).
    YaRN's correction range is truncated (`truncate`: floor and ceil, as llama.cpp's rope and
    strata_prefill.contract.numerics.rope_table compute it; the released config.json says false)."""
    r = cfg.rope_scaling
    rope = None if r.type == "none" else {
        "rope_type": r.type, "factor": r.factor, **({
            "original_max_position_embeddings": r.original_context, "beta_fast": r.beta_fast,
            "beta_slow": r.beta_slow, "truncate": True} if r.type == "yarn" else {})}
    return {
        "num_hidden_layers": cfg.n_layer, "hidden_size": cfg.n_embd, "intermediate_size": cfg.n_ff_exp,
        "num_attention_heads": cfg.n_head, "num_key_value_heads": cfg.n_head_kv, "head_dim": cfg.head_dim,
        "num_local_experts": cfg.n_expert, "num_experts_per_tok": cfg.n_expert_used, "vocab_size": cfg.n_vocab,
        "sliding_window": cfg.sliding_window, "max_position_embeddings": cfg.context_length,
        "rms_norm_eps": cfg.rms_eps, "rope_theta": cfg.rope_base, "attention_bias": True,
        "layer_types": ["sliding_attention" if is_sliding(b) else "full_attention" for b in range(cfg.n_layer)],
        "rope_scaling": rope, "swiglu_limit": MOE.act.limit, "tie_word_embeddings": False,
    }
