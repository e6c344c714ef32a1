"""dev/kernels, without a GPU: the mma probe's cases; the MMQ core's definition, worked out here
element by element; every kernel file's C signatures against its script's launch format and its
build against production's headers (where nvcc is on PATH); every script's one-line exit
without CUDA. On a GPU: the core's check, byte for byte against the NumPy definition, and the
probe's run."""
from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from strata_prefill.fast.cuda import kernel_paths, runtime, signatures

ROOT = Path(__file__).resolve().parent.parent
DEV = ROOT / "dev" / "kernels"

try:
    _CUDA, _WHY = runtime.cuda_available()
except ImportError as exc:  # pragma: no cover - a broken install
    _CUDA, _WHY = False, f"the cuda runtime does not import: {exc}"


def _load(stem: str):
    """dev/kernels/<stem>.py, the module dev.kernels.<stem>."""
    return importlib.import_module(f"dev.kernels.{stem}")


@pytest.fixture(scope="module")
def probe():
    return _load("mma_probe")


@pytest.fixture(scope="module")
def core():
    return _load("mmq_core")


#: every kernel file of dev/kernels: (its script, the module, the defines its script builds it with)
KERNEL_FILES = (("mma_probe", "mma_probe", None), ("mmq_core", "mmq_core", None))
#: the files with versions on Hopper's own instructions, also built for their target
WGMMA_FILES = ("mmq_core",)


def test_the_table_is_every_kernel_file_and_none_copies_a_header():
    """A kernel file added or removed here shows in KERNEL_FILES; production's headers are
    inlined from fast/cuda/kernels/, never copied here."""
    assert sorted(m for _s, m, _d in KERNEL_FILES) == sorted(f.stem for f in DEV.glob("*.cu"))
    assert not list(DEV.glob("*.cuh")) and not list(DEV.glob("*.h")), "dev/kernels must use production's headers"
    src = runtime.kernel_source("mmq_core", str(DEV))
    assert '#include "' not in src and "#define STRATA_NUMERICS_CUH" in src
    assert runtime.kernel_source("add") == runtime.kernel_source("add", runtime.KERNEL_DIR)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("stem,module,defines,target",
                         [(*f, runtime.DEFAULT_ARCH) for f in KERNEL_FILES]
                         + [(*f, kernel_paths.WGMMA_TARGET) for f in KERNEL_FILES if f[1] in WGMMA_FILES])
def test_each_kernel_file_compiles_against_production_headers(tmp_path, stem, module, defines, target):
    """The inlined source compiles as the runtime builds it (NVCC_OPTIONS, the defines its script
    uses) for the default architecture, and a file with wgmma versions for their target too: a
    header change that breaks one shows here."""
    src = tmp_path / f"{module}.cu"
    src.write_text(runtime.kernel_source(module, str(DEV)))
    assert '#include "' not in src.read_text()
    flags = [f"-D{k}={v}" for k, v in (getattr(_load(stem), defines) if defines else {}).items()]
    cmd = ["nvcc", "-cubin", f"-arch={target}", *runtime.NVCC_OPTIONS, *flags, str(src),
           "-o", str(tmp_path / "k.cubin"), "-Xptxas", "-v"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    # a wgmma that ptxas serializes (its accumulators read while it runs) is no candidate form
    assert "wgmma.mma_async instructions are serialized" not in r.stderr, r.stderr[-4000:]


def test_the_wgmma_versions_run_on_sm_90_only(core):
    assert core.build_target("sm_90") == (kernel_paths.WGMMA_TARGET, core.VERSIONS)
    target, versions = core.build_target("sm_80")
    assert target == "sm_80" and versions == tuple(v for v in core.VERSIONS if v not in core.WGMMA_VERSIONS)
    assert set(core.WGMMA_VERSIONS) < set(core.VERSIONS)


@pytest.mark.parametrize("stem,args", [("mma_probe", ["--cases", "8", "--iters", "1", "--reps", "1"]),
                                       ("mmq_core", ["--rows", "128", "--reps", "1"])])
def test_without_cuda_each_script_says_so_in_one_line(stem, args):
    if _CUDA:
        pytest.skip("a CUDA device is here: the script would run")
    r = subprocess.run([sys.executable, "-m", f"dev.kernels.{stem}", *args], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stdout == "" and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"dev/kernels/{stem}.py needs a CUDA GPU" in r.stderr


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
        text = (DEV / f"{stem}.cu").read_text()
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
def test_every_core_form_is_the_definition_on_the_device(core):
    assert core.check(core.Cores(runtime.Device())) == []
