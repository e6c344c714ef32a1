"""A folder of compiled kernels, shared by processes and machines.

Compiling the kernels dominates a cold start: every MMQ tile configuration is a module of its
own, tens of seconds each, and every pytest-xdist worker or fresh GPU machine pays again. With
``STRATA_PREFILL_KERNEL_CACHE=DIR`` the runtime looks a module up here before compiling it and
stores what it compiles. A cubin's name is a digest of everything that decides it (the kernel
file with its own headers inlined, the nvcc options and defines, the architecture, the nvcc
release), so an edited kernel, header or define misses and is rebuilt; nothing is ever stale.
The folder also keeps ``manifest.jsonl``, one line per (module, defines) ever asked for, so
``strata-prefill build-kernels`` can rebuild the same set ahead of time on a machine without
a GPU (it needs nvcc only), e.g. after a kernel edit and before a GPU run.

No PyCUDA here: building is plain nvcc, loading is the runtime's (``module_from_file``).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import threading

from strata.errors import DeviceError, InputError

__all__ = ["ENV", "cache_dir", "cubin_path", "build", "record", "manifest", "nvcc_release"]

#: the environment variable naming the folder (unset or empty: no cache)
ENV = "STRATA_PREFILL_KERNEL_CACHE"
MANIFEST = "manifest.jsonl"

_lock = threading.Lock()
_release: dict = {}


def cache_dir() -> str | None:
    """The cache folder from the environment, created if missing; None when unset."""
    d = os.environ.get(ENV, "").strip()
    if not d:
        return None
    os.makedirs(d, exist_ok=True)
    return d


def _nvcc(nvcc: str = "nvcc") -> str:
    """nvcc's path, or the one-line error that it is missing."""
    exe = shutil.which(nvcc)
    if exe is None:
        raise DeviceError(f"{nvcc} is not on PATH: kernels cannot be compiled here")
    return exe


def nvcc_release(nvcc: str = "nvcc") -> str:
    """The last line of ``nvcc --version`` (its build: a different compiler, a different cubin)."""
    with _lock:
        got = _release.get(nvcc)
        if got is None:
            out = subprocess.run([_nvcc(nvcc), "--version"], capture_output=True, text=True, check=False).stdout
            lines = [ln for ln in out.splitlines() if ln.strip()]
            if not lines:
                raise DeviceError(f"{nvcc} --version printed nothing")
            got = lines[-1].strip()
            _release[nvcc] = got
        return got


def _options(defines: dict | None, base: tuple[str, ...]) -> list[str]:
    return list(base) + [f"-D{k}={v}" for k, v in sorted((defines or {}).items())]


def digest(name: str, source: str, options: list[str], arch: str, release: str) -> str:
    """The cubin's key: sha256 over the module name, its full source, options, arch, nvcc."""
    h = hashlib.sha256()
    for part in (name, source, "\0".join(options), arch, release):
        h.update(part.encode("utf-8"))
        h.update(b"\x01")
    return h.hexdigest()


def cubin_path(folder: str, name: str, source: str, defines: dict | None, arch: str,
               base_options: tuple[str, ...]) -> str:
    """Where the cubin of this module, source, defines and arch lives (or would) in folder."""
    key = digest(name, source, _options(defines, base_options), arch, nvcc_release())
    return os.path.join(folder, f"{name}-{key[:24]}.cubin")


def build(folder: str, name: str, source: str, defines: dict | None, arch: str,
          base_options: tuple[str, ...]) -> str:
    """The cubin's path, compiling it with nvcc first if the folder lacks it. The file appears
    whole or not at all (written aside, then renamed), so processes may share the folder."""
    path = cubin_path(folder, name, source, defines, arch, base_options)
    if os.path.exists(path):
        return path
    exe = _nvcc()
    with tempfile.TemporaryDirectory(prefix="strata-kernel-") as tmp:
        cu = os.path.join(tmp, f"{name}.cu")
        with open(cu, "w", encoding="utf-8") as f:
            f.write(source)
        out = os.path.join(tmp, f"{name}.cubin")
        cmd = [exe, "--cubin", *_options(defines, base_options), "-arch", arch, "-o", out, cu]
        r = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if r.returncode != 0 or not os.path.exists(out):
            tail = "\n".join((r.stderr or r.stdout).strip().splitlines()[-12:])
            raise DeviceError(f"compiling {name}.cu failed ({' '.join(cmd[1:-1])}):\n{tail}")
        fd, part = tempfile.mkstemp(prefix=f".{name}-", suffix=".part", dir=folder)
        os.close(fd)
        shutil.copyfile(out, part)
        os.replace(part, path)
    return path


def record(folder: str, name: str, defines: dict | None) -> None:
    """Add (name, defines) to the folder's manifest unless it is there (one short appended
    line: concurrent writers do not interleave)."""
    line = json.dumps({"module": name, "defines": dict(sorted((defines or {}).items()))}, sort_keys=True)
    if line in _manifest_lines(folder):
        return
    with open(os.path.join(folder, MANIFEST), "a", encoding="utf-8") as f:
        f.write(line + "\n")


def _manifest_lines(folder: str) -> set[str]:
    try:
        with open(os.path.join(folder, MANIFEST), encoding="utf-8") as f:
            return {ln.strip() for ln in f if ln.strip()}
    except FileNotFoundError:
        return set()


def manifest(folder: str) -> list[tuple[str, dict]]:
    """The (module, defines) pairs recorded in folder, sorted, each once."""
    out = []
    for ln in _manifest_lines(folder):
        try:
            d = json.loads(ln)
            out.append((str(d["module"]), dict(d["defines"])))
        except (ValueError, KeyError, TypeError):
            raise InputError(f"{os.path.join(folder, MANIFEST)}: {ln[:80]!r} is not a manifest entry") from None
    return sorted(out, key=lambda m: (m[0], sorted(m[1].items())))
