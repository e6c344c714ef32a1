"""The gate's plumbing (verify/gate.py): the worker count per machine, the runs it leaves alone,
the lines it ends with, and work started ahead that a stopped run does not wait for."""
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from strata_prefill.verify import gate


@pytest.mark.parametrize("cores,gpu,env,want", [
    (16, "NVIDIA H200", None, gate.GPU_WORKERS),
    (2, "NVIDIA H200", None, 2),  # never more workers than cores
    (16, None, None, 16),
    (2, None, None, 2),
    (16, "NVIDIA H200", "6", 6),
    (16, None, "off", 0),
])
def test_workers_for_the_machine(cores, gpu, env, want):
    assert gate.workers_for(cores, gpu, env)[0] == want


@pytest.mark.parametrize("env", ["0.5", "-2", "many"])
def test_a_bad_worker_count_is_one_line(env):
    with pytest.raises(ValueError, match="STRATA_PREFILL_WORKERS"):
        gate.workers_for(4, None, env)


def test_named_ids_and_benchmarks_are_not_spread():
    assert gate._named_ids(["verify/test_parity.py::test_parity[x]"])
    assert not gate._named_ids(["verify/", "tests"])
    assert gate._benchmarks([str(gate.ROOT / "bench" / "test_bench_reference.py")])
    assert not gate._benchmarks([str(gate.ROOT / "verify")])


def _report(nodeid, kind, outcome="passed", seconds=1.0, case="c", hits=0, misses=0):
    props = [("gate_kind", kind), ("gate_case", case), ("gate_ref_hits", hits), ("gate_ref_misses", misses)]
    return SimpleNamespace(nodeid=nodeid, duration=seconds, user_properties=props, failed=outcome == "failed",
                           skipped=outcome == "skipped")


def test_the_last_lines_count_rows_cases_hits_and_the_slowest(monkeypatch):
    monkeypatch.setattr(gate, "_ahead", {})
    monkeypatch.setattr(gate, "_plan", {})
    s = gate.Summary()
    for i in range(3):
        s.pytest_runtest_logreport(_report(f"verify/k.py::t[{i}]", "kernel", seconds=i))
    s.pytest_runtest_logreport(_report("verify/k.py::t[9]", "kernel", outcome="failed"))
    s.pytest_runtest_logreport(_report("verify/p.py::t[a]", "parity", case="A", hits=1, seconds=7))
    s.pytest_runtest_logreport(_report("verify/p.py::t[b]", "parity", case="A", misses=1))
    s.pytest_runtest_logreport(_report("verify/p.py::t[c]", "parity", case="B", hits=1))
    lines = s.lines()
    assert "gate: kernel rows: 3 passed, 1 failed, 0 skipped" in lines
    assert "gate: parity rows (arms): 3 passed over 2 cases (pack, prompt), 0 failed, 0 skipped" in lines
    assert "gate: reference cache: 2 hits, 1 misses" in lines
    assert lines[-1].startswith("gate: slowest: 7.0 s p.py::t[a]; 2.0 s k.py::t[2]")


def test_a_stopped_run_does_not_wait_for_work_started_ahead(monkeypatch):
    """A compile still running and a reference still computing are named, not waited for; the
    reference process is left to finish (its result is kept for the next run)."""
    hold = threading.Event()
    thread = threading.Thread(target=hold.wait, daemon=True)
    thread.start()
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    monkeypatch.setattr(gate, "_ahead", {"thread": thread, "kernels": 5, "refs": proc})
    try:
        t0 = time.perf_counter()
        lines = gate.finish_ahead()
        assert time.perf_counter() - t0 < 5
        assert "5 modules, still compiling" in lines[0]
        assert f"still computing in process {proc.pid}" in lines[1] and proc.poll() is None
    finally:
        hold.set()
        proc.kill()
        proc.wait()


def _fake_config(args=()):
    opt = SimpleNamespace(numprocesses=None, collectonly=False, usepdb=False)
    return SimpleNamespace(option=opt, args=list(args), pluginmanager=SimpleNamespace(hasplugin=lambda name: True))


@pytest.mark.parametrize("gpu", ["NVIDIA H200", None])
def test_workers_yield_to_the_work_ahead_on_a_gpu_machine(monkeypatch, gpu):
    for var in (*gate.THREAD_VARS, gate.ENV_NICE, gate.ENV_WORKERS, "PYTEST_XDIST_WORKER"):
        monkeypatch.setenv(var, "")  # remembered, so that what plan_workers sets is undone
        monkeypatch.delenv(var)
    monkeypatch.setattr(gate, "_plan", {})
    monkeypatch.setattr(gate, "gpu_name", lambda: gpu)
    monkeypatch.setattr(gate, "cores", lambda: 16)
    config = _fake_config()
    gate.plan_workers(config)
    assert config.option.numprocesses == (gate.GPU_WORKERS if gpu else 16)
    import os

    assert os.environ.get(gate.ENV_NICE) == (str(gate.WORKER_NICE) if gpu else None)


def test_a_worker_takes_the_niceness_it_is_given():
    # in a child, so that this process keeps its own
    code = ("import os; from types import SimpleNamespace as N; from verify import gate; before = os.nice(0); "
            "gate.configure(N(addinivalue_line=lambda *a: None)); print(os.nice(0) - before)")
    env = dict(__import__("os").environ, PYTEST_XDIST_WORKER="gw0", **{gate.ENV_NICE: "3"})
    out = subprocess.run([sys.executable, "-c", code], cwd=gate.ROOT, env=env, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "3"


def test_old_versions_of_a_test_pack_are_removed_but_the_newest_kept(tmp_path):
    import os

    name = "small-IQ2_XS"
    paths = [tmp_path / f"{name}-{k:016x}.gguf" for k in range(5)]
    for i, p in enumerate(paths):
        p.write_bytes(b"x")
        (tmp_path / f"{p.name}.lock").write_text("")
        os.utime(p, (1000 + i, 1000 + i))  # paths[4] the newest
    other = tmp_path / f"{name}-layers2-{0:016x}.gguf"  # another pack whose name starts alike
    other.write_bytes(b"y")
    gate._prune(tmp_path, name, paths[4])
    kept = sorted(p.name for p in tmp_path.glob("*.gguf"))
    assert kept == sorted([paths[4].name, paths[3].name, other.name])  # the new one and one earlier
    assert not (tmp_path / f"{paths[0].name}.lock").exists()


def test_a_pack_another_process_uses_is_not_pruned(tmp_path, monkeypatch):
    """kept_pack holds a shared lock on the pack it returns for as long as its process lives;
    a newer version made by another process (another tree's gate) then prunes around it."""
    monkeypatch.setenv(gate.ENV_PACKS, str(tmp_path))
    code = ("import sys, time; from verify import gate; "
            "print(gate.kept_pack('tiny', 'Q8_0', {}, None), flush=True); sys.stdin.read()")
    user = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            cwd=gate.ROOT)
    try:
        used = Path(user.stdout.readline().strip())
        assert used.exists()
        import os

        os.utime(used, (1000, 1000))  # the oldest version of its pack
        name = used.name[: -len("-0123456789abcdef.gguf")]
        newer = [tmp_path / f"{name}-{k:016x}.gguf" for k in range(1, 4)]
        for i, p in enumerate(newer):
            p.write_bytes(b"x")
            os.utime(p, (2000 + i, 2000 + i))
        gate._prune(tmp_path, name, newer[-1])
        assert used.exists()  # in use: kept although two newer versions are
        assert not newer[0].exists() and newer[1].exists()
    finally:
        user.communicate("")
    gate._prune(tmp_path, name, newer[-1])
    assert not used.exists()  # its user gone, it goes too


def test_two_processes_use_one_kept_pack_at_once(tmp_path, monkeypatch):
    """Users hold shared locks: a second process asking for a pack the first one holds gets it
    at once, and a third asking for a pack not yet made waits only for its making."""
    monkeypatch.setenv(gate.ENV_PACKS, str(tmp_path))
    code = ("import sys; from verify import gate; "
            "print(gate.kept_pack('tiny', 'Q8_0', {}, None), flush=True); sys.stdin.read()")
    users = [subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, cwd=gate.ROOT) for _ in range(3)]
    try:
        import select

        for u in users:  # each answers while the others hold it (an exclusive lock would wait forever)
            assert select.select([u.stdout], [], [], 120)[0], "a process is still waiting for the pack"
        paths = {u.stdout.readline().strip() for u in users}
        assert len(paths) == 1 and Path(paths.pop()).exists()
        t0 = time.perf_counter()
        assert gate.kept_pack("tiny", "Q8_0", {}, None).exists()  # a fourth, in this process
        assert time.perf_counter() - t0 < 5.0
    finally:
        for u in users:
            u.communicate("", timeout=60)


def test_a_process_that_saw_the_pack_missing_does_not_wait_for_its_users(tmp_path, monkeypatch):
    """The race of the test above, made certain: this process found the pack missing, and by the
    time it asks to make it another has made it and holds it shared (a user, for as long as it
    lives). It must take the pack, not wait for the exclusive lock until every user ends."""
    import fcntl

    monkeypatch.setenv(gate.ENV_PACKS, str(tmp_path))
    made = gate.kept_pack("tiny", "Q8_0", {}, None)  # made, and held shared by this process
    for f in gate._in_use:
        f.close()
    gate._in_use.clear()
    user = open(tmp_path / f"{made.name}.lock", "a")  # another open: a lock of its own, as a process's
    fcntl.flock(user, fcntl.LOCK_SH)
    seen = []
    real_exists = Path.exists

    def exists_once_missing(self):  # the first look at the pack finds it missing
        if self == made and not seen:
            seen.append(self)
            return False
        return real_exists(self)

    monkeypatch.setattr(Path, "exists", exists_once_missing)
    got = []
    t = threading.Thread(target=lambda: got.append(gate.kept_pack("tiny", "Q8_0", {}, None)), daemon=True)
    t.start()
    t.join(20)
    try:
        assert got == [made], "waiting for the exclusive lock while a user holds the pack"
        assert seen == [made]
    finally:
        user.close()  # (lets an old-code thread go)
        t.join(20)
        monkeypatch.undo()
        for f in gate._in_use:
            f.close()
        gate._in_use.clear()


def test_recorded_durations_order_the_next_run_longest_first(tmp_path, monkeypatch):
    """A run records its tests' seconds beside the test packs; the next run of the same
    reference source gives its workers one copy and each orders its collection longest first
    (tests never timed before all others); a run of another source is not ordered by them."""
    from strata_prefill.verify import conftest as vconf

    monkeypatch.setenv(gate.ENV_PACKS, str(tmp_path))
    monkeypatch.setattr(gate, "_order", {})
    tests = {f"verify/t.py::t[{i}]": {"outcome": o, "seconds": float(i)} for i, o in
             enumerate(("passed", "failed", "skipped", "passed"))}
    gate.record_durations(tests)
    got = gate.read_durations(tmp_path / gate.DURATIONS)
    assert got == {"verify/t.py::t[0]": 0.0, "verify/t.py::t[1]": 1.0, "verify/t.py::t[3]": 3.0}  # no skipped one
    gate.record_durations({"verify/t.py::t[0]": {"outcome": "passed", "seconds": 9.0}})  # merged, the newest wins
    assert gate.read_durations(tmp_path / gate.DURATIONS)["verify/t.py::t[0]"] == 9.0

    gate.share_durations()
    shared = gate.os.environ[gate.ENV_ORDER]
    items = [SimpleNamespace(nodeid=f"verify/t.py::t[{i}]") for i in (1, 3, 0, 7)]
    vconf.pytest_collection_modifyitems(items)
    assert [it.nodeid[-2] for it in items] == ["7", "0", "3", "1"]
    gate.record_durations({"verify/t.py::t[1]": {"outcome": "passed", "seconds": 99.0}})
    monkeypatch.setattr(gate, "_order", {})
    vconf.pytest_collection_modifyitems(items)  # a worker started now reads the copy, not the record
    assert [it.nodeid[-2] for it in items] == ["7", "0", "3", "1"]
    monkeypatch.delenv(gate.ENV_ORDER)
    Path(shared).unlink()

    monkeypatch.setattr(gate, "_source", lambda: "another source")
    assert gate.read_durations(tmp_path / gate.DURATIONS) == {}
    gate.share_durations()
    assert gate.ENV_ORDER not in gate.os.environ


def test_the_gate_spreads_by_work_stealing_unless_told(monkeypatch):
    monkeypatch.setattr(gate, "_plan", {})
    monkeypatch.setattr(gate, "cores", lambda: 8)
    monkeypatch.setattr(gate, "gpu_name", lambda: None)
    for var in gate.THREAD_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv(gate.ENV_WORKERS, raising=False)
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    for dist, want in (("no", "worksteal"), ("loadgroup", "loadgroup")):
        opt = SimpleNamespace(numprocesses=None, collectonly=False, usepdb=False, dist=dist)
        config = SimpleNamespace(option=opt, args=[], pluginmanager=SimpleNamespace(hasplugin=lambda name: True))
        gate.plan_workers(config)
        assert (opt.numprocesses, opt.dist) == (8, want)


def test_the_last_lines_say_what_the_run_leaves_in_the_cache(tmp_path, monkeypatch):
    """The cache home's size by folder and how to clear it, measured at the end of every run
    (the README cites the line, never a count that goes stale)."""
    import numpy as np

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(gate, "_ahead", {})
    monkeypatch.setattr(gate, "_plan", {})
    home = tmp_path / "strata-prefill"
    assert gate.Summary().lines() == []  # no cache home yet: nothing to say
    rng = np.random.default_rng(5)
    (home / "test-packs").mkdir(parents=True)
    (home / "test-packs" / "a.gguf").write_bytes(rng.integers(0, 256, 3_000_000, dtype=np.uint8).tobytes())
    (home / "reference" / "x").mkdir(parents=True)
    (home / "reference" / "x" / "r.bin").write_bytes(rng.integers(0, 256, 2_000_000, dtype=np.uint8).tobytes())
    (home / "small.txt").write_text("tiny")
    assert gate.Summary().lines() == [
        f"gate: cache: 5 MB kept in {home} for the next run (test-packs 3 MB, reference 2 MB); "
        f"rm -rf {home} clears it, the next run remakes what it needs"]


def test_a_process_that_took_a_kept_pack_closes_its_locks_as_it_ends(tmp_path, monkeypatch):
    """kept_pack's shared locks are files held open for the process's life; they are closed as
    it ends (atexit), not left to the interpreter's teardown, which may warn of each one
    (`ResourceWarning: unclosed file ... .gguf.lock`, printed after pytest's summary). A check
    registered before the gate (atexit runs last-in first-out) sees them closed; with -X dev,
    where every ResourceWarning prints, stderr stays empty."""
    monkeypatch.setenv(gate.ENV_PACKS, str(tmp_path))
    code = ("import atexit, sys\n"
            "held = []\n"
            "atexit.register(lambda: print('closed' if held and all(f.closed for f in held) else 'open'))\n"
            "from verify import gate\n"
            "gate.kept_pack('tiny', 'Q8_0', {}, None)\n"
            "held += gate._in_use\n")
    proc = subprocess.run([sys.executable, "-X", "dev", "-c", code], cwd=gate.ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout == "closed\n"
