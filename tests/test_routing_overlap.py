"""dev/routing_overlap.py on record files written here: the per-layer counts it prints for a
second prompt against the first, checked against the counts worked out by hand."""
import numpy as np
import pytest

from strata_prefill.formats.dumps import RecordWriter


def _script():
    from dev import routing_overlap

    return routing_overlap


def _records(path, layers):
    with RecordWriter(path) as w:
        for l, ids in enumerate(layers):
            w.write(f"L{l:02d}.topk_ids", np.asarray(ids, np.int32))


def test_overlap_table(tmp_path, capsys):
    mod = _script()
    # 2 layers of 8 experts, top-2; the cache holds 4 (place_experts spreads them: 1, 3, 5, 7)
    a = [[[6, 4], [6, 2], [6, 4]], [[0, 2], [0, 2], [1, 3]]]
    b = [[[0, 2], [0, 4], [1, 3]], [[0, 2], [6, 4], [0, 7]]]
    _records(tmp_path / "a.spd", a)
    _records(tmp_path / "b.spd", b)
    assert mod.main([str(tmp_path / "a.spd"), str(tmp_path / "b.spd"), "--expert-cache", "8", "--head", "2"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 0") or line.startswith("| 1")]
    # layer 0: B routes 0 1 2 3 4 (5); streamed 0 2 4 6 -> routed 0 2 4 (3); a cache of A's top 4
    # (6, 4, 2, then 0 by id) leaves 1 3 5 7 streamed -> routed 1 3 (2); head by id 0 2 -> 2 routed;
    # head by A's use among streamed 0 2 4 6: 6, 4 -> 4 routed (1)
    assert rows[0] == "| 0 | 5 | 3 | 2 | 2 | 1 |"
    # layer 1: B routes 0 2 4 6 7 (5); streamed 0 2 4 6 -> 4; A's top 4: 0, 2, then 1 and 3 ->
    # streamed 4 5 6 7 -> routed 4 6 7 (3); head by id 0 2 -> 2; by A's use: 0, 2 -> 2
    assert rows[1] == "| 1 | 5 | 4 | 3 | 2 | 2 |"


def test_records_of_different_packs_are_refused(tmp_path):
    mod = _script()
    _records(tmp_path / "a.spd", [[[0, 1]]])
    _records(tmp_path / "b.spd", [[[0, 1]], [[2, 3]]])
    with pytest.raises(SystemExit):
        mod.main([str(tmp_path / "a.spd"), str(tmp_path / "b.spd"), "--expert-cache", "1"])
