"""Float experts (F16, BF16, F32 `ffn_*_exps`, docs/numerics.md section 6): make-pack writes
them and `info` shows them; the reference multiplies each expert's gathered rows, never
quantized, by the float product of section 3a, checked against float64 products of the
weights as `gguf.quants.dequantize` reads them (within the float product's own rounding, far
inside a q8_1 activation's error) and against the definition's bytes; packs that mix float and
quantized experts; and the sim's walk over them: byte parity with the reference, the products
per expert, the streamed blobs' bytes counted. The parity table's float rows (verify/cases.py,
FLOAT_EXPERT_TYPES) run every switch on both backends."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from hypothesis import given, settings, strategies as st
from gguf.quants import dequantize

from strata_prefill.fast import make_fast_engine
from strata_prefill.reference.model import ReferenceEngine
from strata_prefill.reference.moe_half import moe_half
from strata_prefill.contract import dense
from strata_prefill.formats import make_pack as make_pack_module
from strata_prefill.formats.make_pack import make_pack
from strata_prefill.contract.moe import gather_rows, scatter_rows, swiglu
from strata_prefill.formats.pack import Pack
from strata_prefill.formats.records import q8_layouts
from strata_prefill.contract.routing import routing_tables
from strata_prefill.cli import main as cli
from strata_prefill.verify.common import assert_same_run, run_engine

FLOAT_EXPERTS = ["F16", "BF16", "F32"]
U = 2.0 ** -24  # float32's unit roundoff


class Records:
    """A dump that keeps what moe_half records, by name (the expert-sorted arrays as computed)."""

    ops = True

    def __init__(self):
        self.rec = {}

    def op(self, layer, name, array, slot=None):
        self.rec[name] = np.array(array)

    def layer(self, layer, name, array):
        self.rec[name] = np.array(array)


def float_bound(K: int, w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """A bound on |float_matmul(w, x) - w . x| (float64 [T, N]): each output is a sum of K
    rounded products in 32 lane partials of ceil(K/32) terms, then a tree of 5 levels, so at
    most ceil(K/32) + 6 roundings of size u touch any term: gamma times sum |w_k x_k|."""
    m = -(-K // 32) + 6
    return (m * U / (1 - m * U)) * (np.abs(x) @ np.abs(w).T) + 1e-37


@pytest.mark.parametrize("etype", FLOAT_EXPERTS)
def test_make_pack_writes_float_experts_and_info_shows_them(tmp_path, capsys, etype):
    out = tmp_path / "p.gguf"
    assert cli(["make-pack", "--expert-type", etype, "--no-progress", str(out)]) == 0
    pack = Pack.open(out)
    qt = QT[etype]
    assert pack.expert_types(0) == (qt, qt) and pack.fallbacks == []
    for name in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"):
        m = pack.matrix(f"blk.1.{name}")
        assert m.qtype == qt and m.is_float and m.n_expert == pack.config.n_expert
        want = dequantize(np.asarray(m.data[3]), qt)  # gguf's own reading of one expert's bytes
        assert np.array_equal(m.expert(3).dequantize(), want) and np.isfinite(want).all() and want.std() > 0
    gu, d = pack.expert_blob_bytes(0)
    width = 4 if qt == QT.F32 else 2
    assert (gu, d) == (width * pack.config.n_ff_exp * pack.config.n_embd,) * 2
    capsys.readouterr()
    assert cli(["info", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"expert gate/up {etype}, down {etype}" in text and "fallbacks:      none" in text


def test_make_pack_refuses_an_unknown_expert_type_naming_the_float_ones(tmp_path):
    from strata_prefill.contract.errors import InputError

    with pytest.raises(InputError, match="unsupported expert type F64 .*F16, BF16, F32"):
        make_pack(tmp_path / "p.gguf", expert_type="F64")
    assert not (tmp_path / "p.gguf").exists()


@settings(max_examples=60, deadline=None)
@given(T=st.integers(1, 40), E=st.integers(1, 12), K=st.integers(1, 70), seed=st.integers(0, 2**32 - 1),
       data=st.data())
def test_gather_and_scatter_rows_are_one_definition(T, E, K, seed, data):
    """Over any routing, the rows gathered by src and scattered by slot are the same bytes:
    row r holds its token's row, the expert-sorted order of the routing tables."""
    k = data.draw(st.integers(1, E))
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((T, K), dtype=np.float32)
    ids = np.stack([rng.permutation(E)[:k] for _ in range(T)]).astype(np.int32)
    tab = routing_tables(ids, E)
    g = gather_rows(x, tab.src)
    assert g.shape == (T * k, K) and np.array_equal(g, x[tab.src])
    assert np.array_equal(g[tab.slot], np.repeat(x, k, axis=0))  # pair t*k+j's row is token t's
    assert np.array_equal(g.view(np.uint32), scatter_rows(x, tab.slot, k).view(np.uint32))


@pytest.mark.parametrize("etype", FLOAT_EXPERTS)
def test_reference_multiplies_float_experts_in_float32_unquantized(make_test_pack, etype):
    """Layer 0's MoE half on random rows: every pair's gate, up and down product is within the
    float product's rounding of the float64 product of gguf's dequantized weights with the normed
    row itself (a q8_1 activation would be off by about 1/254 of its amax), has the bytes of
    float_matmul over the expert's gathered rows, and H is SwiGLU of gate and up."""
    pack = make_test_pack("tiny", etype)
    cfg, L = pack.config, pack.layer(0)
    x = np.random.default_rng(9).standard_normal((37, cfg.n_embd), dtype=np.float32)
    rec = Records()
    moe_half(ReferenceEngine(pack), 0, x, rec)
    r = rec.rec
    assert "moe_in_q8_1" not in r and "down_in_q8_1" not in r  # no q8_1 buffer exists
    h, ids = r["ffn_norm"], r["topk_ids"]
    tab = routing_tables(ids, cfg.n_expert)
    assert np.array_equal(r["slot"], tab.slot)
    assert np.array_equal(r["swiglu_h"].view(np.uint32), swiglu(r["gate"], r["up"]).view(np.uint32))
    worst = 0.0
    for e in tab.order:
        rows = tab.rows_of(e)
        xe, he = h[tab.src[rows]], r["swiglu_h"][rows]
        for name, w, act, out in (("gate", L.ffn_gate_exps, xe, r["gate"]), ("up", L.ffn_up_exps, xe, r["up"]),
                                  ("down", L.ffn_down_exps, he, r["y"])):
            wq = dequantize(np.asarray(w.data[e]), w.qtype)  # float32, exact
            got = out[rows]
            assert np.array_equal(got.view(np.uint32), dense.float_matmul(wq, act).view(np.uint32)), (name, e)
            exact = act.astype(np.float64) @ wq.astype(np.float64).T
            err = np.abs(got - exact)
            bound = float_bound(w.n_cols, wq.astype(np.float64), act.astype(np.float64))
            assert (err <= bound).all(), (name, e, float((err - bound).max()))
            worst = max(worst, float((err / (np.abs(act) @ np.abs(wq).T).max()).max()))
    assert 0 < worst < 1e-5  # rounded as float32 is, and nowhere near a quantized input's error


@pytest.mark.parametrize("etype", FLOAT_EXPERTS)
def test_a_float_pack_has_no_q8_1_records(make_test_pack, etype):
    assert q8_layouts(make_test_pack("tiny", etype)) == {}


def mixed_pack(tmp_path, monkeypatch, gu: QT, down: QT) -> Pack:
    """A tiny pack whose gate/up experts are one type and down experts another."""
    monkeypatch.setattr(make_pack_module, "expert_types", lambda cfg, xt: (gu, down, []))
    return Pack.open(make_pack(tmp_path / f"{gu.name}-{down.name}.gguf", "tiny", expert_type=gu, progress=False))


@pytest.mark.parametrize("gu,down", [(QT.Q8_0, QT.F16), (QT.BF16, QT.Q4_1), (QT.F32, QT.BF16)],
                         ids=["Q8_0-F16", "BF16-Q4_1", "F32-BF16"])
def test_float_and_quantized_experts_mixed(tmp_path, monkeypatch, gu, down):
    """gate/up and down of different kinds: the rows that reach a float matrix are float, the
    ones that reach a quantized one q8_1 in its layout; the sim's walk (gathered and scattered
    input, streamed and resident) matches the reference byte for byte."""
    pack = mixed_pack(tmp_path, monkeypatch, gu, down)
    assert pack.expert_types(1) == (gu, down)
    assert set(name for _, name in q8_layouts(pack)) == {n for n, t in (("moe_in_q8_1", gu), ("down_in_q8_1", down))
                                                         if not dense.is_float(t)}
    ids = np.random.default_rng(4).integers(0, pack.config.n_vocab, 70).astype(np.int32)
    ref = run_engine(ReferenceEngine(pack), ids, 64, tmp_path / "ref", greedy=1)
    for i, arm in enumerate([{}, dict(quant_gather=1, in_place=0, fuse_group=0),
                             dict(expert_cache=9, ring=8, stream_min=16, group_gather=0)]):
        got = run_engine(make_fast_engine(pack, "sim", **arm), ids, 64, tmp_path / f"sim{i}", greedy=1)
        assert_same_run(ref, got, pack, f"{gu.name}/{down.name} {arm}")


def launches_by_phase(eng):
    """Launches of each walk phase (and the float products among them) of a sim engine."""
    import collections
    import contextlib

    be, got = eng.be, collections.Counter()
    phase = be.phase

    @contextlib.contextmanager
    def counted(name, **args):
        before, floats = be.counters["launches"], be.counters["float_dense"]
        with phase(name, **args):
            yield
        got[name] += be.counters["launches"] - before
        got[(name, "float_dense")] += be.counters["float_dense"] - floats
        got[(name, "experts")] += args.get("experts", 0)
        got[(name, "entries")] += 1

    be.phase = counted
    return got


@pytest.mark.parametrize("in_place", [1, 0])
def test_float_experts_take_one_product_launch_per_expert_and_matrix(make_test_pack, tmp_path, in_place):
    """In place (one batch a layer) or gathered in groups: gate/up is two float products per
    expert, down one, SwiGLU one launch writing H unquantized; the MoE input is one row copy."""
    pack = make_test_pack("tiny", "BF16")
    eng = make_fast_engine(pack, "sim", in_place=in_place)
    by_phase = launches_by_phase(eng)
    ids = np.random.default_rng(7).integers(0, pack.config.n_vocab, 90).astype(np.int32)
    run_engine(eng, ids, 64, tmp_path, greedy=0, dump_level="layer")
    experts = by_phase[("down", "experts")]
    assert experts >= pack.config.n_layer * 2  # two chunks, several routed experts each
    assert by_phase["gate/up"] == by_phase[("gate/up", "float_dense")] == 2 * experts
    assert by_phase["down"] == by_phase[("down", "float_dense")] == experts
    assert by_phase["swiglu+quantize H"] == by_phase[("swiglu+quantize H", "entries")] > 0  # SwiGLU alone
    assert eng.counters["swiglu_q8_1"] == 0 and eng.counters["q8_1_scatter"] == 0
    assert eng.counters["scatter_rows"] == by_phase["gather rows"] > 0  # quant_gather 0: per token
    assert eng.counters["gathers"] == (0 if in_place else by_phase["gather"])


@pytest.mark.parametrize("etype", ["F16", "F32"])
def test_streamed_float_experts_are_counted_in_the_copies(make_test_pack, tmp_path, etype):
    """None resident, one streamed chunk, a ring holding every expert: each float expert's
    blob crosses once, its bytes in copy_bytes (an F32 blob is twice an F16 one)."""
    pack = make_test_pack("tiny", etype)
    cfg = pack.config
    # one copy per expert (copy_coalesce 0), so that the copy events count the experts
    eng = make_fast_engine(pack, "sim", expert_cache=0, stream_min=1, ring=cfg.n_layer * cfg.n_expert, copy_coalesce=0)
    ids = np.random.default_rng(8).integers(0, cfg.n_vocab, 60).astype(np.int32)
    run_engine(eng, ids, "auto", tmp_path, greedy=0, layer_dumps=False)
    gu, d = pack.expert_blob_bytes(0)
    width = 4 if etype == "F32" else 2
    assert gu == d == width * cfg.n_ff_exp * cfg.n_embd
    c = eng.counters
    assert c["copy_events"] == cfg.n_layer * cfg.n_expert
    assert c["copy_bytes"] == cfg.n_layer * cfg.n_expert * (2 * gu + d)
    assert c["float_dense"] > 0 and c["mmq"] > 0  # experts float, the dense matrices Q8_0
