"""bench/bench_streaming_cuda.py's CPU side: its arm table (the window arms beside the others),
the arm choice, each arm's row from its reps (bytes per token, link busy share and rate, the
floor), the Markdown table over a results dict and its picture (--plot), on made-up and random
numbers."""
import re

import numpy as np
import pytest

from strata_prefill.fast import options


@pytest.fixture(scope="module")
def bsc():
    from bench import bench_streaming_cuda  # nothing imports PyCUDA until a prefill is timed

    return bench_streaming_cuda


def test_arm_table_has_the_window_arms_and_only_known_switches(bsc):
    table = bsc.arm_table(24576)
    assert table["window-off"] == {"window": "off"} and table["window-24576"] == {"window": 24576}
    assert table["default"] == {} and {"gathered", "per-expert", "gather-q", "one-copy"} <= set(table)
    assert "window-16384" in bsc.arm_table()
    for switches in table.values():  # every keyword is a switch of the table, and its value resolves
        options.resolve(switches)
        assert set(switches) <= set(options.BY_KEYWORD)
    # and the switch table's rule takes each arm on the 8-layer strata pack with a third of its
    # experts resident (the bench's default cache): none sets a switch that would do nothing
    layers, n_expert = 8, 512
    facts = options.placed_facts("fast", "cuda", layers * n_expert // 3, layers * n_expert, "--expert-cache",
                                 layers, n_expert)
    for name, switches in table.items():
        options.refuse_idle({**switches, "expert_cache": layers * n_expert // 3}, facts, environ={})


def test_pick_arms_keeps_the_order_and_names_the_known_ones(bsc):
    table = bsc.arm_table(16384)
    assert bsc.pick_arms("window-16384,default", table) == ["window-16384", "default"]
    with pytest.raises(SystemExit, match=r"unknown arm\(s\) window-8192; arms: default, .*window-16384"):
        bsc.pick_arms("default,window-8192", table)


def test_arm_row_by_hand(bsc):
    row = bsc.arm_row(1000, [0.2, 0.1, 0.3], [(0.05, 10), (0.15, 10), (0.1, 10)],
                      {k: 0 for k in bsc.COUNTED} | {"copy_bytes": 5_530_000_000}, 16384, resident_s=0.05)
    assert row["ms"] == pytest.approx(200)
    assert row["window"] == 1000  # at most the prompt
    assert row["bytes_per_token"] == 5_530_000
    assert row["copy_busy_share"] == pytest.approx(0.5)  # 0.1 s busy of 0.2 s
    assert row["copy_gbs"] == pytest.approx(55.3)
    assert row["vs_floor"] == pytest.approx(0.2 / 0.1)  # the floor: 5.53 GB at 55.3 GB/s
    assert "vs_floor" not in bsc.arm_row(10, [1.0], [(0.0, 0)], {k: 0 for k in bsc.COUNTED}, 8192, None)


def _random_results(bsc, rng, lengths, arms) -> list[dict]:
    """main's rows on random numbers: per length, the resident arm and `arms`, each from
    arm_row over random reps, the resident time the one the floors are taken against."""
    results = []
    for n in lengths:
        res_s = float(rng.uniform(0.02, 1.0))
        row = {"tokens": n, "cache": 1365, "experts": 4096, "arms": {}}
        for a in ["resident", *arms]:
            counts = {k: int(rng.integers(1, 10_000)) for k in bsc.COUNTED}
            counts["copy_bytes"] = 0 if a == "resident" else int(rng.integers(1, 30_000_000_000))
            times = rng.uniform(0.02, 1.5, 3).tolist()
            busy = [(float(rng.uniform(0.001, t)), counts["copy_bytes"]) for t in times]
            row["arms"][a] = bsc.arm_row(n, times, busy, counts, 8192, None if a == "resident" else res_s)
        row["arms"]["resident"]["ms"] = 1e3 * res_s
        results.append(row)
    return results


@pytest.mark.parametrize("seed", range(4))
def test_format_table_gives_every_arm_its_figures(bsc, seed):
    rng = np.random.default_rng(seed)
    lengths = sorted(rng.choice([254, 1030, 8179, 30118], 2, replace=False).tolist())
    results = _random_results(bsc, rng, lengths, ["default", "window-off"])
    text = bsc.format_table(results, "head line")
    lines = text.splitlines()
    assert lines[0] == "head line"
    cols = [c.strip() for c in lines[2].strip("|").split("|")]
    body = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines[4:]]
    assert len(body) == 3 * len(results)
    for cells, (row, a) in zip(body, [(r, a) for r in results for a in r["arms"]]):
        v, got = row["arms"][a], dict(zip(cols, cells))
        assert got["prompt tokens"] == f"{row['tokens']:,}" and got["arm"] == a
        assert float(got["ms"]) == pytest.approx(v["ms"], abs=0.05)
        assert float(got["MB/token"]) == pytest.approx(v["copy_bytes"] / row["tokens"] / 1e6, abs=5e-4)
        if a == "resident":
            assert got["link busy"] == got["link GB/s"] == got["vs floor"] == "-"
        else:
            assert got["link busy"] == f"{100 * v['copy_busy_share']:.0f}%"
            assert float(got["link GB/s"]) == pytest.approx(v["copy_gbs"], abs=0.05)
            assert got["vs floor"] == f"{v['vs_floor']:.2f}x"
            assert float(got["vs resident"].rstrip("x")) == pytest.approx(v["ms"] / row["arms"]["resident"]["ms"],
                                                                          abs=0.006)


def test_progress_line_puts_bytes_and_link_beside_each_time(bsc):
    counts = {k: 1 for k in bsc.COUNTED}
    row = {"tokens": 100, "arms": {
        "resident": bsc.arm_row(100, [0.01], [(0.0, 0)], counts | {"copy_bytes": 0}, 8192, None),
        "group": bsc.arm_row(100, [0.02], [(0.01, 1)], counts | {"copy_bytes": 400_000_000}, 8192, 0.01)}}
    line = bsc.progress_line(row)
    assert re.fullmatch(r"  100 tokens: resident 10\.0 ms, group 20\.0 ms \(4\.00 MB/token, link busy 50% at 40\.0 GB/s\)",
                        line), line


def test_the_script_still_parses_its_command_line(bsc):
    with pytest.raises(SystemExit) as e:
        bsc.main(["--help"])
    assert e.value.code == 0
    with pytest.raises(SystemExit, match="unknown arm"):
        bsc.main(["--pack", "none.gguf", "--arms", "nope"])  # refused before the pack is opened


def test_plot_draws_saved_results_and_never_over_an_input(bsc, tmp_path, capsys):
    """--plot JSON [JSON ...] PNG: a PNG of one panel per prompt length, without a GPU; the
    picture may not take an input's path, and a file that is not results is named."""
    pytest.importorskip("matplotlib")
    import json

    a, b = tmp_path / "a.json", tmp_path / "b.json"
    rng = np.random.default_rng(0)
    a.write_text(json.dumps(_random_results(bsc, rng, [254, 8179], ["default", "threshold"])))
    b.write_text(json.dumps(_random_results(bsc, rng, [30118], ["default", "window-off"])))
    png = tmp_path / "out.png"
    assert bsc.main(["--plot", str(a), str(b), str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    before = a.read_bytes()
    with pytest.raises(SystemExit):
        bsc.main(["--plot", str(a), str(a)])
    assert a.read_bytes() == before
    assert "is one of the inputs" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text('{"runs": []}')
    with pytest.raises(SystemExit):
        bsc.main(["--plot", str(tmp_path / "bad.json"), str(tmp_path / "x.png")])
    assert "is not a bench_streaming_cuda.py results file" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()
    with pytest.raises(SystemExit):
        bsc.main([])
    assert "--pack is required for a GPU run" in capsys.readouterr().err
