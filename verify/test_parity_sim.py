"""The parity gate on a machine with no GPU: the reference against the fast path's walk on
the `sim` backend (NumPy kernels), byte for byte, for every weight type and switch
combination, plus the invariance promises (chunk size, group size, backend)."""
import collections
import contextlib
import itertools

import numpy as np
import pytest

from conftest import EXPERT_TYPES
from fast import make_fast_engine
from reference import ReferenceEngine
from strata import q8_1
from verify.common import assert_same_run, run_engine

# (group_gather, quant_gather, overlap_plan, fuse_group, in_place): the defaults first, then every
# pair of switches takes all four value pairs
SWITCHES = [(1, 0, 1, 1, 1), (0, 0, 0, 0, 0), (0, 1, 0, 1, 0), (0, 1, 1, 0, 0), (1, 1, 0, 0, 0), (0, 1, 0, 0, 1)]


@pytest.fixture(scope="module")
def reference_runs(tmp_path_factory):
    cache = {}

    def get(pack, ids, chunk):
        key = (str(pack.path), ids.tobytes(), chunk)
        if key not in cache:
            out = tmp_path_factory.mktemp("ref")
            cache[key] = run_engine(ReferenceEngine(pack), ids, chunk, out)
        return cache[key]

    return get


def prompt(pack, n, seed):
    return np.random.default_rng(seed).integers(0, pack.config.n_vocab, n).astype(np.int32)


@pytest.mark.parametrize("expert_type", EXPERT_TYPES)
@pytest.mark.parametrize("n_tokens", [1, 63, 130])
def test_reference_vs_sim_every_type_and_switch(make_test_pack, reference_runs, tmp_path,
                                               expert_type, n_tokens):
    pack = make_test_pack("tiny", expert_type)
    ids = prompt(pack, n_tokens, seed=n_tokens)
    ref = reference_runs(pack, ids, 64)
    for gg, qg, op, fg, ip in SWITCHES:
        eng = make_fast_engine(pack, "sim", group_gather=gg, quant_gather=qg, overlap_plan=op, fuse_group=fg,
                               in_place=ip)
        got = run_engine(eng, ids, 64, tmp_path / f"g{gg}q{qg}o{op}f{fg}i{ip}")
        assert_same_run(ref, got, pack,
                        f"tiny {expert_type} T={n_tokens} group_gather={gg} quant_gather={qg} overlap_plan={op} "
                        f"fuse_group={fg} in_place={ip}")


@pytest.mark.parametrize("router_type", ["F32", "BF16", "Q8_0"])
@pytest.mark.parametrize("dense_type", ["Q8_0", "F16"])
def test_reference_vs_sim_router_and_dense_types(make_test_pack, reference_runs, tmp_path,
                                                 router_type, dense_type):
    """Float routers (F32, BF16) and float attention/shared-expert/head matrices (F16) take
    the float path (strata.dense) on both sides; a Q8_0 router the MMQ path."""
    pack = make_test_pack("tiny", "Q4_1", router_type=router_type, dense_type=dense_type)
    assert pack.layer(0).ffn_gate_inp.qtype.name == router_type
    ids = prompt(pack, 70, seed=3)
    ref = reference_runs(pack, ids, 64)
    eng = make_fast_engine(pack, "sim")
    got = run_engine(eng, ids, 64, tmp_path)
    assert_same_run(ref, got, pack, f"tiny router {router_type} dense {dense_type}")
    floats = (router_type != "Q8_0") + 4 * (dense_type != "Q8_0")  # router; q, k, v, o
    assert eng.counters["float_dense"] >= floats * pack.config.n_layer


@pytest.mark.parametrize("expert_type", ["Q2_K", "IQ3_XXS"])
def test_reference_vs_sim_small_pack_several_chunks(make_test_pack, reference_runs, tmp_path, expert_type):
    """64 experts, top-8, a fallback down type, a 600-token prompt in three chunks."""
    pack = make_test_pack("small", expert_type)
    ids = prompt(pack, 600, seed=11)
    ref = reference_runs(pack, ids, 256)
    for gg, qg in [(1, 0), (0, 1)]:
        got = run_engine(make_fast_engine(pack, "sim", group_gather=gg, quant_gather=qg), ids, 256, tmp_path / f"g{gg}q{qg}")
        assert_same_run(ref, got, pack, f"small {expert_type} T=600 group_gather={gg} quant_gather={qg}")


@pytest.mark.parametrize("group_size", [1, 3, 16])
def test_group_size_does_not_change_a_bit(make_test_pack, reference_runs, tmp_path, group_size):
    pack = make_test_pack("tiny", "IQ2_XS")
    ids = prompt(pack, 97, seed=5)
    ref = reference_runs(pack, ids, 64)
    got = run_engine(make_fast_engine(pack, "sim", group_size=group_size), ids, 64, tmp_path)
    assert_same_run(ref, got, pack, f"group size {group_size}")


def test_chunk_size_does_not_change_a_bit_on_the_fast_path(make_test_pack, tmp_path):
    pack = make_test_pack("tiny", "Q4_1")
    ids = prompt(pack, 150, seed=6)
    runs = [run_engine(make_fast_engine(pack, "sim"), ids, c, tmp_path / f"c{c}") for c in (1, 37, "auto")]
    for r, c in zip(runs[:2], (1, 37)):
        assert_same_run(runs[2], r, pack, f"fast chunk {c} vs whole")


def test_launch_counts_follow_the_switches(make_test_pack, tmp_path):
    """All resident, every expert gathered (in_place 0): one gather launch per group of 16 routed
    experts, or one per routed expert; nothing to wait for. Scatter quantize: one quantize launch
    for the MoE input per layer."""
    pack = make_test_pack("small", "Q8_0")  # 64 experts, top-8: 4 groups a layer when all are routed
    ids = prompt(pack, 200, seed=7)
    counts = {}
    for gg in (1, 0):
        eng = make_fast_engine(pack, "sim", group_gather=gg, in_place=0)
        run_engine(eng, ids, "auto", tmp_path / f"g{gg}", greedy=0)
        counts[gg] = dict(eng.counters)
    n_layer = pack.config.n_layer
    assert counts[1]["gathers"] <= 4 * n_layer and "gather_one" not in counts[1]
    assert counts[0]["gather_one"] >= counts[1]["gather_group"] * 8
    assert counts[1]["q8_1_scatter"] == n_layer
    for c in counts.values():
        assert "waits" not in c and "events" not in c and "copies" not in c


def launches_by_phase(eng) -> collections.Counter:
    """Launches enqueued inside each phase of the engine's sim backend, and (under
    (name, "entries")) how often each phase was entered."""
    be, got = eng.be, collections.Counter()
    phase = be.phase

    @contextlib.contextmanager
    def counted(name, **args):
        before = be.counters["launches"]
        with phase(name, **args):
            yield
        got[name] += be.counters["launches"] - before
        got[(name, "entries")] += 1

    be.phase = counted
    return got


@pytest.mark.parametrize("level", ["layer", "ops"])
@pytest.mark.parametrize("fuse", [1, 0])
def test_a_group_makes_four_launches(make_test_pack, tmp_path, level, fuse):
    """All resident, every expert gathered (in_place 0), group mode: a group is one gather, one
    gate/up launch (both matrices), one SwiGLU + quantize of H and one down. Op records need H
    itself: SwiGLU and the quantize of H are then two launches (five a group). fuse_group=0: six
    a group, at either level."""
    pack = make_test_pack("small", "Q8_0")
    eng = make_fast_engine(pack, "sim", fuse_group=fuse, in_place=0)
    by_phase = launches_by_phase(eng)
    run_engine(eng, prompt(pack, 200, seed=7), "auto", tmp_path, greedy=0, dump_level=level)
    groups = by_phase[("gate/up", "entries")]
    assert groups >= 4 * pack.config.n_layer  # 200 tokens x top-8 route every one of 64 experts
    assert by_phase[("gather", "entries")] == by_phase["gather"] == groups
    assert by_phase["down"] == groups and by_phase["gate/up"] == (1 if fuse else 2) * groups
    fused = fuse and level == "layer"
    assert eng.counters["swiglu_q8_1"] == (groups if fused else 0)
    assert by_phase["swiglu+quantize H"] == (1 if fused else 2) * groups
    walk = sum(by_phase[p] for p in ("gather", "gate/up", "swiglu+quantize H", "down"))
    assert walk == (6 if not fuse else 4 if level == "layer" else 5) * groups


@pytest.mark.parametrize("level", ["layer", "ops"])
@pytest.mark.parametrize("fuse", [1, 0])
def test_in_place_a_layer_makes_three_launches(make_test_pack, tmp_path, level, fuse):
    """All resident, in place (the default): a layer's routed experts are one gate/up launch (two
    with fuse_group=0), one SwiGLU + quantize of H (two with op records or fuse_group=0) and one
    down, whatever the number of experts; no gather, wait or event."""
    pack = make_test_pack("small", "Q8_0")
    eng = make_fast_engine(pack, "sim", fuse_group=fuse)
    by_phase = launches_by_phase(eng)
    run_engine(eng, prompt(pack, 200, seed=7), "auto", tmp_path, greedy=0, dump_level=level)
    layers = by_phase[("gate/up", "entries")]
    assert layers == by_phase[("down", "entries")] == by_phase[("swiglu+quantize H", "entries")]
    assert layers >= pack.config.n_layer  # one batch a layer of each chunk (and greedy steps)
    assert by_phase["gather"] == 0 and eng.counters["gathers"] == 0
    assert eng.counters["waits"] == 0 and eng.counters["events"] == 0
    fused = fuse and level == "layer"
    assert by_phase["gate/up"] == (1 if fuse else 2) * layers and by_phase["down"] == layers
    assert by_phase["swiglu+quantize H"] == (1 if fused else 2) * layers


@pytest.mark.parametrize("expert_type", ["Q8_0", "Q4_1", "Q2_K"])
def test_reference_vs_sim_fused_swiglu_quantize(make_test_pack, reference_runs, tmp_path, expert_type):
    """At the layer dump level H is never recorded, so the walk's SwiGLU and quantize of H run
    as one step (swiglu_quantize): byte for byte the reference's down input and everything after,
    in every q8_1 layout a down type selects (D4, DS4, D2S6)."""
    pack = make_test_pack("tiny", expert_type)
    layouts = {q8_1.layout_for(pack.expert_types(l)[1]) for l in range(pack.config.n_layer)}
    ids = prompt(pack, 90, seed=12)
    ref = run_engine(ReferenceEngine(pack), ids, 64, tmp_path / "ref", dump_level="layer")
    eng = make_fast_engine(pack, "sim")
    got = run_engine(eng, ids, 64, tmp_path / "fast", dump_level="layer")
    assert eng.counters["swiglu_q8_1"] > 0 and layouts
    assert_same_run(ref, got, pack, f"tiny {expert_type} fused SwiGLU + quantize, down layouts {layouts}")


def test_streaming_counts_one_wait_and_event_per_group(make_test_pack, tmp_path):
    """None resident, streamed walk, a ring deeper than a layer: group mode waits and records once
    per group (every routed expert streamed, none skipped at 300 tokens on 64 experts);
    per-expert mode once per routed expert; both copy every streamed expert once a chunk."""
    pack = make_test_pack("small", "Q8_0")
    ids = prompt(pack, 300, seed=8)
    counts = {}
    for gg in (1, 0):
        eng = make_fast_engine(pack, "sim", group_gather=gg, expert_cache=0, stream_min=1, ring=128)
        run_engine(eng, ids, "auto", tmp_path / f"g{gg}", greedy=0, layer_dumps=False)
        counts[gg] = dict(eng.counters)
    cfg = pack.config
    n_experts = cfg.n_layer * cfg.n_expert
    for c in counts.values():
        assert c["copies"] == n_experts and c["copy_events"] == n_experts
        assert c["copy_bytes"] == sum(pack.expert_blob(l, 0).nbytes * cfg.n_expert for l in range(cfg.n_layer))
    assert counts[1]["waits"] == counts[1]["events"] == counts[1]["gather_group"] == 4 * cfg.n_layer
    assert counts[0]["waits"] == counts[0]["events"] == counts[0]["gather_one"] == n_experts


RINGS = [8, 16, 96, 128, 384]
STREAM_SWITCHES = list(itertools.product([1, 0], [0, 1], [0, 1]))  # group, quant gather, coalesce


@pytest.mark.parametrize("expert_type", ["Q8_0", "IQ2_XS", "Q2_K"])
@pytest.mark.parametrize("ring", RINGS)
def test_streaming_same_bytes_every_switch_cache_and_ring(make_test_pack, reference_runs, tmp_path,
                                                          expert_type, ring):
    """130 tokens in chunks of 64: two streamed chunks (stream_min 64), a staged one, and the
    greedy tokens staged; caches of none, some and every expert (tiny: 2 x 16 experts)."""
    pack = make_test_pack("tiny", expert_type)
    ids = prompt(pack, 130, seed=ring)
    ref = reference_runs(pack, ids, 64)
    for i, (gg, qg, co) in enumerate(STREAM_SWITCHES):
        cache = (0, 11, 32)[(i + ring) % 3]
        eng = make_fast_engine(pack, "sim", sim_options=dict(schedule_seed=i), group_gather=gg, quant_gather=qg,
                               copy_coalesce=co, expert_cache=cache, ring=ring, stream_min=64)
        got = run_engine(eng, ids, 64, tmp_path / f"{i}")
        assert_same_run(ref, got, pack, f"tiny {expert_type} ring {ring} cache {cache} group_gather={gg} "
                                        f"quant_gather={qg} coalesce={co}")


def test_streaming_small_pack_streamed_and_staged(make_test_pack, reference_runs, tmp_path):
    """64 experts top-8, a third resident, a 600-token prompt: a streamed chunk of 512 and a
    staged one of 88."""
    pack = make_test_pack("small", "IQ3_S")
    ids = prompt(pack, 600, seed=12)
    ref = reference_runs(pack, ids, 512)
    n_cache = pack.config.n_layer * pack.config.n_expert // 3
    for gg in (1, 0):
        eng = make_fast_engine(pack, "sim", group_gather=gg, expert_cache=n_cache, ring=16, stream_min=256)
        got = run_engine(eng, ids, 512, tmp_path / f"g{gg}")
        assert_same_run(ref, got, pack, f"small IQ3_S cache {n_cache} ring 16 group_gather={gg}")
