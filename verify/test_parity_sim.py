"""The fast path's walk on the `sim` backend, beyond its bytes (those are the sim rows of
verify/cases.py, checked by verify/test_parity.py): launch, wait and event counts per switch."""
import collections
import contextlib

import numpy as np
import pytest

from strata_prefill.fast import make_fast_engine
from strata_prefill.verify.common import SIM_SKIP_REASON, run_engine, sim_here

pytestmark = pytest.mark.skipif(not sim_here(), reason=SIM_SKIP_REASON)


def prompt(pack, n, seed):
    return np.random.default_rng(seed).integers(0, pack.config.n_vocab, n).astype(np.int32)


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


def test_streaming_counts_one_wait_and_event_per_group(make_test_pack, tmp_path):
    """None resident, streamed walk, a ring deeper than a layer: group mode waits and records once
    per group (every routed expert streamed, none skipped at 300 tokens on 64 experts);
    per-expert mode once per routed expert; both copy every streamed expert once a chunk."""
    pack = make_test_pack("small", "Q8_0")
    ids = prompt(pack, 300, seed=8)
    counts = {}
    for gg in (1, 0):
        eng = make_fast_engine(pack, "sim", group_gather=gg, expert_cache=0, stream_min=1, ring=128, copy_coalesce=0,
                               ring_in_place=0)
        run_engine(eng, ids, "auto", tmp_path / f"g{gg}", greedy=0, layer_dumps=False)
        counts[gg] = dict(eng.counters)
    cfg = pack.config
    n_experts = cfg.n_layer * cfg.n_expert
    for c in counts.values():
        assert c["copies"] == n_experts and c["copy_events"] == n_experts
        assert c["copy_bytes"] == sum(pack.expert_blob(l, 0).nbytes * cfg.n_expert for l in range(cfg.n_layer))
    assert counts[1]["waits"] == counts[1]["events"] == counts[1]["gather_group"] == 4 * cfg.n_layer
    assert counts[0]["waits"] == counts[0]["events"] == counts[0]["gather_one"] == n_experts
