"""make-pack's types beyond one per role: every registered type for the experts and for the
dense matrices, and the llama-quantize mixes (formats/mixes.py: `--mix Q4_K_M`, `--mix Q2_K`).

The mixes' expected types are written here from llama.cpp's src/llama-quant.cpp as tables of
their own (qwen3moe, no importance matrix), not computed by the module under test."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader
from gguf import quants as gq

from strata_prefill.formats.config import PRESETS
from strata_prefill.contract.errors import InputError
from strata_prefill.formats.make_pack import make_pack
from strata_prefill.formats.mixes import MIXES, layer_classes, layer_key, mix_types, use_more_bits
from strata_prefill.formats.pack import Pack
from strata_prefill.cli import main as cli

NEW = ["Q4_0", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "Q3_K"]


def file_types(path) -> dict[str, str]:
    """{file tensor name: type name} as plain gguf-py reads the file."""
    return {t.name: QT(t.tensor_type).name for t in GGUFReader(path).tensors}


# ---------------------------------------------------------------------------- one type per role


@pytest.mark.parametrize("qt", NEW)
def test_every_new_type_for_experts_and_for_dense_matrices(tmp_path, qt):
    other = "Q8_0" if qt != "Q8_0" else "Q4_0"
    for expert, dense in ((qt, other), (other, qt)):
        path = make_pack(tmp_path / f"{expert}-{dense}.gguf", "tiny", layers=1, expert_type=expert,
                         dense_type=dense, seed=4)
        types = file_types(path)
        for name, t in types.items():
            if name.endswith("_norm.weight") or "ffn_gate_inp" in name:
                assert t == "F32", name
            elif "_exps." in name:
                assert t == expert, name
            else:
                assert t == dense, name
        pack = Pack.open(path)
        # what the loader reads is what gguf-py decodes, value for value
        for name in ("blk.0.ffn_up_exps", "blk.0.attn_v", "token_embd"):
            m = pack.matrix(name)
            want = gq.dequantize(np.asarray(m.data), m.qtype)
            assert np.array_equal(m.dequantize().view(np.uint32), want.view(np.uint32)), name
        # random valid blocks at the asked scale: the values spread as make-pack intends
        x = pack.matrix("blk.0.attn_q").dequantize()
        assert 0.02 < float(x.std()) < 0.2


def test_a_dense_type_that_does_not_fit_is_refused_in_one_line(tmp_path, capsys):
    # the strata preset's shared expert has rows of 640: no 256-value type divides them
    with pytest.raises(InputError, match=r"dense type Q4_K: the rows of blk\.\{0\.\.3\}\.ffn_down_shexp\.weight "
                                         r"are not a multiple of its 256-value block"):
        make_pack(tmp_path / "x.gguf", "strata", dense_type="Q4_K")
    assert not list(tmp_path.iterdir())
    assert cli(["make-pack", "--preset", "strata", "--layers", "2", "--dense-type", "Q6_K",
                str(tmp_path / "x.gguf")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "blk.{0,1}.ffn_down_shexp.weight" in err[0]
    assert not list(tmp_path.iterdir())


# ---------------------------------------------------------------------------- mixes


def test_use_more_bits_is_llama_quantize_s():
    # 48 layers: the first and last six, and every third between from layer 8
    assert [i for i in range(48) if use_more_bits(i, 48)] == [
        0, 1, 2, 3, 4, 5, 8, 11, 14, 17, 20, 23, 26, 29, 32, 35, 38, 41, 42, 43, 44, 45, 46, 47]
    assert [i for i in range(2) if use_more_bits(i, 2)] == [1]
    assert [i for i in range(4) if use_more_bits(i, 4)] == [2, 3]


# tiny: 2 layers, 4 heads on 2 KV heads, 16 experts, rows of 256 everywhere, a shared expert
TINY_Q4_K_M = {
    "token_embd": "Q4_K", "output": "Q6_K",
    **{f"blk.{l}.{k}": "Q4_K" for l in (0, 1) for k in (
        "attn_q", "attn_k", "attn_output", "ffn_gate_exps", "ffn_up_exps", "ffn_gate_shexp", "ffn_up_shexp")},
    "blk.0.attn_v": "Q4_K", "blk.1.attn_v": "Q6_K",
    "blk.0.ffn_down_exps": "Q4_K", "blk.1.ffn_down_exps": "Q6_K",
    "blk.0.ffn_down_shexp": "Q4_K", "blk.1.ffn_down_shexp": "Q6_K",
}
TINY_Q2_K = {
    "token_embd": "Q2_K", "output": "Q6_K",
    **{f"blk.{l}.{k}": "Q2_K" for l in (0, 1) for k in (
        "attn_q", "attn_k", "ffn_gate_exps", "ffn_up_exps", "ffn_gate_shexp", "ffn_up_shexp")},
    **{f"blk.{l}.{k}": "Q3_K" for l in (0, 1) for k in (
        "attn_v", "attn_output", "ffn_down_exps", "ffn_down_shexp")},  # n_gqa 2: attn_v Q3_K
}


@pytest.mark.parametrize("mix, want", [("Q4_K_M", TINY_Q4_K_M), ("Q2_K", TINY_Q2_K)])
def test_tiny_mix_types(mix, want):
    got = {k: v.name for k, v in mix_types(PRESETS["tiny"], mix).items()}
    assert got == want


# the IQ file types on tiny: 2 layers (n/8 = 0: no ffn_down of the first eighth), n_gqa 2, 16 experts
TINY_IQ4_XS = {"token_embd": "IQ4_XS", "output": "Q6_K",
               **{f"blk.{l}.{k}": "IQ4_XS" for l in (0, 1) for k in (
                   "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps",
                   "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp")}}


def _tiny_iq_low(base: str, attn_output: str) -> dict:
    return {"token_embd": "Q2_K", "output": "Q5_K",
            **{f"blk.{l}.{k}": base for l in (0, 1) for k in (
                "attn_q", "attn_k", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps",
                "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp")},
            **{f"blk.{l}.attn_v": "Q4_K" for l in (0, 1)},  # 16 experts (>= 4): Q4_K
            **{f"blk.{l}.attn_output": attn_output for l in (0, 1)}}


@pytest.mark.parametrize("mix, want", [("IQ4_XS", TINY_IQ4_XS), ("IQ2_XXS", _tiny_iq_low("IQ2_XXS", "IQ2_XXS")),
                                       ("IQ1_S", _tiny_iq_low("IQ1_S", "IQ2_XXS"))])
def test_tiny_iq_mix_types(mix, want):
    got = {k: v.name for k, v in mix_types(PRESETS["tiny"], mix).items()}
    assert got == want


def test_iq_mixes_on_48_layers():
    # qwen3-30b-a3b: 48 layers (n/8 = 6), 32 query heads on 4, 128 experts, no shared expert
    cfg = PRESETS["qwen3-30b-a3b"]
    xs = mix_types(cfg, "IQ4_XS")
    assert [xs[f"blk.{l}.ffn_down_exps"].name for l in range(8)] == ["Q5_K"] * 6 + ["IQ4_XS"] * 2
    assert {xs[f"blk.{l}.attn_v"].name for l in range(48)} == {"Q5_K"}
    assert (xs["output"].name, xs["token_embd"].name, xs["blk.9.attn_output"].name) == ("Q6_K", "IQ4_XS", "IQ4_XS")
    for mix in ("IQ2_XXS", "IQ1_S"):
        t = mix_types(cfg, mix)
        assert [t[f"blk.{l}.ffn_down_exps"].name for l in range(8)] == ["Q2_K"] * 6 + [mix] * 2
        assert {t[f"blk.{l}.attn_v"].name for l in range(48)} == {"Q4_K"}
        assert {t[f"blk.{l}.attn_output"].name for l in range(48)} == {"IQ2_XXS"}
        assert (t["output"].name, t["token_embd"].name) == ("Q5_K", "Q2_K")


def test_iq_low_mix_counts_ffn_down_tensors_and_falls_back_on_640_rows():
    # strata, 24 layers: a shared expert, so 48 ffn_down tensors in file order (a layer's experts'
    # then its shared expert's), the first 24 / 8 = 3 of them Q2_K: layer 0's two and layer 1's
    # experts'. Expert rows of 640 fit no 256-value block: Q2_K -> Q4_0, IQ2_XXS -> IQ4_NL.
    t = mix_types(PRESETS["strata"].replace(n_layer=24), "IQ2_XXS")
    got = [(t[f"blk.{l}.ffn_down_exps"].name, t[f"blk.{l}.ffn_down_shexp"].name) for l in range(3)]
    assert got == [("Q4_0", "Q4_0"), ("Q4_0", "IQ4_NL"), ("IQ4_NL", "IQ4_NL")]
    assert t["blk.5.ffn_gate_exps"].name == "IQ2_XXS"  # rows of 2,560 = 10 x 256


@settings(max_examples=60, deadline=None)
@given(preset=st.sampled_from(sorted(PRESETS)), n=st.integers(1, 200), mix=st.sampled_from(sorted(MIXES)))
def test_layer_classes_count_what_the_walk_finds(preset, n, mix):
    cfg = PRESETS[preset].replace(n_layer=n)
    walked = Counter(layer_key(cfg, mix, l) for l in range(n))
    assert layer_classes(cfg, mix) == walked


def test_mix_fallbacks_and_the_tied_head():
    # small: expert rows of 384 (no 256-value block fits): Q4_K -> Q5_0, Q6_K -> Q8_0, Q3_K -> Q4_0
    small = PRESETS["small"]  # 4 layers: use_more_bits picks 2 and 3
    q4 = mix_types(small, "Q4_K_M")
    assert [q4[f"blk.{l}.ffn_down_exps"].name for l in range(4)] == ["Q5_0", "Q5_0", "Q8_0", "Q8_0"]
    assert [q4[f"blk.{l}.attn_v"].name for l in range(4)] == ["Q4_K", "Q4_K", "Q6_K", "Q6_K"]
    q2 = mix_types(small, "Q2_K")
    assert {q2[f"blk.{l}.ffn_down_exps"].name for l in range(4)} == {"Q4_0"}
    assert {q2[f"blk.{l}.ffn_gate_exps"].name for l in range(4)} == {"Q2_K"}
    # tied: token_embd is the head, Q6_K; no output
    tied = mix_types(small, "Q2_K", tie_embeddings=True)
    assert tied["token_embd"] == QT.Q6_K and "output" not in tied
    # 8 query heads per KV head (qwen3-30b-a3b: 32 on 4): Q2_K's attn_v is Q4_K
    big = mix_types(PRESETS["qwen3-30b-a3b"].replace(n_layer=4), "Q2_K")
    assert {big[f"blk.{l}.attn_v"] for l in range(4)} == {QT.Q4_K}
    # a model of exactly 8 experts: attn_v and attn_k Q8_0, attn_output Q5_K
    eight = mix_types(PRESETS["tiny"].replace(n_expert=8, n_expert_used=2), "Q4_K_M")
    assert (eight["blk.0.attn_v"], eight["blk.0.attn_k"], eight["blk.0.attn_output"]) == (QT.Q8_0, QT.Q8_0, QT.Q5_K)


def test_make_pack_writes_the_mix(tmp_path):
    path = make_pack(tmp_path / "m.gguf", "small", layers=4, mix="q4_k_m", seed=2)
    types = file_types(path)
    want = {k + ".weight": v.name for k, v in mix_types(PRESETS["small"], "Q4_K_M").items()}
    assert {k: types[k] for k in want} == want
    assert all(types[k] == "F32" for k in types if k not in want)  # norms and the router
    pack = Pack.open(path)
    assert pack.field("strata.mix") == "Q4_K_M" and pack.fallbacks == []
    assert pack.field("general.file_type") == 15  # llama.cpp's LLAMA_FTYPE_MOSTLY_Q4_K_M
    assert [pack.expert_types(l)[1].name for l in range(4)] == ["Q5_0", "Q5_0", "Q8_0", "Q8_0"]
    # the same arguments, the same bytes; the mix's base expert type may be given
    again = make_pack(tmp_path / "m2.gguf", "small", layers=4, mix="Q4_K_M", expert_type="Q4_K", seed=2)
    assert again.read_bytes() == path.read_bytes()


def test_mix_arguments_refused_in_one_line(tmp_path, capsys):
    out = str(tmp_path / "x.gguf")
    for args in (["--mix", "Q2_K", "--dense-type", "Q8_0"], ["--mix", "Q2_K", "--expert-type", "Q4_K"],
                 ["--mix", "Q3_K_M"]):
        assert cli(["make-pack", *args, out]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 3
    assert "--mix Q2_K sets the dense matrices' types: give no --dense-type" in err[0]
    assert "--mix Q2_K writes its experts in Q2_K" in err[1]
    assert "argument --mix: invalid choice: 'Q3_K_M'" in err[2]
    assert not list(tmp_path.iterdir())
    with pytest.raises(InputError, match="unknown mix 'q5_k_s' \\(mixes: Q4_K_M, Q2_K, IQ4_XS, IQ2_XXS, IQ1_S\\)"):
        make_pack(tmp_path / "y.gguf", mix="q5_k_s")


def test_both_backends_take_a_mixed_pack(tmp_path):
    """Every type of a mix has a CUDA MMQ kernel, so the cuda backend finds nothing to refuse in
    the pack (its bytes: the mix's cuda parity rows, verify/cases.py); the sim runs it (the sim
    rows)."""
    from strata_prefill.fast import make_fast_engine

    for mix in MIXES:
        pack = Pack.open(make_pack(tmp_path / f"{mix}.gguf", "tiny", mix=mix, seed=1))
        assert pack.cuda_type_problems() == []
        assert pack.config.cuda_problems() == []
    make_fast_engine(pack, "sim")


@pytest.mark.parametrize("preset, layers, mix, tie", [("tiny", 3, "Q4_K_M", False), ("small", 9, "Q4_K_M", True),
                                                      ("small", 2, "Q2_K", False), ("small", 17, "IQ4_XS", False),
                                                      ("tiny", 20, "IQ2_XXS", False), ("small", 9, "IQ1_S", True)])
def test_a_mix_is_sized_from_the_arguments_alone(tmp_path, preset, layers, mix, tie):
    """make-pack's free-disk check sizes a mix by its classes of layer: the data it writes."""
    import argparse

    from strata_prefill.commands.make_pack import data_bytes

    out = make_pack(tmp_path / "m.gguf", preset, layers=layers, mix=mix, tie_embeddings=tie)
    data = sum(int(t.n_bytes) for t in GGUFReader(out).tensors)
    args = argparse.Namespace(preset=preset, layers=layers, expert_type=None, dense_type=None,
                              router_type=None, tie_embeddings=tie, mix=mix)
    assert data_bytes(args) == data
    assert data_bytes(argparse.Namespace(**{**vars(args), "layers": 10**9})) > 10**9 * data // (2 * layers)


def test_info_names_the_mix_and_counts_the_tensors_by_type(tmp_path, capsys):
    out = tmp_path / "mix.gguf"
    make_pack(out, "tiny", mix="Q4_K_M", progress=False)
    assert cli(["info", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "mix:            Q4_K_M (llama-quantize's choice of type per matrix, formats/mixes.py)" in lines
    (types,) = [ln for ln in lines if ln.startswith("tensor types:   ")]
    want = {}
    for name, t in file_types(out).items():
        want[t] = want.get(t, 0) + 1
    got = dict(part.split(" ") for part in types[len("tensor types:   "):].split(", "))
    assert {k: int(v) for k, v in got.items()} == want and "Q6_K" in want and "Q4_K" in want
