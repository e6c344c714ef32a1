"""The cuda backend's stress mode (fast/cuda/stress.py), the parts that need no GPU: the variable
read (a bad seed is one line), enabled() over it, the seeded schedule of spins as a pure
function of the configuration, and Stress enqueueing what the schedule says (a fake launcher
in place of the spin kernel). verify/test_stress_cuda.py runs it on the GPU."""
import collections
import json
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strata_prefill.fast.cuda import stress
from strata_prefill.contract.errors import InputError


def test_off_unless_the_variable_names_a_seed(monkeypatch):
    monkeypatch.delenv(stress.ENV, raising=False)
    assert stress.current() is None
    monkeypatch.setenv(stress.ENV, " ")
    assert stress.current() is None
    monkeypatch.setenv(stress.ENV, "17")
    assert stress.current() == stress.Config(17)


@pytest.mark.parametrize("bad", ["x", "1.5", "0x10", "seed=3"])
def test_a_bad_seed_is_one_line(monkeypatch, bad):
    monkeypatch.setenv(stress.ENV, bad)
    with pytest.raises(InputError, match=f"{stress.ENV} must be an integer seed, got {bad!r}") as err:
        stress.current()
    assert "\n" not in str(err.value)


def test_enabled_overrides_the_variable_and_restores_it(monkeypatch):
    monkeypatch.setenv(stress.ENV, "5")
    with stress.enabled(9, copy_us=(10, 10), compute_share=0.0) as cfg:
        assert stress.current() is cfg and cfg.seed == 9 and cfg.copy_us == (10, 10)
        with stress.enabled(None):
            assert stress.current() is None
        assert stress.current() is cfg
    assert stress.current() == stress.Config(5)


@pytest.mark.parametrize("kw", [dict(copy_us=(5, 1)), dict(compute_us=(-1, 3)), dict(compute_share=1.5)])
def test_a_bad_configuration_is_refused(kw):
    with pytest.raises(InputError, match="stress"):
        stress.Config(1, **kw)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), lo=st.floats(0, 100), span=st.floats(0, 300), share=st.floats(0, 1),
       n=st.integers(1, 300))
def test_schedule_is_seeded_and_in_range(seed, lo, span, share, n):
    cfg = stress.Config(seed, copy_us=(lo, lo + span), compute_us=(lo, lo + span), compute_share=share)
    copies, launches = stress.plan(cfg, n, n)
    assert stress.plan(cfg, n, n) == (copies, launches)  # the same seed, the same spins
    assert all(lo <= c <= lo + span for c in copies)
    assert all(c == 0.0 or lo <= c <= lo + span for c in launches)
    # the copies' spins do not depend on how many launches came before them
    assert stress.plan(cfg, n, 0)[0] == copies
    if share == 0.0:
        assert not any(launches)


def test_seeds_differ_and_the_share_is_kept():
    a, b = stress.Config(1), stress.Config(2)
    assert stress.plan(a, 50, 50) != stress.plan(b, 50, 50)
    _, launches = stress.plan(stress.Config(3, compute_share=0.25), 0, 4000)
    share = sum(x > 0 for x in launches) / len(launches)
    assert 0.2 < share < 0.3, share
    copies, _ = stress.plan(stress.Config(3), 4000, 0)
    assert 80 < sum(copies) / len(copies) < 120  # uniform on 0-200 us by default
    _, always = stress.plan(stress.Config(4, compute_us=(7, 7), compute_share=1.0), 0, 20)
    assert always == [7.0] * 20


def test_stress_enqueues_the_schedule_and_counts_it():
    cfg = stress.Config(11, copy_us=(1, 50), compute_us=(1, 50), compute_share=0.5)
    calls = []
    counters = collections.Counter()
    s = stress.Stress(cfg, counters, launch=lambda stream, cycles: calls.append((stream, cycles)), clock_khz=2_000_000)
    for _ in range(30):
        s.before_copy("copy")
        s.before_launch("compute")
    copies, launches = stress.plan(cfg, 30, 30)
    want = []
    for c, l in zip(copies, launches):
        want.append(("copy", round(c * 2000)))
        if l > 0:
            want.append(("compute", round(l * 2000)))
    assert calls == want
    assert counters["stress_spins"] == len(want) and counters["launches"] == 0


def test_no_spin_of_zero_cycles():
    calls = []
    counters = collections.Counter()
    s = stress.Stress(stress.Config(1, copy_us=(0, 0), compute_share=0.0), counters,
                      launch=lambda *a: calls.append(a), clock_khz=1_500_000)
    for _ in range(10):
        s.before_copy(None)
        s.before_launch(None)
    assert calls == [] and counters["stress_spins"] == 0
    assert s.cycles(20_000) == 30_000_000  # 20 ms at 1.5 GHz
    assert s.prepare() is s and calls == []  # the launcher and clock given: nothing loaded, nothing run


def test_the_planted_race_harness_runs_on_the_sim(make_test_pack, tmp_path, monkeypatch, capsys):
    """verify/stress_child.py's child, on the sim backend (whose routing tables never go
    through the cuda backend's page-locked buffer: the planted counts read changes nothing
    there): it runs the three runs, plants in place and reports its one line."""
    from strata_prefill.fast.cuda import backend
    from strata_prefill.verify import stress_child as t

    monkeypatch.setattr(backend.DevTables, "resolve", backend.DevTables.resolve)  # restored after
    pack = make_test_pack("tiny", "Q8_0")
    t.child({"case": "c_counts_read_early_overlap1", "pack": str(pack.path), "out": str(tmp_path), "backend": "sim"})
    assert backend.DevTables.resolve is t._counts_without_wait  # planted
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith(t.RESULT)]
    got = json.loads(lines[-1][len(t.RESULT):])
    assert got == {"warm_same": True, "planted_same": True, "error": None, "spins": 0, "copies": 0, "waits": 0}


def test_the_zygote_forks_a_child_per_case_and_survives_a_failed_one(make_test_pack, tmp_path):
    """The zygote (verify/stress_child.py) answers case after case from one process, each in a
    fork of its own: a child that fails reports its exit code and its stderr, and the zygote
    goes on to the next case."""
    import os
    from pathlib import Path

    from strata_prefill.verify import stress_child as t

    pack = make_test_pack("tiny", "Q8_0")
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
    answers = []
    for i, case in enumerate(("c_counts_read_early_overlap1", "no such case", "c_counts_read_early_streamed")):
        out = tmp_path / str(i)
        out.mkdir()
        lines, code = t.Zygote.ask({"case": case, "pack": str(pack.path), "out": str(out), "backend": "sim"}, env, root,
                                   timeout=300)
        answers.append((lines, code, (out / "child-stderr.txt").read_text()))
    pid = t.Zygote.proc.pid
    assert t.Zygote.proc.poll() is None  # one zygote answered all three
    (ok1, c1, _), (bad, c2, err2), (ok3, c3, _) = answers
    assert c1 == 0 and c3 == 0 and c2 == 1, (c1, c2, c3)
    assert not any(ln.startswith(t.RESULT) for ln in bad) and "KeyError" in err2
    for lines in (ok1, ok3):
        got = json.loads([ln for ln in lines if ln.startswith(t.RESULT)][-1][len(t.RESULT):])
        assert got["warm_same"] and got["error"] is None, got
    t.Zygote.proc.stdin.close()  # its end: the zygote leaves when its input does
    assert t.Zygote.proc.wait(timeout=60) == 0 and pid == t.Zygote.proc.pid
    t.Zygote.proc = None
