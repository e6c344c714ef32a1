"""PyCUDA runtime for the `cuda` backend: availability, one lazily created context, kernel
modules compiled from fast/kernels/<name>.cu, and device allocations that fail with a
:class:`strata.errors.DeviceError` naming what did not fit.

Nothing here imports PyCUDA at module import time: on machines without it (CI) importing
this module is free and :func:`cuda_available` says why the backend is off, in one line.

Kernels are compiled with ``--fmad=false`` (docs/numerics.md, section 4.5: no contraction,
IEEE division and square root, never fast-math) for the device's own architecture.
"""
from __future__ import annotations

import atexit
import os
import re
import threading

from strata.errors import DeviceError

__all__ = [
    "DeviceError",
    "cuda_available",
    "context",
    "device_name",
    "arch",
    "multiprocessor_count",
    "load_module",
    "alloc",
    "to_device",
    "synchronize",
    "KERNEL_DIR",
    "NVCC_OPTIONS",
]

KERNEL_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "kernels")
NVCC_OPTIONS = ("--fmad=false",)

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
    major, minor = _device().compute_capability()
    return f"sm_{major}{minor}"


def multiprocessor_count() -> int:
    cuda = _driver()
    return int(_device().get_attribute(cuda.device_attribute.MULTIPROCESSOR_COUNT))


_LOCAL_INCLUDE = re.compile(r'^#include "([A-Za-z0-9_]+\.cuh)".*$', re.M)


def kernel_source(name: str) -> str:
    """The text of fast/kernels/<name>.cu with the project's own headers (`#include "x.cuh"`)
    inlined, so the compiled source, and PyCUDA's compile cache key, hold all of it."""
    def read(fname: str) -> str:
        with open(os.path.join(KERNEL_DIR, fname), encoding="utf-8") as f:
            return f.read()

    return _LOCAL_INCLUDE.sub(lambda m: read(m.group(1)), read(f"{name}.cu"))


def load_module(name: str, defines: dict | None = None):
    """Compile fast/kernels/<name>.cu (cached per name and defines) and return the
    pycuda SourceModule. ``defines`` become ``-DKEY=VALUE`` options (tile configurations)."""
    key = (name, tuple(sorted((defines or {}).items())))
    with _lock:
        mod = _state["modules"].get(key)
        if mod is not None:
            return mod
        context()
        from pycuda.compiler import SourceModule  # noqa: PLC0415

        src = kernel_source(name)
        options = list(NVCC_OPTIONS) + [f"-D{k}={v}" for k, v in key[1]]
        try:
            mod = SourceModule(src, options=options, arch=arch(), no_extern_c=True)
        except Exception as e:
            raise DeviceError(f"compiling {name}.cu failed: {e}") from e
        _state["modules"][key] = mod
        return mod


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
    import numpy as np  # noqa: PLC0415

    a = np.ascontiguousarray(arr)
    buf = alloc(a.nbytes, what)
    if a.nbytes:
        _driver().memcpy_htod(buf, a)
    return buf


def synchronize() -> None:
    context()
    _driver().Context.synchronize()
