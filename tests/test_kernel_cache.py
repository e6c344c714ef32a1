"""The cubin folder (fast/cuda/kernel_cache.py) and `strata-prefill build-kernels`: a key that
moves with everything that decides a cubin, a manifest that keeps each module once, files that
appear whole, a default folder under the user cache dir (moved by the variable, `off` turns it
off), one compile per cubin however many threads and processes ask (the lock), the compile
message once, parallel builds that meet the runtime's digests, and one-line errors. A fake nvcc
on PATH (a script that counts its runs) stands in where counting or waiting is the point; the
real nvcc parts skip where nvcc is missing (CI)."""
import contextlib
import io
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strata_prefill.fast.cuda import build_list, kernel_cache, kernel_paths, products, runtime
from strata_prefill.contract.errors import DeviceError, InputError
from strata_prefill.cli import main

has_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
ROOT = Path(__file__).resolve().parent.parent
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


def test_cache_dir_default_is_under_the_user_cache_dir(tmp_path, monkeypatch):
    monkeypatch.delenv(kernel_cache.ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    want = tmp_path / "xdg" / "strata-prefill" / "kernels"
    assert kernel_cache.cache_dir() == str(want) and want.is_dir()
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")  # the XDG rule: only absolute paths
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    want = tmp_path / "home" / ".cache" / "strata-prefill" / "kernels"
    assert kernel_cache.cache_dir() == str(want) and want.is_dir()
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert kernel_cache.default_dir() == str(want)


def test_cache_dir_moved_or_off(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv(kernel_cache.ENV, str(tmp_path / "k"))
    assert kernel_cache.cache_dir() == str(tmp_path / "k") and (tmp_path / "k").is_dir()
    for off in ("off", "OFF", " off "):
        monkeypatch.setenv(kernel_cache.ENV, off)
        assert kernel_cache.cache_dir() is None
    assert not (tmp_path / "xdg").exists()  # off creates nothing
    (tmp_path / "file").write_text("x")
    monkeypatch.setenv(kernel_cache.ENV, str(tmp_path / "file" / "k"))
    with pytest.raises(InputError, match="cannot create the folder"):
        kernel_cache.cache_dir()


def test_cli_needs_a_folder_when_the_cache_is_off(monkeypatch, capsys):
    monkeypatch.setenv(kernel_cache.ENV, "off")
    assert main(["build-kernels"]) == 2
    assert "the kernel cache is off" in capsys.readouterr().err


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


# ---- a fake nvcc: counts its compiles, takes its time, writes a small "cubin" -----------------
FAKE_NVCC = """#!/bin/sh
if [ "$1" = "--version" ]; then echo "nvcc: fake"; echo "Build fake-nvcc-1"; exit 0; fi
args="$*"
out=""
while [ $# -gt 0 ]; do
  if [ "$1" = "-o" ]; then out="$2"; shift; fi
  shift
done
echo "run $args" >> "$FAKE_NVCC_LOG"
sleep "${FAKE_NVCC_SLEEP:-0}"
printf cubin > "$out"
"""


@pytest.fixture
def fake_nvcc(tmp_path, monkeypatch):
    """A fake nvcc first on PATH; returns a function giving how many compiles it ran."""
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    exe = bin_dir / "nvcc"
    exe.write_text(FAKE_NVCC)
    exe.chmod(0o755)
    log = tmp_path / "nvcc.log"
    log.write_text("")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("FAKE_NVCC_LOG", str(log))
    monkeypatch.setenv("FAKE_NVCC_SLEEP", "0")
    monkeypatch.setattr(kernel_cache, "_release", {})  # ask the fake for its release
    return lambda: len(log.read_text().splitlines())


def _build_same_module_twice_at_once(folder):
    barrier = threading.Barrier(2)
    paths = []

    def one():
        barrier.wait()
        paths.append(kernel_cache.build(folder, "add", "source", {"X": 1}, "sm_90", ("--fmad=false",)))

    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return paths


def test_two_threads_compile_a_module_once(tmp_path, fake_nvcc, monkeypatch):
    monkeypatch.setenv("FAKE_NVCC_SLEEP", "0.5")
    folder = str(tmp_path / "k")
    os.makedirs(folder)
    paths = _build_same_module_twice_at_once(folder)
    assert len(set(paths)) == 1 and open(paths[0]).read() == "cubin"
    assert fake_nvcc() == 1  # the second waited for the lock, then found the cubin
    assert os.path.exists(kernel_cache.lock_path(paths[0]))
    # the lock is what holds it to one: without it both compile
    monkeypatch.setattr(kernel_cache.atomic, "flocked", lambda path, create=False: contextlib.nullcontext())
    os.remove(paths[0])
    _build_same_module_twice_at_once(folder)
    assert fake_nvcc() == 3


def test_build_creates_a_missing_folder(tmp_path, fake_nvcc):
    folder = tmp_path / "not" / "yet"  # as a --cache folder named on a command line
    path = kernel_cache.build(str(folder), "add", "source", {}, "sm_90", ("--fmad=false",))
    assert os.path.dirname(path) == str(folder) and open(path).read() == "cubin"
    assert fake_nvcc() == 1


def test_two_processes_compile_a_module_once(tmp_path, fake_nvcc, monkeypatch):
    monkeypatch.setenv("FAKE_NVCC_SLEEP", "1.5")
    folder = str(tmp_path / "k")
    os.makedirs(folder)
    code = ("import sys; from strata_prefill.fast.cuda import kernel_cache as k; "
            "print(k.build(sys.argv[1], 'add', 'source', {}, 'sm_90', ('--fmad=false',)))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    procs = [subprocess.Popen([sys.executable, "-c", code, folder], stdout=subprocess.PIPE, text=True, env=env)
             for _ in range(2)]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert outs[0] == outs[1] and os.path.exists(outs[0])
    assert fake_nvcc() == 1


def test_compile_message_once_and_none_from_the_folder(tmp_path, fake_nvcc, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_NVCC_SLEEP", "0.2")
    folder = str(tmp_path / "k")
    os.makedirs(folder)
    runtime.cubin_for("add", {"MMQ_BN": 128, "A": 2}, folder, "sm_90")
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2, err  # not a terminal: a line when it starts, one when it ends
    assert err[0] == f"compiling kernel add (A=2 MMQ_BN=128) for sm_90 into {folder} ..."
    assert re.fullmatch(r"compiling kernel add \(A=2 MMQ_BN=128\): \d+\.\d s", err[1]), err[1]
    assert float(err[1].split(": ")[1][:-2]) >= 0.2
    runtime.cubin_for("add", {"A": 2, "MMQ_BN": 128}, folder, "sm_90")  # in the folder now: silent
    assert capsys.readouterr().err == ""
    assert fake_nvcc() == 1
    assert kernel_cache.manifest(folder) == [("add", {"A": 2, "MMQ_BN": 128})]


def test_compile_message_is_one_line_at_a_terminal(tmp_path, fake_nvcc, monkeypatch):
    class Tty(io.StringIO):
        def isatty(self):
            return True

    tty = Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    folder = str(tmp_path / "k")
    os.makedirs(folder)
    runtime.cubin_for("add", {}, folder, "sm_90")
    assert re.fullmatch(rf"compiling kernel add for sm_90 into {re.escape(folder)} \.\.\. \d+\.\d s\n",
                        tty.getvalue()), tty.getvalue()


def test_a_failed_compile_says_so(tmp_path, fake_nvcc, monkeypatch, capsys):
    monkeypatch.setattr(kernel_cache, "_compile", lambda *a: (_ for _ in ()).throw(DeviceError("compiling x")))
    with pytest.raises(DeviceError):
        runtime.cubin_for("add", {}, str(tmp_path), "sm_90")
    assert "compiling kernel add: failed after" in capsys.readouterr().err


def test_build_all_runs_nvcc_in_parallel_once_each(tmp_path, fake_nvcc, monkeypatch):
    monkeypatch.setenv("FAKE_NVCC_SLEEP", "1")
    folder = str(tmp_path / "k")
    mods = [("add", {}), ("embed", {}), ("rope", {}), ("add", {"X": 1}), ("add", {})]  # one twice
    seen = []
    t0 = time.perf_counter()
    got = kernel_cache.build_all(folder, "sm_90", mods, jobs=4, progress=lambda *a: seen.append(a))
    wall = time.perf_counter() - t0
    assert fake_nvcc() == 4 and wall < 3.0, wall  # four 1 s compiles side by side
    assert [(n, d) for n, d, _p, _s in got] == mods[:4]
    assert all(s is not None and s >= 1.0 for *_x, s in got)
    assert sorted(a[0] for a in seen) == [1, 2, 3, 4] and {a[1] for a in seen} == {4}
    again = kernel_cache.build_all(folder, "sm_90", mods, jobs=4)
    assert fake_nvcc() == 4 and all(s is None for *_x, s in again)
    with pytest.raises(InputError, match="no kernel file nope.cu"):
        kernel_cache.build_all(folder, "sm_90", [("nope", {})])
    assert fake_nvcc() == 4


def test_build_kernels_meets_the_runtimes_digest(tmp_path, fake_nvcc, monkeypatch, capsys):
    """What `build-kernels` builds with no --arch on a machine without a GPU is what the runtime
    asks for on the H200 (compute capability 9.0): loading it compiles nothing and says nothing."""
    assert runtime.arch_of((9, 0)) == runtime.DEFAULT_ARCH == "sm_90"
    if not runtime.cuda_available()[0]:
        assert runtime.device_arch() == "sm_90"
    folder = str(tmp_path / "k")
    os.makedirs(folder)
    kernel_cache.record(folder, "add", {})
    kernel_cache.record(folder, "mmq", dict(products.AUTO_CONFIGS[-1][1]))
    assert main(["build-kernels", "--cache", folder, "--jobs", "2"]) == 0
    assert fake_nvcc() == 2
    capsys.readouterr()
    runtime.cubin_for("add", {}, folder, runtime.arch_of((9, 0)))
    runtime.cubin_for("mmq", products.auto_config(1e9), folder, runtime.arch_of((9, 0)))
    assert fake_nvcc() == 2 and capsys.readouterr().err == ""


def test_build_all_defaults_cover_the_fast_paths_modules(tmp_path, monkeypatch):
    """Every module the backend builds with its defaults and under each switch is in the set a
    gate session builds ahead (wanted: the folder's manifest and default_modules)."""
    from strata_prefill.fast.cuda import attention, dense

    mods = build_list.wanted(str(tmp_path))
    keys = {(n, tuple(sorted(d.items()))) for n, d in mods}
    need = [("attention_pair", dict(attention.ATTEND_PAIR_CONFIG)), ("float_dense", dict(dense.TILE_CONFIG)),
            ("spin", {}), ("gather_group", {})]
    need += [m for rows in (1, 20, 1e9) for m in products.mmq_modules(products.auto_config(rows))]
    for name, d in need:
        assert (name, tuple(sorted(d.items()))) in keys, (name, d)
    assert len(keys) == len(mods)  # each once
    for name in build_list.CONFIGURED:  # built with a configuration only: no build without defines ahead
        assert (name, ()) not in keys or any(not d for n, d in need if n == name), name
    kernel_cache.record(str(tmp_path), "mmq", {"MMQ_BN": 32})
    assert ("mmq", {"MMQ_BN": 32}) in build_list.wanted(str(tmp_path), defaults=False)
    monkeypatch.setenv("STRATA_MMQ_DEFINES", '{"MMQ_MIX": 0}')
    assert products.mmq_modules(products.auto_config(1e9))[0] in build_list.default_modules()


def test_arch_specific_modules_build_for_their_target_only(tmp_path, fake_nvcc):
    """A kernel file of one architecture's own instructions (kernel_paths.ARCH_SPECIFIC:
    attention_wgmma.cu, sm_90a) compiles for its target on its base architecture, is left out
    of a build for any other, and cannot be asked for there; every other file builds for the
    device's architecture."""
    assert kernel_paths.ARCH_SPECIFIC == {"attention_wgmma": "sm_90a"}
    for name, target in kernel_paths.ARCH_SPECIFIC.items():
        assert name in kernel_paths.kernel_names()
        assert kernel_paths.target_arch(name, target[:-1]) == target
        assert kernel_paths.target_arch(name, "sm_80") is None
    assert kernel_paths.target_arch("add", "sm_80") == "sm_80"
    log = tmp_path / "nvcc.log"
    folder = str(tmp_path / "k")
    got = kernel_cache.build_all(folder, "sm_90", [("attention_wgmma", {}), ("add", {})], jobs=1)
    assert [g[0] for g in got] == ["attention_wgmma", "add"]
    runs = log.read_text().splitlines()
    assert any("-arch sm_90a" in r and "attention_wgmma" in r for r in runs)
    assert any("-arch sm_90 " in r and "add" in r for r in runs)
    got = kernel_cache.build_all(str(tmp_path / "k80"), "sm_80", [("attention_wgmma", {}), ("add", {})], jobs=1)
    assert [g[0] for g in got] == ["add"] and fake_nvcc() == 3
    with pytest.raises(DeviceError, match="attention_wgmma.cu is built for sm_90a only; this device is sm_80"):
        kernel_cache.cubin_path(folder, "attention_wgmma", "src", {}, "sm_80", ("--fmad=false",))
    # the digest holds the target the module compiles for
    key = kernel_cache.digest("attention_wgmma", "src", [], "sm_90a", kernel_cache.nvcc_release())
    assert kernel_cache.cubin_path(folder, "attention_wgmma", "src", {}, "sm_90", ()).endswith(
        f"attention_wgmma-{key[:24]}.cubin")


def test_build_kernels_types_builds_those_types_mmq_only(tmp_path, fake_nvcc, monkeypatch, capsys):
    """--types narrows mmq.cu's builds to the types named (any case, repeats once) and leaves
    every other module as --defaults wants it; with STRATA_MMQ_DEFINES, the A/B variant of
    those types alone."""
    from strata_prefill.contract import qformats

    monkeypatch.setenv(products.DEFINES_ENV, '{"MMQ_MIX_AT": 1}')
    folder = str(tmp_path / "k")
    whole = build_list.wanted(None, True)
    assert main(["build-kernels", "--cache", folder, "--defaults", "--types", "q4_k,Q6_K,Q4_K"]) == 0
    runs = (tmp_path / "nvcc.log").read_text().splitlines()
    q4, q6 = int(qformats.QT.Q4_K), int(qformats.QT.Q6_K)
    mmq_runs = [r for r in runs if "-DMMQ_ONLY=" in r]
    assert {r.split("-DMMQ_ONLY=")[1].split()[0] for r in mmq_runs} == {str(q4), str(q6)}
    assert all("-DMMQ_MIX_AT=1" in r for r in mmq_runs)
    others = [m for m in whole if m[0] not in build_list.CONFIGURED]
    per_type = [m for m in whole if m[0] == "mmq" and m[1]["MMQ_ONLY"] == q4]
    assert len(per_type) >= 3  # every automatic tile configuration, and their empty-exit forms
    assert fake_nvcc() == len(others) + 2 * len(per_type)


@pytest.mark.parametrize("args, needle", [
    (["--types", "Q4_K,Q9_Z"], "'Q9_Z' is not a type with an MMQ kernel"),
    (["--types", ""], "is not a type with an MMQ kernel"),
    (["--types", "Q4_K", "--prune"], "--prune with --types would delete the other types' cubins"),
])
def test_build_kernels_types_refused_before_any_compile(tmp_path, fake_nvcc, capsys, args, needle):
    assert main(["build-kernels", "--cache", str(tmp_path / "k"), *args]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1
    assert fake_nvcc() == 0
