"""One installed name: every room of the repository is installed under `strata_prefill`
(pyproject.toml's package-dir and packages), and nothing else is: no top-level `fast`,
`reference`, `verify`, `contract` or `formats` that would collide with other projects' names."""
from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ROOMS = ("contract", "formats", "reference", "fast", "verify")


def setuptools_table() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_room_maps_under_the_one_name():
    dirs = setuptools_table()["package-dir"]
    assert dirs == {"strata_prefill": "strata_prefill", **{f"strata_prefill.{r}": r for r in ROOMS}}


def test_the_package_list_is_every_package_folder():
    """A folder with an __init__.py under a room or the command is listed (it is installed),
    and the list names no other."""
    want = {"strata_prefill." + ".".join(p.parent.relative_to(ROOT).parts)
            for room in ROOMS for p in (ROOT / room).rglob("__init__.py") if "__pycache__" not in p.parts}
    want |= {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "strata_prefill").rglob("__init__.py")
             if "__pycache__" not in p.parts}
    assert set(setuptools_table()["packages"]) == want


def test_a_checkout_resolves_each_room_once(tmp_path):
    """Run from a checkout without installing (PYTHONPATH=the root, as the GPU gate runs): each
    room loads from its folder under the one name, and no module loads under a folder's name."""
    code = ("import sys, strata_prefill.fast.engine, strata_prefill.reference.model, strata_prefill.verify.cases\n"
            "import strata_prefill.formats.pack as p\n"
            "print(p.__file__)\n"
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {ROOMS!r}))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    path, leaked = out.stdout.splitlines()
    assert Path(path) == ROOT / "formats" / "pack.py"
    assert leaked == "[]"


def test_the_wheel_holds_one_top_level_package(tmp_path):
    """The built wheel: every file under strata_prefill/ (and its .dist-info), the kernels' .cu
    sources included."""
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                            "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=300)
    if built.returncode != 0:  # an older setuptools without bdist_wheel: build in isolation
        built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(ROOT)],
                               capture_output=True, text=True, timeout=300)
    wheels = list(tmp_path.glob("*.whl"))
    if not wheels:
        pytest.skip(f"no wheel could be built here: {built.stderr.strip().splitlines()[-1:]}")
    names = zipfile.ZipFile(wheels[0]).namelist()
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"strata_prefill"}
    kernels = {Path(n).name for n in names if n.startswith("strata_prefill/fast/cuda/kernels/")}
    assert kernels == {p.name for p in (ROOT / "fast/cuda/kernels").iterdir() if p.suffix in (".cu", ".cuh")}
    for room in ROOMS:
        assert f"strata_prefill/{room}/__init__.py" in names
