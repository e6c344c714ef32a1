"""dev/kernel_times.py without a GPU: an ncu --csv list read and summed (by kernel name, and by
kernel, grid and block, largest first), and the refusals before any work."""
import json

import pytest

from dev import kernel_times as kt

HEAD = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size",'
        '"Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')


def _row(i, kernel, grid, block, value, unit="nsecond", metric=kt.METRIC):
    return (f'"{i}","7","python3","h","{kernel}","1","13","{block}","{grid}","0","9.0","Command line profiler '
            f'metrics","{metric}","{unit}","{value}"')


def _listing(rows):
    return ["==PROF== Connected to process 7", "profiled one prefill", HEAD, *rows, "==PROF== Disconnected"]


def test_the_sums_by_name_and_by_launch():
    lines = _listing([
        _row(0, "mmq_q4_k(const unsigned char *, int)", "(16, 32, 1)", "(256, 1, 1)", "500,000"),
        _row(1, "mmq_q4_k(const unsigned char *, int)", "(16, 4, 1)", "(256, 1, 1)", "80000"),
        _row(2, "mmq_q4_k(const unsigned char *, int)", "(16, 4, 1)", "(256, 1, 1)", "76000"),
        _row(3, "attention_wgmma", "(11, 32, 1)", "(512, 1, 1)", "0.3", unit="msecond"),
        _row(4, "rmsnorm", "(2048, 1, 1)", "(128, 1, 1)", "9", unit="usecond"),
        _row(5, "rmsnorm", "(2048, 1, 1)", "(128, 1, 1)", "11", metric="sm__cycles_elapsed.avg"),
    ])
    launches = kt.read_durations(lines)
    assert len(launches) == 5  # the other metric's row is not a duration
    assert launches[0] == {"kernel": "mmq_q4_k", "grid": "(16, 32, 1)", "block": "(256, 1, 1)", "us": 500.0}
    s = kt.summarize(launches)
    assert s["total_us"] == pytest.approx(500 + 80 + 76 + 300 + 9)
    assert [(k, round(us, 6), n) for k, us, n in s["by_name"]] == [("mmq_q4_k", 656.0, 3), ("attention_wgmma", 300.0, 1),
                                                                    ("rmsnorm", 9.0, 1)]
    # the grid tells the dense product from the two small ones of the same kernel
    assert s["by_launch"][0] == (("mmq_q4_k", "(16, 32, 1)", "(256, 1, 1)"), 500.0, 1)
    assert s["by_launch"][2] == (("mmq_q4_k", "(16, 4, 1)", "(256, 1, 1)"), 156.0, 2)
    text = kt.format_summary(s)
    assert text.splitlines()[0] == "5 launches, 0.96 ms of kernel time (each launch alone)"
    assert "    0.656  68.0%        3  mmq_q4_k" in text
    json.dumps(s)  # the sums are written as they are


def test_the_units_as_symbols():
    """ncu --print-units base writes ns, us, ms (the words without it): the same durations."""
    words = kt.read_durations(_listing([_row(0, "k", "(1, 1, 1)", "(32, 1, 1)", "2500"),
                                        _row(1, "k", "(1, 1, 1)", "(32, 1, 1)", "0.25", unit="msecond")]))
    symbols = kt.read_durations(_listing([_row(0, "k", "(1, 1, 1)", "(32, 1, 1)", "2500", unit="ns"),
                                          _row(1, "k", "(1, 1, 1)", "(32, 1, 1)", "0.25", unit="ms")]))
    assert symbols == words and [l["us"] for l in symbols] == [2.5, 250.0]


def test_an_unknown_unit_is_refused(tmp_path, capsys):
    rows = _listing([_row(0, "k", "(1, 1, 1)", "(32, 1, 1)", "3", unit="cycle")])
    with pytest.raises(ValueError, match="unknown unit"):
        kt.read_durations(rows)
    f = tmp_path / "k.csv"
    f.write_text("\n".join(rows) + "\n")
    assert kt.main(["--csv", str(f)]) == 2  # one line, no traceback
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"kernel_times: {f}:" in err and "unknown unit 'cycle'" in err


def test_refused_before_any_work(tmp_path, capsys):
    assert kt.main(["--pack", str(tmp_path / "none.gguf"), "--ncu", str(tmp_path / "ncu"), "--tokens", "0,x",
                    "--out", str(tmp_path / "o"), "--no-such-switch", "1"]) == 2
    err = capsys.readouterr().err
    for words in ("unknown switch --no-such-switch", "no pack at", "--tokens must be positive integers", "no ncu"):
        assert words in err
    assert not (tmp_path / "o").exists()


def test_a_written_list_is_summed(tmp_path, capsys):
    f = tmp_path / "k.csv"
    f.write_text("\n".join(_listing([_row(0, "combine", "(64, 1, 1)", "(256, 1, 1)", "1234")])) + "\n")
    assert kt.main(["--csv", str(f)]) == 0
    assert "1 launches, 0.00 ms" in capsys.readouterr().out
    assert kt.main(["--csv", str(tmp_path / "missing.csv")]) == 2
