"""The CUDA sources, checked without a GPU: each kernel file names the NumPy function that
defines it (and that name exists), and the project's own headers inline completely."""
import importlib
import re
from pathlib import Path

import pytest

from strata_prefill.fast.cuda.runtime import KERNEL_DIR, kernel_source

KERNELS = sorted(Path(KERNEL_DIR).glob("*.cu"))
NAME = re.compile(r"strata_prefill\.[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")


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


SHARED = ("float strata_exp(float x)", "float strata_exp2c(float x)", "float roundf_away(float x)",
          "int roundf_away_int(float x)", "float rint_nonneg_magic(float y)", "float warp_max(float v)",
          "float quad_max(float v)", "float warp_sum(float v)", "#define MAGIC_I", "#define MAGIC_F",
          "float row_quantize_warp(", "float scaled_magic(")


def test_one_definition_of_the_shared_device_functions():
    """The exponentials, the roundings, the row quantize, the warp reductions and the
    magic-number conversion constants live in strata_numerics.cuh only."""
    header = (Path(KERNEL_DIR) / "strata_numerics.cuh").read_text()
    for fn in SHARED:
        assert header.count(fn) == 1, f"strata_numerics.cuh lacks {fn}"
    for path in KERNELS:
        text = path.read_text()
        for fn in SHARED:
            assert fn not in text, f"{path.name} defines {fn} again"


#: a one-value xor butterfly written out in a kernel (the header's warp_sum / warp_max do it)
BUTTERFLY = re.compile(r"for \(int o = 16; o > 0; o >>= 1\) *\w+ = [^;{]*__shfl_xor_sync")


@pytest.mark.parametrize("path", KERNELS, ids=lambda p: p.name)
def test_block_quantize_exp_and_reductions_come_from_the_header(path):
    """No kernel writes its own q8 block scale (127 / amax), exponential or full-warp
    butterfly: the header's q8_inv_scale, strata_exp, warp_sum and warp_max are the one home."""
    code = "\n".join(line.split("//")[0] for line in path.read_text().splitlines())  # comments out
    assert "127.0f /" not in code, f"{path.name} computes a q8 scale inline"
    assert not re.search(r"\b(__expf|expf|exp2f|__exp2f)\s*\(", code), f"{path.name} calls a libm exp"
    assert "strata_exp_fast" not in code
    assert not BUTTERFLY.search(code), f"{path.name} writes a warp butterfly inline"


def test_combine_row_form_k_limit_matches_the_host():
    """elementwise.combine picks the row form only for K up to the kernel's shared arrays."""
    from strata_prefill.fast.cuda import elementwise

    text = (Path(KERNEL_DIR) / "combine.cu").read_text()
    m = re.search(r"#define COMBINE_MAXK (\d+)", text)
    assert m and int(m.group(1)) == elementwise.COMBINE_MAXK


def test_generated_headers_are_inlined_and_no_files():
    """A header fast/cuda/generated.py writes is inlined as its text wherever a kernel includes it,
    and no file of its name lies in the kernel folder (a stale copy nobody regenerates)."""
    from strata_prefill.fast.cuda import generated

    assert generated.HEADERS
    for name in generated.HEADERS:
        assert not (Path(KERNEL_DIR) / name).exists(), f"{name} is generated: remove the file"
        users = [p for p in KERNELS if f'#include "{name}"' in p.read_text()]
        assert users, f"no kernel includes the generated {name}"
        for p in users:
            assert generated.header(name) in kernel_source(p.stem)
    assert generated.header("no_such.cuh") is None
