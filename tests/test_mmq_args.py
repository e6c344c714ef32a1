"""The layout fast/cuda/signatures.py computes for a struct passed by value (mmq.cu's one parameter,
MmqArgs in kernels/mmq_args.cuh, and planted structs with arrays, nested structs, a typedef and
tail padding) is the one nvcc gives it: a probe compiled to PTX holds a static_assert of each
field's offset, the size and the alignment, all written from the Python side, and its kernels'
``.param`` declarations say the struct's size. Needs nvcc, no GPU (skipped without nvcc).
"""
from __future__ import annotations

import re
import shutil
import struct
import subprocess

import pytest

from fast.cuda import runtime, signatures
from strata import qformats

PLANTED = r'''
#include <stdint.h>
#define TWO 2
struct In { char c; double d; };
typedef struct { int a; In in[TWO]; short s; } Out;
struct Tail { const float* p; long long n; int k; };
struct Half { __half h[3]; unsigned char b; };
extern "C" __global__ void k_out(Out o) {}
extern "C" __global__ void k_mixed(int x, In y, float z) {}
extern "C" __global__ void k_tail(const Tail t) {}
extern "C" __global__ void k_half(Half h) {}
'''


def _mmq_layout() -> signatures.Struct:
    k = next(f.mmq_kernel for f in qformats.formats() if f.mmq_kernel)
    return signatures.argument_struct("mmq", k)


def test_mmq_args_layout():
    """MmqArgs: the 16 fields in their order at C's offsets, 116 bytes of fields and 4 of tail
    padding; the packed bytes hold each value at its offset and zeros in the padding."""
    lay = _mmq_layout()
    assert [(f.name, f.letter, f.offset) for f in lay.fields] == [
        ("w", "P", 0), ("w_stride", "q", 8), ("N", "i", 16), ("K", "i", 20), ("act", "P", 24),
        ("R_total", "i", 32), ("bounds", "P", 40), ("n_exp", "i", 48), ("out", "P", 56), ("ldo", "q", 64),
        ("tab", "P", 72), ("tile_rows", "i", 80), ("w_pair", "q", 88), ("out2", "P", 96), ("tiles", "P", 104),
        ("n_tiles", "i", 112)]
    assert (lay.size, lay.align, lay.file) == (120, 8, "mmq_args.cuh")
    assert struct.calcsize("@" + lay.format) == 120
    b = lay.pack(**{f.name: 0x0101 * (i + 1) for i, f in enumerate(lay.fields)})
    assert len(b) == 120 and b[116:] == bytes(4) and b[36:40] == bytes(4)
    assert struct.unpack_from("@i", b, 112)[0] == 0x0101 * 16
    with pytest.raises(ValueError, match=r"struct MmqArgs \(mmq_args.cuh:\d+\): unknown fields \['x'\], missing \['w'\]"):
        lay.pack(x=1, **{f.name: 0 for f in lay.fields[1:]})


def test_planted_layouts(tmp_path):
    """Arrays, a nested struct (its fields "in[1].d"), a typedef, a half array and tail padding;
    a struct after a scalar parameter is packed after the padding that aligns it."""
    (tmp_path / "planted.cu").write_text(PLANTED)
    got = signatures.kernels("planted", kernel_dir=str(tmp_path))
    out = got["k_out"].params[0].struct
    assert [(f.name, f.offset) for f in out.fields] == [
        ("a", 0), ("in[0].c", 8), ("in[0].d", 16), ("in[1].c", 24), ("in[1].d", 32), ("s", 40)]
    assert (out.size, out.align, out.format) == (48, 8, "i4xb7xdb7xdh6x")
    assert got["k_out"].format == "ibdbdh"  # the letters, as before
    assert got["k_mixed"].packed_format == "i4x16sf"
    assert struct.calcsize("@" + got["k_mixed"].packed_format) == 28
    tail = got["k_tail"].params[0].struct
    assert (tail.size, tail.format) == (24, "Pqi4x")
    half = got["k_half"].params[0].struct
    assert (half.size, half.align, half.format) == (8, 2, "3eB1x")
    signatures.check_kernel(got["k_tail"], "24s", "planted.cu")
    signatures.check_kernel(got["k_tail"], "Pqi", "planted.cu")
    with pytest.raises(ValueError, match="prepared with '20s'"):
        signatures.check_kernel(got["k_tail"], "20s", "planted.cu")


def _asserts(type_name: str, lay: signatures.Struct) -> list[str]:
    lines = [f'static_assert(sizeof({type_name}) == {lay.size}, "sizeof {type_name}");',
             f'static_assert(alignof({type_name}) == {lay.align}, "alignof {type_name}");']
    for f in lay.fields:
        lines.append(f'static_assert(__builtin_offsetof({type_name}, {f.name}) == {f.offset}, '
                     f'"offset of {type_name}.{f.name}");')
        lines.append(f'static_assert(sizeof((({type_name}*)0)->{f.name}) == {f.size * f.count}, '
                     f'"size of {type_name}.{f.name}");')
    return lines


def _param_sizes(ptx: str, kernel: str) -> list[tuple[int, int]]:
    """(alignment, bytes) of each .param of an entry: `.param .align 8 .b8 k_param_0[120]`, or a
    scalar's `.param .u32 k_param_0`."""
    m = re.search(rf"\.entry\s+{kernel}\s*\((.*?)\)", ptx, re.S)
    assert m, f"no entry {kernel} in the probe's PTX"
    out = []
    for decl in m.group(1).split(","):
        agg = re.search(r"\.align\s+(\d+)\s+\.b8\s+\w+\[(\d+)\]", decl)
        if agg:
            out.append((int(agg.group(1)), int(agg.group(2))))
        else:
            bits = int(re.search(r"\.[usbf](\d+)\s", decl + " ").group(1))
            out.append((bits // 8, bits // 8))
    return out


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (no GPU)")
def test_layouts_are_nvccs(tmp_path):
    """Every offset, size and alignment computed here is nvcc's: static_asserts in a probe that
    includes mmq_args.cuh (and the planted structs), and the size of the kernels' .param."""
    lay = _mmq_layout()
    (tmp_path / "planted.cu").write_text(PLANTED)
    got = signatures.kernels("planted", kernel_dir=str(tmp_path))
    body = ["#include <stdint.h>", "#include <cuda_fp16.h>", '#include "mmq_args.cuh"',
            PLANTED.replace("#include <stdint.h>", ""), *_asserts("MmqArgs", lay),
            'extern "C" __global__ void probe_mmq(const MmqArgs a) {}']
    for kname, tname in (("k_out", "Out"), ("k_tail", "Tail"), ("k_half", "Half")):
        body += _asserts(tname, got[kname].params[0].struct)
    body += _asserts("In", got["k_mixed"].params[1].struct)
    src = tmp_path / "probe.cu"
    src.write_text("\n".join(body) + "\n")
    ptx = tmp_path / "probe.ptx"
    r = subprocess.run(["nvcc", "-ptx", f"-arch={runtime.DEFAULT_ARCH}", "-I", runtime.KERNEL_DIR,
                        "-o", str(ptx), str(src)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    text = ptx.read_text()
    assert _param_sizes(text, "probe_mmq") == [(lay.align, lay.size)]
    assert _param_sizes(text, "k_mixed") == [(4, 4), (8, 16), (4, 4)]
    for kname in ("k_out", "k_tail", "k_half"):
        s = got[kname].params[0].struct
        assert _param_sizes(text, kname) == [(s.align, s.size)], kname
