"""`strata-prefill build-kernels`: compile the kernels into a cubin folder ahead of time.

    strata-prefill build-kernels [--cache DIR] [--arch sm_90] [--jobs N] [--defaults] [--prune]
                                 [--types Q4_K,Q6_K]

Fills the folder the fast path loads its cubins from (fast/cuda/kernel_cache.py: by default
under the user cache dir, STRATA_PREFILL_KERNEL_CACHE moves it): every module the folder's
manifest lists (the (module, defines) pairs some run asked for), and with --defaults (or an
empty manifest) every module the fast path builds with its defaults and switches
(build_list.default_modules). N nvcc processes at a time (default: the CPU count), a
progress line per module. Needs nvcc, not a GPU: build on any machine, then run on the GPU
with the folder and no compile waits. The architecture is the GPU's where one is present,
else sm_90 (the H200's), named as the runtime names it so the cubins' digests meet. Cubins
already there are kept; an edited kernel or header has a new name and is built.

--types narrows mmq.cu's builds (one a weight type and tile configuration) to the types named,
the rest as above: an A/B of an MMQ define (STRATA_MMQ_DEFINES) on one pack then compiles only
that pack's types, not all of them (`strata-prefill info --pack P` lists a pack's types).
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time

from strata_prefill.contract.errors import InputError
from strata_prefill import checks, variables


def add_parser(sub, name: str) -> None:
    p = sub.add_parser(name, help="compile the CUDA kernels into the cubin folder (needs nvcc, no GPU)",
                       description="Compile the fast path's kernels into its cubin folder, in parallel, "
                                   "ahead of a GPU run.")
    p.add_argument("--cache", metavar="DIR", type=checks.output_dir,
                   help="the cubin folder (default: $STRATA_PREFILL_KERNEL_CACHE, else under the user cache dir)")
    p.add_argument("--arch", type=arch_name, default=None,
                   help="nvcc architecture (default: the GPU's, else sm_90, the H200)")
    p.add_argument("--jobs", type=checks.workers, default=os.cpu_count() or 1,
                   help=f"parallel nvcc processes (default: the CPU count; at most {checks.WORKERS_MAX})")
    p.add_argument("--defaults", action="store_true",
                   help="also build every module the fast path builds by default and under its switches")
    p.add_argument("--prune", action="store_true",
                   help="then delete the folder's cubins that no wanted module has (stale sources)")
    p.add_argument("--types", type=mmq_types, default=None, metavar="T[,T...]",
                   help="build mmq.cu for these weight types only (default: every type with an MMQ kernel)")
    p.set_defaults(func=main)


def arch_name(text: str) -> str:
    """An nvcc real architecture such as sm_90 or sm_90a, checked before any compile."""
    if not re.fullmatch(r"sm_\d+a?", text):
        raise argparse.ArgumentTypeError(f"not an nvcc architecture like sm_90: {text!r}")
    return text


def mmq_types(text: str) -> tuple[int, ...]:
    """--types: comma-separated names of weight types with an MMQ kernel (qformats), as their
    type numbers; checked before any compile."""
    from strata_prefill.contract import qformats  # noqa: PLC0415

    known = {f.qtype.name: int(f.qtype) for f in qformats.with_mmq_kernel()}
    names = [t.strip() for t in text.split(",")]
    bad = [t for t in names if t.upper() not in known]
    if not text.strip() or bad:
        raise argparse.ArgumentTypeError(
            f"{', '.join(map(repr, bad)) or repr(text)} is not a type with an MMQ kernel "
            f"(one of {', '.join(known)})")
    return tuple(dict.fromkeys(known[t.upper()] for t in names))


def main(args) -> int:
    from strata_prefill.fast.cuda import build_list, kernel_cache, runtime  # noqa: PLC0415

    if args.cache is None:
        variables.value_of(kernel_cache.ENV)  # an empty or bad folder said in one line, never the default
    if args.types is not None and args.prune:
        raise InputError("--prune with --types would delete the other types' cubins: give one of them")
    folder = str(args.cache) if args.cache is not None else kernel_cache.cache_dir()
    if folder is None:
        raise InputError(f"the kernel cache is off ({kernel_cache.ENV}={kernel_cache.OFF}): give --cache DIR")
    checks.distinct_files("build-kernels", [("fast/cuda/kernels", runtime.KERNEL_DIR, "the kernel source folder")],
                          [("--cache" if args.cache is not None else "the cubin folder", folder)])
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise InputError(f"{folder}: cannot create the cubin folder ({e.strerror or e})") from None
    todo = kernel_cache.check_modules(build_list.wanted(folder, args.defaults, args.types), folder)
    arch = args.arch or runtime.device_arch()
    release = kernel_cache.nvcc_release()
    print(f"{len(todo)} modules for {arch} with {release} into {folder}, {args.jobs} at a time", flush=True)
    t_all = time.perf_counter()

    def progress(i, n, name, defines, secs):
        state = "present" if secs is None else f"built in {secs:.1f} s"
        label = " ".join(filter(None, (name, kernel_cache.define_text(defines))))
        print(f"[{i}/{n}] {label}: {state}", flush=True)

    got = kernel_cache.build_all(folder, arch, todo, args.jobs, progress=progress)
    keep = {os.path.basename(path) for _n, _d, path, _s in got}
    pruned = 0
    if args.prune:
        for f in os.listdir(folder):
            if f.endswith(".cubin") and f not in keep:
                os.remove(os.path.join(folder, f))
                pruned += 1
    built = sum(secs is not None for *_x, secs in got)
    print(f"built {built}, already present {len(got) - built}, pruned {pruned}, "
          f"in {time.perf_counter() - t_all:.1f} s", file=sys.stderr)
    return 0
