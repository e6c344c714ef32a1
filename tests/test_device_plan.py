"""device_plan (fast/walk.py DeviceBatch): a layer whose experts are all resident is planned on
the device. Checked without a GPU: the device's tile cut (strata_prefill.fast.tiles.routed_row_lists, the
definition of routing_tables.cu's kernel) against the host's cut of the same experts; the sim
backend runs such a layer with no device-to-host read between its router and its combine (its
`host_reads` counter), reads the counts back where the layer streams or the switch is off, and
gives the same bytes either way."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from strata_prefill.contract.errors import InputError
from strata_prefill.contract.routing import routing_tables
from strata_prefill.fast.engine import FastEngine
from strata_prefill.fast.sim import SimBackend
from strata_prefill.fast.tiles import ListPlan, max_row_tiles, routed_choice, routed_row_lists, row_tiles
from strata_prefill.session import Session


def _routing(rng, n_tok, k, n_expert, streamed_share, skew):
    k = min(k, n_expert)
    pool = rng.choice(n_expert, max(k, n_expert // 4), replace=False) if skew else np.arange(n_expert)
    ids = np.stack([rng.choice(pool, k, replace=False) for _ in range(n_tok)]).astype(np.int32)
    tab = routing_tables(ids, n_expert)
    resident = rng.random(n_expert) >= streamed_share
    woff = np.where(resident, rng.integers(0, 2**33, n_expert) * 2, -1)
    return tab, resident, woff


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 300), st.integers(1, 9), st.integers(2, 64), st.lists(st.sampled_from([8, 16, 64, 128]),
       min_size=1, max_size=3), st.lists(st.integers(0, 200), min_size=3, max_size=3), st.integers(0, 2**16),
       st.floats(0.0, 1.0), st.booleans())
def test_the_chosen_list_is_the_host_cut_then_empty_entries(n_tok, k, n_expert, tile_rows, bounds, seed,
                                                           streamed_share, skew):
    """routed_row_lists: the list routed_choice picks holds row_tiles of the experts with an
    offset and rows, in id order, at its tile_rows, then (0, 0, 0, 0) up to its max_row_tiles,
    which always holds the cut (any routing, any placement); every other list is empty, and
    live counts the chosen list's tiles alone."""
    rng = np.random.default_rng(seed)
    tab, resident, woff = _routing(rng, n_tok, k, n_expert, streamed_share, skew)
    plans = [ListPlan(tr, b, max_row_tiles(tab.n_rows, n_expert, tr)) for tr, b in zip(tile_rows, bounds)]
    got, live = routed_row_lists(tab.cnt, tab.off, woff, plans)
    chosen = routed_choice(tab.cnt, woff, [p.bound for p in plans])
    mine = [int(e) for e in tab.order if resident[e]]
    want = row_tiles(np.array([[tab.off[e], tab.off[e] + tab.cnt[e]] for e in mine]).reshape(-1, 2),
                     woff[mine], plans[chosen].tile_rows)
    assert got.shape == (sum(p.n_max for p in plans), 4) and got.dtype == np.int32
    assert live.dtype == np.int32 and live.tolist() == [len(want) if i == chosen else 0 for i in range(len(plans))]
    first = sum(p.n_max for p in plans[:chosen])
    assert np.array_equal(got[first:first + len(want)], want)
    assert not np.delete(got, np.arange(first, first + len(want)), axis=0).any()
    if resident.all():  # every row is some resident expert's: the tiles cover 0 .. T*K once
        covered = np.concatenate([np.arange(b, e) for b, e, _, _ in want.tolist()])
        assert np.array_equal(np.sort(covered), np.arange(tab.n_rows))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 400), st.integers(1, 10), st.integers(2, 512), st.integers(0, 2**16), st.booleans())
def test_the_device_chooses_the_configuration_the_host_would(n_tok, k, n_expert, seed, skew):
    """The device's choice among products.routed_tile_plans is the configuration the host's plan
    takes for the same routed experts (products.tile_config of rows / routed experts), and the
    plans span every configuration a routing of those rows could call for."""
    from strata_prefill.fast.cuda import products

    rng = np.random.default_rng(seed)
    tab, _resident, _woff = _routing(rng, n_tok, k, n_expert, 0.0, skew)
    woff = np.arange(n_expert, dtype=np.int64) * 2
    plans = products.routed_tile_plans(tab.n_rows, n_expert)
    chosen = routed_choice(tab.cnt, woff, [p.bound for _cfg, p in plans])
    host = products.tile_config(tab.n_rows / int((tab.cnt > 0).sum()))
    assert plans[chosen][0] == host
    for n_exp in range(1, min(n_expert, tab.n_rows) + 1):  # any number of experts holding the rows
        assert products.tile_config(tab.n_rows / n_exp) in [cfg for cfg, _p in plans]


def test_a_list_too_short_or_no_list_is_refused():
    with pytest.raises(InputError, match="do not fit"):
        routed_row_lists([300, 5], [0, 300], [0, 2], [ListPlan(128, 0, 3)])
    with pytest.raises(InputError, match="no list"):
        routed_row_lists([300, 5], [0, 300], [0, 2], [])
    assert max_row_tiles(0, 16, 128) == 0 and max_row_tiles(300, 1, 128) == 4


def _reads_in_moe_half(engine) -> list[int]:
    """Per MoE half run: the host reads (the sim's host_reads counter) between the start of its
    router phase and the start of its combine phase."""
    be, seen, at = engine.be, [], {}
    real = be.phase

    def phase(name, **args):
        if name == "router":
            at["router"] = be.counters["host_reads"]
        elif name == "combine":
            seen.append(be.counters["host_reads"] - at.pop("router"))
        return real(name, **args)

    be.phase = phase
    return seen


def _run(pack, n_tok=70, **switches):
    engine = FastEngine(pack, SimBackend(schedule_seed=5), **switches)
    seen = _reads_in_moe_half(engine)
    ids = np.random.default_rng(3).integers(0, pack.config.n_vocab, n_tok).astype(np.int32)
    res = Session(engine, chunk=32, progress=False).run(ids, greedy=1)
    return res.logits.tobytes(), seen, dict(engine.counters)


@pytest.mark.parametrize("etype", ["Q8_0", "IQ2_XS"])
def test_a_fully_resident_layer_reads_nothing_back_between_router_and_combine(make_test_pack, etype):
    pack = make_test_pack("tiny", etype)
    on, reads_on, c_on = _run(pack)  # the sim holds every expert; device_plan is on by default
    off, reads_off, c_off = _run(pack, device_plan=0)
    n_halves = pack.config.n_layer * 3  # 70 tokens in chunks of 32
    assert reads_on == [0] * n_halves
    assert reads_off == [1] * n_halves  # the counts come back: the check can fail
    assert on == off  # the same bytes
    assert c_on["routed_row_tiles"] == n_halves and "routed_row_tiles" not in c_off
    assert c_on["mmq"] == c_off["mmq"]


def test_only_whole_layers_plan_on_the_device(make_test_pack):
    """The tiny pack's 2 layers of 16 experts with 31 cached: layer 0 holds all of its experts and
    is planned on the device, layer 1 streams one and reads its counts back; the same bytes as
    the switch off and as every expert resident."""
    pack = make_test_pack("tiny", "Q8_0")
    mixed, reads, counts = _run(pack, expert_cache=31, ring=8, window="off")
    assert reads[0::2] == [0, 0, 0] and all(r >= 1 for r in reads[1::2]) and len(reads) == 6
    assert counts["routed_row_tiles"] == 3
    off, _, _ = _run(pack, expert_cache=31, ring=8, window="off", device_plan=0)
    assert mixed == off == _run(pack)[0]


def test_op_records_still_read_the_counts_when_asked(make_test_pack, tmp_path):
    """--dump-level ops on device-planned layers: every record is the host plan's, byte for byte
    (the records may read back what they need)."""
    from strata_prefill.cli import main
    from strata_prefill.formats.records import read_timeline

    pack = make_test_pack("tiny", "Q8_0")
    outs = {}
    for v in (1, 0):
        folder = tmp_path / f"d{v}"
        rc = main(["run", "--pack", str(pack.path), "--prompt-tokens", "20", "--greedy", "1", "--no-progress",
                   "--impl", "fast", "--backend", "sim", "--device-plan", str(v), "--dump-dir", str(folder),
                   "--dump-level", "ops"])
        assert rc == 0
        outs[v] = [(c.index, {k: a.tobytes() for k, a in c.records.items()})
                   for c in read_timeline(folder / "layers.spd")]
    names = set(outs[1][0][1])
    assert {"L00.gate", "L00.swiglu_h", "L00.y", "L01.down_in_q8_1", "L01.slot"} <= names
    assert outs[1] == outs[0]
