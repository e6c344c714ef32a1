#!/usr/bin/env python3
"""Compile the CUDA kernels of two trees the way the fast path builds them and compare them
kernel by kernel: each kernel's PTX body first, then, where the PTX is equal, the cubin that
ptxas makes of that kernel alone. A kernel edit that should change no instruction (a dead form
removed, a file split) is checked this way without a GPU.

    python3 -m dev.compare_cubins --base REV [--new REV] [--cache DIR] [--jobs N] [--no-cubin]

--base is a git revision; --new one too (or a folder holding a tree), or the working tree when
absent. The (module, defines)
pairs are the new tree's fast-path and gate builds (strata_prefill.fast.cuda.build_list.default_modules()
and strata_prefill.verify.cases.ahead_modules(), read in that tree); each is compiled in both trees with the
new tree's nvcc options (fast/cuda/runtime.py NVCC_OPTIONS) for runtime.DEFAULT_ARCH (a file of
one architecture's own instructions for its target, fast/cuda/kernel_paths.py ARCH_SPECIFIC). A module
the base lacks is looked up under its earlier name (RENAMES, or --rename NEW=OLD); kernels are
matched by name. Labels and local depots carry the function's index in its module, so they are
numbered afresh per kernel before the bodies are compared. Builds and cubins are kept in the
cache folder, keyed by source and options, so a second run against one base compiles only
what changed. Prints one row per (module, defines, kernel); exits 1 if a kernel present in
both trees differs in PTX, or its cubin differs though the PTX is equal. Needs git, nvcc and
ptxas; no GPU.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: new module name -> the module that held its kernels before (file splits)
RENAMES: dict[str, str] = {"attention_pair": "attention_mma", "attention_split": "attention_mma"}

# Run inside a tree: its build list, nvcc options, architecture and every kernel source (headers inlined).
_PROBE = r"""
import importlib, json, os, sys
sys.path.insert(0, os.getcwd())  # the tree's own packages, before any installed copy
# a tree from before the one installed name imports its rooms by their folders' names (an
# installed strata_prefill would otherwise answer for them with its own, newer sources)
top = "strata_prefill." if os.path.isdir("contract") else ""
runtime = importlib.import_module(top + "fast.cuda.runtime")
try:
    default_modules = importlib.import_module(top + "fast.cuda.build_list").default_modules
except ImportError:  # a tree from before the build list left fast/cuda/kernel_cache.py
    default_modules = importlib.import_module(top + "fast.cuda.kernel_cache").default_modules
mods = default_modules()
try:
    mods += importlib.import_module(top + "verify.cases").ahead_modules()
except ImportError:
    pass
names = sorted(f[:-3] for f in os.listdir(runtime.KERNEL_DIR) if f.endswith(".cu"))
mods = [(n, d) for i, (n, d) in enumerate(mods) if (n, d) not in mods[:i]]  # each once, in order
# each file's nvcc target (an sm_90a file: kernel_paths.target_arch; a tree from before it: the arch)
target = getattr(importlib.import_module(top + "fast.cuda.kernel_paths"), "target_arch", lambda n, a: a)
print(json.dumps({"modules": mods, "options": list(runtime.NVCC_OPTIONS), "arch": runtime.DEFAULT_ARCH,
                  "targets": {n: target(n, runtime.DEFAULT_ARCH) for n in names},
                  "sources": {n: runtime.kernel_source(n) for n in names}}))
"""

_ENTRY = re.compile(r"^(?:\.visible\s+|\.weak\s+)?(\.entry|\.func)\b(?:\s*\([^)]*\))?\s*([A-Za-z_$][\w$]*)", re.M)
_DECL = re.compile(r"^(?:\.visible\s+|\.extern\s+|\.weak\s+)*\.(?:global|const|shared)\b[^;=\[]*?([A-Za-z_$][\w$]*)\s*(?:\[[^\]]*\])?\s*(?:=|;)")
_LABELS = ((re.compile(r"\$L__(BB|tmp|func_begin|func_end)\d+_"), r"$L__\1_"),
           (re.compile(r"__local_depot\d+"), "__local_depot"))


def tree_of(rev: str | None, cache: str) -> str:
    """The folder of rev's files (git archive into the cache), or the working tree for None."""
    if rev is None:
        return REPO
    if os.path.isdir(rev):  # a folder holding a tree (e.g. a commit with some files over it)
        return os.path.abspath(rev)
    sha = subprocess.run(["git", "-C", REPO, "rev-parse", f"{rev}^{{commit}}"], check=True, capture_output=True,
                         text=True).stdout.strip()
    dest = os.path.join(cache, "trees", sha)
    if not os.path.isdir(dest):
        tmp = tempfile.mkdtemp(dir=os.path.join(cache, "trees"))
        archive = subprocess.run(["git", "-C", REPO, "archive", sha], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        os.rename(tmp, dest)
    return dest


def probe(tree: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRATA_")}  # the defaults, not a run's
    r = subprocess.run([sys.executable, "-c", _PROBE], cwd=tree, env=env, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"compare_cubins: reading the build list in {tree} failed:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout)


def tag(defines: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(defines.items())) or "-"


def _digest(*parts: str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode("utf-8"))
        h.update(b"\x01")
    return h.hexdigest()[:32]


def ptx(cache: str, name: str, source: str, defines: dict, options: list, arch: str) -> str | None:
    """The PTX text of source compiled with defines (cached), or None when it does not compile."""
    opts = list(options) + [f"-D{k}={v}" for k, v in sorted(defines.items())]
    key = _digest(name, source, "\0".join(opts), arch)
    out = os.path.join(cache, "ptx", f"{name}-{key}.ptx")
    if not os.path.exists(out):
        src = os.path.join(cache, "ptx", f"{name}-{key}.cu")
        with open(src, "w", encoding="utf-8") as f:
            f.write(source)
        r = subprocess.run(["nvcc", "-ptx", *opts, "-arch", arch, "-o", out + ".tmp", src], capture_output=True, text=True)
        if r.returncode:
            sys.stderr.write(f"{name} [{tag(defines)}] does not compile:\n{r.stderr[-1500:]}\n")
            return None
        os.rename(out + ".tmp", out)
    with open(out, encoding="utf-8") as f:
        return f.read()


def split(text: str) -> tuple[str, dict, dict]:
    """(header, {function name: (kind, body text)}, {declared name: line}) of one PTX module."""
    lines = text.splitlines()
    header = [ln for ln in lines if ln.startswith((".version", ".target", ".address_size"))]
    funcs, decls, i = {}, {}, 0
    while i < len(lines):
        ln = lines[i]
        m = _ENTRY.match(ln)
        if m:
            j = i
            while lines[j].strip() != "{" and not lines[j].rstrip().endswith(";"):
                j += 1
            if lines[j].rstrip().endswith(";"):  # a prototype (declaration of a .func)
                i = j + 1
                continue
            depth, k = 0, j
            while True:
                depth += lines[k].count("{") - lines[k].count("}")
                if depth == 0:
                    break
                k += 1
            funcs[m.group(2)] = (m.group(1), "\n".join(lines[i:k + 1]))
            i = k + 1
            continue
        d = _DECL.match(ln)
        if d:
            decls[d.group(1)] = ln
        i += 1
    return "\n".join(header), funcs, decls


_LOCAL_STATIC = re.compile(r"_ZZ[\w$]+")  # a function-local static (__shared__) variable's mangled name


def local_statics_renamed(text: str) -> str:
    """text with each function-local static variable renamed by its order of first appearance:
    their mangled names carry the enclosing function's signature, which a kernel body moved into
    a template changes while the code stays the same."""
    names: dict[str, str] = {}
    return _LOCAL_STATIC.sub(lambda m: names.setdefault(m.group(0), f"_ZZlocal{len(names)}"), text)


def normalized(body: str) -> str:
    for pat, rep in _LABELS:
        body = pat.sub(rep, body)
    return local_statics_renamed(body)


def standalone(header: str, funcs: dict, decls: dict, name: str) -> str:
    """A PTX module holding only function `name`, the functions it calls and the names it uses."""
    need, todo = [], [name]
    while todo:
        fn = todo.pop()
        if fn in need:
            continue
        need.append(fn)
        words = set(re.findall(r"[A-Za-z_$][\w$]*", funcs[fn][1]))
        todo += [f for f in funcs if f in words and f not in need]
    words = set(re.findall(r"[A-Za-z_$][\w$]*", "\n".join(funcs[f][1] for f in need)))
    used = [line for d, line in decls.items() if d in words]
    return local_statics_renamed("\n".join([header, *used, *(funcs[f][1] for f in reversed(need))]) + "\n")


def cubin(cache: str, side: str, text: str, options: list, arch: str) -> bytes | None:
    """ptxas's cubin of one standalone PTX module; side keeps each tree's build apart."""
    fmad = [o for o in options if o.startswith("--fmad")]
    key = _digest(side, text, "\0".join(fmad), arch)
    out = os.path.join(cache, "cubin", f"{key}.cubin")
    if not os.path.exists(out):
        src = out[:-6] + ".ptx"
        with open(src, "w", encoding="utf-8") as f:
            f.write(text)
        r = subprocess.run(["ptxas", f"-arch={arch}", *fmad, "-o", out + ".tmp", src], capture_output=True, text=True)
        if r.returncode:
            sys.stderr.write(f"ptxas failed on {src}:\n{r.stderr[-1500:]}\n")
            return None
        os.rename(out + ".tmp", out)
    with open(out, "rb") as f:
        return f.read()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="git revision to compare against")
    ap.add_argument("--new", help="git revision or a tree's folder (default: the working tree)")
    ap.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "strata-compare-cubins"),
                    help="folder for trees, PTX and cubins (kept between runs)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--no-cubin", action="store_true", help="compare PTX only")
    ap.add_argument("--rename", action="append", default=[], metavar="NEW=OLD",
                    help="the base's name of a module the new tree renamed")
    ap.add_argument("--only", action="append", default=[], metavar="MODULE", help="compare these modules only")
    args = ap.parse_args()
    renames = dict(RENAMES, **dict(r.split("=", 1) for r in args.rename))
    for sub in ("trees", "ptx", "cubin"):
        os.makedirs(os.path.join(args.cache, sub), exist_ok=True)
    new, base = probe(tree_of(args.new, args.cache)), probe(tree_of(args.base, args.cache))
    options, arch = new["options"], new["arch"]
    if base["options"] != options:
        print(f"note: the base's nvcc options {base['options']} differ; both built with {options}")

    jobs, dropped, added_forms = [], [], []  # (module, defines, base module or None)
    for name, defines in new["modules"]:
        if args.only and name not in args.only:
            continue
        unused = [k for k in defines if not re.search(rf"\b{k}\b", new["sources"][name])]
        if unused:  # a build of a form the new tree removed: nothing of the new tree to compare
            dropped.append((name, defines, unused))
            continue
        old = name if name in base["sources"] else renames.get(name)
        old = old if old in base["sources"] else None
        if old is not None and (new_only := [k for k in defines if not re.search(rf"\b{k}\b", base["sources"][old])]):
            added_forms.append((name, defines, new_only))  # a form the base has no source for: nothing to compare
            continue
        jobs.append((name, defines, old))
    # the base's builds that no new build continues (same module, or one renamed from it, and defines)
    carried = {(renames.get(n, n), tag(d)) for n, d in new["modules"]} | {(n, tag(d)) for n, d in new["modules"]}
    wanted = {renames.get(o, o) for o in args.only} | set(args.only)
    gone = [(n, d) for n, d in base["modules"] if (n, tag(d)) not in carried and (not wanted or n in wanted)]

    def target(name: str) -> str:
        """The new tree's nvcc target for module name (both sides build for it)."""
        return new.get("targets", {}).get(name) or arch

    def compile_pair(job):
        name, defines, old = job
        a = ptx(args.cache, old, base["sources"][old], defines, options, target(name)) if old else None
        b = ptx(args.cache, name, new["sources"][name], defines, options, target(name))
        return a, b

    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        built = list(pool.map(compile_pair, jobs))

    # a base module split in several (RENAMES): the kernels each new module holds, so that one
    # missing from a part is shown as moved to its sibling, not as removed
    held: dict = {}
    for (name, _defines, _old), (_a, b) in zip(jobs, built):
        if b is not None:
            held.setdefault(name, set()).update(split(b)[1])

    def moved_to(fn: str, name: str, old: str | None) -> str | None:
        return next((m for m in sorted(held) if m != name and (renames.get(m, m) == old or m == old)
                     and fn in held[m]), None)

    rows, checks = [], []
    for (name, defines, old), (a, b) in zip(jobs, built):
        label = name if old in (None, name) else f"{name} (base {old})"
        if b is None:
            rows.append([label, tag(defines), "-", "NEW DOES NOT COMPILE"])
            continue
        if a is None:
            rows.append([label, tag(defines), "-", "absent in base" if old is None else "BASE DOES NOT COMPILE"])
            continue
        ha, fa, da = split(a)
        hb, fb, db = split(b)
        for fn in sorted(set(fa) | set(fb)):
            if fn not in fb:
                sibling = moved_to(fn, name, old)
                if sibling is not None:
                    continue  # compared in the build of the module it moved to
                rows.append([label, tag(defines), fn, "removed"])
            elif fn not in fa:
                rows.append([label, tag(defines), fn, "added"])
            else:
                same = normalized(fa[fn][1]) == normalized(fb[fn][1])
                rows.append([label, tag(defines), fn, "same" if same else "DIFFERENT"])
                if same and not args.no_cubin:
                    checks.append((len(rows) - 1, standalone(ha, fa, da, fn), standalone(hb, fb, db, fn), target(name)))
        for d in sorted(set(da) & set(db)):
            if da[d] != db[d]:
                rows.append([label, tag(defines), d, "DIFFERENT (declaration)"])

    def assemble(check):
        i, ta, tb, tgt = check
        return i, cubin(args.cache, "base", ta, options, tgt), cubin(args.cache, "new", tb, options, tgt)

    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        for i, ca, cb in pool.map(assemble, checks):
            if ca is None or cb is None:
                rows[i][3] = "same PTX, PTXAS FAILED"
            elif ca == cb:
                rows[i][3] = "same (PTX and cubin)"
            else:
                rows[i][3] = "same PTX, CUBIN DIFFERENT"

    widths = [max(len(r[c]) for r in rows + [["module", "defines", "kernel", "result"]]) for c in range(4)]
    for r in [["module", "defines", "kernel", "result"]] + rows:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip())
    for n, d, unused in dropped:
        print(f"not compared: {n} [{tag(d)}] (the new source no longer reads {', '.join(unused)}: a removed form)")
    for n, d in gone:
        print(f"base build with no new build of the same defines: {n} [{tag(d)}]")
    for n, d, new_only in added_forms:
        print(f"added form: {n} [{tag(d)}] (the base reads no {', '.join(new_only)})")
    bad = [r for r in rows if any(w in r[3] for w in ("DIFFERENT", "FAILED", "NOT COMPILE"))]
    compared = [r for r in rows if r[3].startswith(("same", "DIFFERENT"))]
    print(f"{len(compared)} kernel builds compared in {len(jobs)} module builds: "
          + ("all same" if not bad else f"{len(bad)} DIFFERENT or failed (above)"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
