"""The overlap of the copy and compute streams (fast/trace.py): interval arithmetic on hand-made
and random [start, end) lists against a brute force over a fine grid, the per-layer figures of
hand-made spans, unit labels of windows, and the figures end to end on the sim: `run --timing`
prints them per layer and per window, and they come out of the sim's modelled clock as the
trace's own spans say."""
import json
import re

import numpy as np
import pytest

from strata_prefill.fast.phases import format_chunk_tables, format_overlap, ChunkTimes
from strata_prefill.fast.sim_streams import ModelClock, SimEvent, SimStreams
from strata_prefill.fast.trace import (Overlap, Span, intersect, layer_overlap, link_idle, merge, overlap_by_layer, read_trace_meta,
                        subtract, summed, total, units)
from strata_prefill.fast.tuning import COPY_BYTES_PER_S
from strata_prefill.cli import main


def grid(intervals, n=400):
    """The intervals as a boolean mask over n unit cells (integer endpoints in 0..n)."""
    m = np.zeros(n, bool)
    for a, b in intervals:
        m[int(a):int(b)] = True
    return m


def random_intervals(rng, k, n=400):
    a = rng.integers(0, n, k)
    return [(int(x), int(x + d)) for x, d in zip(a, rng.integers(0, 40, k)) if x + d <= n]


def test_merge_and_total_by_hand():
    assert merge([(5, 7), (0, 2), (1, 3), (7, 8), (4, 4)]) == [(0, 3), (5, 8)]
    assert total([(0, 2), (1, 3), (10, 11)]) == 4
    assert merge([]) == [] and total([]) == 0


def test_intersect_and_subtract_by_hand():
    x, y = [(0, 10), (20, 30)], [(5, 25)]
    assert intersect(x, y) == [(5, 10), (20, 25)]
    assert subtract(x, y) == [(0, 5), (25, 30)]
    assert subtract(y, x) == [(10, 20)]
    assert subtract([(0, 4)], [(0, 4)]) == []
    assert subtract([(0, 4)], [(1, 2), (3, 5)]) == [(0, 1), (2, 3)]


@pytest.mark.parametrize("seed", range(8))
def test_interval_arithmetic_matches_a_grid(seed):
    rng = np.random.default_rng(seed)
    x, y = random_intervals(rng, 12), random_intervals(rng, 12)
    gx, gy = grid(x), grid(y)
    assert total(x) == gx.sum()
    assert total(intersect(x, y)) == (gx & gy).sum()
    assert total(subtract(x, y)) == (gx & ~gy).sum()
    assert grid(merge(x)).tolist() == gx.tolist()
    m = merge(x)
    assert all(b1 < a2 for (_, b1), (a2, _) in zip(m, m[1:]))  # disjoint, ascending, not touching


def test_layer_overlap_by_hand():
    # compute works 0-10 and 30-40 and waits 10-30 for a copy that runs 5-28
    work, waits, copies = [(0, 10), (30, 40)], [(10, 30)], [(5, 28)]
    o = layer_overlap(copies, waits, work)
    assert o.copy == 23
    assert o.uncovered == 18  # 10..28: the copy runs with no compute beside it
    assert o.waiting == 18  # the wait's last 2 (28..30) had no copy running: not counted
    # a copy wholly under compute: covered; a wait span that is only markers: no waiting
    assert layer_overlap([(1, 9)], [(10, 10.5)], [(0, 10), (10.5, 20)]) == Overlap(8, 0, 0)


@pytest.mark.parametrize("seed", range(6))
def test_layer_overlap_random_against_a_grid(seed):
    rng = np.random.default_rng(100 + seed)
    work, waits, copies = (random_intervals(rng, 10) for _ in range(3))
    o = layer_overlap(copies, waits, work)
    gw, gq, gc = grid(work), grid(waits), grid(copies)
    assert o.copy == gc.sum()
    assert o.uncovered == (gc & ~gw).sum()
    assert o.waiting == (gq & ~gw & gc).sum()
    assert 0 <= o.uncovered <= o.copy


def test_overlap_by_layer_splits_copies_and_waits_by_layer():
    spans = [Span("compute", "attention", 0, 4, {"chunk": 0, "layer": 0}),
             Span("compute", "wait copy", 4, 3, {"chunk": 0, "layer": 0}),
             Span("compute", "gather", 7, 1, {"chunk": 0, "layer": 0}),
             Span("compute", "attention", 8, 4, {"chunk": 0, "layer": 1}),
             Span("compute", "wait copy", 12, 2, {"chunk": 0, "layer": 1}),
             # layer 0's copy 2-7 (3 of it uncovered), layer 1's copy (a cuda note: experts) 7-14
             Span("copy", "copy", 2, 5, {"chunk": 0, "layer": 0}),
             Span("copy", "wait release", 0, 2, {"chunk": 0}),
             Span("copy", "copy", 7, 7, {"chunk": 0, "experts": [[1, 3], [1, 4]]}),
             Span("copy", "copy", 20, 1, {"chunk": 1, "layer": 0})]
    by = overlap_by_layer(spans, chunk=0)
    assert by == {0: Overlap(5, 3, 3), 1: Overlap(7, 2, 2)}
    assert summed(by) == Overlap(12, 5, 5)
    assert overlap_by_layer(spans)[0] == Overlap(6, 4, 3)  # chunk 1's copy too (its unit's first: no idle)
    # chunk 0's layer 0 copies again at 16-18 (after layer 1's 7-14): the link idled 14-16 before it
    again = spans + [Span("copy", "copy", 16, 2, {"chunk": 0, "layer": 0})]
    assert overlap_by_layer(again, chunk=0)[0].idle == 2 and overlap_by_layer(again, chunk=0)[1].idle == 0
    assert overlap_by_layer(again)[0].idle == 2
    assert overlap_by_layer([s for s in spans if s.track == "compute" and s.name != "wait copy"]) == {}


def test_link_idle_is_the_gap_before_each_copy():
    every = [(0, 2), (3, 5), (5, 6), (9, 10)]
    assert link_idle([(3, 5), (9, 10)], every) == [(2, 3), (6, 9)]
    assert link_idle([(0, 2), (5, 6)], every) == []  # the first copy, and one right behind another
    assert layer_overlap([(3, 5), (9, 10)], [], [], every).idle == 4


def test_units_name_windows_and_their_chunks():
    assert units(40, 20, 20) == ["chunk 0", "chunk 1"]
    assert units(100, 20, 80) == ["window 0 (chunks 0-3)", "window 1 (chunk 4)"]
    assert units(120, 20, 40) == ["window 0 (chunks 0-1)", "window 1 (chunks 2-3)", "window 2 (chunks 4-5)"]
    rng = np.random.default_rng(7)
    for _ in range(20):
        chunk = int(rng.integers(1, 50))
        per = int(rng.integers(2, 6))
        n = int(rng.integers(1, 1000))
        labels = units(n, chunk, chunk * per)
        assert len(labels) == -(-n // (chunk * per))
        last = int(re.findall(r"\d+", labels[-1])[-1])
        assert last == -(-n // chunk) - 1  # the last window ends at the prompt's last chunk


def test_format_overlap_and_labelled_tables():
    text = format_overlap({0: Overlap(0.004, 0.001, 0.0005), 3: Overlap(0.002, 0.002, 0.001)}, sim=False)
    rows = {l.split()[0]: l.split()[1:4] for l in text.splitlines()[2:4]}
    assert rows == {"0": ["4.00", "1.00", "0.50"], "3": ["2.00", "2.00", "1.00"]}
    assert re.search(r"^all\s+6\.00\s+3\.00\s+1\.50\s+0\.00\s+\(50% of the copy time not covered\)", text, re.M)
    text = format_overlap({0: Overlap(0.004, 0.001, 0.0005, 0.0025)}, sim=False)
    assert text.splitlines()[2].split() == ["0", "4.00", "1.00", "0.50", "2.50"]
    assert "nothing copied" in format_overlap({}, sim=True)
    t = ChunkTimes({"gather": 0.001}, {}, None)
    out = format_chunk_tables([t, t], [ChunkTimes(total=0.002)], sim=True,
                              labels=["window 0 (chunks 0-1)", "window 1 (chunk 2)"],
                              overlap=[Overlap(0.003, 0.001, 0.002), None])
    blocks = out.split("\n\n")
    assert blocks[0].startswith("window 0 (chunks 0-1)\n") and blocks[1].startswith("window 1 (chunk 2)\n")
    assert "overlap              copy 3.00 ms, not covered by compute 1.00 ms, compute waiting for copies 2.00 ms" \
        in blocks[0]
    assert "overlap" not in blocks[1]


def test_model_clock_gives_the_waiting_it_modelled():
    """A copy of 10 ms modelled, a kernel far shorter, then a wait: the compute stream waits the
    copy's rest, and all of the copy but the kernel's time is not covered."""
    streams = SimStreams(seed=1, policy="random")
    streams.clock = ModelClock()
    nbytes = 553_000_000
    streams.copy_into("ring", 0, ("ring", 0, 0, 1, "1:0"), "copy", lambda: None, nbytes=nbytes,
                      args={"chunk": 0, "layer": 0})
    copied = streams.record("copy", SimEvent("copied"))
    streams.enqueue("compute", "k1", lambda: None, name="k1", args={"chunk": 0, "layer": 0})
    streams.wait("compute", copied, "the copy", {"chunk": 0, "layer": 0})
    streams.enqueue("compute", "k2", lambda: None, name="k2", args={"chunk": 0, "layer": 0})
    streams.synchronize()
    spans = {s.name: s for s in streams.clock.spans}
    copy_s = nbytes / COPY_BYTES_PER_S
    o = overlap_by_layer(streams.clock.spans)[0]
    assert o.copy == pytest.approx(copy_s)
    assert o.uncovered == pytest.approx(copy_s - spans["k1"].dur)
    assert o.waiting == pytest.approx(spans["wait copy"].dur) and o.waiting > 0.9 * copy_s


def sim_args(pack, *extra, cache="4 --ring 2 --stream-min 1"):
    return ["run", "--pack", str(pack.path), "--impl", "fast", "--backend", "sim", "--expert-cache",
            *cache.split(), "--prompt-tokens", "60", "--prefill", "20", "--greedy", "0", "--no-progress", "--window", "off",
            *extra]


@pytest.fixture
def pack(make_test_pack):
    return make_test_pack("tiny", "Q8_0")


def test_timing_labels_windows_and_prints_overlap_per_layer(pack, tmp_path, capsys):
    trace = tmp_path / "t.json"
    assert main(sim_args(pack, "--window", "40", "--timing", "--trace", str(trace))) == 0
    out = capsys.readouterr().out
    heads = re.findall(r"^(window \d+ \(chunks? [\d-]+\)|chunk \d+)$", out, re.M)
    assert heads == ["window 0 (chunks 0-1)", "window 1 (chunk 2)"]
    table = out[out.index("overlap of the copy and compute streams, per layer"):]
    rows = {int(m[0]): tuple(map(float, m[1:])) for m in
            re.findall(r"^(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", table, re.M)}
    assert sorted(rows) == list(range(pack.config.n_layer))
    spans, meta = read_trace_meta(trace)
    assert meta["units"] == heads and meta["window_tokens"] == 40 and meta["chunk_tokens"] == 20
    # the figures are the trace's: the printed table is the traced prefill's overlap
    by = overlap_by_layer(spans)
    for layer, (copy_ms, uncovered_ms, waiting_ms, idle_ms) in rows.items():
        assert idle_ms == pytest.approx(by[layer].idle * 1e3, abs=0.006)
        assert copy_ms == pytest.approx(by[layer].copy * 1e3, abs=0.006)
        assert uncovered_ms == pytest.approx(by[layer].uncovered * 1e3, abs=0.006)
        assert waiting_ms == pytest.approx(by[layer].waiting * 1e3, abs=0.006)
        # every streamed expert of the layer crosses once per window: its bytes at the link's rate
        blob = sum(pack.expert_blob_bytes(layer)) + pack.expert_blob_bytes(layer)[0]
        n_streamed = pack.config.n_expert - 2  # 4 resident over 2 layers
        assert by[layer].copy == pytest.approx(2 * n_streamed * blob / COPY_BYTES_PER_S, rel=1e-3)
    # a ring of 2 slots makes the compute stream wait for copies, and that wait is not covered
    assert all(o.waiting > 0 and o.waiting <= o.uncovered + 1e-9 for o in by.values())
    lines = re.findall(r"^overlap +copy ([\d.]+) ms, not covered by compute ([\d.]+) ms, "
                       r"compute waiting for copies ([\d.]+) ms \(modelled clock\)$", out, re.M)
    assert len(lines) == 2
    for i, line in enumerate(lines):
        o = summed(overlap_by_layer(spans, chunk=i))
        assert float(line[0]) == pytest.approx(o.copy * 1e3, abs=0.006)


def test_timing_without_windows_keeps_chunk_labels(pack, capsys):
    assert main(sim_args(pack, "--timing", cache="32")) == 0
    out = capsys.readouterr().out
    assert re.findall(r"^(chunk \d+)$", out, re.M) == ["chunk 0", "chunk 1", "chunk 2"]
    assert "nothing copied (every routed expert resident)" in out


def test_plot_marks_the_overlap_of_a_window(pack, tmp_path, capsys, monkeypatch):
    """With the sim's link modelled slow, copies outlast compute: the picture's title and its
    line name the window and give the same figures as fast/trace.py for that window."""
    import strata_prefill.fast.sim_streams

    monkeypatch.setattr(strata_prefill.fast.sim_streams, "COPY_BYTES_PER_S", 2e7)
    trace, png = tmp_path / "w.json", tmp_path / "w.png"
    assert main(sim_args(pack, "--window", "40", "--trace", str(trace), cache="8 --stream-min 1")) == 0
    capsys.readouterr()
    assert main(["plot", str(trace), str(png), "--chunk", "0"]) == 0
    line = capsys.readouterr().out
    m = re.search(r"\(window 0 \(chunks 0-1\): .* copy not covered by compute ([\d.]+) ms, "
                  r"compute waiting for copies ([\d.]+) ms\)$", line.strip())
    assert m, line
    o = summed(overlap_by_layer(read_trace_meta(trace)[0], chunk=0))
    assert o.uncovered > 0 and o.waiting > 0
    assert float(m.group(1)) == pytest.approx(o.uncovered * 1e3, abs=2e-3)
    assert float(m.group(2)) == pytest.approx(o.waiting * 1e3, abs=2e-3)
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_overlap_marks_and_unit_label_by_hand():
    from strata_prefill.commands.plot import overlap_marks, unit_label

    lanes = {"compute": [Span("compute", "gate/up", 0, 2), Span("compute", "wait copy", 2, 3),
                         Span("compute", "down", 5, 1)],
             "copy": [Span("copy", "wait release", 0, 1), Span("copy", "copy", 1, 3), Span("copy", "copy", 4, 2)]}
    marks = overlap_marks(lanes)
    assert marks == {"copy": [(1, 6)], "uncovered": [(2, 5)], "waiting": [(2, 5)]}
    assert unit_label({"units": ["window 0 (chunks 0-3)"]}, 0) == "window 0 (chunks 0-3)"
    assert unit_label({}, 2) == "chunk 2" and unit_label({"units": ["chunk 0"]}, 5) == "chunk 5"


def test_bench_phases_add_the_overlap_per_length_and_layer(pack, tmp_path, capsys):
    out = tmp_path / "b.json"
    arm = "expert-cache=4,stream-min=1,ring=2"
    assert main(["bench", "--pack", str(pack.path), "--backend", "sim", "--tokens", "40", "--reps", "2",
                 "--prefill", "20", "--a", arm + ",window=off", "--b", arm + ",window=40", "--phases", "--no-progress",
                 "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "overlap medians, ms, A / B" in text and "the sim's modelled stream clock" in text
    data = json.loads(out.read_text())["lengths"][0]
    for arm_ in "AB":
        laps = [r[arm_]["overlap_ms"] for r in data["reps"]]
        for o in laps:  # the sums are the layers'
            assert set(o["layers"]) == {"0", "1"}
            assert o["copy"] == pytest.approx(sum(v["copy"] for v in o["layers"].values()))
            assert 0 < o["waiting"] <= o["uncovered"] + 1e-9 <= o["copy"] + 1e-9
        med = data["median"][arm_]["overlap_ms"]
        assert med["uncovered"] == pytest.approx(np.median([o["uncovered"] for o in laps]))
    # a window of two chunks copies each streamed expert once per layer instead of twice
    assert data["median"]["B"]["overlap_ms"]["copy"] == pytest.approx(data["median"]["A"]["overlap_ms"]["copy"] / 2,
                                                                      rel=1e-3)
    rows = re.findall(r"^\| 40 \| (\d) \| ([\d.]+) / ([\d.]+) \|", text, re.M)
    assert [r[0] for r in rows] == ["0", "1"]
    for layer, a, b in rows:
        assert float(a) == pytest.approx(data["median"]["A"]["overlap_ms"]["layers"][layer]["copy"], abs=0.006)


def test_bench_without_phases_has_no_overlap_table():
    from strata_prefill.commands.bench import overlap_lines

    assert overlap_lines([{"tokens": 8, "median": {"A": {"ms": 1.0}, "B": {"ms": 1.0}}}]) == []
