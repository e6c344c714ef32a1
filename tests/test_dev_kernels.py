"""dev/kernels, without a GPU: version 1 of the prefill attention kernel
(dev/kernels/attention_v1_mma.cu) against its script's launch format and production's headers;
the mma probe's cases; the MMQ core's definition, worked out here element by element; every
kernel file's build against production's headers (where nvcc is on PATH) and every script's
one-line exit without CUDA. On a GPU: attention's check and the core's, byte for byte against
the NumPy definitions, and the probe's run."""
from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from strata_prefill.fast.cuda import runtime, signatures

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "dev" / "kernels" / "attention.py"

try:
    _CUDA, _WHY = runtime.cuda_available()
except ImportError as exc:  # pragma: no cover - a broken install
    _CUDA, _WHY = False, f"the cuda runtime does not import: {exc}"


def _load(stem: str):
    """dev/kernels/<stem>.py, the module dev.kernels.<stem>."""
    return importlib.import_module(f"dev.kernels.{stem}")


@pytest.fixture(scope="module")
def script():
    return _load("attention")


@pytest.fixture(scope="module")
def probe():
    return _load("mma_probe")


@pytest.fixture(scope="module")
def core():
    return _load("mmq_core")


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


#: every kernel file of dev/kernels: (its script, the module, the defines its script builds it with)
KERNEL_FILES = (("attention", "attention_v1_mma", "V1_DEFINES"), ("mma_probe", "mma_probe", None),
                ("mmq_core", "mmq_core", None))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("stem,module,defines", KERNEL_FILES)
def test_each_kernel_file_compiles_against_production_headers(tmp_path, stem, module, defines):
    """The inlined source compiles as the runtime builds it (NVCC_OPTIONS, the defines its script
    uses) for the default architecture: a header change that breaks one shows here."""
    src = tmp_path / f"{module}.cu"
    src.write_text(runtime.kernel_source(module, str(SCRIPT.parent)))
    assert '#include "' not in src.read_text()
    flags = [f"-D{k}={v}" for k, v in (getattr(_load(stem), defines) if defines else {}).items()]
    cmd = ["nvcc", "-cubin", f"-arch={runtime.DEFAULT_ARCH}", *runtime.NVCC_OPTIONS, *flags, str(src),
           "-o", str(tmp_path / "k.cubin")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]


@pytest.mark.parametrize("stem,args", [("attention", ["--tokens", "64", "--reps", "1"]),
                                       ("mma_probe", ["--cases", "8", "--iters", "1", "--reps", "1"]),
                                       ("mmq_core", ["--rows", "128", "--reps", "1"])])
def test_without_cuda_each_script_says_so_in_one_line(stem, args):
    if _CUDA:
        pytest.skip("a CUDA device is here: the script would run")
    r = subprocess.run([sys.executable, "-m", f"dev.kernels.{stem}", *args], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stdout == "" and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"dev/kernels/{stem}.py needs a CUDA GPU" in r.stderr


@pytest.mark.skipif(not _CUDA, reason=f"cuda backend unavailable: {_WHY}")
def test_check_is_byte_exact_on_the_device(script, capsys):
    """Versions 1 and 2 against the NumPy definition at a small size (prefills and chunks that
    cross key blocks), every byte."""
    bad = script.check(tokens=150)
    out = capsys.readouterr().out
    assert not bad, "\n".join(bad)
    assert out.count("same bytes") == 2 * len(script.check_cases(150))


# ---- the mma probe (dev/kernels/mma_probe.py) -------------------------------------------------
def test_probe_cases_stay_below_two_to_the_24(probe):
    """Integers exact in f16, sums and every partial sum below 2^24, the widest at 2^24 - 1, odd
    sums a different one per column, the first quarter of C zero."""
    a, b, c = probe.exact_cases(64, seed=3)
    assert np.abs(a).max() == probe.A_MAX < 2048 and np.abs(b).max() == probe.B_MAX
    d = np.einsum("mik,mkj->mij", a, b) + c
    assert np.abs(d).max() == 2 ** 24 - 1
    assert (np.abs(c) + np.einsum("mik,mkj->mij", np.abs(a), np.abs(b))).max() < 2 ** 24
    assert (d[-1] % 2 == 1).all() and len(np.unique(d[-1])) == 8
    assert (c[:16] == 0).all() and (c[16:64] != 0).any()


def test_probe_and_core_take_their_scripts_formats(probe, core):
    for stem, want in (("mma_probe", {"mma_f16_exact": "PPPPi", **{n: "iP" for n, _m in probe.RATES}}),
                       ("mmq_core", {f"mmq_core_{v}": core.FORMAT for v in core.VERSIONS})):
        text = (SCRIPT.parent / f"{stem}.cu").read_text()
        found = signatures.parse_source(text, f"{stem}.cu", {}, include_dir=runtime.KERNEL_DIR)
        assert sorted(found) == sorted(want)
        for name, fmt in want.items():
            assert found[name].format == signatures.normalize_format(fmt), name


@pytest.mark.skipif(not _CUDA, reason=f"cuda backend unavailable: {_WHY}")
def test_the_probe_runs(probe, capsys):
    """On a GPU: the check and the rates run (whether the sums are exact is what the probe
    reports, not what this test asserts)."""
    probe.main(["--cases", "256", "--iters", "64", "--reps", "1"])
    out = capsys.readouterr().out
    assert "check f16 m16n8k16" in out and "mma_rate_s8_k32" in out


# ---- MMQ's product core (dev/kernels/mmq_core.py) -------------------------------------------
@pytest.mark.parametrize("widest", [False, True])
def test_core_definition_is_the_epilogue_element_by_element(core, widest):
    """strata_prefill.contract.mmq.mmq_prepared on the script's operands is the epilogue written out here, one
    element and block at a time in float32."""
    a = core.inputs(np.random.default_rng(5), 3, 64, 4, widest)
    got = core.definition(a)
    w, u, dw, x, da = (a[k] for k in ("w", "u", "dw", "x", "da"))
    for r in range(4):
        for n in range(3):
            acc = np.float32(0.0)
            for b in range(2):
                s = 0
                for h in range(2):
                    lo = 32 * b + 16 * h
                    s += int(u[n, 2 * b + h]) * int(np.dot(w[n, lo:lo + 16].astype(np.int64),
                                                           x[r, lo:lo + 16].astype(np.int64)))
                assert abs(s) < 2 ** 24
                acc = np.float32(acc + np.float32(np.float32(dw[n, b] * da[r, b]) * np.float32(s)))
            assert got[r, n].tobytes() == acc.tobytes(), (r, n, got[r, n], acc)


def test_core_inputs_look_like_iq2_xs(core):
    a = core.inputs(np.random.default_rng(0), 64, 256, 128)
    assert set(np.unique(np.abs(a["w"]))) == {8, 25, 43}
    assert set(np.unique(a["u"])) <= set(range(1, 32, 2)) and len(np.unique(a["u"])) > 8
    assert (a["dw"] != 0).all() and (a["da"] > 0).all() and np.abs(a["x"]).max() == 127


@pytest.mark.skipif(not _CUDA, reason=f"cuda backend unavailable: {_WHY}")
def test_both_core_forms_are_the_definition_on_the_device(core):
    assert core.check(core.Cores(runtime.Device())) == []
