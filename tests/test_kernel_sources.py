"""The CUDA sources, checked without a GPU: each kernel file names the NumPy function that
defines it (and that name exists), and the project's own headers inline completely."""
import importlib
import re
from pathlib import Path

import pytest

from fast.cuda.runtime import KERNEL_DIR, kernel_source

KERNELS = sorted(Path(KERNEL_DIR).glob("*.cu"))
NAME = re.compile(r"strata\.[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")


def resolve(dotted: str):
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


def test_there_are_kernels():
    assert len(KERNELS) >= 10


@pytest.mark.parametrize("path", KERNELS, ids=lambda p: p.name)
def test_kernel_names_its_numpy_definition(path):
    head = "\n".join(path.read_text().splitlines()[:30])
    names = sorted(set(NAME.findall(head)))
    if not names:
        # a kernel whose definition is a plain NumPy expression says so
        assert re.search(r"Definition: NumPy", head), f"{path.name} names no NumPy definition"
    for name in names:
        resolve(name)  # raises if the named definition does not exist


@pytest.mark.parametrize("path", KERNELS, ids=lambda p: p.name)
def test_local_headers_inline(path):
    src = kernel_source(path.stem)
    assert '#include "' not in src
    if '#include "strata_numerics.cuh"' in path.read_text():
        assert "float strata_exp(float x)" in src or "float roundf_away(float x)" in src


def test_one_definition_of_the_shared_device_functions():
    """strata_exp, roundf_away, to_i8 and warp_max live in strata_numerics.cuh only."""
    for path in KERNELS:
        text = path.read_text()
        for fn in ("float strata_exp(float x)", "float roundf_away(float x)", "int8_t to_i8(float v)",
                   "float warp_max(float v)"):
            assert fn not in text, f"{path.name} defines {fn} again"
