"""bench/phase_floors.py's arithmetic: each phase's lower bounds (the contract's issue slots and
the bytes it must move) counted by hand for the strata shape, their scaling with the prompt,
and the pack and plot plumbing. The measured side needs the GPU (the script itself)."""
import json

import pytest
from gguf import GGMLQuantizationType as QT
from hypothesis import given, settings
from hypothesis import strategies as st

from bench import phase_floors as pf
from strata_prefill.contract import qformats
from strata_prefill.formats.config import PRESETS
from strata_prefill.formats.make_pack import make_pack
from strata_prefill.formats.pack import Pack

STRATA = PRESETS["strata"]
TYPES = {"attn_q": QT.Q8_0, "attn_k": QT.Q8_0, "attn_v": QT.Q8_0, "attn_output": QT.Q8_0,
         "ffn_gate_inp": QT.BF16, "ffn_gate_exps": QT.IQ2_XS, "ffn_down_exps": QT.Q8_0,
         "ffn_gate_shexp": QT.Q8_0, "ffn_up_shexp": QT.Q8_0, "ffn_down_shexp": QT.Q8_0}
H200 = pf.Device(schedulers=4 * 132, clock_hz=1.98e9, peak_bytes_per_s=4.8e12)


def test_attention_slots_per_pair():
    # hd 128: the score's 2, 16 per key (max, s - m, exp2c 9, lsum, p * dv, w max, P code 2),
    # O's update 2 x 128 / 64
    assert pf.attention_slots_per_pair(128) == 2 + 16 + 4
    assert pf.attention_slots_per_pair(64) == 2 + 16 + 2


def test_gate_up_and_down_by_hand():
    T, layers = 8192, 8
    fl = pf.phase_floors(STRATA, TYPES, T, layers, H200)
    rows = T * 10
    # gate and up: 2 matrices x rows x 640 outputs x 80 blocks x 6 slots (IQ2_XS)
    gu_ops = 2 * rows * 640 * 80 * 6
    assert fl["gate/up"]["issue_s"] == pytest.approx(gu_ops / 32 / 528 / 1.98e9 * layers, rel=1e-12)
    # down: rows x 2560 outputs x 20 blocks x 4 (Q8_0)
    dn_ops = rows * 2560 * 20 * 4
    assert fl["down"]["issue_s"] == pytest.approx(dn_ops / 32 / 528 / 1.98e9 * layers, rel=1e-12)
    # router: BF16, a product and a sum per multiply-add over 512 experts
    assert fl["router"]["issue_s"] == pytest.approx(2 * T * 512 * 2560 / 32 / 528 / 1.98e9 * layers, rel=1e-12)
    # the quantize is bytes only: h read, 10 q8_1 rows a token written
    assert fl["quantize"]["issue_s"] is None and fl["quantize"]["bound"] == "memory"
    assert fl["quantize"]["memory_s"] == pytest.approx((T * 2560 * 4 + rows * 2560 * 1.125) / 4.8e12 * layers)
    for v in fl.values():
        assert v["floor_s"] == max(v["memory_s"], v["issue_s"] or 0.0)
        assert v["bound"] == ("issue" if v["issue_s"] is not None and v["issue_s"] > v["memory_s"] else "memory")


def test_attention_counts_causal_pairs():
    fl1 = pf.phase_floors(STRATA, TYPES, 1, 1, H200)
    fl2 = pf.phase_floors(STRATA, TYPES, 4096, 1, H200)
    # T = 1: one pair a head; projections 4 slots per output and block
    # (22 slots a pair at head_dim 128: attention_slots_per_pair)
    proj = lambda T: 4 * T * (4096 * 80 + 2 * 512 * 80 + 2560 * 128)  # noqa: E731
    assert fl1["attention"]["issue_s"] == pytest.approx(H200.issue_s(proj(1) + 22 * 32), rel=1e-12)
    assert fl2["attention"]["issue_s"] == pytest.approx(H200.issue_s(proj(4096) + 22 * 32 * 4096 * 4097 / 2),
                                                        rel=1e-12)
    # a later chunk at position pos0 sees pos0 more keys per query
    fl3 = pf.phase_floors(STRATA, TYPES, 64, 1, H200, pos0=1000)
    assert fl3["attention"]["issue_s"] == pytest.approx(H200.issue_s(proj(64) + 22 * 32 * (64 * 1000 + 64 * 65 / 2)),
                                                        rel=1e-12)


@settings(max_examples=40, deadline=None)
@given(t=st.integers(1, 40000), layers=st.integers(1, 48))
def test_floors_grow_with_the_prompt_and_layers(t, layers):
    a = pf.phase_floors(STRATA, TYPES, t, layers, H200)
    b = pf.phase_floors(STRATA, TYPES, t + 1, layers, H200)
    c = pf.phase_floors(STRATA, TYPES, t, layers + 1, H200)
    assert a.keys() == b.keys() == c.keys()
    for k in a:
        assert b[k]["floor_s"] > a[k]["floor_s"] > 0
        assert c[k]["floor_s"] == pytest.approx(a[k]["floor_s"] * (layers + 1) / layers, rel=1e-12)


def test_a_type_without_a_count_keeps_the_memory_bound():
    types = dict(TYPES, ffn_down_exps=QT.TQ2_0)  # a gguf type the registry does not hold
    assert qformats.lookup(QT.TQ2_0) is None
    fl = pf.phase_floors(STRATA, types, 512, 1, H200)
    assert fl["down"]["issue_s"] is None and fl["down"]["bound"] == "memory"
    weights = min(512, 512 * 10) * 2560 * (640 // 256) * 66  # TQ2_0: 66 bytes a 256-value block
    assert fl["down"]["memory_s"] >= H200.bytes_s(weights)


@pytest.mark.parametrize("qt, slots", [
    # conversion (or the sub-scaled sum), dw * da, product, sum
    (QT.Q8_0, 4), (QT.IQ4_NL, 4), (QT.MXFP4, 4), (QT.IQ3_S, 4), (QT.IQ4_XS, 4),
    # two sub-scaled halves and their sum, then 3
    (QT.IQ2_XS, 6), (QT.Q6_K, 6), (QT.Q3_K, 6), (QT.IQ1_M, 6),
    (QT.Q4_1, 6),  # and mw * sa, its sum
    # sub-scaled sum, 3; mi = v * sum, mw * da, its product, the difference
    (QT.Q4_K, 8), (QT.Q5_K, 8),
    (QT.Q2_K, 12),  # each of the two integers from two halves and their sum
    (QT.NVFP4, 8),  # per half: conversion, dw_h * da, product; their sum; the accumulation
])
def test_epilogue_slots_by_hand(qt, slots):
    assert pf.epilogue_slots(qt) == slots


def test_every_registered_type_has_a_count():
    for f in qformats.formats():
        assert pf.epilogue_slots(f.qtype) >= 4


def test_a_mix_is_summed_layer_by_layer():
    """A Q4_K_M mix gives some layers Q6_K value and down matrices: the groups' floors are the
    layers' floors summed, not layer 0's times the layers."""
    cfg = PRESETS["qwen3-30b-a3b"].replace(n_layer=8)
    groups = pf.preset_groups(cfg, "qwen3-30b-a3b", mix="Q4_K_M")
    assert sum(n for _, n in groups) == 8 and len(groups) == 2
    downs = {t["ffn_down_exps"] for t, _ in groups}
    assert downs == {QT.Q4_K, QT.Q6_K}
    per_layer = [t for t, n in groups for _ in range(n)]
    whole = pf.model_floors(cfg, groups, 1024, H200)
    for name, fl in whole.items():
        want = sum(pf.phase_floors(cfg, t, 1024, 1, H200)[name]["floor_s"] for t in per_layer)
        assert fl["floor_s"] == pytest.approx(want, rel=1e-12)
    assert whole["down"]["floor_s"] != pytest.approx(pf.phase_floors(cfg, groups[0][0], 1024, 8, H200)["down"]["floor_s"])


def test_preset_groups_are_the_packs(tmp_path):
    """The floors alone plan the same types make-pack writes."""
    path = make_pack(tmp_path / "mix.gguf", "qwen3-30b-a3b", layers=3, mix="Q4_K_M", progress=False,
                     config=PRESETS["qwen3-30b-a3b"].replace(n_layer=3, n_expert=8, n_vocab=512))
    with Pack.open(path) as pack:
        got = pf.pack_groups(pack)
        cfg = pack.config
    assert got == pf.preset_groups(cfg, "qwen3-30b-a3b", mix="Q4_K_M")
    assert pf.preset_groups(cfg, "qwen3-30b-a3b", mix="Q2_K") != got


def test_floors_alone_print_the_ceiling(capsys, tmp_path):
    assert pf.main(["--preset", "qwen3-30b-a3b", "--mix", "Q4_K_M", "--layers", "4", "--tokens", "512,2048",
                    "--card", "132:1.98:4800", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "2 layers: attn_q Q4_K" in out and "ffn_down_exps Q6_K" in out
    cfg = PRESETS["qwen3-30b-a3b"].replace(n_layer=4)
    fl = pf.model_floors(cfg, pf.preset_groups(cfg, "qwen3-30b-a3b", mix="Q4_K_M"), 2048, H200)
    total = sum(v["floor_s"] for v in fl.values())
    assert f"at most {2048 / total:,.0f} tokens/s" in out
    saved = json.loads((tmp_path / "floors.json").read_text())
    assert [r["tokens"] for r in saved["runs"]] == [512, 2048] and saved["layers"] == 4
    with pytest.raises(SystemExit):  # the floors alone are no measured run to draw
        pf.main(["--plot", str(tmp_path / "floors.json"), str(tmp_path / "f.png")])
    assert "no measured runs" in capsys.readouterr().err


def test_cards():
    assert pf.card("H100") == pf.CARDS["h100"]
    assert pf.card("132:1.98:4800") == H200


def test_a_model_without_a_shared_expert_has_no_such_phase():
    fl = pf.phase_floors(PRESETS["qwen3-30b-a3b"], {k: v for k, v in TYPES.items() if "shexp" not in k}, 256, 1, H200)
    assert "shared expert" not in fl and "gate/up" in fl


def test_layer_types_of_a_pack_and_the_table(tmp_path):
    path = make_pack(tmp_path / "tiny.gguf", "tiny", expert_type="IQ2_XS", router_type="BF16")
    with Pack.open(path) as pack:
        types = pf.layer_types(pack)
        cfg = pack.config
    assert types["ffn_gate_exps"] == QT.IQ2_XS and types["ffn_gate_inp"] == QT.BF16
    fl = pf.phase_floors(cfg, types, 128, cfg.n_layer, H200)
    measured = {k: 2 * v["floor_s"] for k, v in fl.items()}
    measured["down"] = 0.5 * fl["down"]["floor_s"]  # faster than possible: the table must say so
    text = pf.format_table(128, measured, fl)
    assert "BELOW THE FLOOR" in text.split("down")[1].split("\n")[0]
    assert text.count("BELOW THE FLOOR") == 1
    assert " 2.0" in text.split("gate/up")[1].split("\n")[0]


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    fl = pf.phase_floors(STRATA, TYPES, 2048, 8, H200)
    res = {"device": "test", "pack": "strata8", "runs": [
        {"tokens": 2048, "measured": {k: 3 * v["floor_s"] for k, v in fl.items()}, "floors": fl}]}
    src = tmp_path / "f.json"
    src.write_text(json.dumps(res))
    assert pf.main(["--plot", str(src), str(tmp_path / "f.png")]) == 0
    assert (tmp_path / "f.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("argv, what", [
    (["--pack", "x.gguf", "--tokens", "2048,abc"], "comma-separated positive integers"),
    (["--pack", "x.gguf", "--tokens", "0"], "comma-separated positive integers"),
    (["--pack", "/nonexistent/strata8.gguf"], "no such file"),
    ([], "--pack is required"),
    (["--plot", "/nonexistent/f.json", "f.png"], "cannot read"),
    (["--preset", "nope"], "unknown preset 'nope'"),
    (["--preset", "qwen3-30b-a3b", "--mix", "Q9_X"], "unknown mix"),
    (["--preset", "qwen3-30b-a3b", "--layers", "0"], "positive number of layers"),
    (["--preset", "qwen3-30b-a3b", "--card", "a100"], "SMS:GHZ:GB/S"),
    (["--preset", "qwen3-30b-a3b", "--card", "132:0:3350"], "SMS:GHZ:GB/S"),
    (["--preset", "qwen3-30b-a3b", "--pack", "x.gguf"], "give no --pack"),
    (["--pack", "x.gguf", "--mix", "Q4_K_M"], "--mix goes with --preset"),
    (["--pack", "x.gguf", "--card", "h200"], "--card goes with --preset"),
])
def test_bad_arguments_are_one_line(argv, what, capsys):
    with pytest.raises(SystemExit) as e:
        pf.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert what in err[-1] and "Traceback" not in "\n".join(err)


def test_plot_refuses_a_json_that_is_not_a_floors_file(tmp_path, capsys):
    src = tmp_path / "other.json"
    src.write_text('{"results": []}')
    with pytest.raises(SystemExit):
        pf.main(["--plot", str(src), str(tmp_path / "f.png")])
    assert "not a phase_floors.json" in capsys.readouterr().err
    assert not (tmp_path / "f.png").exists()
