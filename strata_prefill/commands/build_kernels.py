"""`strata-prefill build-kernels`: compile the kernels into a cubin folder ahead of time.

    strata-prefill build-kernels --cache .kcache --arch sm_90 --jobs 2

Fills the folder that STRATA_PREFILL_KERNEL_CACHE names for the fast path (fast/cuda/
kernel_cache.py): every module the folder's manifest lists (the (module, defines) pairs some
run asked for), and with --defaults (or an empty manifest) every kernel file as it builds with
no defines plus each automatic MMQ tile configuration. Needs nvcc, not a GPU: build on any
machine, then run on the GPU with the folder and no compile waits. Cubins already there are
kept; an edited kernel or header has a new name and is built.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from strata.errors import InputError
from strata_prefill import checks


def add_parser(sub, name: str) -> None:
    p = sub.add_parser(name, help="compile the CUDA kernels into a cubin folder (needs nvcc, no GPU)",
                       description="Compile the fast path's kernels into the folder "
                                   "STRATA_PREFILL_KERNEL_CACHE names, ahead of a GPU run.")
    p.add_argument("--cache", metavar="DIR",
                   help="the cubin folder (default: $STRATA_PREFILL_KERNEL_CACHE)")
    p.add_argument("--arch", type=arch_name, default="sm_90", help="nvcc architecture (default sm_90, the H200)")
    p.add_argument("--jobs", type=checks.positive_int, default=os.cpu_count() or 1,
                   help="parallel nvcc processes (default: the CPU count)")
    p.add_argument("--defaults", action="store_true",
                   help="also build every kernel file without defines and the automatic MMQ configurations")
    p.add_argument("--prune", action="store_true",
                   help="then delete the folder's cubins that no wanted module has (stale sources)")
    p.set_defaults(func=main)


def arch_name(text: str) -> str:
    """An nvcc real architecture such as sm_90 or sm_90a, checked before any compile."""
    if not re.fullmatch(r"sm_\d+a?", text):
        raise argparse.ArgumentTypeError(f"not an nvcc architecture like sm_90: {text!r}")
    return text


def wanted(folder: str, defaults: bool) -> list[tuple[str, dict]]:
    """The (module, defines) pairs to build: the manifest's, plus the defaults if asked (or if
    the manifest is empty)."""
    from fast.cuda import kernel_cache, products, runtime  # noqa: PLC0415

    out = kernel_cache.manifest(folder)
    if defaults or not out:
        names = sorted(f[:-3] for f in os.listdir(runtime.KERNEL_DIR) if f.endswith(".cu"))
        out += [(n, {}) for n in names]
        out += [("mmq", dict(cfg)) for _, cfg in products.AUTO_CONFIGS]
    seen, uniq = set(), []
    for name, d in out:
        k = (name, tuple(sorted(d.items())))
        if k not in seen:
            seen.add(k)
            uniq.append((name, d))
    return uniq


def main(args) -> int:
    from fast.cuda import kernel_cache, runtime  # noqa: PLC0415

    folder = args.cache or os.environ.get(kernel_cache.ENV, "").strip()
    if not folder:
        raise InputError(f"no cubin folder: give --cache DIR or set {kernel_cache.ENV}")
    os.makedirs(folder, exist_ok=True)
    todo = wanted(folder, args.defaults)
    for name, _ in todo:
        if not os.path.exists(os.path.join(runtime.KERNEL_DIR, f"{name}.cu")):
            raise InputError(f"{folder}: the manifest names a kernel file that does not exist: {name}.cu")
    release = kernel_cache.nvcc_release()
    print(f"{len(todo)} modules for {args.arch} with {release} into {folder}, {args.jobs} at a time",
          flush=True)
    t_all = time.perf_counter()
    done = [0, 0]

    def one(item):
        name, defines = item
        src = runtime.kernel_source(name)
        path = kernel_cache.cubin_path(folder, name, src, defines, args.arch, runtime.NVCC_OPTIONS)
        if os.path.exists(path):
            return name, defines, path, None
        t0 = time.perf_counter()
        kernel_cache.build(folder, name, src, defines, args.arch, runtime.NVCC_OPTIONS)
        return name, defines, path, time.perf_counter() - t0

    keep = set()
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for i, (name, defines, path, secs) in enumerate(pool.map(one, todo), 1):
            keep.add(os.path.basename(path))
            d = " ".join(f"{k}={v}" for k, v in sorted(defines.items()))
            if secs is None:
                done[1] += 1
                state = "present"
            else:
                done[0] += 1
                state = f"built in {secs:.1f} s"
            print(f"[{i}/{len(todo)}] {name} {d}: {state}", flush=True)
    pruned = 0
    if args.prune:
        for f in os.listdir(folder):
            if f.endswith(".cubin") and f not in keep:
                os.remove(os.path.join(folder, f))
                pruned += 1
    print(f"built {done[0]}, already present {done[1]}, pruned {pruned}, in {time.perf_counter() - t_all:.1f} s",
          file=sys.stderr)
    return 0
