#!/usr/bin/env python3
"""How many CTAs of each MMQ type's kernel an SM holds under a tile configuration, against the
CTAs the configuration asks for (its MMQ_MINB), read from the built cubins: no GPU.

    python3 -m dev.mmq_occupancy [--config big|mid|small|JSON] [--arch sm_90] [--cache DIR] [--jobs N]

The configurations are fast/cuda/products.py's AUTO_CONFIGS (small, mid and big, in that order)
with STRATA_MMQ_DEFINES, or a JSON object of mmq.cu defines. Each type's module is built as the
fast path builds it (fast/cuda/kernel_cache.py: the cubins come from the kernel cache folder and
are compiled with nvcc where it lacks them). From each cubin's ELF:

- the threads a CTA (its __launch_bounds__) and the registers a thread (.nv.info attributes);
- the stack frame (a frame above 0 holds spills or local arrays);
- the shared memory a CTA: the dynamic bytes the kernel exports (`<kernel>_smem`, mmq.cu's
  Geo<QT>::SMEM) plus the kernel's .nv.shared section (its static arrays and the bytes the
  architecture reserves a CTA);
- the code bytes: the kernel's .text section, every unrolled body of it. Warps of one SM that
  run different bodies compete for the instruction caches (docs/results/2026-12-06-mmq-raw-once.md:
  the in-place gate/up's largest stall was the instruction fetch).

The CTAs an SM each allows follow from the architecture's limits (SM_LIMITS). A row whose
CTAs are fewer than MMQ_MINB says "short": the occupancy the configuration was chosen for is
not had, which changes speed, never a bit. docs/results/2026-12-06-mmq-wgmma-core.md is what
made this a tool: Q4_K's big tiles ran one CTA an SM on an H100 for their shared memory.
Exit 0; 1 when a row is short (so a script can tell); 2 for bad input.
"""
from __future__ import annotations

import argparse
import json
import math
import struct
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from strata_prefill.contract import qformats
from strata_prefill.fast.cuda import kernel_cache, products
from strata_prefill.fast.cuda.kernel_paths import DEFAULT_ARCH, NVCC_OPTIONS, kernel_source

#: per architecture (CUDA's documented limits): registers an SM, the register allocation unit a
#: warp (registers), threads an SM, CTAs an SM, shared memory an SM (bytes, the per-CTA
#: reservation included: a CTA's .nv.shared section counts it)
SM_LIMITS = {
    "sm_90": {"regs": 65536, "reg_unit": 256, "threads": 2048, "ctas": 32, "smem": 233472},
}
#: the names AUTO_CONFIGS' entries go by here, in its order
CONFIG_NAMES = ("small", "mid", "big")
# .nv.info attributes: in .nv.info, a function's registers and its stack frame (bytes), each
# (symbol index, value); in .nv.info.<function>, its __launch_bounds__ threads (x, y, z)
_REGCOUNT, _FRAME_SIZE, _MAX_THREADS = 0x2F, 0x11, 0x05


@dataclass(frozen=True)
class KernelUse:
    """What one kernel of a cubin asks of an SM."""
    name: str
    threads: int  # a CTA's, from its __launch_bounds__
    registers: int
    frame: int  # stack frame bytes
    dynamic_smem: int  # the kernel's exported <name>_smem
    static_smem: int  # its .nv.shared section (static arrays and the per-CTA reservation)
    code_bytes: int = 0  # its .text section: every unrolled body (what the instruction caches hold)


def _sections(blob: bytes) -> dict:
    shoff = struct.unpack_from("<Q", blob, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", blob, 0x3A)
    heads = [struct.unpack_from("<IIQQQQIIQQ", blob, shoff + i * shentsize) for i in range(shnum)]
    names = heads[shstrndx][4]

    def cstr(at: int) -> str:
        return blob[at:blob.index(b"\0", at)].decode()

    return {cstr(names + h[0]): (i, h[4], h[5], h[6]) for i, h in enumerate(heads)}  # index, offset, size, link


def _symbols(blob: bytes, secs: dict) -> list[tuple[str, int, int]]:
    """(name, section index, value) of each .symtab entry."""
    _, off, size, link = secs[".symtab"]
    strtab = next(o for i, o, _s, _l in secs.values() if i == link)
    out = []
    for k in range(size // 24):
        name, _info, _other, shndx, value, _size = struct.unpack_from("<IBBHQQ", blob, off + 24 * k)
        out.append((blob[strtab + name:blob.index(b"\0", strtab + name)].decode(), shndx, value))
    return out


def _info(blob: bytes, secs: dict, section: str) -> list[tuple[int, bytes]]:
    """(attribute, value bytes) of each sized entry of an .nv.info section."""
    _, off, size, _link = secs[section]
    data, i, out = blob[off:off + size], 0, []
    while i + 4 <= len(data):
        fmt, attr = data[i], data[i + 1]
        if fmt == 4:  # a sized value; the other formats hold theirs in these 4 bytes
            n = struct.unpack_from("<H", data, i + 2)[0]
            out.append((attr, data[i + 4:i + 4 + n]))
            i += 4 + n
        else:
            i += 4
    return out


def kernel_use(cubin: str, kernel: str) -> KernelUse:
    """Registers, stack frame and shared memory of ``kernel`` in the cubin at ``cubin``, which
    exports its dynamic shared memory as the int ``<kernel>_smem`` (mmq.cu's convention)."""
    with open(cubin, "rb") as f:
        blob = f.read()
    secs = _sections(blob)
    syms = _symbols(blob, secs)
    index = {name: k for k, (name, _s, _v) in enumerate(syms)}
    if kernel not in index or f"{kernel}_smem" not in index:
        raise KeyError(f"{cubin}: no kernel {kernel} with a {kernel}_smem global")
    _, shndx, value = syms[index[f"{kernel}_smem"]]
    data_off = next(o for i, o, _s, _l in secs.values() if i == shndx)
    dynamic = struct.unpack_from("<i", blob, data_off + value)[0]
    static = secs.get(f".nv.shared.{kernel}", (0, 0, 0, 0))[2]
    per_symbol = {(a, sym): val for a, v in _info(blob, secs, ".nv.info") if len(v) == 8
                  for sym, val in [struct.unpack("<II", v)]}
    bounds = [v for a, v in _info(blob, secs, f".nv.info.{kernel}") if a == _MAX_THREADS and len(v) == 12]
    if not bounds:
        raise KeyError(f"{cubin}: kernel {kernel} has no __launch_bounds__ threads")
    x, y, z = struct.unpack("<III", bounds[0])
    k = index[kernel]
    return KernelUse(kernel, x * y * z, per_symbol.get((_REGCOUNT, k), 0), per_symbol.get((_FRAME_SIZE, k), 0),
                     dynamic, static, secs.get(f".text.{kernel}", (0, 0, 0, 0))[2])


def type_use(folder: str, cfg: dict, fmt, arch: str = DEFAULT_ARCH, source: str | None = None) -> KernelUse:
    """The KernelUse of type ``fmt``'s MMQ kernel under the tile configuration ``cfg``, its module
    built as the fast path builds it (from the cubin in ``folder``, compiled there if missing);
    ``source``: mmq.cu's text, when the caller has it already."""
    path = kernel_cache.build(folder, "mmq", kernel_source("mmq") if source is None else source,
                              products._type_defines(cfg, fmt), arch, NVCC_OPTIONS)
    return kernel_use(path, fmt.mmq_kernel)


def ctas_an_sm(use: KernelUse, arch: str = DEFAULT_ARCH) -> dict[str, int]:
    """The CTAs of the kernel an SM of ``arch`` holds, by each limit and in all."""
    lim, threads = SM_LIMITS[arch], use.threads
    warps = math.ceil(threads / 32)
    per_warp = math.ceil(use.registers * 32 / lim["reg_unit"]) * lim["reg_unit"]
    by = {
        "registers": (lim["regs"] // (per_warp * warps)) if per_warp else lim["ctas"],
        "shared memory": lim["smem"] // (use.dynamic_smem + use.static_smem),
        "threads": lim["threads"] // threads,
    }
    by["all"] = min(lim["ctas"], *by.values())
    return by


def parse_config(text: str) -> tuple[str, dict]:
    """(a name, the tile configuration's defines) from a CONFIG_NAMES name or a JSON object."""
    if text in CONFIG_NAMES:
        return text, products._with_extra(products.AUTO_CONFIGS[CONFIG_NAMES.index(text)][1])
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError:
        cfg = None
    if not isinstance(cfg, dict) or not all(isinstance(v, int) and not isinstance(v, bool) for v in cfg.values()):
        raise ValueError(f"--config: {', '.join(CONFIG_NAMES)} or a JSON object of mmq.cu defines (integers), "
                         f"got {text!r}")
    return text, cfg


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="big", help=f"{', '.join(CONFIG_NAMES)} (AUTO_CONFIGS) or JSON (default big)")
    p.add_argument("--arch", default=DEFAULT_ARCH, choices=sorted(SM_LIMITS))
    p.add_argument("--cache", help="kernel cache folder (default: fast/cuda/kernel_cache.py's)")
    p.add_argument("--jobs", type=int, default=None, help="parallel nvcc builds (default: the CPUs)")
    args = p.parse_args(argv)
    if args.jobs is not None and args.jobs < 1:
        p.error(f"--jobs must be at least 1, got {args.jobs}")
    try:
        name, cfg = parse_config(args.config)
    except ValueError as e:
        p.error(str(e))
    folder = args.cache or kernel_cache.cache_dir()
    if folder is None:
        p.error("the kernel cache is off: name a folder with --cache")
    asked = int(cfg.get("MMQ_MINB", 1))
    fmts = list(qformats.with_mmq_kernel())
    source = kernel_source("mmq")

    def one(fmt):
        return fmt, type_use(folder, cfg, fmt, args.arch, source)

    print(f"MMQ under {name} ({kernel_cache.define_text(cfg)}), {asked} CTAs an SM asked, {args.arch}; "
          f"cubins in {folder}", flush=True)
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        rows = list(pool.map(one, fmts))
    print(f"{'type':<8} {'threads':>7} {'registers':>9} {'frame':>6} {'shared a CTA':>13} {'by regs':>8} "
          f"{'by smem':>8} {'CTAs':>5}  vs {asked} asked {'code bytes':>11}")
    short = 0
    for fmt, use in rows:
        by = ctas_an_sm(use, args.arch)
        mark = "short" if by["all"] < asked else "ok"
        short += by["all"] < asked
        print(f"{fmt.qtype.name:<8} {use.threads:>7} {use.registers:>9} {use.frame:>6} "
              f"{use.dynamic_smem + use.static_smem:>13,} {by['registers']:>8} {by['shared memory']:>8} "
              f"{by['all']:>5}  {mark:<9} {use.code_bytes:>11,}")
    print(f"{short} of {len(rows)} types short of {asked} CTAs an SM")
    return 1 if short else 0


if __name__ == "__main__":
    sys.exit(main())
