"""Which kernel modules are worth compiling ahead into the cubin folder
(fast/cuda/kernel_cache.py): the fast path's own builds under the default settings and every
switch, read from the tables that decide them (products.AUTO_CONFIGS, attention's
ATTEND_TILE_CONFIGS), plus whatever a folder's manifest recorded. `build-kernels` and the gate
hand the list to kernel_cache.build_all.

It sits above the products and attention wrappers (it reads their tables), so the cubin folder
and the runtime below them never import it.
"""
from __future__ import annotations

from . import attention, kernel_cache, products
from .kernel_paths import kernel_names

__all__ = ["CONFIGURED", "default_modules", "wanted"]

#: kernel files the fast path only ever builds with a configuration (mmq.cu with a tile
#: configuration): their build without defines, which nothing loads, is not made ahead (mmq.cu's
#: was the longest compile of a cold gate)
CONFIGURED = ("mmq",)


def default_modules() -> list[tuple[str, dict]]:
    """The modules the fast path builds with the default settings and every switch: each kernel
    file without defines but those of CONFIGURED (the pair and split-K attention kernels among
    them), the tile attention kernels with their configurations (ATTEND_TILE_CONFIGS), and mmq.cu in each automatic tile
    configuration (with STRATA_MMQ_DEFINES), one build a type (products.mmq_modules), and each
    again with MMQ_EMPTY_EXIT (device_plan's tile-list launches: products.with_empty_exit). Test sweeps
    of other configurations reach a folder through its manifest."""
    out = [(n, {}) for n in kernel_names() if n not in CONFIGURED]
    out += [(module, dict(attention.ATTEND_TILE_CONFIGS[v])) for v, module in attention.ATTEND_TILE_MODULES.items()]
    out += [m for _bound, cfg in products.AUTO_CONFIGS for m in products.mmq_modules(products._with_extra(cfg))]
    # device_plan (on by default): the tile-list launches over device-cut lists skip their padding
    out += [m for _bound, cfg in products.AUTO_CONFIGS
            for m in products.mmq_modules(products.with_empty_exit(products._with_extra(cfg)))]
    return kernel_cache.distinct(out)


def wanted(folder: str | None, defaults: bool = True, types=None) -> list[tuple[str, dict]]:
    """The (module, defines) pairs worth building into folder: its manifest's (every module some
    run there asked for), plus default_modules() when ``defaults`` (or when the manifest is
    empty); with ``types`` (type numbers), mmq.cu's builds of those types only."""
    out = kernel_cache.manifest(folder) if folder else []
    if defaults or not out:
        out += default_modules()
    if types is not None:
        keep = set(types)
        out = [(n, d) for n, d in out if n not in CONFIGURED or d.get("MMQ_ONLY") in keep]
    return kernel_cache.distinct(out)
