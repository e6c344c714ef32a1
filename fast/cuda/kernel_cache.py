"""A folder of compiled kernels, shared by processes and machines.

Compiling the kernels dominates a cold start: every MMQ tile configuration is a module of its
own, tens of seconds each, and every pytest-xdist worker or fresh GPU machine would pay again.
So the runtime looks a module up in this folder before compiling it and stores what it
compiles, by default in ``$XDG_CACHE_HOME/strata-prefill/kernels`` (``~/.cache/...`` when
XDG_CACHE_HOME is unset); ``STRATA_PREFILL_KERNEL_CACHE=DIR`` moves it, ``=off`` turns it off
(each process then compiles in memory, through PyCUDA's own compile cache). A cubin's name is a
digest of everything that decides it (the kernel file with its own headers inlined, the nvcc
options and defines, the architecture, the nvcc release), so an edited kernel, header or define
misses and is rebuilt; nothing is ever stale. Two processes never compile one cubin at once: the
builder holds an ``fcntl.flock`` on the cubin's lock file (``.NAME.cubin.lock``); the other
waits, then finds the cubin and loads it.

The folder also keeps ``manifest.jsonl``, one line per (module, defines) ever asked for, so
``strata-prefill build-kernels`` (or :func:`build_all` over fast/cuda/build_list.py's
``wanted``, e.g. at the start of a gate session) can rebuild the same set ahead of time, in parallel nvcc processes, on a machine without a GPU
(it needs nvcc only), e.g. after a kernel edit and before a GPU run.

No PyCUDA here: building is plain nvcc, loading is the runtime's (``module_from_file``).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from strata_prefill.formats import atomic
from strata_prefill.formats.cache_home import user_cache_dir
from strata_prefill.contract.errors import DeviceError, InputError

from .kernel_paths import ARCH_SPECIFIC, KERNEL_DIR, NVCC_OPTIONS, kernel_source, target_arch

__all__ = ["ENV", "OFF", "cache_dir", "default_dir", "cubin_path", "build", "build_all", "check_modules",
           "record", "manifest", "distinct", "nvcc_release", "target"]

#: the environment variable that moves the folder (unset or empty: default_dir(); OFF: no folder)
ENV = "STRATA_PREFILL_KERNEL_CACHE"
OFF = "off"
MANIFEST = "manifest.jsonl"

_lock = threading.Lock()
_release: dict = {}


def default_dir() -> str:
    """$XDG_CACHE_HOME/strata-prefill/kernels, or ~/.cache/strata-prefill/kernels where
    XDG_CACHE_HOME is unset or not absolute (the XDG rule: a relative value is ignored)."""
    return str(user_cache_dir() / "kernels")


def cache_dir() -> str | None:
    """The cubin folder, created if missing: STRATA_PREFILL_KERNEL_CACHE's, else default_dir();
    None when the variable says ``off``, or when the default folder cannot be written (a
    read-only home: compiling in memory still works). A folder the variable names that cannot
    be created or written is a one-line InputError."""
    raw = os.environ.get(ENV, "").strip()
    if raw.lower() == OFF:
        return None
    folder = os.path.expanduser(raw) if raw else default_dir()
    try:
        os.makedirs(folder, exist_ok=True)
        writable = os.access(folder, os.W_OK | os.X_OK)
    except OSError as e:
        if raw:
            raise InputError(f"{ENV}={raw}: cannot create the folder ({e.strerror or e})") from None
        return None
    if not writable:
        if raw:
            raise InputError(f"{ENV}={raw}: the folder is not writable")
        return None
    return folder


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
    """Where the cubin of this module, source, defines and arch lives (or would) in folder (the
    digest holds the target the module compiles for: kernel_paths.target_arch)."""
    key = digest(name, source, _options(defines, base_options), target(name, arch), nvcc_release())
    return os.path.join(folder, f"{name}-{key[:24]}.cubin")


def lock_path(cubin: str) -> str:
    """The lock file of a cubin: beside it, hidden (``.NAME.cubin.lock``)."""
    folder, base = os.path.split(cubin)
    return os.path.join(folder, f".{base}.lock")


def build(folder: str, name: str, source: str, defines: dict | None, arch: str,
          base_options: tuple[str, ...], on_compile=None) -> str:
    """The cubin's path, compiling it with nvcc first if the folder lacks it. The builder holds
    the cubin's lock: a second process (or thread) asking for it meanwhile waits, then finds it.
    The file appears whole or not at all (formats/atomic.py). ``on_compile``: a
    context manager factory, entered around nvcc only when this call compiles (the runtime's
    message; nothing when the cubin was there)."""
    path = cubin_path(folder, name, source, defines, arch, base_options)
    if os.path.exists(path):
        return path
    os.makedirs(folder, exist_ok=True)  # a folder named on a command line may not exist yet
    with atomic.flocked(lock_path(path), create=True):
        if os.path.exists(path):  # built by whoever held the lock before us
            return path
        with (on_compile() if on_compile is not None else contextlib.nullcontext()):
            _compile(folder, path, name, source, defines, arch, base_options)
    return path


def target(name: str, arch: str) -> str:
    """The nvcc target of module ``name`` for a device of ``arch`` (kernel_paths.target_arch),
    or DeviceError where that module cannot run there."""
    got = target_arch(name, arch)
    if got is None:
        raise DeviceError(f"{name}.cu is built for {ARCH_SPECIFIC[name]} only; this device is {arch}")
    return got


def _compile(folder, path, name, source, defines, arch, base_options) -> None:
    exe = _nvcc()
    with tempfile.TemporaryDirectory(prefix="strata-kernel-") as tmp:
        cu = os.path.join(tmp, f"{name}.cu")
        with open(cu, "w", encoding="utf-8") as f:
            f.write(source)
        out = os.path.join(tmp, f"{name}.cubin")
        cmd = [exe, "--cubin", *_options(defines, base_options), "-arch", target(name, arch), "-o", out, cu]
        r = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if r.returncode != 0 or not os.path.exists(out):
            tail = "\n".join((r.stderr or r.stdout).strip().splitlines()[-12:])
            raise DeviceError(f"compiling {name}.cu failed ({' '.join(cmd[1:-1])}):\n{tail}")
        with open(out, "rb") as f:
            atomic.write_bytes(path, f.read())


def define_text(defines: dict | None) -> str:
    """``K=V K=V`` in key order: how messages and progress lines name a module's defines."""
    return " ".join(f"{k}={v}" for k, v in sorted((defines or {}).items()))


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


def distinct(pairs) -> list[tuple[str, dict]]:
    """(module, defines) pairs each once, in their first order."""
    seen, out = set(), []
    for name, d in pairs:
        k = (name, tuple(sorted(d.items())))
        if k not in seen:
            seen.add(k)
            out.append((name, dict(d)))
    return out


def check_modules(modules, folder: str = "") -> list[tuple[str, dict]]:
    """modules as a list, or a one-line InputError naming one without a kernel file."""
    modules = list(modules)
    for name, _ in modules:
        if not os.path.exists(os.path.join(KERNEL_DIR, f"{name}.cu")):
            where = f" ({folder}'s manifest or the modules asked for)" if folder else ""
            raise InputError(f"no kernel file {name}.cu{where}")
    return modules


def build_all(folder: str | None, arch: str, modules, jobs: int | None = None,
              progress=None) -> list[tuple[str, dict, str, float | None]]:
    """Compile every module of ``modules`` ((name, defines) pairs: fast/cuda/build_list.py's
    ``wanted`` says which are worth it) into ``folder`` (None: cache_dir()) for ``arch`` (the
    runtime's ``device_arch()`` names a present GPU's, or sm_90, the H200's, the same way the
    runtime does, so the digests meet), ``jobs`` nvcc processes at a time (None: the CPU count),
    longest sources first. Cubins already there are kept; a module another process is compiling
    is waited for. ``progress(done, total, name, defines, seconds)`` after each (seconds None: it
    was there). Returns (name, defines, cubin path, seconds or None) in the order given. Raises
    InputError for a folder that is off, a module without a kernel file or a bad jobs count,
    DeviceError for a failed compile (after the others ran)."""
    folder = folder if folder is not None else cache_dir()
    if folder is None:
        raise InputError(f"the kernel cache is off ({ENV}={OFF}, or the default folder is not writable): "
                         "name a folder")
    os.makedirs(folder, exist_ok=True)
    jobs = (os.cpu_count() or 1) if jobs is None else int(jobs)
    if jobs < 1:
        raise InputError(f"jobs must be >= 1, got {jobs}")
    # a module built for another architecture's own instructions (kernel_paths.ARCH_SPECIFIC)
    # cannot run on this one: nothing to build
    todo = [m for m in check_modules(distinct(modules), folder) if target_arch(m[0], arch) is not None]
    sources = {name: kernel_source(name) for name, _ in todo}
    order = sorted(range(len(todo)), key=lambda i: -len(sources[todo[i][0]]))  # long compiles first
    results: list = [None] * len(todo)
    count = [0]
    count_lock = threading.Lock()

    def one(i: int):
        name, defines = todo[i]
        src = sources[name]
        path = cubin_path(folder, name, src, defines, arch, NVCC_OPTIONS)
        took = []

        @contextlib.contextmanager
        def timed():
            t0 = time.perf_counter()
            yield
            took.append(time.perf_counter() - t0)

        build(folder, name, src, defines, arch, NVCC_OPTIONS, on_compile=timed)
        results[i] = (name, defines, path, took[0] if took else None)
        if progress is not None:
            with count_lock:
                count[0] += 1
                progress(count[0], len(todo), name, defines, results[i][3])

    errors = []
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for fut in [pool.submit(one, i) for i in order]:
            try:
                fut.result()
            except DeviceError as e:
                errors.append(e)
    if errors:
        raise errors[0]
    return results
