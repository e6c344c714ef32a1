"""The layers, read from the source. Every room is installed under one name, strata_prefill:
`contract/` (strata_prefill.contract) is the base, `formats/` stands on it, `reference/` and
`fast/` stand on both side by side, the command (`strata_prefill/`) on all four and `verify/`
above it. An import that crosses these lines fails here with its file, line and module, wherever
it sits (top level, inside a function, relative, or a literal `importlib.import_module`); so does
an import of a room by its folder's name (`import fast`), which would load a second copy.

Within the layers, modules import each other at module level without a circle: a circle held
apart by an import inside a function hides which module stands on which (a shared bottom module
breaks it). A circle fails here naming its modules in order."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "strata_prefill"
# the rooms installed under PACKAGE (pyproject.toml's package-dir maps each folder)
ROOMS = ("contract", "formats", "reference", "fast", "verify")
# the folders that are not installed: run from the checkout (python3 -m bench.x)
LOOSE = ("bench", "dev", "tests")

# layer -> the layers it must never import ("cli": the command, strata_prefill/'s own modules)
FORBIDDEN = {
    "contract": {"formats", "reference", "fast", "cli", "verify", "bench", "dev"},
    "formats": {"reference", "fast", "cli", "verify", "bench", "dev"},
    "reference": {"fast", "cli", "verify", "bench", "dev"},
    "fast": {"reference", "cli", "verify", "bench", "dev"},
    "cli": {"verify", "bench", "dev"},
    "verify": {"bench", "dev"},
}


def folder_of(layer: str) -> str:
    return PACKAGE if layer == "cli" else layer


def layer_of(module: str) -> str | None:
    """The layer a module name belongs to (None: not this project's)."""
    parts = module.split(".")
    if parts[0] == PACKAGE:
        return parts[1] if len(parts) > 1 and parts[1] in ROOMS else "cli"
    return parts[0] if parts[0] in LOOSE else None


def _installed_parts(path: Path, root: Path) -> list[str]:
    """A file's module name as parts, as it is imported: a room's under PACKAGE."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return [PACKAGE] + parts if parts[0] in ROOMS else parts


def _package_of(path: Path, root: Path) -> list[str]:
    """The dotted package a module sits in, as parts (for resolving relative imports)."""
    return _installed_parts(path, root)[:-1]


def _from_module(node: ast.ImportFrom, path: Path, root: Path) -> str:
    """The absolute module of a `from X import ...` in path (relative ones resolved; "" for
    `from ... import name` above the top package)."""
    module = node.module or ""
    if node.level:
        base = _package_of(path, root)
        base = base[: max(0, len(base) - (node.level - 1))]
        module = ".".join(base + ([module] if module else []))
    return module


def imported_modules(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, absolute module name) for every import in a file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = _from_module(node, path, root)
            if module:
                found.append((node.lineno, module))
            else:  # `from ... import fast` above the top package: the names are modules
                found += [(node.lineno, alias.name) for alias in node.names]
        elif (isinstance(node, ast.Call) and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and (getattr(node.func, "attr", None) == "import_module"
                   or getattr(node.func, "id", None) in ("import_module", "__import__"))):
            found.append((node.lineno, node.args[0].value))
    return found


# the folders whose modules may not import each other in a circle
PACKAGES = (*ROOMS, PACKAGE, *LOOSE)


def _module_name(path: Path, root: Path) -> str:
    parts = _installed_parts(path, root)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _top_level_statements(body):
    """The statements a module runs when it is imported: its own, and those inside top-level
    if/try/with/for/while blocks and class bodies; not function bodies, nor `if TYPE_CHECKING:`."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from _top_level_statements(node.orelse)
            continue
        yield node
        for field in ("body", "orelse", "finalbody", "handlers"):
            inner = getattr(node, field, None)
            if isinstance(inner, list) and inner and isinstance(inner[0], (ast.stmt, ast.excepthandler)):
                yield from _top_level_statements(inner)


def module_level_imports(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, absolute name) of every import a module runs when it is imported; for
    ``from P import a, b`` P.a and P.b (a submodule, where there is one, is what it loads; else
    the name stands in P)."""
    found = []
    for node in _top_level_statements(ast.parse(path.read_text(), filename=str(path)).body):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = _from_module(node, path, root)
            for alias in node.names:
                found.append((node.lineno, f"{module}.{alias.name}" if module else alias.name))
    return found


def import_graph(root: Path = ROOT, packages=PACKAGES) -> dict[str, set[str]]:
    """module -> the project modules it imports at module level (a name that is no module of
    the project, e.g. a function imported from one, resolves to the module that holds it)."""
    paths = {_module_name(p, root): p for package in packages for p in sorted((root / package).rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        edges = set()
        for _line, target in module_level_imports(path, root):
            while target and target not in paths:  # P.function -> P
                target = target.rpartition(".")[0]
            if target and target != name:
                edges.add(target)
        graph[name] = edges
    return graph


def import_circles(root: Path = ROOT, packages=PACKAGES) -> list[list[str]]:
    """The circles of module-level imports, each as its modules in import order (the first again
    at the end): in each strongly connected set of modules, the shortest circle through each
    module that no earlier one passes."""
    graph = import_graph(root, packages)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    circles = []
    for group in groups:
        named: set[str] = set()
        for start in sorted(group):  # a circle through each module no circle named yet
            if start not in named:
                circles.append(_shortest_circle(graph, group, start))
                named.update(circles[-1])
    return sorted(circles)


def _shortest_circle(graph: dict[str, set[str]], group: set[str], start: str) -> list[str]:
    """The shortest way from start back to start through modules of group (breadth first)."""
    came: dict[str, str | None] = {start: None}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & group):
                if w == start:
                    path = [start]
                    while v is not None and v != start:
                        path.insert(1, v)
                        v = came[v]
                    return path + [start]
                if w not in came:
                    came[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"{start} is in no circle of {sorted(group)}")


def layer_violations(root: Path = ROOT) -> list[str]:
    bad = []
    for layer, forbidden in FORBIDDEN.items():
        for path in sorted((root / folder_of(layer)).rglob("*.py")):
            for line, module in imported_modules(path, root):
                if layer_of(module) in forbidden:
                    bad.append(f"{path.relative_to(root)}:{line}: {layer} imports {module}")
    return bad


def folder_imports(root: Path = ROOT) -> list[str]:
    """Imports of a room by its folder's name, anywhere in the project."""
    bad = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            for line, module in imported_modules(path, root):
                if module.split(".")[0] in ROOMS:
                    bad.append(f"{path.relative_to(root)}:{line}: imports {module}, not {PACKAGE}.{module}")
    return bad


def test_every_layer_exists():
    for layer in FORBIDDEN:
        assert list((ROOT / folder_of(layer)).rglob("*.py")), f"no modules under {folder_of(layer)}/"


def test_no_room_is_imported_by_its_folder_name():
    bad = folder_imports()
    assert not bad, "imports of a room outside the one installed name:\n" + "\n".join(bad)


def test_no_import_crosses_the_layers():
    bad = layer_violations()
    assert not bad, "imports across the layers:\n" + "\n".join(bad)


@pytest.mark.parametrize("source, line, module", [
    ("import numpy\nimport strata_prefill.fast.engine\n", 2, "strata_prefill.fast.engine"),
    ("def f():\n    from strata_prefill.reference import ReferenceEngine\n", 2, "strata_prefill.reference"),
    ("from ...fast import engine\n", 1, "strata_prefill.fast"),
    ("from ... import cli\n", 1, "strata_prefill"),
    ("import importlib\nimportlib.import_module('strata_prefill.verify.common')\n", 2, "strata_prefill.verify.common"),
])
def test_the_check_sees_every_form(tmp_path, source, line, module):
    """The check itself: each form of a crossing import in formats/pkg/mod.py is reported with
    its file, line and absolute module; a relative import inside the layer is not."""
    path = tmp_path / "formats" / "pkg" / "mod.py"
    path.parent.mkdir(parents=True)
    path.write_text(source + "from .. import config\nfrom . import sibling\nfrom strata_prefill.contract import q8_1\n")
    assert layer_violations(tmp_path) == [f"formats/pkg/mod.py:{line}: formats imports {module}"]


def test_the_folder_name_check_sees_it(tmp_path):
    path = tmp_path / "tests" / "test_x.py"
    path.parent.mkdir(parents=True)
    path.write_text("import numpy\nfrom fast import engine\nimport strata_prefill.fast\n")
    assert folder_imports(tmp_path) == ["tests/test_x.py:2: imports fast, not strata_prefill.fast"]


def test_no_module_level_import_circle():
    circles = import_circles()
    assert not circles, "module-level import circles:\n" + "\n".join(" -> ".join(c) for c in circles)


def test_the_circle_check_names_the_circle(tmp_path):
    """The check itself: a circle of three modules through absolute, relative and from-package
    imports is named in order; an import inside a function, under TYPE_CHECKING, or of a
    module that imports nothing back closes no circle."""
    pkg = tmp_path / "fast" / "cuda"
    pkg.mkdir(parents=True)
    (tmp_path / "fast" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("import os\nfrom strata_prefill.fast.cuda import b\n")
    (pkg / "b.py").write_text("from .c import thing\nfrom . import leaf\n")
    (pkg / "c.py").write_text("try:\n    from ..cuda.a import x\nexcept ImportError:\n    pass\nthing = 1\n")
    (pkg / "leaf.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import b\n"
                                 "def f():\n    from . import a\n")
    assert import_circles(tmp_path, ("fast",)) == [["strata_prefill.fast.cuda.a", "strata_prefill.fast.cuda.b", "strata_prefill.fast.cuda.c", "strata_prefill.fast.cuda.a"]]
    (pkg / "c.py").write_text("thing = 1\ndef g():\n    from . import a\n")
    assert import_circles(tmp_path, ("fast",)) == []
