"""formats/archs/gpt_oss.py against gguf-py's own tables (every tensor kind of the table is one of
gguf.constants' GPT_OSS tensors and every GPT_OSS tensor is in the table; the keys are gguf.Keys'
formats filled with the architecture's name), its presets (shapes the paths need: MXFP4 rows a
multiple of 32, GQA, a context longer than the window), make-pack's gpt-oss packs (opened by
Pack: names, shapes, types from the table; the converter's type rule) and a file laid out as
llama.cpp's converter writes one (no vocab_size key: the vocabulary from the token list)."""
from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf.constants import MODEL_ARCH, MODEL_ARCH_NAMES, MODEL_TENSORS, TENSOR_NAMES

from strata_prefill.contract import moe, quants
from strata_prefill.contract.errors import PackError
from strata_prefill.formats import archs
from strata_prefill.formats import tensor_names as tn
from strata_prefill.formats.archs import gpt_oss as go
from strata_prefill.formats.config import PRESETS, RopeScaling
from strata_prefill.formats.make_pack import make_pack, plan_tensors
from strata_prefill.formats.pack import Pack

K = gguf.Keys
GPT_PRESETS = [n for n, c in PRESETS.items() if c.arch == go.NAME]


def test_architecture_is_registered_under_gguf_pys_name():
    assert MODEL_ARCH_NAMES[MODEL_ARCH.GPT_OSS] == go.NAME and archs.get(go.NAME) is go
    assert archs.module_name(go.NAME) == "gpt_oss"
    assert sorted(GPT_PRESETS) == ["gpt-oss-20b", "gpt-oss-tiny"]


def test_tensor_names_match_gguf_constants():
    want = {TENSOR_NAMES[t] for t in MODEL_TENSORS[MODEL_ARCH.GPT_OSS]}
    got = {TENSOR_NAMES[t.kind] for t in go.MODEL_TENSORS + go.BLOCK_TENSORS}
    assert got == want, (sorted(got - want), sorted(want - got))
    names = [t.name(0) for t in go.MODEL_TENSORS + go.BLOCK_TENSORS]
    assert len(set(names)) == len(names)
    # the biases llama.cpp's loader creates (openai-moe.cpp: create_tensor_qkv's and the four)
    biased = {t.part.removesuffix(".bias") for t in go.BLOCK_TENSORS if t.suffix == tn.BIAS}
    assert biased == {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate_inp", "ffn_gate_exps",
                      "ffn_up_exps", "ffn_down_exps"}
    assert [tn.file_name(t.name(3)) for t in go.BLOCK_TENSORS[1:3]] == ["blk.3.attn_q.weight", "blk.3.attn_q.bias"]
    assert tn.logical_name("blk.3.attn_q.bias") == "blk.3.attn_q.bias" and tn.logical_name("blk.3.attn_q.scale") is None


def test_layer_fields_are_the_agreed_names():
    assert [t.field for t in go.BLOCK_TENSORS] == [
        "attn_norm", "attn_q", "attn_q_b", "attn_k", "attn_k_b", "attn_v", "attn_v_b", "attn_output",
        "attn_output_b", "attn_sinks", "ffn_norm", "ffn_gate_inp", "ffn_gate_inp_b", "ffn_gate_exps",
        "ffn_gate_exps_b", "ffn_up_exps", "ffn_up_exps_b", "ffn_down_exps", "ffn_down_exps_b"]
    by = {t.field: t for t in go.BLOCK_TENSORS}
    assert by["ffn_norm"].name(5) == "blk.5.post_attention_norm"
    vectors = {f for f, t in by.items() if t.is_vector}
    assert vectors == {"attn_norm", "ffn_norm", "attn_sinks"} | {f for f in by if f.endswith("_b")}
    assert all(t.float_only for t in by.values() if t.is_vector)


def test_keys_are_gguf_pys():
    f = {"n_layer": K.LLM.BLOCK_COUNT, "context_length": K.LLM.CONTEXT_LENGTH, "n_embd": K.LLM.EMBEDDING_LENGTH,
         "n_head": K.Attention.HEAD_COUNT, "n_head_kv": K.Attention.HEAD_COUNT_KV,
         "rope_base": K.Rope.FREQ_BASE, "rms_eps": K.Attention.LAYERNORM_RMS_EPS, "n_expert": K.LLM.EXPERT_COUNT,
         "n_expert_used": K.LLM.EXPERT_USED_COUNT, "head_dim": K.Attention.KEY_LENGTH,
         "sliding_window": K.Attention.SLIDING_WINDOW, "n_ff_exp": K.LLM.EXPERT_FEED_FORWARD_LENGTH,
         "n_ff_shexp": K.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH, "n_vocab": K.LLM.VOCAB_SIZE}
    assert go.KEYS == {k: v.format(arch=go.NAME) for k, v in f.items()}
    r = {"type": K.Rope.SCALING_TYPE, "factor": K.Rope.SCALING_FACTOR, "original_context": K.Rope.SCALING_ORIG_CTX_LEN,
         "attn_factor": K.Rope.SCALING_ATTN_FACTOR}
    assert go.ROPE_KEYS == {k: v.format(arch=go.NAME) for k, v in r.items()}
    assert go.VALUE_LENGTH_KEY == K.Attention.VALUE_LENGTH.format(arch=go.NAME)
    assert go.FEED_FORWARD_KEY == K.LLM.FEED_FORWARD_LENGTH.format(arch=go.NAME)
    assert K.Rope.SCALING_YARN_BETA_FAST.format(arch=go.NAME) in go.ROPE_UNREAD_KEYS


def test_the_20b_preset():
    c = PRESETS["gpt-oss-20b"]
    assert (c.n_layer, c.n_expert, c.n_expert_used, c.n_embd, c.n_head, c.n_head_kv, c.head_dim, c.n_ff_exp,
            c.n_vocab, c.sliding_window, c.rope_base, c.rms_eps) == \
        (24, 32, 4, 2880, 64, 8, 64, 2880, 201088, 128, 150000.0, 1e-5)
    assert c.rope_scaling == RopeScaling("yarn", 32.0, 4096) and c.problems() == []
    shapes = {t.name(b): tuple(reversed(t.shape(c))) for t in go.BLOCK_TENSORS for b in (0, 23)}
    assert shapes["blk.23.ffn_gate_exps"] == (32, 2880, 2880) and shapes["blk.0.ffn_gate_exps.bias"] == (32, 2880)
    assert shapes["blk.0.attn_q"] == (4096, 2880) and shapes["blk.0.attn_k.bias"] == (512,)
    assert shapes["blk.0.attn_sinks"] == (64,) and shapes["blk.23.ffn_down_exps.bias"] == (32, 2880)
    assert len(go.MODEL_TENSORS) + 24 * len(go.BLOCK_TENSORS) == 3 + 24 * 19


@pytest.mark.parametrize("name", GPT_PRESETS)
def test_presets_fit_the_paths(name):
    c = PRESETS[name]
    vpb = quants.block_size(QT.MXFP4)[0]
    assert c.n_embd % vpb == 0 and c.n_ff_exp % vpb == 0  # MXFP4 rows of whole blocks, either product
    assert c.n_head % c.n_head_kv == 0 and c.n_head > c.n_head_kv  # GQA
    assert c.head_dim % 32 == 0 and c.n_expert_used <= min(32, c.n_expert)
    assert c.context_length > c.sliding_window >= 1 and not c.has_shexp
    assert [go.is_sliding(b) for b in range(4)] == [True, False, True, False]
    assert [go.ATTENTION.window(c, b) for b in range(2)] == [c.sliding_window, None]
    for p in plan_tensors(c.replace(n_layer=1), QT.MXFP4, QT.MXFP4, QT.Q8_0):
        assert p.qtype == QT.F32 or p.n_cols % quants.block_size(p.qtype)[0] == 0, p.name


def test_tiny_preset_is_small_and_windowed():
    c = PRESETS["gpt-oss-tiny"]
    assert c.sliding_window <= 16 and c.n_layer >= 2 and c.n_vocab <= 1024
    assert c.rope_scaling == PRESETS["gpt-oss-20b"].rope_scaling  # the released models' rope


def test_types_follow_the_converters_rule():
    """F32 for norms, biases, sinks and the router; the experts' type; the dense type else."""
    c = PRESETS["gpt-oss-tiny"]
    by = {p.name: p.qtype for p in plan_tensors(c, QT.MXFP4, QT.MXFP4, QT.Q8_0)}
    f32 = [n for n, t in by.items() if t == QT.F32]
    assert sorted(f32) == sorted(t.name(b) for b in range(c.n_layer) for t in go.BLOCK_TENSORS
                                 if t.is_vector or t.role == "router") + ["output_norm"]
    assert by["blk.0.ffn_down_exps"] == by["blk.1.ffn_up_exps"] == QT.MXFP4
    assert by["blk.0.attn_q"] == by["token_embd"] == by["output"] == QT.Q8_0


def test_moe_params_are_gpt_osss():
    m = go.MOE
    assert (m.scoring, m.renormalize, m.shared_expert, m.router_bias, m.expert_bias, m.activation) == \
        ("softmax_selected", False, "never", True, True, "swiglu_oai")
    assert m.act == moe.SwigluOai() and (m.act.alpha, m.act.limit) == (1.702, 7.0)
    assert not moe.unsupported(m)
    a = go.ATTENTION
    assert (a.qk_norm, a.rope, a.qkvo_bias, a.sinks, a.swa_every) == (False, "neox", True, True, 2)


def test_hf_config_names_the_same_shape():
    c = PRESETS["gpt-oss-tiny"]
    h = go.hf_config(c)
    assert (h["hidden_size"], h["num_local_experts"], h["num_experts_per_tok"], h["sliding_window"]) == \
        (c.n_embd, c.n_expert, c.n_expert_used, c.sliding_window)
    assert h["layer_types"] == ["sliding_attention", "full_attention"]
    assert h["rope_scaling"]["rope_type"] == "yarn" and h["rope_scaling"]["truncate"] is True
    assert h["swiglu_limit"] == 7.0


@pytest.fixture(scope="module")
def tiny_pack(tmp_path_factory):
    return make_pack(tmp_path_factory.mktemp("gpt_oss") / "tiny.gguf", preset="gpt-oss-tiny", seed=3)


def test_make_pack_writes_a_pack_pack_opens(tiny_pack):
    c = PRESETS["gpt-oss-tiny"]
    with Pack.open(tiny_pack) as pack:
        got = pack.config
        assert got.arch == go.NAME and got.sliding_window == c.sliding_window
        assert got.rope_scaling == c.rope_scaling and got.n_vocab == c.n_vocab
        assert (got.expert_gu_type, got.expert_down_type, got.dense_type) == (QT.MXFP4, QT.MXFP4, QT.Q8_0)
        assert pack.field(go.KEYS["n_vocab"]) == c.n_vocab  # no vocabulary written: llama.cpp reads the count here
        lay = pack.layer(1)
        assert isinstance(lay, go.Layer) and lay.index == 1
        assert lay.ffn_gate_exps_b.shape == (c.n_expert, c.n_ff_exp) and lay.ffn_gate_exps_b.dtype == np.float32
        assert lay.ffn_down_exps_b.shape == (c.n_expert, c.n_embd)
        assert lay.attn_sinks.shape == (c.n_head,) and lay.attn_q_b.shape == (c.n_q,)
        assert lay.ffn_norm.shape == (c.n_embd,) and lay.ffn_gate_inp.qtype == QT.F32
        assert lay.ffn_gate_exps.qtype == QT.MXFP4 and lay.ffn_gate_exps.n_expert == c.n_expert
        # the values as gguf-py reads them: the vectors are the F32 tensors' own
        t = pack.tensor("blk.1.ffn_up_exps.bias")
        assert t.name == "blk.1.ffn_up_exps.bias"
        np.testing.assert_array_equal(lay.ffn_up_exps_b, np.asarray(t.data, np.float32).reshape(c.n_expert, -1))
        assert np.std(lay.ffn_up_exps_b) > 0.05 and np.std(lay.attn_sinks) > 0.3  # random, not zeros
        ref = gguf.quants.dequantize(pack.tensor("blk.0.ffn_down_exps").data, QT.MXFP4)
        np.testing.assert_array_equal(pack.matrix("blk.0.ffn_down_exps").dequantize(), ref)


def _converter_like(path, c, *, drop=(), change=None, expert_type=QT.F16):
    """A GGUF laid out as llama.cpp's converter writes gpt-oss (the keys of
    tests/test_gpt_oss_transformers.py: no vocab_size, the betas written, a token list; F32
    norms, biases, sinks and router; F16 matrices), random values. drop: tensor names left out;
    change: {name: numpy shape} written instead of the table's."""
    rng = np.random.default_rng(1)
    w = gguf.GGUFWriter(str(path), go.NAME)
    p = go.NAME + "."
    for key, value in ((p + "block_count", c.n_layer), (p + "context_length", c.context_length),
                       (p + "embedding_length", c.n_embd), (p + "feed_forward_length", c.n_ff_exp),
                       (p + "attention.head_count", c.n_head), (p + "attention.head_count_kv", c.n_head_kv),
                       (p + "expert_count", c.n_expert), (p + "expert_used_count", c.n_expert_used),
                       (p + "attention.key_length", c.head_dim), (p + "attention.value_length", c.head_dim),
                       (p + "attention.sliding_window", c.sliding_window),
                       (p + "expert_feed_forward_length", c.n_ff_exp),
                       (p + "rope.scaling.original_context_length", c.rope_scaling.original_context)):
        w.add_uint32(key, value)
    for key, value in ((p + "rope.freq_base", c.rope_base), (p + "attention.layer_norm_rms_epsilon", c.rms_eps),
                       (p + "rope.scaling.factor", c.rope_scaling.factor),
                       (p + "rope.scaling.yarn_beta_fast", 32.0), (p + "rope.scaling.yarn_beta_slow", 1.0)):
        w.add_float32(key, value)
    w.add_string(p + "rope.scaling.type", "yarn")
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"<t{i}>" for i in range(c.n_vocab)])
    specs = [(t.name(), t) for t in go.MODEL_TENSORS] + [
        (t.name(b), t) for b in range(c.n_layer) for t in go.BLOCK_TENSORS]
    for name, t in specs:
        if name in drop:
            continue
        shape = (change or {}).get(name, tuple(reversed(t.shape(c))))
        x = rng.standard_normal(shape).astype(np.float32) * 0.05
        f32 = t.is_vector or t.role == "router"
        typ = expert_type if t.role.startswith("expert_") and not t.is_vector else None
        w.add_tensor(tn.file_name(name), x if f32 else x.astype(np.float16 if typ in (None, QT.F16) else np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_converters_file_opens(tmp_path):
    c = PRESETS["gpt-oss-tiny"]
    with Pack.open(_converter_like(tmp_path / "conv.gguf", c)) as pack:
        got = pack.config
        assert got.n_vocab == c.n_vocab and got.sliding_window == c.sliding_window  # the token list's count
        assert got.rope_scaling == c.rope_scaling
        assert (got.expert_gu_type, got.dense_type) == (QT.F16, QT.F16)
        assert pack.layer(0).ffn_gate_inp_b.shape == (c.n_expert,)


def test_a_converters_file_with_a_bad_bias_or_none_is_refused(tmp_path):
    c = PRESETS["gpt-oss-tiny"]
    bad = _converter_like(tmp_path / "a.gguf", c, drop={"blk.1.attn_sinks", "blk.0.ffn_up_exps.bias"})
    with pytest.raises(PackError, match=r"missing tensors blk\.0\.ffn_up_exps\.bias, blk\.1\.attn_sinks\.weight"):
        Pack.open(bad)
    bad = _converter_like(tmp_path / "b.gguf", c, change={"blk.0.ffn_down_exps.bias": (c.n_expert, c.n_ff_exp + 32)})
    with pytest.raises(PackError, match=r"tensor blk\.0\.ffn_down_exps\.bias has the wrong shape: expected \[256, 8\]"):
        Pack.open(bad)


def test_a_missing_window_key_is_refused(tmp_path):
    c = PRESETS["gpt-oss-tiny"]
    path = _converter_like(tmp_path / "c.gguf", c)
    fields = dict(Pack.open(path).reader.fields)
    del fields["gpt-oss.attention.sliding_window"]
    from strata_prefill.formats.config import ModelConfig
    with pytest.raises(PackError, match=r"^missing metadata key gpt-oss\.attention\.sliding_window$"):
        ModelConfig.from_metadata(fields)
    with pytest.raises(PackError, match=r"gpt-oss\.attention\.sliding_window 0: must be at least 1"):
        ModelConfig.from_metadata({**fields, "gpt-oss.attention.sliding_window": 0})
