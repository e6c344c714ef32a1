"""llama.cpp's tensor names: a qwen3moe file written the way llama.cpp's converters write one
(gguf-py's GGUFWriter and its own name tables, `.weight` suffixes, gguf's quantizer), not by
make-pack, opens with Pack.open; the project's names come from the same tables."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf import GGUFWriter
from gguf import quants as gq
from gguf.constants import MODEL_ARCH, MODEL_TENSOR, MODEL_TENSORS, TENSOR_NAMES

from strata_prefill.formats import archs, tensor_names
from strata_prefill.formats.pack import Pack

T = MODEL_TENSOR
D, HEADS, KV, HD, E, USED, F, S, V, LAYERS = 64, 2, 1, 32, 4, 2, 32, 32, 40, 2


def gguf_name(t: MODEL_TENSOR, bid: int | None = None) -> str:
    return TENSOR_NAMES[t].format(bid=bid) + ".weight"


def write_converter_style(path, rng) -> dict[str, tuple[QT, np.ndarray]]:
    """A small qwen3moe model with a shared expert; returns file name -> (type, float values)
    of every tensor (the values a reader must decode)."""
    w = GGUFWriter(path, "qwen3moe")
    w.add_block_count(LAYERS)
    w.add_context_length(256)
    w.add_embedding_length(D)
    w.add_feed_forward_length(F)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV)
    w.add_key_length(HD)
    w.add_value_length(HD)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_expert_count(E)
    w.add_expert_used_count(USED)
    w.add_expert_feed_forward_length(F)
    w.add_expert_shared_feed_forward_length(S)
    w.add_vocab_size(V)
    shapes = {gguf_name(T.TOKEN_EMBD): (V, D), gguf_name(T.OUTPUT_NORM): (D,), gguf_name(T.OUTPUT): (V, D)}
    for b in range(LAYERS):
        shapes.update({
            gguf_name(T.ATTN_NORM, b): (D,), gguf_name(T.ATTN_Q, b): (HEADS * HD, D),
            gguf_name(T.ATTN_K, b): (KV * HD, D), gguf_name(T.ATTN_V, b): (KV * HD, D),
            gguf_name(T.ATTN_OUT, b): (D, HEADS * HD), gguf_name(T.ATTN_Q_NORM, b): (HD,),
            gguf_name(T.ATTN_K_NORM, b): (HD,), gguf_name(T.FFN_NORM, b): (D,),
            gguf_name(T.FFN_GATE_INP, b): (E, D), gguf_name(T.FFN_GATE_EXP, b): (E, F, D),
            gguf_name(T.FFN_UP_EXP, b): (E, F, D), gguf_name(T.FFN_DOWN_EXP, b): (E, D, F),
            gguf_name(T.FFN_GATE_INP_SHEXP, b): (D,), gguf_name(T.FFN_GATE_SHEXP, b): (S, D),
            gguf_name(T.FFN_UP_SHEXP, b): (S, D), gguf_name(T.FFN_DOWN_SHEXP, b): (D, S),
        })
    out = {}
    for name, shape in shapes.items():
        vals = (rng.standard_normal(shape) * 0.1).astype(np.float32)
        if len(shape) == 1 or ".ffn_gate_inp." in name:
            qt = QT.F32  # norms and the router, as the converters keep them
            w.add_tensor(name, vals)
        elif ".attn_k." in name:
            qt = QT.F16
            vals = vals.astype(np.float16).astype(np.float32)
            w.add_tensor(name, vals.astype(np.float16))
        else:
            qt = QT.Q8_0
            q = gq.quantize(vals, qt)
            vals = gq.dequantize(q, qt).reshape(shape)
            w.add_tensor(name, q, raw_dtype=qt)
        out[name] = (qt, vals)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def test_pack_opens_a_converter_style_file(tmp_path):
    path = tmp_path / "converted.gguf"
    written = write_converter_style(path, np.random.default_rng(1))
    pack = Pack.open(path)
    c = pack.config
    assert (c.n_layer, c.n_embd, c.n_head, c.n_head_kv, c.head_dim, c.n_expert, c.n_expert_used,
            c.n_ff_exp, c.n_ff_shexp, c.n_vocab) == (LAYERS, D, HEADS, KV, HD, E, USED, F, S, V)
    assert c.expert_gu_type == c.expert_down_type == c.dense_type == QT.Q8_0
    assert not pack.tied_embeddings and pack.pack_format is None
    # logical names in, the file's bytes out
    for logical in ("blk.0.attn_q", "blk.1.attn_k", "blk.1.ffn_gate_inp", "blk.0.ffn_down_shexp",
                    "output", "blk.1.ffn_gate_inp_shexp"):
        qt, vals = written[logical + ".weight"]
        m = pack.matrix(logical)
        assert m.qtype == qt, logical
        assert np.array_equal(m.dequantize(), vals.reshape(m.n_rows, m.n_cols)), logical
    qt, gate = written["blk.1.ffn_gate_exps.weight"]
    lay = pack.layer(1)
    assert np.array_equal(lay.ffn_gate_exps.expert(3).dequantize(), gate[3])
    assert np.array_equal(lay.attn_norm, written["blk.1.attn_norm.weight"][1])
    assert lay.has_shexp
    _, emb = written["token_embd.weight"]
    assert np.array_equal(pack.embedding_rows([0, 7, V - 1]), emb[[0, 7, V - 1]])
    assert pack.tensor_type("token_embd") == QT.Q8_0
    assert pack.tensor("blk.0.attn_q").name == "blk.0.attn_q.weight"


def test_names_come_from_gguf_tables():
    arch = archs.get("qwen3moe")
    own = {TENSOR_NAMES[t] for t in MODEL_TENSORS[MODEL_ARCH.QWEN3MOE]}
    table = arch.MODEL_TENSORS + arch.BLOCK_TENSORS
    for t in table:
        if t.group == "shexp":
            assert t.kind in MODEL_TENSORS[arch.SHEXP_ARCH]
        else:
            assert TENSOR_NAMES[t.kind] in own
    assert {t.group for t in table} == {None, "output", "shexp"}
    assert tensor_names.name(T.FFN_GATE_EXP, 3) == "blk.3.ffn_gate_exps"
    assert tensor_names.file_name("blk.3.ffn_gate_exps") == "blk.3.ffn_gate_exps.weight"
    assert tensor_names.logical_name("token_embd.weight") == "token_embd"
    assert tensor_names.logical_name("token_embd") is None


def test_make_pack_writes_only_gguf_names(make_test_pack):
    """Every tensor make-pack writes is a qwen3moe (or shared-expert) name plus `.weight`."""
    pack = make_test_pack("tiny")
    arch = pack.config.spec
    allowed = set()
    for l in range(pack.config.n_layer):
        for t in arch.BLOCK_TENSORS:
            allowed.add(gguf_name(t.kind, l))
    allowed |= {gguf_name(t.kind) for t in arch.MODEL_TENSORS}
    names = {t.name for t in pack.reader.tensors}
    assert names <= allowed and len(names) == len(allowed)


@pytest.mark.parametrize("missing", ["blk.1.ffn_up_shexp", "output_norm"])
def test_converter_style_file_missing_tensor_named_as_in_the_file(tmp_path, missing):
    from strata_prefill.contract.errors import PackError

    src = tmp_path / "full.gguf"
    written = write_converter_style(src, np.random.default_rng(2))
    # rewrite without one tensor
    path = tmp_path / "missing.gguf"
    from gguf import GGUFReader

    r = GGUFReader(src)
    w = GGUFWriter(path, "qwen3moe")
    for k, f in r.fields.items():
        if k.startswith("qwen3moe."):
            w.add_key_value(k, f.contents(), f.types[0])
    for t in r.tensors:
        if t.name != missing + ".weight":
            qt, _ = written[t.name]
            w.add_tensor(t.name, np.asarray(t.data), raw_dtype=qt if qt != QT.F32 else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(PackError, match=f"missing tensor {missing}.weight"):
        Pack.open(path)
