"""Where the kernels' source lives and how every build of it is compiled: the kernel folder
(fast/cuda/kernels), the nvcc options, the architecture's spelling, and a kernel file's text
with the project's headers inlined. The bottom of fast/cuda: the runtime (loading), the cubin
folder (fast/cuda/kernel_cache.py) and the signature reader (fast/cuda/signatures.py) all read
these, so this module imports none of them.

No PyCUDA and no nvcc here: plain files and strings.
"""
from __future__ import annotations

import os
import re

from . import generated

__all__ = ["KERNEL_DIR", "NVCC_OPTIONS", "DEFAULT_ARCH", "WGMMA_TARGET", "ARCH_SPECIFIC", "runs_on", "arch_of",
           "target_arch", "kernel_source", "kernel_names"]

KERNEL_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels")
#: docs/numerics.md: no contraction, IEEE division and square root, never fast-math
NVCC_OPTIONS = ("--fmad=false",)

#: what `build-kernels` builds for where no GPU says otherwise: the H200's architecture
DEFAULT_ARCH = "sm_90"


#: the target of a file with Hopper's own instructions (wgmma, setmaxnreg): built and run on
#: sm_90 only
WGMMA_TARGET = "sm_90a"

#: kernel files that use one architecture's own instructions, and the target they are built for;
#: such a file builds and runs only on its base architecture (:func:`runs_on`)
ARCH_SPECIFIC = {"attention_wgmma": WGMMA_TARGET}


def runs_on(target: str, arch: str) -> bool:
    """Whether code built for ``target`` runs on a device of ``arch``: its own architecture, or
    an architecture-specific target ("sm_90a") on its base ("sm_90")."""
    return target == arch or (target.endswith("a") and target[:-1] == arch)


def target_arch(name: str, arch: str) -> str | None:
    """The nvcc target module ``name`` is compiled for on a device of ``arch``: ``arch`` itself,
    or ARCH_SPECIFIC's target where ``arch`` is its base; None where the module cannot run there."""
    want = ARCH_SPECIFIC.get(name)
    if want is None:
        return arch
    return want if runs_on(want, arch) else None


def arch_of(compute_capability) -> str:
    """nvcc's name of a compute capability: (9, 0) -> "sm_90". The one spelling, shared by the
    runtime and `build-kernels` (the cubin's digest holds it: the two must agree)."""
    major, minor = (int(v) for v in compute_capability)
    return f"sm_{major}{minor}"


_LOCAL_INCLUDE = re.compile(r'^#include "([A-Za-z0-9_]+\.cuh)".*$', re.M)


def kernel_source(name: str, folder: str = KERNEL_DIR) -> str:
    """The text of <folder>/<name>.cu (default fast/cuda/kernels) with the project's own headers
    (`#include "x.cuh"`) inlined, so the compiled source, and PyCUDA's compile cache key, hold all
    of it. The headers always come from KERNEL_DIR: a kernel kept elsewhere (dev/kernels' numbered
    versions) computes production's shared steps, not copies of them. A header written from
    Python (fast/cuda/generated.py: ``qformats.cuh``) is inlined as that text; it is no file."""
    def read(where: str, fname: str) -> str:
        text = generated.header(fname)
        if text is not None:
            return text
        with open(os.path.join(where, fname), encoding="utf-8") as f:
            return f.read()

    return _LOCAL_INCLUDE.sub(lambda m: read(KERNEL_DIR, m.group(1)), read(folder, f"{name}.cu"))


def kernel_names() -> list[str]:
    """The modules of fast/cuda/kernels: each .cu file's name without it, sorted."""
    return sorted(f[:-3] for f in os.listdir(KERNEL_DIR) if f.endswith(".cu"))

