"""The CUDA host code's layout, checked without a GPU: every module under fast/cuda imports
without PyCUDA, imports nothing from fast/ beyond what both backends share (base, phases, traces, expert placement), keeps
no module-level launch counters, and launches only through runtime.Device.launch."""
import ast
import importlib
from pathlib import Path

import pytest

CUDA_DIR = Path(__file__).resolve().parent.parent / "fast" / "cuda"
MODULES = sorted(CUDA_DIR.glob("*.py"))
ALLOWED_FAST = {"strata_prefill.fast.backend_base", "strata_prefill.fast.phases", "strata_prefill.fast.experts", "strata_prefill.fast.trace"}  # what both backends share


def _imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module


def test_the_split_is_there():
    names = {p.stem for p in MODULES}
    assert {"runtime", "products", "attention", "elementwise", "backend"} <= names
    assert not (CUDA_DIR.parent / "ops_cuda.py").exists()
    assert not (CUDA_DIR.parent / "ops_model_cuda.py").exists()


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_imports_without_pycuda(path):
    importlib.import_module(f"strata_prefill.fast.cuda.{path.stem}")


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_no_import_back_into_fast(path):
    for mod in _imports(path):
        if mod == "fast" or mod.startswith("fast."):
            assert mod.startswith("strata_prefill.fast.cuda") or mod in ALLOWED_FAST, f"{path.name} imports {mod}"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_launches_and_counters_live_on_the_device(path):
    tree = ast.parse(path.read_text())
    for node in tree.body:  # module level: no Counter shared by every engine
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                assert not (isinstance(t, ast.Name) and "counter" in t.id.lower()), f"{path.name}: {t.id}"
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "prepared_async_call"]
    if path.name != "runtime.py":
        assert not calls, f"{path.name} launches past Device.launch"
