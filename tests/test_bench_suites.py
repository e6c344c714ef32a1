"""The benchmark suites in bench/ as their users run them, on a machine without a GPU: `pytest
bench/` collects every suite, the GPU suites skip with the backend's one-line reason, and
`--benchmark-autosave` then `--benchmark-compare` work (on the reference's smallest case, in a
temporary storage)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from strata_prefill.fast.cuda.runtime import cuda_available

ROOT = Path(__file__).resolve().parents[1]
GPU_SUITES = ["q8_1", "gather", "mmq", "attention", "copy", "prefill", "router"]
SMALLEST_REFERENCE = ["bench/test_bench_reference.py", "-k", "128 and tiny"]


def bench_pytest(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    # a run under pytest-xdist leaves its worker variables behind; pytest-benchmark, seeing
    # them, would disable itself in the child
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_CURRENT"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])  # keep the user's
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_collects_every_suite():
    res = bench_pytest("bench/", "--collect-only", "-q", "-rs")
    assert res.returncode == 0, res.stdout + res.stderr
    for name in GPU_SUITES:
        assert f"bench/test_bench_{name}_cuda.py::" in res.stdout, name
    assert "bench/test_bench_reference.py::test_reference_prefill[128-tiny]" in res.stdout
    torch_file = "bench/test_bench_torch_side_cuda.py"
    assert f"{torch_file}::" in res.stdout or "could not import 'torch'" in res.stdout


def test_gpu_suites_skip_with_the_reason():
    ok, why = cuda_available()
    if ok:
        pytest.skip("a GPU is here: the suites run rather than skip")
    res = bench_pytest("bench/test_bench_gather_cuda.py", "bench/test_bench_copy_cuda.py", "-q", "-rs")
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"cuda backend unavailable: {why}" in res.stdout
    assert "6 skipped" in res.stdout and "passed" not in res.stdout


def test_autosave_then_compare(tmp_path):
    storage = f"--benchmark-storage=file://{tmp_path}"
    saved = bench_pytest(*SMALLEST_REFERENCE, storage, "--benchmark-autosave", "-q")
    assert saved.returncode == 0, saved.stdout + saved.stderr
    files = list(tmp_path.rglob("0001_*.json"))
    assert len(files) == 1, saved.stdout
    data = json.loads(files[0].read_text())
    (bench,) = data["benchmarks"]
    assert bench["extra_info"]["tokens"] == 128 and bench["extra_info"]["tokens_per_s"] > 0
    assert data["machine_info"]["cpu"] and ("gpu" in data["machine_info"]) == cuda_available()[0]
    compared = bench_pytest(*SMALLEST_REFERENCE, storage, "--benchmark-compare", "-q")
    assert compared.returncode == 0, compared.stdout + compared.stderr
    assert "test_reference_prefill[128-tiny] (NOW)" in compared.stdout
    assert "test_reference_prefill[128-tiny] (0001_" in compared.stdout


def test_per_call_counts_keep_every_counter():
    """extra_info's counts: every counter the suites report, per call, zeros included."""
    from bench.gpu_timing import COUNTED, per_call
    before = {"launches": 5, "waits": 1}
    after = {"launches": 5 + 12, "waits": 1, "gathers": 7}
    got = per_call(after, before, 4)
    assert set(got) == set(COUNTED)
    assert got["launches"] == 3 and isinstance(got["launches"], int)
    assert got["gathers"] == 1.75 and got["waits"] == 0 and got["events"] == 0


def test_interleaved_alternates_the_arms():
    """bench/gpu_timing.interleaved: one untimed call per arm, then rounds in alternating order,
    each call between its own start and stop of the clock."""
    from bench.gpu_timing import interleaved
    log = []

    class Clock:
        def start(self):
            log.append("start")

        def stop(self):
            log.append("stop")
            return float(len(log))

    fns = [lambda a=a: log.append(a) for a in "ABC"]
    times = interleaved(Clock(), fns, 3)
    calls = [x for x in log if x not in ("start", "stop")]
    assert calls == list("ABC") + list("ABC") + list("CBA") + list("ABC")
    assert log[3:6] == ["start", "A", "stop"]
    assert [len(t) for t in times] == [3, 3, 3]
    assert times[0][1] > times[2][1]  # in the second round C ran first


def test_contract_cost_prints_its_table():
    """bench/contract_cost.py (NumPy only) prints the three error rows, each a coarser block
    costing more error than the contract's 32-value blocks; the three exponentials' ulps; and
    attention contract v1 against v2, one row per draw and their mean."""
    res = subprocess.run([sys.executable, "-m", "bench.contract_cost", "--tokens", "64", "--seed", "3",
                          "--exp-step", "4999", "--attention-draws", "2"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    rows = [line for line in lines if line.startswith("| ") and line.endswith("x |") and line.count("|") == 5]
    assert len(rows) == 3, res.stdout
    for row in rows:
        ratio = float(row.rstrip(" |").rsplit("|", 1)[1].strip().rstrip("x"))
        assert ratio > 1.0, row
    exp_rows = [line for line in lines if "polynomial" in line]
    assert len(exp_rows) == 3, res.stdout
    for row in exp_rows:  # exp within 1.25 ulps of float64, the table form within 2, exp2c within 3e-6
        worst = float(row.split("|")[2])
        assert 0.0 < worst < (60.0 if "exp2c" in row else 1.25 if "contract" in row else 2.0), row
    v12 = [line.split("|")[1:-1] for line in lines if line.count("|") == 8 and line.endswith("x |")]
    assert [r[0].strip() for r in v12] == ["3", "4", "mean"], res.stdout
    for r in v12:  # scores and outputs of both contracts: errors of a few percent at most
        assert all(0.0 < float(r[i]) < 0.2 for i in (1, 2, 4, 5)), r


def test_a_kernel_row_goes_into_extra_info():
    """bench/conftest.row_info: a timed row's id, op, shape, weight type and form, as JSON (what
    gpu_benchmark(case=...) puts into extra_info beside TOP/s and GB/s from the row's flops and
    bytes)."""
    from bench import conftest as mod
    from strata_prefill.verify.cases import kernel_rows

    case = [c for c in kernel_rows("float_dense", timed=True) if c.weight_type == "BF16"][0]
    info = mod.row_info(case)
    assert info["row"] == case.id and info["op"] == "float_dense" and info["form"] == case.form
    assert info["weight_type"] == "BF16" and info["shape"]["N"] == 512
    json.dumps(info)
    att = mod.row_info(kernel_rows("attention", timed=True)[0])
    assert att["shape"]["positions"] == {"range": [0, 4096]} and "form" not in att


def test_ab_harness_interleaves_checks_and_tabulates():
    """bench/ab_harness.measure on NumPy arms and a fake clock: arms called A B / B A after one
    untimed call each, medians per arm, each output against the definition's rows and the
    first arm's bytes (a wrong byte in a checked row and one outside are both named), and the
    Markdown table's lines."""
    import numpy as np

    from bench.ab_harness import Arm, Definition, markdown, measure
    from strata_prefill.verify.cases import kernel_case

    calls, now = [], [0.0]

    class Clock:
        def start(self):
            self.t0 = now[0]

        def stop(self):
            return now[0] - self.t0

    def arm(name, cost, out):
        def run():
            calls.append(name)
            now[0] += cost
        return Arm(name, run, lambda: out)

    good = np.arange(40, dtype=np.float32).reshape(10, 4)
    off_row = good.copy()
    off_row[3, 1] = -1.0  # row 3 is not among the checked rows
    in_row = good.copy()
    in_row[9, 0] = 7.5  # row 9 is
    case = kernel_case("add", "n40", dict(n=40))
    definition = Definition(np.array([0, 5, 9]), good[[0, 5, 9]])
    res = measure(Clock(), case, [arm("A", 1e-3, good), arm("B", 2e-3, off_row), arm("C", 3e-3, in_row)], 3,
                  lambda: definition)
    assert calls == list("ABC") + list("ABC") + list("CBA") + list("ABC")
    assert [round(m, 6) for m in res.median_ms] == [1.0, 2.0, 3.0]
    assert res.differs[0] is None and "first arm" in res.differs[1] and "definition" in res.differs[2]
    assert "first at byte 54 (row 3)" in res.differs[1]  # element 13 (row 3), its third byte
    assert not res.same
    table = markdown([res], 3).splitlines()
    assert len(table) == 4 and table[1].startswith("| row | arm 0 ms | arm 1 ms | arm 2 ms |")
    assert table[3].startswith("| n40 | 1.000 | 2.000 | 3.000 | +200.0% |") and "DIFFER" in table[3]
    assert f"{case.bytes / 1e-3 / 1e9:.0f} GB/s" in table[3]
