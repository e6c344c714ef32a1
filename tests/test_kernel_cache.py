"""The cubin folder (fast/cuda/kernel_cache.py) and `strata-prefill build-kernels`: a key that
moves with everything that decides a cubin, a manifest that keeps each module once, files that
appear whole, and one-line errors. The nvcc parts skip where nvcc is missing (CI)."""
import os
import shutil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fast.cuda import kernel_cache, runtime
from strata.errors import DeviceError, InputError
from strata_prefill.cli import main

has_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
BASE = ("name", "source", ["--fmad=false"], "sm_90", "release")


@settings(max_examples=50, deadline=None)
@given(which=st.integers(0, 4), extra=st.text(min_size=1, max_size=8))
def test_digest_moves_with_each_input(which, extra):
    parts = [BASE[0], BASE[1], list(BASE[2]), BASE[3], BASE[4]]
    before = kernel_cache.digest(*parts)
    assert kernel_cache.digest(*parts) == before  # stable
    if which == 2:
        parts[2] = parts[2] + [extra]
    else:
        parts[which] = parts[which] + extra
    assert kernel_cache.digest(*parts) != before


def test_defines_order_does_not_matter_but_values_do(monkeypatch):
    monkeypatch.setitem(kernel_cache._release, "nvcc", "Build test")
    a = kernel_cache.cubin_path("/d", "mmq", "src", {"A": 1, "B": 2}, "sm_90", ("--fmad=false",))
    b = kernel_cache.cubin_path("/d", "mmq", "src", {"B": 2, "A": 1}, "sm_90", ("--fmad=false",))
    c = kernel_cache.cubin_path("/d", "mmq", "src", {"A": 1, "B": 3}, "sm_90", ("--fmad=false",))
    d = kernel_cache.cubin_path("/d", "mmq", "src", {"A": 1, "B": 2}, "sm_89", ("--fmad=false",))
    assert a == b and len({a, c, d}) == 3
    assert os.path.basename(a).startswith("mmq-") and a.endswith(".cubin")


def test_manifest_keeps_each_pair_once(tmp_path):
    kernel_cache.record(str(tmp_path), "mmq", {"MMQ_BN": 64, "MMQ_WM": 4})
    kernel_cache.record(str(tmp_path), "mmq", {"MMQ_WM": 4, "MMQ_BN": 64})  # same pair
    kernel_cache.record(str(tmp_path), "add", None)
    kernel_cache.record(str(tmp_path), "add", {})
    got = kernel_cache.manifest(str(tmp_path))
    assert got == [("add", {}), ("mmq", {"MMQ_BN": 64, "MMQ_WM": 4})]
    assert len((tmp_path / kernel_cache.MANIFEST).read_text().splitlines()) == 2


def test_a_bad_manifest_line_is_named(tmp_path):
    (tmp_path / kernel_cache.MANIFEST).write_text('{"module": "add", "defines": {}}\nnot json\n')
    with pytest.raises(InputError, match="not a manifest entry"):
        kernel_cache.manifest(str(tmp_path))


def test_cache_dir_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv(kernel_cache.ENV, raising=False)
    assert kernel_cache.cache_dir() is None
    monkeypatch.setenv(kernel_cache.ENV, str(tmp_path / "k"))
    assert kernel_cache.cache_dir() == str(tmp_path / "k") and (tmp_path / "k").is_dir()


def test_cli_needs_a_folder(monkeypatch, capsys):
    monkeypatch.delenv(kernel_cache.ENV, raising=False)
    assert main(["build-kernels"]) == 2
    assert "no cubin folder" in capsys.readouterr().err


def test_cli_refuses_a_bad_arch_before_any_work(tmp_path, capsys):
    assert main(["build-kernels", "--cache", str(tmp_path), "--arch", "hopper"]) == 2
    assert "not an nvcc architecture" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_cli_refuses_a_manifest_naming_a_missing_kernel(tmp_path, capsys):
    kernel_cache.record(str(tmp_path), "no_such_kernel", {})
    assert main(["build-kernels", "--cache", str(tmp_path)]) == 2
    assert "no_such_kernel.cu" in capsys.readouterr().err


@has_nvcc
def test_build_once_then_found(tmp_path):
    src = runtime.kernel_source("add")
    p = kernel_cache.build(str(tmp_path), "add", src, {}, "sm_90", runtime.NVCC_OPTIONS)
    assert os.path.getsize(p) > 0
    stamp = os.stat(p).st_mtime_ns
    assert kernel_cache.build(str(tmp_path), "add", src, {}, "sm_90", runtime.NVCC_OPTIONS) == p
    assert os.stat(p).st_mtime_ns == stamp  # not rebuilt
    edited = src + "\n// an edit\n"
    q = kernel_cache.build(str(tmp_path), "add", edited, {}, "sm_90", runtime.NVCC_OPTIONS)
    assert q != p and os.path.exists(q)
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".part")]


@has_nvcc
def test_a_compile_error_names_the_kernel(tmp_path):
    with pytest.raises(DeviceError, match="compiling broken.cu failed"):
        kernel_cache.build(str(tmp_path), "broken", "this is not C++;", {}, "sm_90", runtime.NVCC_OPTIONS)
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".cubin")]


@has_nvcc
def test_cli_builds_the_manifest(tmp_path, capsys):
    kernel_cache.record(str(tmp_path), "add", {})
    kernel_cache.record(str(tmp_path), "embed", {})
    assert main(["build-kernels", "--cache", str(tmp_path), "--jobs", "2"]) == 0
    out = capsys.readouterr().out
    assert "[2/2]" in out and "built in" in out
    assert len([f for f in os.listdir(tmp_path) if f.endswith(".cubin")]) == 2
    assert main(["build-kernels", "--cache", str(tmp_path)]) == 0
    assert out.count("present") == 0 and capsys.readouterr().out.count("present") == 2


@has_nvcc
def test_cli_prune_drops_stale_cubins(tmp_path):
    kernel_cache.record(str(tmp_path), "add", {})
    (tmp_path / "add-stale.cubin").write_bytes(b"old")
    (tmp_path / "notes.txt").write_text("kept")
    assert main(["build-kernels", "--cache", str(tmp_path), "--prune"]) == 0
    names = sorted(os.listdir(tmp_path))
    assert "add-stale.cubin" not in names and "notes.txt" in names
    assert len([f for f in names if f.endswith(".cubin")]) == 1
