"""`run --timing`, `run --trace FILE` and `plot` on the sim backend: per-chunk phase tables with
the uninstrumented total, a Chrome trace with compute and copy tracks, a PNG drawn by
matplotlib's Agg backend, and one-line errors."""
import json
import re
import struct
import sys

import pytest

from strata_prefill.fast.phases import HOST_PHASES, HOW_MEASURED_SIM, PhaseRecorder
from strata_prefill.fast.sim_streams import ModelClock, SimEvent, SimStreams
from strata_prefill.fast.tuning import COPY_BYTES_PER_S
from strata_prefill.cli import main

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
EPS_US = 2e-3  # ts and dur are written rounded to 1e-3 us


def sim_run(pack, *extra):
    """run --impl fast --backend sim on 40 tokens in chunks of 20 (no windows), 4 resident experts."""
    return ["run", "--pack", str(pack.path), "--impl", "fast", "--backend", "sim", "--expert-cache", "4",
            "--ring", "8", "--prompt-tokens", "40", "--prefill", "20", "--greedy", "0", "--no-progress",
            "--window", "off", *extra]


@pytest.fixture
def pack(make_test_pack):
    return make_test_pack("tiny", "Q8_0")


@pytest.mark.parametrize("rip", ["0", "1"], ids=["gathered", "in-ring"])
@pytest.mark.parametrize("stream_min", ["1", "1024"], ids=["streamed", "staged"])
def test_trace_is_chrome_json_with_compute_and_copy_tracks(pack, tmp_path, capsys, stream_min, rip):
    path = tmp_path / "t.json"
    assert main(sim_run(pack, "--stream-min", stream_min, "--ring-in-place", rip, "--trace", str(path))) == 0
    assert f"trace     {path}" in capsys.readouterr().out
    doc = json.loads(path.read_text())
    assert doc["displayTimeUnit"] == "ms"
    events = doc["traceEvents"]
    tracks = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert sorted(tracks.values()) == ["compute", "copy"]
    spans = [e for e in events if e["ph"] == "X"]
    by_track = {name: [e for e in spans if e["tid"] == tid] for tid, name in tracks.items()}
    compute_names = {e["name"] for e in by_track["compute"]}
    assert {"gate/up", "down", "attention", "router", "combine", "wait copy"} <= compute_names
    assert ("gather" in compute_names) == (rip == "0")  # products read the ring slots: no gather
    assert {e["name"] for e in by_track["copy"]} >= {"copy"}
    assert {e["args"]["chunk"] for e in spans} == {0, 1}
    for name, lane in by_track.items():
        assert lane, name
        for a, b in zip(lane, lane[1:]):  # in time order, none overlapping the next
            assert a["ts"] <= b["ts"], (name, a, b)
            assert a["ts"] + a["dur"] <= b["ts"] + EPS_US, (name, a, b)
        assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in lane)
    blob = [2 * gu + d for gu, d in (pack.expert_blob_bytes(l) for l in range(pack.config.n_layer))]
    copies = [e for e in by_track["copy"] if e["name"] == "copy"]
    for e in copies:  # one expert's blob a copy, its modelled time its bytes at the link's rate
        assert e["args"]["bytes"] == blob[e["args"]["layer"]]
        assert e["dur"] == pytest.approx(e["args"]["bytes"] / COPY_BYTES_PER_S * 1e6, abs=EPS_US)
    gathers = [e for e in by_track["compute"] if e["name"] == "gather"]
    assert all(e["args"]["experts"] >= 1 and "layer" in e["args"] for e in gathers)


def test_model_clock_starts_an_op_after_the_copy_it_waits_for():
    streams = SimStreams(seed=3, policy="compute_first")
    streams.clock = ModelClock()
    ran = []
    nbytes = 553_000_000  # 10 ms at the link's rate: far longer than k1's host time
    streams.copy_into("ring", 0, ("ring", 0, 0, 1, "1:0"), "copy", lambda: ran.append("copy"), nbytes=nbytes)
    copied = streams.record("copy", SimEvent("copied"))
    streams.enqueue("compute", "k1", lambda: ran.append("k1"), name="k1")
    streams.wait("compute", copied, "the copy")
    streams.enqueue("compute", "k2", lambda: ran.append("k2"), name="k2")
    streams.synchronize()
    spans = {s.name: s for s in streams.clock.spans}
    copy_end = nbytes / COPY_BYTES_PER_S
    assert spans["copy"].start == 0 and spans["copy"].dur == pytest.approx(copy_end)
    assert spans["k1"].start == 0 and spans["k1"].end < copy_end
    assert spans["k2"].start == pytest.approx(copy_end)  # not before the copy it waited for
    # the compute stream stalled from k1's end to the copy's: the wait is a span of its own
    assert spans["wait copy"].start == pytest.approx(spans["k1"].end)
    assert spans["wait copy"].end == pytest.approx(copy_end)
    assert sorted(ran) == ["copy", "k1", "k2"]


def test_phase_recorder_keeps_chunks_apart_and_times_the_chunk_itself():
    clock = iter(range(0, 10_000, 10))  # each mark 10 ticks after the last
    rec = PhaseRecorder(lambda: next(clock), lambda a, b: (b - a) / 1000, timing=True)
    rec.chunk_timing = True
    for chunk_phases in (["a", "b", "a"], ["b"]):
        rec.chunk_begin()
        for name in chunk_phases:
            with rec.phase(name, layer=0):
                pass
        rec.chunk_end()
    tables = rec.chunk_tables()
    assert [t.phases for t in tables] == [{"a": 0.02, "b": 0.01}, {"b": 0.01}]
    # chunk 0: begin at 0, three pairs (10..60), end at 70; chunk 1: begin 80, pair, end 110
    assert [t.total for t in tables] == [0.07, 0.03]
    assert rec.chunk_tables() == []  # read once


def _table_rows(block: str) -> dict:
    rows = {}
    for line in block.splitlines():
        m = re.match(r"(.+?)\s+(-?[\d.]+)(?:\s+([\d.]+)%)?(?:\s+\(.*\))?$", line)
        if m and not line.startswith("phase"):
            rows[m.group(1).strip()] = (float(m.group(2)), float(m.group(3)) if m.group(3) else None)
    return rows


@pytest.mark.parametrize("how", ["flag", "env"])
def test_timing_prints_each_chunks_phases_beside_its_uninstrumented_total(pack, capsys, monkeypatch, how):
    args = sim_run(pack, "--stream-min", "1", "--ring-in-place", "0")  # the gathered walk: every phase
    if how == "flag":
        args.append("--timing")
    else:
        monkeypatch.setenv("STRATA_PREFILL_TIMING", "1")
    assert main(args) == 0
    out = capsys.readouterr().out
    assert HOW_MEASURED_SIM in out
    blocks = re.findall(r"^chunk (\d+)\n(.*?)(?=\n\n)", out, re.S | re.M)
    assert [int(i) for i, _ in blocks] == [0, 1]
    for _, block in blocks:
        rows = _table_rows(block)
        for name in ("attention", "router", "quantize", "wait copy", "gather", "gate/up", "down",
                     "swiglu+quantize H", "shared expert", "combine"):
            assert name in rows, (name, block)
        for host in HOST_PHASES:
            assert f"{host} (host)" in rows and rows[f"{host} (host)"][1] is None  # no share of the GPU sum
        host_lines = {line.split("  ")[0]: line for line in block.splitlines() if "(host)" in line}
        shares = {k: float(re.search(r"\(([\d.]+)% of the span\)", v).group(1)) for k, v in host_lines.items()}
        assert set(shares) == {f"{h} (host)" for h in HOST_PHASES} | {"host waits (host)"}
        span = rows["span"][0]
        assert span > 0
        for name, share in shares.items():  # each host phase (and their total) as a share of the span
            # both printed rounded: ms to 0.005, the share to 0.05 points
            assert share == pytest.approx(100 * rows[name][0] / span, abs=100 * 0.0051 / span + 0.051)
        assert rows["host waits (host)"][0] == pytest.approx(sum(rows[f"{h} (host)"][0] for h in HOST_PHASES),
                                                             abs=0.02)
        device = {k: v for k, v in rows.items() if v[1] is not None}
        assert sum(ms for ms, _ in device.values()) == pytest.approx(rows["instrumented sum"][0], abs=0.05)
        assert sum(share for _, share in device.values()) == pytest.approx(100, abs=0.6)
        assert rows["uninstrumented"][0] > 0


def test_plot_draws_a_png_with_agg(pack, tmp_path, capsys):
    trace, png = tmp_path / "t.json", tmp_path / "t.png"
    assert main(sim_run(pack, "--stream-min", "1", "--trace", str(trace))) == 0
    assert main(["plot", str(trace), str(png), "--chunk", "1", "--min-gap-us", "0"]) == 0
    assert f"plot      {png} (chunk 1:" in capsys.readouterr().out
    import matplotlib

    assert matplotlib.get_backend().lower() == "agg"
    data = png.read_bytes()
    assert data[:8] == PNG_SIGNATURE and len(data) > 1000
    width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk
    assert (width, height) == (14 * 120, int(4.2 * 120))


def _one_line_error(capsys, *words):
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("strata-prefill: error: "), err
    assert "Traceback" not in err
    for w in words:
        assert w in err, (w, err)


def test_bad_trace_path_and_reference_trace_are_one_line_errors(pack, tmp_path, capsys):
    assert main(sim_run(pack, "--trace", str(tmp_path / "no" / "t.json"))) == 2
    _one_line_error(capsys, "--trace", "does not exist")
    assert main(["run", "--pack", str(pack.path), "--trace", str(tmp_path / "t.json"), "--no-progress"]) == 2
    _one_line_error(capsys, "--impl fast")
    assert main(["run", "--pack", str(pack.path), "--timing", "--no-progress"]) == 2
    _one_line_error(capsys, "--impl fast")


def test_plot_errors_are_one_line(pack, tmp_path, capsys, monkeypatch):
    trace, png = tmp_path / "t.json", tmp_path / "t.png"
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["plot", str(bad), str(png)]) == 2
    _one_line_error(capsys, "not a JSON trace")
    bad.write_text(json.dumps({"traceEvents": []}))
    assert main(["plot", str(bad), str(png)]) == 2
    _one_line_error(capsys, "'compute' and 'copy'")
    assert main(sim_run(pack, "--trace", str(trace))) == 0
    capsys.readouterr()
    assert main(["plot", str(trace), str(png), "--chunk", "7"]) == 2
    _one_line_error(capsys, "chunk 7", "chunks in the trace: 0, 1")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if the extra were not installed
    assert main(["plot", str(trace), str(png)]) == 2
    _one_line_error(capsys, "strata-prefill[plot]")
    assert not png.exists()
