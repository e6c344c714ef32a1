"""dev/kernels/mma_probe.py without a GPU: its cases keep their promise (integers below 2^24,
the extremes at 2^24 - 1 and odd), the kernel file compiles as the runtime would build it (where
nvcc is on PATH), its launch formats match the kernels' C signatures, and without CUDA the
script says so in one line."""
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fast.cuda import runtime, signatures

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "dev" / "kernels" / "mma_probe.py"

try:
    _CUDA, _WHY = runtime.cuda_available()
except ImportError as exc:  # pragma: no cover - a broken install
    _CUDA, _WHY = False, f"the cuda runtime does not import: {exc}"


@pytest.fixture(scope="module")
def script():
    name = "dev_kernels_mma_probe"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, SCRIPT)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


def test_cases_stay_below_two_to_the_24(script):
    a, b, c = script.exact_cases(64, seed=3)
    assert np.abs(a).max() == script.A_MAX and np.abs(b).max() == script.B_MAX
    assert np.abs(a).max() < 2048  # every A exact in f16
    d = np.einsum("mik,mkj->mij", a, b) + c
    assert np.abs(d).max() == 2 ** 24 - 1  # the widest sums need every bit of the significand
    assert (np.abs(c) + np.einsum("mik,mkj->mij", np.abs(a), np.abs(b))).max() < 2 ** 24  # every partial sum too
    assert (d[-1] % 2 == 1).all() and len(np.unique(d[-1])) == 8  # odd sums, a different one per column
    assert (c[:16] == 0).all() and (c[16:64] != 0).any()


def test_launch_formats_are_the_kernels_signatures(script):
    text = (SCRIPT.parent / "mma_probe.cu").read_text()
    found = signatures.parse_source(text, "mma_probe.cu", {}, include_dir=runtime.KERNEL_DIR)
    assert found["mma_f16_exact"].format == signatures.normalize_format("PPPPi")
    for name, _macs in script.RATES:
        assert found[name].format == signatures.normalize_format("iP"), name


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_the_probe_compiles(tmp_path):
    src = tmp_path / "mma_probe.cu"
    src.write_text(runtime.kernel_source("mma_probe", str(SCRIPT.parent)))
    cmd = ["nvcc", "-cubin", f"-arch={runtime.DEFAULT_ARCH}", *runtime.NVCC_OPTIONS, str(src),
           "-o", str(tmp_path / "p.cubin")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]


def test_without_cuda_the_script_says_so_in_one_line():
    if _CUDA:
        pytest.skip("a CUDA device is here: the script would run")
    r = subprocess.run([sys.executable, str(SCRIPT), "--cases", "8", "--iters", "1", "--reps", "1"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "needs a CUDA GPU" in r.stderr


@pytest.mark.skipif(not _CUDA, reason=f"cuda backend unavailable: {_WHY}")
def test_the_probe_runs(script, capsys):
    """On a GPU: the check and the rates run (whether the sums are exact is what the probe
    reports, not what this test asserts)."""
    script.main(["--cases", "256", "--iters", "64", "--reps", "1"])
    out = capsys.readouterr().out
    assert "check f16 m16n8k16" in out and "mma_rate_s8_k32" in out
