"""dev/kernels/mmq_core.py without a GPU: its definition is production's NumPy product on these
operands, worked out here one element at a time in float32; its launch format is the kernels'
C signature; the kernel file compiles against production's headers (where nvcc is on PATH);
without CUDA the script says so in one line. On a GPU: both forms' bytes are the definition's."""
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fast.cuda import runtime, signatures

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "dev" / "kernels" / "mmq_core.py"
F32 = np.float32

try:
    _CUDA, _WHY = runtime.cuda_available()
except ImportError as exc:  # pragma: no cover - a broken install
    _CUDA, _WHY = False, f"the cuda runtime does not import: {exc}"


@pytest.fixture(scope="module")
def script():
    name = "dev_kernels_mmq_core"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, SCRIPT)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


@pytest.mark.parametrize("widest", [False, True])
def test_definition_is_the_epilogue_element_by_element(script, widest):
    a = script.inputs(np.random.default_rng(5), 3, 64, 4, widest)
    got = script.definition(a)
    w, u, dw, x, da = (a[k] for k in ("w", "u", "dw", "x", "da"))
    for r in range(4):
        for n in range(3):
            acc = F32(0.0)
            for b in range(2):
                s = 0
                for h in range(2):
                    lo = 32 * b + 16 * h
                    s += int(u[n, 2 * b + h]) * int(np.dot(w[n, lo:lo + 16].astype(np.int64), x[r, lo:lo + 16].astype(np.int64)))
                assert abs(s) < 2 ** 24
                acc = F32(acc + F32(F32(dw[n, b] * da[r, b]) * F32(s)))
            assert got[r, n].tobytes() == acc.tobytes(), (r, n, got[r, n], acc)


def test_inputs_look_like_iq2_xs(script):
    a = script.inputs(np.random.default_rng(0), 64, 256, 128)
    assert set(np.unique(np.abs(a["w"]))) == {8, 25, 43}
    assert set(np.unique(a["u"])) <= set(range(1, 32, 2)) and len(np.unique(a["u"])) > 8
    assert (a["dw"] != 0).all() and (a["da"] > 0).all() and np.abs(a["x"]).max() == 127


def test_the_kernels_take_the_scripts_format(script):
    text = (SCRIPT.parent / "mmq_core.cu").read_text()
    found = signatures.parse_source(text, "mmq_core.cu", {}, include_dir=runtime.KERNEL_DIR)
    for v in script.VERSIONS:
        assert found[f"mmq_core_{v}"].format == signatures.normalize_format(script.FORMAT), v


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_the_core_compiles_against_production_headers(tmp_path):
    src = tmp_path / "mmq_core.cu"
    src.write_text(runtime.kernel_source("mmq_core", str(SCRIPT.parent)))
    assert '#include "' not in src.read_text()
    cmd = ["nvcc", "-cubin", f"-arch={runtime.DEFAULT_ARCH}", *runtime.NVCC_OPTIONS, str(src),
           "-o", str(tmp_path / "c.cubin")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]


def test_without_cuda_the_script_says_so_in_one_line():
    if _CUDA:
        pytest.skip("a CUDA device is here: the script would run")
    r = subprocess.run([sys.executable, str(SCRIPT), "--rows", "128", "--reps", "1"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "needs a CUDA GPU" in r.stderr


@pytest.mark.skipif(not _CUDA, reason=f"cuda backend unavailable: {_WHY}")
def test_both_forms_are_the_definition_on_the_device(script):
    from fast.cuda import runtime as rt

    assert script.check(script.Cores(rt.Device())) == []
