"""formats/gpt_oss_table.py against gguf-py's own tables: every tensor template of the table is
one of gguf.constants' GPT_OSS tensors and every GPT_OSS tensor is in the table; the keys are
gguf.Keys' formats filled with the architecture's name; the presets' shapes hold what the
project's paths need (MXFP4 rows a multiple of 32, GQA, a context longer than the window)."""
from __future__ import annotations

import gguf
import pytest
from gguf import GGMLQuantizationType as QT
from gguf.constants import MODEL_ARCH, MODEL_ARCH_NAMES, MODEL_TENSORS, TENSOR_NAMES

from strata_prefill.formats import gpt_oss_table as gt
from strata_prefill.contract import quants

K = gguf.Keys


def test_architecture_name_is_gguf_pys():
    assert MODEL_ARCH_NAMES[MODEL_ARCH.GPT_OSS] == gt.ARCH


def test_tensor_names_match_gguf_constants():
    want = {TENSOR_NAMES[t] for t in MODEL_TENSORS[MODEL_ARCH.GPT_OSS]}
    got = {s.template for s in gt.TENSORS}
    assert got == want, (sorted(got - want), sorted(want - got))
    # each tensor's weight once, and the biases llama.cpp's loader creates (openai-moe.cpp)
    names = [(s.template, s.suffix) for s in gt.TENSORS]
    assert len(set(names)) == len(names)
    biased = {s.template.split(".")[-1] for s in gt.TENSORS if s.suffix == ".bias"}
    assert biased == {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate_inp", "ffn_gate_exps",
                      "ffn_up_exps", "ffn_down_exps"}


def test_keys_are_gguf_pys():
    f = {"n_layer": K.LLM.BLOCK_COUNT, "context_length": K.LLM.CONTEXT_LENGTH, "n_embd": K.LLM.EMBEDDING_LENGTH,
         "n_ff": K.LLM.FEED_FORWARD_LENGTH, "n_head": K.Attention.HEAD_COUNT, "n_head_kv": K.Attention.HEAD_COUNT_KV,
         "rope_base": K.Rope.FREQ_BASE, "rms_eps": K.Attention.LAYERNORM_RMS_EPS, "n_expert": K.LLM.EXPERT_COUNT,
         "n_expert_used": K.LLM.EXPERT_USED_COUNT, "head_dim": K.Attention.KEY_LENGTH,
         "head_dim_v": K.Attention.VALUE_LENGTH, "sliding_window": K.Attention.SLIDING_WINDOW,
         "n_ff_exp": K.LLM.EXPERT_FEED_FORWARD_LENGTH}
    assert gt.KEYS == {k: v.format(arch=gt.ARCH) for k, v in f.items()}
    r = {"type": K.Rope.SCALING_TYPE, "factor": K.Rope.SCALING_FACTOR, "original_context": K.Rope.SCALING_ORIG_CTX_LEN,
         "beta_fast": K.Rope.SCALING_YARN_BETA_FAST, "beta_slow": K.Rope.SCALING_YARN_BETA_SLOW}
    assert gt.ROPE_KEYS == {k: v.format(arch=gt.ARCH) for k, v in r.items()}


def test_the_20b_preset():
    c = gt.PRESETS["gpt-oss-20b"]
    assert (c.n_layer, c.n_expert, c.n_expert_used, c.n_embd, c.n_head, c.n_head_kv, c.head_dim, c.n_ff_exp,
            c.n_vocab, c.sliding_window) == (24, 32, 4, 2880, 64, 8, 64, 2880, 201088, 128)
    assert c.expert_gu_type == c.expert_down_type == QT.MXFP4
    md = gt.metadata(c)
    assert md["gpt-oss.expert_count"] == 32 and md["gpt-oss.attention.sliding_window"] == 128
    assert md["gpt-oss.rope.scaling.type"] == "yarn" and md["gpt-oss.rope.freq_base"] == 150000.0
    sizes = dict((n, s) for n, s, _ in gt.tensors(c))
    assert sizes["blk.23.ffn_gate_exps.weight"] == (32, 2880, 2880)
    assert sizes["blk.0.attn_q.weight"] == (4096, 2880) and sizes["blk.0.attn_k.bias"] == (512,)
    assert sizes["blk.5.attn_sinks.weight"] == (64,) and sizes["blk.5.ffn_down_exps.bias"] == (32, 2880)
    assert len(sizes) == 3 + 24 * 19


@pytest.mark.parametrize("name", sorted(gt.PRESETS))
def test_presets_fit_the_paths(name):
    c = gt.PRESETS[name]
    vpb = quants.block_size(QT.MXFP4)[0]
    assert c.n_embd % vpb == 0 and c.n_ff_exp % vpb == 0  # MXFP4 rows of whole blocks, either product
    assert c.n_head % c.n_head_kv == 0 and c.n_head > c.n_head_kv  # GQA
    assert c.head_dim % 32 == 0 and c.n_expert_used <= min(32, c.n_expert)
    assert c.context_length > c.sliding_window
    assert [gt.is_sliding(b) for b in range(4)] == [True, False, True, False]
    for n, s, spec in gt.tensors(c):
        t = gt.tensor_type(spec, c)
        assert t == QT.F32 or s[-1] % quants.block_size(t)[0] == 0, n


def test_tiny_preset_is_small_and_windowed():
    c = gt.PRESETS["gpt-oss-tiny"]
    assert c.sliding_window <= 16 and c.n_layer >= 2 and c.n_vocab <= 1024
    assert c.expert_gu_type == QT.MXFP4


def test_types_follow_the_converters_rule():
    c = gt.PRESETS["gpt-oss-tiny"]
    by = {n: gt.tensor_type(spec, c) for n, _, spec in gt.tensors(c)}
    assert by["blk.0.ffn_gate_inp.weight"] == by["blk.0.ffn_up_exps.bias"] == by["blk.1.attn_sinks.weight"] == QT.F32
    assert by["blk.0.ffn_down_exps.weight"] == QT.MXFP4 and by["blk.0.attn_q.weight"] == QT.Q8_0
    assert gt.tensor_type(gt.TENSORS[0], c, QT.F16) == QT.F16


def test_moe_form_is_gpt_oss():
    assert gt.MOE.gating == "softmax_selected" and gt.MOE.router_bias and gt.MOE.expert_bias
    assert (gt.MOE.act.alpha, gt.MOE.act.limit) == (1.702, 7.0) and not gt.MOE.shared_expert


def test_hf_config_names_the_same_shape():
    c = gt.PRESETS["gpt-oss-tiny"]
    h = gt.hf_config(c)
    assert (h["hidden_size"], h["num_local_experts"], h["num_experts_per_tok"], h["sliding_window"]) == \
        (c.n_embd, c.n_expert, c.n_expert_used, c.sliding_window)
    assert h["layer_types"] == ["sliding_attention", "full_attention"]
