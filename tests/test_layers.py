"""The layers, read from the source: `strata/` is the base, `reference/` and `fast/` stand on it
side by side, `strata_prefill/` (the command) stands on all three. An import that crosses these
lines fails here with its file, line and module, wherever it sits (top level, inside a function,
relative, or a literal `importlib.import_module`)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# package -> top-level packages of this project it must never import
FORBIDDEN = {
    "strata": {"reference", "fast", "strata_prefill", "verify", "bench"},
    "reference": {"fast", "strata_prefill", "verify", "bench"},
    "fast": {"reference", "strata_prefill", "verify", "bench"},
    "strata_prefill": {"verify", "bench"},
}


def _package_of(path: Path, root: Path) -> list[str]:
    """The dotted package a module sits in, as parts (for resolving relative imports)."""
    return list(path.relative_to(root).with_suffix("").parts)[:-1]


def imported_modules(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, absolute module name) for every import in a file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = _package_of(path, root)
                base = base[: max(0, len(base) - (node.level - 1))]
                module = ".".join(base + ([module] if module else []))
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


def layer_violations(root: Path = ROOT) -> list[str]:
    bad = []
    for package, forbidden in FORBIDDEN.items():
        for path in sorted((root / package).rglob("*.py")):
            for line, module in imported_modules(path, root):
                if module.split(".")[0] in forbidden:
                    bad.append(f"{path.relative_to(root)}:{line}: {package} imports {module}")
    return bad


def test_every_layer_exists():
    for package in FORBIDDEN:
        assert list((ROOT / package).rglob("*.py")), f"no modules under {package}/"


def test_no_import_crosses_the_layers():
    bad = layer_violations()
    assert not bad, "imports across the layers:\n" + "\n".join(bad)


@pytest.mark.parametrize("source, line, module", [
    ("import numpy\nimport fast.engine\n", 2, "fast.engine"),
    ("def f():\n    from reference import ReferenceEngine\n", 2, "reference"),
    ("from ...fast import engine\n", 1, "fast"),
    ("from ... import strata_prefill\n", 1, "strata_prefill"),
    ("import importlib\nimportlib.import_module('verify.common')\n", 2, "verify.common"),
])
def test_the_check_sees_every_form(tmp_path, source, line, module):
    """The check itself: each form of a crossing import in strata/pkg/mod.py is reported with
    its file, line and absolute module; a relative import inside the layer is not."""
    path = tmp_path / "strata" / "pkg" / "mod.py"
    path.parent.mkdir(parents=True)
    path.write_text(source + "from .. import config\nfrom . import sibling\n")
    assert layer_violations(tmp_path) == [f"strata/pkg/mod.py:{line}: strata imports {module}"]
