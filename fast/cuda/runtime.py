"""PyCUDA runtime for the `cuda` backend: availability, one lazily created context, kernel
modules compiled from fast/cuda/kernels/<name>.cu (and, in memory, from a kernel file elsewhere:
:func:`load_file`, for dev/kernels), device allocations that fail with a
:class:`strata_prefill.contract.errors.DeviceError` naming what did not fit, the one device-address helper
(:func:`ptr`), and :class:`Device`, the launch object each backend instance owns (counters,
compute stream, memory pool).

Nothing here imports PyCUDA at module import time: on machines without it (CI) importing
this module is free and :func:`cuda_available` says why the backend is off, in one line.

Kernels are compiled with ``--fmad=false`` (docs/numerics.md: no contraction, IEEE division
and square root, never fast-math) for the device's own architecture, into the cubin folder of
fast/cuda/kernel_cache.py (by default under the user cache dir) unless that is off. Each module
this process compiles says so on stderr, once, with its time (:func:`load_module`); a module
found in the folder says nothing.
"""
from __future__ import annotations

import atexit
import collections
import contextlib
import os
import sys
import threading
import time

import numpy as np

from strata_prefill.contract.errors import DeviceError, InputError

from . import kernel_cache, signatures
# the kernel folder, nvcc options and source reader live in kernel_paths (the bottom of fast/cuda,
# read by the cubin folder and the signature reader too); named here as the runtime's own
from .kernel_paths import DEFAULT_ARCH, KERNEL_DIR, NVCC_OPTIONS, arch_of, kernel_source  # noqa: F401

__all__ = [
    "DeviceError",
    "cuda_available",
    "context",
    "device_name",
    "arch",
    "multiprocessor_count",
    "load_module",
    "load_file",
    "alloc",
    "to_device",
    "synchronize",
    "ptr",
    "check",
    "function",
    "Device",
    "KERNEL_DIR",
    "NVCC_OPTIONS",
]

_lock = threading.RLock()
_state: dict = {"ctx": None, "dev": None, "modules": {}}


def _driver():
    import pycuda.driver as cuda  # noqa: PLC0415

    return cuda


def cuda_available() -> tuple[bool, str]:
    """(True, device name) when PyCUDA imports and a CUDA device is present, else
    (False, one-line reason): "PyCUDA is not installed" or "no CUDA device" (with the
    driver's words where it gave some)."""
    try:
        cuda = _driver()
    except Exception:  # ImportError, or a broken install that cannot load libcuda
        return False, "PyCUDA is not installed"
    try:
        cuda.init()
        n = cuda.Device.count()
    except Exception as e:  # no driver, no device, driver too old
        msg = " ".join(str(e).split())
        return False, f"no CUDA device ({msg})" if msg else "no CUDA device"
    if n < 1:
        return False, "no CUDA device"
    try:
        return True, cuda.Device(0).name()
    except Exception as e:
        return False, "no CUDA device (" + " ".join(str(e).split()) + ")"


def _pop_context() -> None:
    ctx = _state.get("ctx")
    if ctx is not None:
        try:
            ctx.pop()
        except Exception:
            pass
        _state["ctx"] = None


def context():
    """The context on device 0 (its primary context), created and made current on first use.
    Raises DeviceError when the backend is unavailable."""
    with _lock:
        if _state["ctx"] is None:
            ok, why = cuda_available()
            if not ok:
                raise DeviceError(f"CUDA backend unavailable: {why}")
            cuda = _driver()
            dev = cuda.Device(0)
            ctx = dev.retain_primary_context()
            ctx.push()
            _state["dev"] = dev
            _state["ctx"] = ctx
            atexit.register(_pop_context)
        return _state["ctx"]


def _device():
    context()
    return _state["dev"]


def device_name() -> str:
    return _device().name()


def arch() -> str:
    """The device's architecture as nvcc names it, e.g. "sm_90"."""
    return arch_of(_device().compute_capability())


def device_arch(default: str = DEFAULT_ARCH) -> str:
    """The architecture of device 0 where one is present, without creating a context (a
    controller process that only builds kernels holds no device memory), else ``default``."""
    ok, _why = cuda_available()
    if not ok:
        return default
    return arch_of(_driver().Device(0).compute_capability())


def clock_rate_khz(fallback: int = 2_000_000) -> int:
    """The SM clock's rate (kHz) as the driver reports it (its peak), or ``fallback`` where it
    reports none; turns microseconds into clock64() cycles (the stress mode's spins)."""
    cuda = _driver()
    try:
        rate = int(_device().get_attribute(cuda.device_attribute.CLOCK_RATE))
    except Exception:  # an attribute the driver no longer reports
        rate = 0
    return rate if rate > 0 else int(fallback)


def multiprocessor_count() -> int:
    cuda = _driver()
    return int(_device().get_attribute(cuda.device_attribute.MULTIPROCESSOR_COUNT))


# Seconds between the lines that say a compile is still running (a module compiles for up to a
# minute; nothing else is printed meanwhile).
COMPILE_HEARTBEAT_S = 10.0


@contextlib.contextmanager
def _announce(name: str, defines: dict, target: str, folder: str, heartbeat_s: float | None = None):
    """The messages of a compile, on stderr: ``compiling kernel NAME (DEFINES) for ARCH ...
    10 s ... 20 s ... 48.2 s`` on one line at a terminal; elsewhere (pytest, logs, parallel
    workers) a line when it starts, one every COMPILE_HEARTBEAT_S while it runs and one when it
    ends, so neither a wait nor an interleaving hides it."""
    label = f"{name} ({kernel_cache.define_text(defines)})" if defines else name
    err = sys.stderr
    tty = bool(getattr(err, "isatty", lambda: False)())
    head = f"compiling kernel {label} for {target} into {folder}"
    err.write(f"{head} ..." if tty else f"{head} ...\n")
    err.flush()
    t0 = time.perf_counter()
    every = COMPILE_HEARTBEAT_S if heartbeat_s is None else heartbeat_s
    stop = threading.Event()

    def beat():
        while not stop.wait(every):
            secs = time.perf_counter() - t0
            err.write(f" {secs:.0f} s ..." if tty else f"compiling kernel {label}: still compiling, {secs:.0f} s\n")
            err.flush()

    ticker = threading.Thread(target=beat, name="compile-heartbeat", daemon=True)
    ticker.start()
    ok = False
    try:
        yield
        ok = True
    finally:
        stop.set()
        ticker.join()
        secs = time.perf_counter() - t0
        tail = f"{secs:.1f} s" if ok else f"failed after {secs:.1f} s"
        err.write(f" {tail}\n" if tty else f"compiling kernel {label}: {tail}\n")
        err.flush()


def cubin_for(name: str, defines: dict | None, folder: str, target: str) -> str:
    """The cubin of fast/cuda/kernels/<name>.cu with ``defines`` for ``target`` in ``folder``:
    recorded in its manifest, compiled (with the message of :func:`_announce`) if missing,
    waited for if another process is compiling it."""
    defines = dict(sorted((defines or {}).items()))
    kernel_cache.record(folder, name, defines)
    return kernel_cache.build(folder, name, kernel_source(name), defines, target, NVCC_OPTIONS,
                              on_compile=lambda: _announce(name, defines, target, folder))


def load_module(name: str, defines: dict | None = None):
    """Compile fast/cuda/kernels/<name>.cu (cached per name and defines) and return the
    pycuda module. ``defines`` become ``-DKEY=VALUE`` options (tile configurations). The cubin
    comes from (or goes to) the folder of fast/cuda/kernel_cache.py (:func:`cubin_for`); with
    that off (STRATA_PREFILL_KERNEL_CACHE=off) it is compiled in memory."""
    key = (name, tuple(sorted((defines or {}).items())))
    with _lock:
        mod = _state["modules"].get(key)
        if mod is not None:
            return mod
        context()
        folder = kernel_cache.cache_dir()
        if folder is not None:  # a shared folder of cubins (fast/cuda/kernel_cache.py)
            mod = _driver().module_from_file(cubin_for(name, dict(key[1]), folder, arch()))
            _state["modules"][key] = mod
            return mod
        mod = _state["modules"][key] = _compile_in_memory(f"{name}.cu", kernel_source(name), key[1],
                                                          kernel_cache.target(name, arch()))
        return mod


def _compile_in_memory(label: str, src: str, defines: tuple, target: str | None = None):
    """The pycuda module of CUDA source ``src`` compiled by PyCUDA's SourceModule with
    NVCC_OPTIONS and ``defines`` ((KEY, VALUE) pairs, as -DKEY=VALUE) for ``target`` (None: the
    device's architecture); DeviceError naming ``label`` where it does not compile. Needs the
    context."""
    from pycuda.compiler import SourceModule  # noqa: PLC0415

    options = list(NVCC_OPTIONS) + [f"-D{k}={v}" for k, v in defines]
    try:
        return SourceModule(src, options=options, arch=target or arch(), no_extern_c=True)
    except Exception as first:
        # PyCUDA's on-disk compile cache is shared by processes (pytest-xdist workers); one
        # that reads a cubin another is still writing gets "device kernel image is invalid".
        # Compiling again without the cache is the cure; a real compile error fails again.
        try:
            return SourceModule(src, options=options, arch=target or arch(), no_extern_c=True, cache_dir=False)
        except Exception as e:
            raise DeviceError(f"compiling {label} failed: {e}") from first


def load_file(path: str, defines: dict | None = None, target: str | None = None):
    """Compile the kernel file at ``path``, one outside fast/cuda/kernels (dev/kernels' numbered
    versions), with its project headers from KERNEL_DIR (:func:`kernel_source`) and ``defines``,
    for ``target`` (None: the device's architecture; "sm_90a" for a file with Hopper's own
    instructions), and return the pycuda module; cached per (path, defines, target). Always
    compiled in memory: the kernel cache folder's manifest (fast/cuda/kernel_cache.py) lists
    production modules only, which `build-kernels` and the gate build ahead. Says on stderr that
    it compiles."""
    path = os.path.abspath(path)
    folder, base = os.path.split(path)
    if not base.endswith(".cu"):
        raise InputError(f"load_file: {path} is not a .cu file")
    # an absolute path: never a module name
    key = (path, tuple(sorted((defines or {}).items())), target)
    with _lock:
        mod = _state["modules"].get(key)
        if mod is not None:
            return mod
        context()
        src = kernel_source(base[:-3], folder)
        with _announce(base, dict(key[1]), target or arch(), "memory"):
            mod = _state["modules"][key] = _compile_in_memory(base, src, key[1], target)
        return mod


def module_ints(mod, name: str, n: int) -> tuple[int, ...]:
    """The n ints of a module's ``extern "C" __device__ int name[n]`` (a kernel file's
    geometry or shared-memory size, read so the host never restates it)."""
    addr, _ = mod.get_global(name)
    got = np.zeros(int(n), np.int32)
    _driver().memcpy_dtoh(got, addr)
    return tuple(int(v) for v in got)


def allow_dynamic_smem(f, nbytes: int):
    """f, allowed ``nbytes`` of dynamic shared memory (above 48 KB a kernel must opt in);
    returns f."""
    f.set_attribute(_driver().function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, int(nbytes))
    return f


_functions: dict = {}


def function(module: str, name: str, fmt: str, defines: dict | None = None):
    """The kernel ``name`` of fast/cuda/kernels/<module>.cu (built with ``defines``), prepared
    with the argument format ``fmt``; compiled and prepared once per process."""
    key = (module, name, tuple(sorted((defines or {}).items())))
    with _lock:
        f = _functions.get(key)
        if f is None:
            # a format unlike the C signature packs the arguments at wrong offsets, silently
            signatures.check(module, name, fmt, defines)
            f = load_module(module, defines).get_function(name)
            f.prepare(fmt)
            _functions[key] = f
        return f


def mem_info() -> tuple[int, int]:
    """(free, total) bytes of device memory."""
    context()
    return _driver().mem_get_info()


def _free_total() -> str:
    try:
        free, total = _driver().mem_get_info()
        return f"{free / 2**20:.0f} MiB free of {total / 2**20:.0f} MiB"
    except Exception:
        return "free memory unknown"


def alloc(nbytes: int, what: str):
    """A device allocation of ``nbytes`` (at least 1); DeviceError naming ``what`` when the
    device is out of memory."""
    context()
    cuda = _driver()
    try:
        return cuda.mem_alloc(max(int(nbytes), 1))
    except (cuda.MemoryError, cuda.LogicError) as e:
        raise DeviceError(
            f"out of GPU memory: {what} ({int(nbytes) / 2**20:.1f} MiB) did not fit "
            f"({_free_total()}): {' '.join(str(e).split())}"
        ) from e


def to_device(arr, what: str):
    """Copy a host array to a new device allocation (synchronous); DeviceError on OOM."""
    a = np.ascontiguousarray(arr)
    buf = alloc(a.nbytes, what)
    if a.nbytes:
        _driver().memcpy_htod(buf, a)
    return buf


def synchronize() -> None:
    context()
    _driver().Context.synchronize()


def ptr(buf) -> int:
    """The device address of a GPUArray (its ``gpudata``), anything with
    ``__cuda_array_interface__``, a ``DeviceAllocation`` or a plain int address (e.g.
    ``int(buf) + offset``)."""
    if buf is None:
        raise InputError("a device buffer is None")
    if isinstance(buf, (int, np.integer)):
        return int(buf)
    gpudata = getattr(buf, "gpudata", None)
    if gpudata is not None:
        return int(gpudata)
    cai = getattr(buf, "__cuda_array_interface__", None)
    if cai:
        return int(cai["data"][0])
    return int(buf)  # DeviceAllocation


def check(a, what: str, dtype, shape=None, ndim=None):
    """A GPUArray argument checked: dtype, C-contiguity, and shape (None entries are free)."""
    if not hasattr(a, "gpudata") or not hasattr(a, "shape"):
        raise InputError(f"{what} must be a pycuda GPUArray, got {type(a).__name__}")
    if np.dtype(a.dtype) != np.dtype(dtype):
        raise InputError(f"{what} must be {np.dtype(dtype).name}, got {np.dtype(a.dtype).name}")
    if not a.flags.c_contiguous:
        raise InputError(f"{what} must be C-contiguous")
    if ndim is not None and len(a.shape) != ndim:
        raise InputError(f"{what} must have {ndim} dimensions, got shape {tuple(a.shape)}")
    if shape is not None:
        if len(a.shape) != len(shape) or any(s is not None and int(s) != int(d) for s, d in zip(shape, a.shape)):
            raise InputError(f"{what} has shape {tuple(a.shape)}, expected {tuple(shape)}")
    return a


def enqueue(func, grid, block, stream, *args, shared_size: int = 0) -> None:
    """Queue the prepared kernel ``func`` on ``stream``: the one place a kernel is queued.
    Device.launch counts the walk's launches through it; the stress mode's spins come here
    uncounted (fast/cuda/stress.py)."""
    func.prepared_async_call(grid, block, stream, *args, shared_size=shared_size)


class Device:
    """What one backend instance launches through: its launch counters (``counters``:
    "launches" and one entry per kernel), its compute ``stream`` (a ``pycuda.driver.Stream``;
    None = the legacy default stream) and a device memory pool for every output and scratch
    buffer the wrappers allocate. Every launch and every async copy goes to ``stream``, so a
    non-blocking stream can be switched in here alone. The pool keeps freed blocks for reuse:
    cuMemAlloc / cuMemFree synchronize the device (and would serialize a copy stream), and on one
    stream a reused block is only written by work queued after the last reader of its old
    contents. ``stress``: the stress mode's spins (fast/cuda/stress.py), or None (off: one
    attribute test a launch)."""

    def __init__(self, stream=None):
        context()
        from pycuda import gpuarray  # noqa: PLC0415
        from pycuda.tools import DeviceMemoryPool  # noqa: PLC0415

        self._ga = gpuarray
        self.stream = stream
        self.pool = DeviceMemoryPool()
        self.counters: collections.Counter = collections.Counter()
        self.scratch: dict = {}  # named scratch buffers a wrapper grows on demand (split-K attention)
        self.stress = None  # a strata_prefill.fast.cuda.stress.Stress when STRATA_PREFILL_STRESS is set

    def launch(self, func, name: str | None, grid, block, *args, shared_size: int = 0) -> None:
        """Queue the prepared kernel ``func`` on the stream and count it under ``name`` (and
        "launches"; name None counts only "launches"). In the stress mode a spin may go first."""
        if self.stress is not None:
            self.stress.before_launch(self.stream)
        enqueue(func, grid, block, self.stream, *args, shared_size=shared_size)
        self.counters["launches"] += 1
        if name is not None:
            self.counters[name] += 1

    def empty(self, shape, dtype):
        """An uninitialized GPUArray from the pool."""
        return self._ga.empty(shape, dtype, allocator=self.pool.allocate)

    def upload(self, arr):
        """A host array as a new GPUArray from the pool (async copy on the stream; the host
        array may be dropped at once: a pageable source is staged before the call returns)."""
        a = np.ascontiguousarray(arr)
        out = self.empty(a.shape, a.dtype)
        if a.nbytes:
            _driver().memcpy_htod_async(out.gpudata, a, self.stream)
        return out

    def output(self, out, what: str, shape, dtype):
        """``out`` checked against shape and dtype, or a new pool array when it is None."""
        shape = tuple(int(s) for s in shape)
        if out is None:
            return self.empty(shape, dtype)
        check(out, what, dtype)
        if tuple(out.shape) != shape:
            raise InputError(f"{what} has shape {tuple(out.shape)}, expected {shape}")
        return out

    def upload_i32(self, a, what: str):
        """A host int array as an int32 GPUArray (uploaded on the stream), or a GPUArray as is."""
        if hasattr(a, "gpudata"):
            return check(a, what, np.int32)
        return self.upload(np.ascontiguousarray(np.asarray(a), dtype=np.int32))

    def synchronize(self) -> None:
        """Wait for everything queued on the stream."""
        if self.stream is None:
            _driver().Context.synchronize()
        else:
            self.stream.synchronize()

    def download(self, a) -> np.ndarray:
        """A GPUArray back on the host, after the stream's work (synchronizes)."""
        self.synchronize()
        return a.get()
