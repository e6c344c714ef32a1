"""Every PyCUDA argument format the host code prepares a kernel with is that kernel's C signature
(fast/cuda/signatures.py), checked without a GPU.

The launch sites are found in the source with ``ast``: each ``X.prepare(FMT)`` whose X came from
``MOD.get_function(NAME)`` (MOD from ``load_module(MODULE, ...)``), and, through them, each call
of a function that passes its own parameters on as module, kernel or format (``runtime.function``
is one: its ``f.prepare(fmt)`` has all three from its parameters; attention's ``_split_func``
another, over ``runtime.function``). Arguments resolve when they are string literals, sums and products of
literals and module constants (``"P" * MMQ_GROUP + "iqqqPP"``), one of a module-level dict's
values, or f-strings, which stand for every kernel of the module their pattern matches
(``f"attend_pair_hd{hd}"``: attend_pair_hd64, attend_pair_hd128). A site whose module, kernel or
format does not resolve must be in DYNAMIC, which supplies exactly what is missing; an entry with
no such site left fails, so the table cannot go stale.
"""
from __future__ import annotations

import ast
import importlib
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from strata_prefill.fast.cuda import runtime, signatures
from strata_prefill.contract import qformats

ROOT = Path(__file__).resolve().parent.parent
KERNELS = Path(runtime.KERNEL_DIR)
PY_FILES = sorted([*ROOT.glob("fast/cuda/*.py"), *ROOT.glob("bench/*.py"), *ROOT.glob("verify/*.py")])

#: (python file, function) of a launch site that does not resolve statically -> what it misses:
#: "module" (a kernel file's name), "kernel" (its kernel names), "fmt" (the format) or "source"
#: (the module-level constant of that python file holding the CUDA source it compiles, in place of
#: "module"); "via": the attribute the site reads its kernel names from (then the file need not
#: spell them)
DYNAMIC = {
    # the module object is passed around in a state dict; the kernel names are the registry's
    # (read through the attribute "via" names, not written in the file)
    ("fast/cuda/products.py", "_mmq_func"): {
        "module": "mmq", "kernel": tuple(f.mmq_kernel for f in qformats.formats() if f.mmq_kernel),
        "via": "mmq_kernel",
        # the format is the letters of the kernel's parameters, read from its C signature
        # (test_mmq_launches_pass_every_parameter_by_name checks what is packed into it)
        "fmt": signatures.expected_format("mmq", "mmq_q8_0")},
    # the token embedding: one kernel a token_embd type, named by the registry (as the MMQ kernels)
    ("fast/cuda/elementwise.py", "embed"): {
        "kernel": tuple(f.embed_kernel for f in qformats.formats() if f.embed_kernel), "via": "embed_kernel"},
    # a module compiled from the file's own source text, passed in as an argument
    ("bench/bench_mmq_cuda.py", "__init__"): {"source": "PEAK_SRC"},
    ("bench/bench_mmq_cuda.py", "measure_peak"): {"source": "PEAK_SRC", "kernel": ("peak_k32", "peak_k16")},
}


# ------------------------------------------------------------------------------ resolving values

@dataclass(frozen=True)
class Known:
    values: frozenset


@dataclass(frozen=True)
class Pattern:
    regex: str  # an f-string: its literal parts, each replaced field one [A-Za-z0-9]+
    text: str


@dataclass(frozen=True)
class Param:
    name: str  # a parameter of the enclosing function: its callers say the value


class PyFile:
    def __init__(self, path: Path):
        self.path = path
        self.rel = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name
        self.text = path.read_text()
        self.tree = ast.parse(self.text)
        self.parent: dict = {}
        for node in ast.walk(self.tree):
            for child in ast.iter_child_nodes(node):
                self.parent[child] = node
        self.constants = {}
        self.imports = {}
        for node in self.tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                self.constants[node.targets[0].id] = node.value
            elif isinstance(node, ast.ImportFrom) and node.module:
                for a in node.names:
                    self.imports[a.asname or a.name] = (node.module, a.name)
        self.strings = {n.value for n in ast.walk(self.tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}

    def function_of(self, node):
        while node in self.parent:
            node = self.parent[node]
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return node
        return None

    def assignments(self, fn, target: str) -> list:
        scope = fn if fn is not None else self.tree
        found = []
        for node in ast.walk(scope):
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    if ast.unparse(t) == target:
                        found.append(node.value)
        return found


def params_of(fn) -> list[str]:
    if fn is None:
        return []
    a = fn.args
    return [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]


def resolve(pf: PyFile, fn, node, depth: int = 0):
    """Known / Pattern / Param, or None where it does not resolve."""
    if depth > 8:
        return None
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, int)):
        return Known(frozenset([node.value]))
    if isinstance(node, ast.JoinedStr):
        parts, known = [], True
        for v in node.values:
            if isinstance(v, ast.Constant):
                parts.append(re.escape(v.value))
            else:
                parts.append("[A-Za-z0-9]+")
                known = False
        if known:
            return Known(frozenset(["".join(v.value for v in node.values)]))
        return Pattern("".join(parts), ast.unparse(node))
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
        a, b = resolve(pf, fn, node.left, depth + 1), resolve(pf, fn, node.right, depth + 1)
        if not (isinstance(a, Known) and isinstance(b, Known)):
            return None
        if isinstance(node.op, ast.Add):
            return Known(frozenset(x + y for x in a.values for y in b.values))
        return Known(frozenset(x * y for x in a.values for y in b.values))
    if isinstance(node, ast.Name):
        if node.id in params_of(fn):
            return Param(node.id)
        local = pf.assignments(fn, node.id) if fn is not None else []
        if len(local) == 1:
            return resolve(pf, fn, local[0], depth + 1)
        if local:
            return None
        if node.id in pf.constants:
            return resolve(pf, None, pf.constants[node.id], depth + 1)
        if node.id in pf.imports and pf.imports[node.id][0].split(".")[:2] in (["strata_prefill", "contract"], ["strata_prefill", "formats"]):
            mod, name = pf.imports[node.id]
            value = getattr(importlib.import_module(mod), name, None)
            if isinstance(value, (str, int)):
                return Known(frozenset([value]))
        return None
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
        table = pf.constants.get(node.value.id)
        if isinstance(table, ast.Dict):  # any of its values, for a key known only at run time
            got = [resolve(pf, None, v, depth + 1) for v in table.values]
            if all(isinstance(g, Known) for g in got):
                return Known(frozenset().union(*(g.values for g in got)))
    return None


def is_call_to(node, name: str) -> bool:
    f = node.func if isinstance(node, ast.Call) else None
    return (isinstance(f, ast.Name) and f.id == name) or (isinstance(f, ast.Attribute) and f.attr == name)


# ------------------------------------------------------------------------------ the launch sites

@dataclass
class Site:
    pf: PyFile
    line: int
    fn: object
    roles: dict = field(default_factory=dict)  # "module" / "kernel" / "fmt" -> Known | Pattern | Param | None

    @property
    def function(self) -> str:
        return self.fn.name if self.fn is not None else "<module>"

    @property
    def where(self) -> str:
        return f"{self.pf.rel}:{self.line} ({self.function})"

    def is_wrapper(self) -> bool:
        vals = self.roles.values()
        return all(v is not None for v in vals) and any(isinstance(v, Param) for v in vals)


def prepare_sites(pf: PyFile) -> list[Site]:
    """The ``X.prepare(FMT)`` calls (one positional argument: PyCUDA's; strata_prefill.contract.mmq.prepare and the
    stress mode's take other arguments) and the kernel and module X came from."""
    out = []
    for node in ast.walk(pf.tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "prepare"
                and len(node.args) == 1 and not node.keywords):
            continue
        fn = pf.function_of(node)
        site = Site(pf, node.lineno, fn, {"module": None, "kernel": None, "fmt": resolve(pf, fn, node.args[0])})
        receiver = ast.unparse(node.func.value)
        for value in pf.assignments(fn, receiver)[-1:]:
            gf = next((c for c in ast.walk(value) if isinstance(c, ast.Call) and is_call_to(c, "get_function")), None)
            if gf is None:
                continue
            site.roles["kernel"] = resolve(pf, fn, gf.args[0])
            mod = gf.func.value
            if isinstance(mod, ast.Name):
                got = pf.assignments(fn, mod.id)
                mod = got[-1] if len(got) == 1 else mod
            if isinstance(mod, ast.Call) and is_call_to(mod, "load_module"):
                site.roles["module"] = resolve(pf, fn, mod.args[0])
        out.append(site)
    return out


def wrapper_calls(files: list[PyFile], wrapper: Site) -> list[Site]:
    """The calls of the function around ``wrapper`` (a site whose roles are its parameters), each
    a site with those parameters' arguments resolved in the caller."""
    fn, home = wrapper.fn, wrapper.pf
    names = params_of(fn)
    defaults = dict(zip(names[len(names) - len(fn.args.defaults):], fn.args.defaults)) if fn.args.defaults else {}
    module_stem = home.path.stem
    out = []
    for pf in files:
        imported = pf.imports.get(fn.name, (None, None))[1] == fn.name
        for node in ast.walk(pf.tree):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            if isinstance(f, ast.Name):
                if f.id != fn.name or not (pf is home or imported):
                    continue
            elif isinstance(f, ast.Attribute):
                if f.attr != fn.name or not (isinstance(f.value, ast.Name) and f.value.id == module_stem):
                    continue
            else:
                continue
            caller = pf.function_of(node)
            if caller is fn:
                continue
            bound = dict(zip(names, node.args))
            bound.update({k.arg: k.value for k in node.keywords if k.arg})
            roles = {}
            for role, v in wrapper.roles.items():
                if isinstance(v, Param):
                    arg = bound.get(v.name)
                    if arg is None:
                        roles[role] = resolve(home, None, defaults[v.name]) if v.name in defaults else None
                    else:
                        roles[role] = resolve(pf, caller, arg)
                else:
                    roles[role] = v
            out.append(Site(pf, node.lineno, caller, roles))
    return out


def all_sites(paths) -> tuple[list[Site], list[Site]]:
    """(launch sites, wrappers) in the python files ``paths``: every prepare call, and every call
    of a function that hands its parameters on to one, followed until nothing new turns up."""
    files = [PyFile(p) for p in paths]
    todo = [s for pf in files for s in prepare_sites(pf)]
    sites, wrappers, seen = [], [], set()
    while todo:
        s = todo.pop()
        key = (s.pf.rel, s.line, s.function)
        if key in seen:
            continue
        seen.add(key)
        if s.is_wrapper():
            wrappers.append(s)
            todo.extend(wrapper_calls(files, s))
        else:
            sites.append(s)
    return sorted(sites, key=lambda s: (s.pf.rel, s.line)), wrappers


SITES, WRAPPERS = all_sites(PY_FILES)


@dataclass(frozen=True)
class Case:
    where: str
    label: str           # "kv_cache.cu", or "bench/bench_mmq_cuda.py:PEAK_SRC"
    found: dict          # the kernels of that module, by name
    kernel: str | None   # None: the site's name matches no kernel (the case fails)
    fmt: str
    wanted: str          # the site's kernel argument as written, for the message

    @property
    def id(self) -> str:
        return f"{self.where.split(' ')[0]}:{self.kernel or self.wanted}"


def source_kernels(pf: PyFile, constant: str) -> dict:
    node = pf.constants[constant]
    assert isinstance(node, ast.Constant) and isinstance(node.value, str), f"{pf.rel}: {constant} is not a string"
    return signatures.parse_source(node.value, f"{pf.rel}:{constant}")


def cases_of(site: Site) -> list[Case]:
    roles = dict(site.roles)
    extra = DYNAMIC.get((site.pf.rel, site.function), {})
    if "kernel" in extra:
        roles["kernel"] = Known(frozenset(extra["kernel"]))
    if "module" in extra:
        roles["module"] = Known(frozenset([extra["module"]]))
    if "fmt" in extra:
        roles["fmt"] = Known(frozenset([extra["fmt"]]))
    if "source" in extra:
        modules = [(f"{site.pf.rel}:{extra['source']}", source_kernels(site.pf, extra["source"]))]
    else:
        assert isinstance(roles["module"], Known), f"{site.where}: module unresolved"
        modules = [(f"{m}.cu", signatures.kernels(m)) for m in sorted(roles["module"].values)]
    assert isinstance(roles["fmt"], Known), f"{site.where}: format unresolved"
    out = []
    for label, found in modules:
        for fmt in sorted(roles["fmt"].values):
            k = roles["kernel"]
            if isinstance(k, Pattern):
                names = sorted(n for n in found if re.fullmatch(k.regex, n))
                wanted = k.text
            else:
                assert isinstance(k, Known), f"{site.where}: kernel unresolved"
                names, wanted = sorted(k.values), " / ".join(sorted(k.values))
            out.extend(Case(site.where, label, found, n, fmt, wanted) for n in names or [None])
    return out


def is_dynamic(site: Site) -> bool:
    return any(v is None for v in site.roles.values())


def all_cases(sites: list[Site]) -> list[Case]:
    return [c for s in sites if not is_dynamic(s) or (s.pf.rel, s.function) in DYNAMIC for c in cases_of(s)]


CASES = all_cases(SITES)


# ------------------------------------------------------------------------------ the checks

@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_format_is_the_kernels_signature(case):
    assert case.kernel is not None, f"{case.where}: {case.wanted} names no kernel of {case.label}"
    assert case.kernel in case.found, (f"{case.where}: {case.label} has no kernel {case.kernel} "
                                       f"(it has {', '.join(sorted(case.found))})")
    signatures.check_kernel(case.found[case.kernel], case.fmt, case.label)


def test_the_sites_are_found():
    # the wrappers the launch paths go through, and enough sites that the scan is not vacuous
    assert {(w.pf.rel, w.function) for w in WRAPPERS} >= {
        ("fast/cuda/runtime.py", "function"), ("fast/cuda/attention.py", "_split_func"),
        ("verify/test_kernels_cuda.py", "_probe")}
    assert len(CASES) >= 40
    # the f-strings of the tile kernels expand to both files and head dims, from the .cu
    tile = {c.kernel for c in CASES if c.where.startswith("fast/cuda/attention.py") and "_hd" in (c.kernel or "")
            and "split" not in c.kernel}
    assert tile == {f"attend_{v}{o}_hd{hd}" for v in ("pair", "wgmma") for o in ("", "_sinks_window") for hd in (64, 128)}


def test_every_kernel_has_a_checked_launch():
    launched = {(c.label, c.kernel) for c in CASES}
    for cu in sorted(KERNELS.glob("*.cu")):
        for name in signatures.kernels(cu.stem):
            assert (cu.name, name) in launched, (
                f"{cu.name}: kernel {name} has no launch site this test resolves: launch it through "
                "runtime.function, or add its site to DYNAMIC")


def test_every_unresolved_site_is_in_the_table():
    for s in SITES:
        missing = {r for r, v in s.roles.items() if v is None}
        if not missing:
            continue
        entry = DYNAMIC.get((s.pf.rel, s.function))
        assert entry is not None, f"{s.where}: {', '.join(sorted(missing))} unresolved: add it to DYNAMIC"
        supplied = {"module" if k == "source" else k for k in entry if k != "via"}
        assert supplied == missing, f"{s.where}: DYNAMIC supplies {sorted(supplied)}, the site lacks {sorted(missing)}"


@pytest.mark.parametrize("key", sorted(DYNAMIC), ids=lambda k: f"{k[0]}:{k[1]}")
def test_table_entries_still_exist(key):
    rel, function = key
    at = [s for s in SITES if (s.pf.rel, s.function) == key and is_dynamic(s)]
    assert at, f"{rel} has no unresolved launch site in {function} any more: drop it from DYNAMIC"
    pf = at[0].pf
    entry = DYNAMIC[key]
    via = entry.get("via")
    if via is not None:
        assert re.search(rf"\.{via}\b", pf.text), f"{rel} no longer reads .{via}"
    for name in (entry.get("module"), *(() if via else entry.get("kernel", ()))):
        if name is not None:
            assert name in pf.strings, f"{rel} no longer mentions {name!r}"
    if "source" in entry:
        assert entry["source"] in pf.constants, f"{rel} has no constant {entry['source']}"


def test_kernel_signatures_do_not_depend_on_defines():
    # the sites are checked with each file's default defines; a signature under an #if would
    # need each configuration's defines checked as well. The one #if allowed picks which of
    # mmq.cu's kernels a build holds (MMQ_ONLY, one module a type): the signature it declares is
    # the one the build without it declares
    for cu in sorted(KERNELS.glob("*.cu")):
        for k in signatures.kernels(cu.stem).values():
            if cu.stem == "mmq" and all("MMQ_ONLY" in c for c in k.conditions):
                fmt = next(f for f in qformats.formats() if f.mmq_kernel == k.name)
                alone = signatures.kernels("mmq", {"MMQ_ONLY": int(fmt.qtype)})
                assert sorted(alone) == [k.name] and alone[k.name].params == k.params, k.name
                continue
            assert not k.conditions, f"{k.where}: kernel {k.name} is declared under {k.conditions}"


# ------------------------------------------------------------------------------ the checker itself

def plant(tmp_path: Path, module: str, old: str, new: str) -> Path:
    """A copy of the kernel folder in tmp_path with one edit of <module>.cu (or of the header
    <module>, a name ending .cuh)."""
    folder = tmp_path / "kernels"
    shutil.copytree(KERNELS, folder)
    cu = folder / (module if module.endswith(".cuh") else f"{module}.cu")
    text = cu.read_text()
    assert text.count(old) == 1, f"{cu.name}: {old!r} is not there once"
    cu.write_text(text.replace(old, new))
    return folder


def test_planted_parameter_change_is_caught(tmp_path):
    fmt = "PqPqPiiiiPPPPP"
    signatures.check("kv_cache", "kv_write", fmt)
    folder = plant(tmp_path, "kv_cache", "int n_kv, int hd, int capacity,\n", "int n_kv, int hd, long long capacity,\n")
    assert signatures.expected_format("kv_cache", "kv_write", kernel_dir=str(folder)) == "PqPqPiiiqPPPPP"
    with pytest.raises(ValueError) as e:
        signatures.check("kv_cache", "kv_write", fmt, kernel_dir=str(folder))
    msg = str(e.value)
    for part in ("kv_cache.cu", "kv_write", "long long capacity", "position 8", "kv_write(const float*"):
        assert part in msg, msg


def test_planted_change_in_a_kernel_macro_is_caught(tmp_path):
    fmt = "PqPiiPPPPPifPq"
    # the macro the prefill kernel is declared by lives in the attention kernels' shared header
    folder = plant(tmp_path, "attention_common.cuh", "int cap, float kq2, float* __restrict__ out, long long ldo)  ",
                   "unsigned cap, float kq2, float* __restrict__ out, long long ldo)")
    for module, name in (("attention_pair", "attend_pair_hd64"), ("attention_pair", "attend_pair_hd128")):
        with pytest.raises(ValueError, match=rf"{module}\.cu: kernel {name} .*position 10 .*'I' for parameter 'unsigned cap'"):
            signatures.check(module, name, fmt, kernel_dir=str(folder))
    signatures.check("attention_split", "attend_split_scores_hd64", "PqPiiiPPifiPP", kernel_dir=str(folder))


def test_a_changed_format_is_caught():
    with pytest.raises(ValueError, match=r"rope\.cu: kernel rope_neox .*position 9 .*nothing \(the format ends\)"):
        signatures.check("rope", "rope_neox", "PqPqPPPii")
    with pytest.raises(ValueError, match=r"position 0 .*'Q', the signature 'q' for parameter 'long long cycles'"):
        signatures.check("spin", "spin", "Q")
    with pytest.raises(ValueError, match=r"field 15 of its 16"):
        signatures.check("gather_group", "gather_native_group", "P" * 15 + "iqqqPP")
    with pytest.raises(ValueError, match=r"has no extern \"C\" __global__ kernel nope"):
        signatures.check("spin", "nope", "q")
    signatures.check("gather_group", "gather_native_group", "16Piqqq2P")  # struct counts are letters


PLANTED_CALLER = '''
from strata_prefill.fast.cuda import runtime


def _rope(name, fmt):
    return runtime.function("rope", name, fmt)


def launch(what):
    _rope("rope_neox", "PqPqPPPii")
    runtime.function("kv_cache", "v_transpose", "PiiiqP"[:what])
    return runtime.function("kv_cache", f"kv_{what}", "P" * 1 + "qPqPiiiiPPPPP")
'''


def test_planted_format_change_in_a_caller_is_caught(tmp_path):
    caller = tmp_path / "caller.py"
    caller.write_text(PLANTED_CALLER)
    sites, wrappers = all_sites([ROOT / "fast/cuda/runtime.py", caller])
    assert {(w.pf.rel, w.function) for w in wrappers} == {("fast/cuda/runtime.py", "function"), ("caller.py", "_rope")}
    cases = {c.kernel: c for c in all_cases(sites)}
    assert sorted(cases) == ["kv_write", "rope_neox"]  # the f-string matched against kv_cache.cu
    signatures.check_kernel(cases["kv_write"].found["kv_write"], cases["kv_write"].fmt, "kv_cache.cu")
    assert cases["rope_neox"].where.startswith("caller.py:10 (launch)")
    # a format that does not resolve is left to DYNAMIC (test_every_unresolved_site_is_in_the_table)
    assert [s.where for s in sites if is_dynamic(s)] == ["caller.py:11 (launch)"]
    with pytest.raises(ValueError, match=r"rope_neox .*position 9"):
        signatures.check_kernel(cases["rope_neox"].found["rope_neox"], cases["rope_neox"].fmt, "rope.cu")


def test_runtime_checks_before_it_compiles():
    # the wrong format fails on the CPU, before PyCUDA is asked for anything
    with pytest.raises(ValueError, match="kv_write"):
        runtime.function("kv_cache", "kv_write", "PqPqPiiiPPPPP")


CONDITIONAL = r'''
#include <stdint.h>
#include "kinds.cuh"
#ifndef WIDE
#define WIDE 0  // the default, as the kernel files write theirs
#endif
#define TWO 2
// extern "C" __global__ void commented(int x) {}
/* extern "C" __global__ void block_commented(int x) {} */
struct Pair { const float* p[TWO]; unsigned n; };
typedef unsigned long long u64;
#if (TWO * 3 - 1) / 2 == 2 && !(TWO > 2) && (0x10 | 010) == 24 && -7 / 2 == -3
extern "C" __global__ void arith(int ok) {}
#else
extern "C" __global__ void arith(float bad) {}
#endif
extern "C" __global__ void __launch_bounds__(32 * TWO, 1) k(const float* __restrict__ x,
#if WIDE == 1
    long long n,
#elif defined(HALF) && !defined(WIDE_TOO)
    short n,
#else
    int n,
#endif
    Pair pair, u64 big, size_t s, uint8_t b, double d, KIND_T t, float* ys[])
{
    const char* s2 = "extern \"C\" __global__ void in_a_string(int)";
}
__global__ void mangled(int x) {}
extern "C" {
__global__ void in_block(unsigned a, unsigned long b, signed char c) {}
}
#define ENTRY(SUFFIX, T) extern "C" __global__ void entry_##SUFFIX(const T* w, T v) {}
ENTRY(f32, float)
ENTRY(i64, int64_t)
'''


def test_preprocessing(tmp_path):
    (tmp_path / "cond.cu").write_text(CONDITIONAL)
    (tmp_path / "kinds.cuh").write_text("#ifndef KINDS\n#define KINDS\n#define KIND_T int16_t\n#endif\n")
    d = str(tmp_path)
    tail = "PPIQQBdhP"
    assert signatures.expected_format("cond", "k", kernel_dir=d) == "Pi" + tail
    assert signatures.expected_format("cond", "k", {"WIDE": 1}, kernel_dir=d) == "Pq" + tail
    assert signatures.expected_format("cond", "k", {"HALF": 1}, kernel_dir=d) == "Ph" + tail
    got = signatures.kernels("cond", kernel_dir=d)
    assert sorted(got) == ["arith", "entry_f32", "entry_i64", "in_block", "k"]
    assert got["arith"].format == "i"  # C's integer arithmetic, octal and hex
    assert got["in_block"].format == "IQb"
    assert got["entry_f32"].format == "Pf" and got["entry_i64"].format == "Pq"
    assert got["entry_i64"].macro == "ENTRY" and got["entry_i64"].line == CONDITIONAL.split("\n").index("ENTRY(i64, int64_t)") + 1
    assert got["k"].params[1].name == "n" and got["k"].params[8].name == "ys"
    assert [c.split(": ", 1)[1] for c in got["k"].conditions] == ["#if WIDE == 1"]  # not #ifndef WIDE
    assert got["entry_f32"].conditions == ()
    with pytest.raises(ValueError, match="position 1"):
        signatures.check("cond", "k", "Pq" + tail, kernel_dir=d)
    (tmp_path / "bad.cu").write_text('struct S { int4 v; };\nextern "C" __global__ void k(S s) {}\n')
    with pytest.raises(ValueError, match="no known PyCUDA letter"):
        signatures.kernels("bad", kernel_dir=d)


def test_list_macros_and_generated_headers(tmp_path, monkeypatch):
    """A list macro applied to a kernel macro declares its kernels (mmq.cu's MMQ_KERNELS), and a
    header fast/cuda/generated.py writes is read as that text, no file, and read again when it
    changes."""
    from strata_prefill.fast.cuda import generated

    text = "#define LIST(X) X(a, int) X(b, float)\n"
    monkeypatch.setitem(generated.HEADERS, "list.cuh", lambda: text)
    (tmp_path / "lst.cu").write_text('#include "list.cuh"\n'
                                     '#define ENTRY(N, T) extern "C" __global__ void k_##N(T* p, T v) {}\n'
                                     "LIST(ENTRY)\n")
    got = signatures.kernels("lst", kernel_dir=str(tmp_path))
    assert {n: k.format for n, k in got.items()} == {"k_a": "Pi", "k_b": "Pf"}
    assert got["k_b"].line == 3 and got["k_b"].macro == "ENTRY"
    text = "#define LIST(X) X(a, long long)\n"
    assert {n: k.format for n, k in signatures.kernels("lst", kernel_dir=str(tmp_path)).items()} == {"k_a": "Pq"}


# ------------------------------------------------------------------------------ MMQ's arguments

def test_mmq_launches_pass_every_parameter_by_name():
    """Each MMQ launch in products.py names every parameter of the kernels' C signature, and no
    other, and the names are packed in the signature's order; the packer refuses a missing or an
    unknown name in one line."""
    from strata_prefill.fast.cuda import products
    from strata_prefill.contract.errors import InputError

    kernels = [f.mmq_kernel for f in qformats.formats() if f.mmq_kernel]
    found = signatures.kernels("mmq")
    names = [p.name for p in found[kernels[0]].params]
    assert len(names) == len(set(names)) == 17 and all(names)
    for k in kernels:
        assert [p.name for p in found[k].params] == names
        assert "".join(lt for _, lt in products._mmq_fields(k)) == found[k].format
    pf = PyFile(ROOT / "fast/cuda/products.py")
    calls = [n for n in ast.walk(pf.tree) if isinstance(n, ast.Call) and is_call_to(n, "_mmq_args")]
    assert len(calls) == 2  # the bounds form and the tile-list form
    for c in calls:
        assert sorted(k.arg for k in c.keywords) == sorted(names), ast.unparse(c)[:80]
    given = {n: i for i, n in enumerate(reversed(names))}
    assert products._mmq_args(kernels[0], **given) == tuple(given[n] for n in names)
    with pytest.raises(InputError, match=r"missing \['n_tiles'\]"):
        products._mmq_args(kernels[0], **{k: v for k, v in given.items() if k != "n_tiles"})
    with pytest.raises(InputError, match=r"unknown parameters \['W'\]"):
        products._mmq_args(kernels[0], W=0, **given)


def test_products_wrappers_are_keyword_only_past_their_inputs():
    """Every launch wrapper of products.py takes the device and at most two more arguments by
    position (a type and weights, or the rows it reads); everything else by name."""
    import inspect

    from strata_prefill.fast.cuda import products

    wrappers = [n for n in products.__all__ if callable(getattr(products, n))
                and next(iter(inspect.signature(getattr(products, n)).parameters), None) == "dev"]
    assert {"quantize_gather", "mmq_group", "mmq_tiles", "gather_native_one"} <= set(wrappers)
    for name in wrappers:
        params = inspect.signature(getattr(products, name)).parameters.values()
        positional = [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
        assert positional[0] == "dev" and len(positional) <= 3, (name, positional)
