#!/usr/bin/env python3
"""Build every CUDA kernel of two git revisions as sm_90 cubins, the way the runtime builds
them, and compare them: first the cubin bytes, then, where those differ, the SASS of each
kernel function (cuobjdump -sass), so a file that lost a dead body still shows that the
kernels it keeps compile to the same instructions.

    python3 dev/compare_cubins.py 04719c8 HEAD [--keep DIR]

Needs git and nvcc on PATH and cuobjdump (on PATH, or named by $CUOBJDUMP; the pip package
nvidia-cuda-cuobjdump has one, and it calls nvdisasm, from nvidia-cuda-nvdisasm); no GPU. The builds mirror fast/cuda/runtime.py:
project headers (`#include "x.cuh"`) inlined into the source, `--fmad=false`, `-arch=sm_90`,
and the defines each wrapper passes (BUILDS below: the MMQ tile configurations and the two
attention warp counts). A build that does not exist in one revision (a removed file or
configuration) is reported as such.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

ARCH = "sm_90"
NVCC_OPTIONS = ("--fmad=false",)
MMQ_SMALL = {"MMQ_V2": 2, "MMQ_WM": 4, "MMQ_BN": 64, "MMQ_MINB": 2}
MMQ_LARGE = {"MMQ_V2": 2, "MMQ_WM": 4, "MMQ_BN": 128, "MMQ_STAGES": 3, "MMQ_MINB": 2}
#: kernel file -> the define sets the wrappers compile it with (default: none)
BUILDS = {
    "mmq": [MMQ_SMALL, MMQ_LARGE, {"MMQ_V2": 0}],
    "attention_mma": [{"MMA_WARPS": 4}, {"MMA_WARPS": 8}],
}
_LOCAL_INCLUDE = re.compile(r'^#include "([A-Za-z0-9_]+\.cuh)".*$', re.M)


def export(rev: str, dest: str) -> str:
    """The rev's kernel folder (the one holding mmq.cu) extracted under dest; returns its path."""
    names = subprocess.run(["git", "ls-tree", "-r", "--name-only", rev], check=True, capture_output=True,
                           text=True).stdout.splitlines()
    found = [n for n in names if n.endswith("/mmq.cu")]
    if len(found) != 1:
        sys.exit(f"compare_cubins: {rev} has {len(found)} mmq.cu files, expected one")
    kd = os.path.dirname(found[0])
    archive = subprocess.run(["git", "archive", rev, kd], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)
    return os.path.join(dest, kd)


def inlined(kdir: str, name: str) -> str:
    def read(fname):
        with open(os.path.join(kdir, fname), encoding="utf-8") as f:
            return f.read()
    return _LOCAL_INCLUDE.sub(lambda m: read(m.group(1)), read(f"{name}.cu"))


def tag(defines: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(defines.items())) or "-"


def build(kdir: str, name: str, defines: dict, out_dir: str) -> str | None:
    """The cubin path, or None when the source does not compile with these defines."""
    src = os.path.join(out_dir, f"{name}.{tag(defines)}.cu")
    with open(src, "w", encoding="utf-8") as f:
        f.write(inlined(kdir, name))
    cubin = src[:-3] + ".cubin"
    cmd = ["nvcc", "-cubin", f"-arch={ARCH}", *NVCC_OPTIONS, *(f"-D{k}={v}" for k, v in sorted(defines.items())),
           "-o", cubin, src]
    r = subprocess.run(cmd, capture_output=True, text=True)
    return cubin if r.returncode == 0 else None


def sass_by_function(cubin: str) -> dict:
    tool = os.environ.get("CUOBJDUMP", "cuobjdump")
    text = subprocess.run([tool, "-sass", cubin], check=True, capture_output=True, text=True).stdout
    funcs, cur = {}, None
    for line in text.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            cur = m.group(1)
            funcs[cur] = []
        elif cur is not None and line.strip():
            funcs[cur].append(" ".join(line.split()))  # the listing's column widths vary per file
    return funcs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rev_a")
    ap.add_argument("rev_b")
    ap.add_argument("--keep", help="build here and keep the sources and cubins")
    args = ap.parse_args()
    root = args.keep or tempfile.mkdtemp(prefix="cubins-")
    dirs = {}
    for side, rev in (("a", args.rev_a), ("b", args.rev_b)):
        d = os.path.join(root, side)
        os.makedirs(d, exist_ok=True)
        dirs[side] = (export(rev, d), d)
    names = sorted({f[:-3] for kd, _ in dirs.values() for f in os.listdir(kd) if f.endswith(".cu")})
    same_all = True
    for name in names:
        for defines in BUILDS.get(name, [{}]):
            label = f"{name}.cu [{tag(defines)}]"
            cub = {}
            for side, (kd, d) in dirs.items():
                has = os.path.exists(os.path.join(kd, f"{name}.cu"))
                cub[side] = build(kd, name, defines, d) if has else None
            if cub["a"] is None or cub["b"] is None:
                which = "both" if cub["a"] is cub["b"] is None else ("a" if cub["a"] is None else "b")
                print(f"{label}: absent in {which} (no such file, or it does not build with these defines)")
                continue
            with open(cub["a"], "rb") as fa, open(cub["b"], "rb") as fb:
                if fa.read() == fb.read():
                    print(f"{label}: cubin identical")
                    continue
            sa, sb = sass_by_function(cub["a"]), sass_by_function(cub["b"])
            parts = []
            for fn in sorted(set(sa) | set(sb)):
                if fn not in sb:
                    parts.append(f"{fn} removed")
                elif fn not in sa:
                    parts.append(f"{fn} added")
                elif sa[fn] != sb[fn]:
                    parts.append(f"{fn} SASS DIFFERS")
                    same_all = False
            kept_same = [fn for fn in sa if fn in sb and sa[fn] == sb[fn]]
            print(f"{label}: cubin differs; SASS equal for {len(kept_same)} kept function(s)"
                  + (f"; {'; '.join(parts)}" if parts else ""))
    print("every kernel present in both: SASS identical" if same_all
          else "some kernel present in both has different SASS (listed above)")
    return 0 if same_all else 1


if __name__ == "__main__":
    sys.exit(main())
