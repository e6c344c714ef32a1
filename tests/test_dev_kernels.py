"""dev/kernels: version 1 of the prefill attention kernel (dev/kernels/attention_v1_mma.cu) and
its script (dev/kernels/attention.py). Without a GPU: the kernel's C signatures against the
format the script launches it with, its source inlined from production's headers, and (where
nvcc is on PATH) that it still compiles against them. On a GPU: the script's check, byte for
byte against the NumPy definition."""
from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fast.cuda import runtime, signatures

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "dev" / "kernels" / "attention.py"

try:
    _CUDA, _WHY = runtime.cuda_available()
except ImportError as exc:  # pragma: no cover - a broken install
    _CUDA, _WHY = False, f"the cuda runtime does not import: {exc}"


def _load_script():
    """dev/kernels/attention.py as a module (dev/ is no package); registered before it runs,
    as its dataclasses need."""
    name = "dev_kernels_attention"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, SCRIPT)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        try:
            spec.loader.exec_module(mod)
        except BaseException:
            del sys.modules[name]
            raise
    return sys.modules[name]


@pytest.fixture(scope="module")
def script():
    return _load_script()


@pytest.mark.parametrize("hd", (64, 128))
def test_v1_signature_is_the_scripts_format(script, hd):
    """The format the script prepares version 1 with (V1_FORMAT, its one place) is each kernel's
    C signature: edit either alone and this fails."""
    k = script.v1_kernels()[script.v1_kernel(hd)]
    assert k.format == signatures.normalize_format(script.V1_FORMAT), k.signature
    script.check_v1_format(hd)


def test_v1_has_exactly_its_two_kernels(script):
    assert sorted(script.v1_kernels()) == sorted(script.v1_kernel(hd) for hd in script.HEAD_DIMS)


def test_a_changed_format_is_caught(script):
    """The check has teeth: one letter off (ldo as an int) and an argument dropped both fail."""
    with pytest.raises(ValueError, match="long long ldo"):
        script.check_v1_format(128, script.V1_FORMAT[:-1] + "i")
    with pytest.raises(ValueError, match="the format ends"):
        script.check_v1_format(64, script.V1_FORMAT[:-1])


def test_v1_takes_the_production_kernels_parameters(script):
    """Both versions are entry points of one macro (attention_common.cuh ATTEND_KERNEL): the
    same parameters, so the script launches them with the same arguments."""
    assert signatures.expected_format("attention_pair", "attend_pair_hd128") == script.V1_FORMAT


def test_v1_source_inlines_production_headers(script):
    src = runtime.kernel_source("attention_v1_mma", str(SCRIPT.parent))
    assert '#include "' not in src
    assert "#define STRATA_ATTENTION_COMMON_CUH" in src and "float strata_exp(float x)" in src
    assert not (SCRIPT.parent / "attention_common.cuh").exists(), "dev/kernels must use production's headers"
    assert runtime.kernel_source("add") == runtime.kernel_source("add", runtime.KERNEL_DIR)


def test_v1_is_the_lean_form_only():
    """No define picks an epilogue: the file is what MMA_EPI=2 compiled, and it instantiates
    the shared templates only as production does."""
    text = (SCRIPT.parent / "attention_v1_mma.cu").read_text()
    assert "MMA_EPI" not in text and "pack4" not in text and "roundf_away_int(" not in text
    assert "exp_masked<FULL>(" in text and "pv_keep_or_rescale(pv," in text


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_v1_compiles_against_production_headers(script, tmp_path):
    """The inlined source compiles as the runtime builds it (NVCC_OPTIONS, the defines the script
    uses) for the default architecture: a header change that breaks version 1 shows here."""
    src = tmp_path / "attention_v1_mma.cu"
    src.write_text(runtime.kernel_source("attention_v1_mma", str(SCRIPT.parent)))
    defines = [f"-D{k}={v}" for k, v in script.V1_DEFINES.items()]
    cmd = ["nvcc", "-cubin", f"-arch={runtime.DEFAULT_ARCH}", *runtime.NVCC_OPTIONS, *defines, str(src),
           "-o", str(tmp_path / "v1.cubin")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]


def test_without_cuda_the_script_says_so_in_one_line():
    if _CUDA:
        pytest.skip("a CUDA device is here: the script would run")
    r = subprocess.run([sys.executable, str(SCRIPT), "--tokens", "64", "--reps", "1"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stdout == "" and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "needs a CUDA GPU" in r.stderr


@pytest.mark.skipif(not _CUDA, reason=f"cuda backend unavailable: {_WHY}")
def test_check_is_byte_exact_on_the_device(script, capsys):
    """Versions 1 and 2 against the NumPy definition at a small size (prefills and chunks that
    cross key blocks), every byte."""
    bad = script.check(tokens=150)
    out = capsys.readouterr().out
    assert not bad, "\n".join(bad)
    assert out.count("same bytes") == 2 * len(script.check_cases(150))
