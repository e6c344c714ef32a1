"""Kernel headers written from Python facts when a kernel is compiled, so that a fact the host
and a kernel both use is stated once, in Python.

``#include "NAME"`` of a name in :data:`HEADERS` reads no file: fast/cuda/runtime.py
(kernel_source) inlines the text HEADERS[NAME]() returns, so the compiled source, and with it the
kernel cache's digest (fast/cuda/kernel_cache.py), hold it; fast/cuda/signatures.py reads the same
text. There is no such file to edit: edit the Python it is written from.

- ``qformats.cuh`` (:func:`qformats_header`): from contract/qformats.py, for the types with an MMQ
  kernel (fast/cuda/kernels/mmq.cu): their GGML type numbers, block sizes, q8_1 layouts,
  half-field offsets and scale factors, the codebook types' codebooks (contract/codebooks.py), the
  MMQ table buffer's offsets (strata_prefill.contract.qformats.table_layout) and the list of MMQ kernels (their
  names and types).
- ``embed_kernels.cuh`` (:func:`embed_kernels_header`): embed.cu's kernel list, the types with an
  ``embed_kernel`` (their names and types).
"""
from __future__ import annotations

import numpy as np

from strata_prefill.contract import q8_1, qformats

__all__ = ["HEADERS", "header", "qformats_header", "embed_kernels_header"]


def _float(v: float, what: str) -> str:
    """A C float literal of exactly v (refused where v is not a float32)."""
    f = np.float32(v)
    if float(f) != float(v) or not np.isfinite(f):
        raise ValueError(f"{what} = {v!r} is not exactly a float32")
    return f"{float(f)!r}f"


def qformats_header() -> str:
    """The text of ``qformats.cuh``: everything mmq.cu knows of a quant format that
    contract/qformats.py states, for the registered formats with an ``mmq_kernel``."""
    fmts = qformats.with_mmq_kernel()
    out = [
        "// qformats.cuh: written by fast/cuda/generated.py from contract/qformats.py when a kernel is",
        "// compiled (fast/cuda/runtime.py kernel_source inlines it); there is no such file.",
        "#ifndef STRATA_QFORMATS_CUH",
        "#define STRATA_QFORMATS_CUH",
        "",
        "// the GGML type numbers of the types with an MMQ kernel",
    ]
    out += [f"#define QT_{f.qtype.name} {int(f.qtype)}" for f in fmts]
    out += ["", "// q8_1 activation layouts (strata_prefill.contract.q8_1.Layout)"]
    out += [f"#define LAYOUT_{lay.name} {int(lay)}" for lay in q8_1.Layout]
    out += ["", "// the MMQ table buffer (strata_prefill.contract.qformats.table_layout): byte offsets, and its size"]
    layout = qformats.table_layout()
    out += [f"#define TAB_{name} {off}" for name, (off, _size) in layout.items() if name != "BYTES"]
    out += [f"#define TAB_BYTES {layout['BYTES'][1]}"]
    out += ["// and each table's bytes"]
    out += [f"#define TABLEN_{name} {size}" for name, (_off, size) in layout.items() if name != "BYTES"]
    out += [
        "",
        "// per type: BS bytes and VPB values of a GGUF block, LAY the q8_1 layout its kernel reads,",
        "// TAB whether it reads the table buffer (then GRID, GRID_BYTES: its grid's offset and bytes",
        "// there, SIGNS: whether it reads the sign masks too), HALF_<field> the byte offset of each",
        "// half field, DW_FACTOR (where the type has one) the factor of the main scale, CODEBOOK0..3",
        "// (the codebook types) the 16 int8 codes, entry 4w + b in byte b of word w",
        "template <int QT> struct QFormat;",
    ]
    for f in fmts:
        fields = [f"BS = {f.block_bytes}", f"VPB = {f.block_values}", f"LAY = LAYOUT_{f.q8_1_layout.name}",
                  f"TAB = {int(f.table_name is not None)}"]
        if f.table_name is not None:
            fields += [f"GRID = TAB_{f.table_name}", f"GRID_BYTES = TABLEN_{f.table_name}",
                       f"SIGNS = {int(f.sign_index)}"]
        fields += [f"HALF_{name.upper()} = {off}" for name, off in f.half_fields.items()]
        body = f"enum {{ {', '.join(fields)} }};"
        factor = getattr(f, "dw_factor", None)
        if factor is not None:
            body += f" static constexpr float DW_FACTOR = {_float(factor, f'{f.qtype.name}.dw_factor')};"
        words = f.codebook_words() if hasattr(f, "codebook_words") else None
        if words is not None:
            body += " static constexpr unsigned " + ", ".join(f"CODEBOOK{i} = 0x{w:08X}u" for i, w in enumerate(words)) + ";"
        out.append(f"template <> struct QFormat<QT_{f.qtype.name}> {{ {body} }};")
    out += ["", "// X(kernel name, type) for each type with an MMQ kernel, in registration order; built with",
            "// MMQ_ONLY=<a type's number>, the module holds that type's kernel alone (one module a type",
            "// compiles in parallel, and faster in all than one module of every type)"]
    for f in fmts:
        out += [f"#if !defined(MMQ_ONLY) || MMQ_ONLY == {int(f.qtype)}",
                f"#define MMQ_KERNEL_{f.qtype.name}(X) X({f.mmq_kernel}, QT_{f.qtype.name})",
                "#else",
                f"#define MMQ_KERNEL_{f.qtype.name}(X)",
                "#endif"]
    out.append("#define MMQ_KERNELS(X) " + " ".join(f"MMQ_KERNEL_{f.qtype.name}(X)" for f in fmts))
    out += ["", "#endif", ""]
    return "\n".join(out)


def embed_kernels_header() -> str:
    """The text of ``embed_kernels.cuh``: embed.cu's kernel list, X(kernel name, type) for each
    registered format with an ``embed_kernel`` (a header of its own, so that mmq.cu's source, and
    its cubins' digests, do not change with it)."""
    embeds = [f for f in qformats.formats() if f.embed_kernel]
    mmq = qformats.with_mmq_kernel()
    if any(f not in mmq for f in embeds):  # qformats.cuh writes QT_<name> and QFormat<> for MMQ types only
        raise ValueError("a type with an embed_kernel needs an mmq_kernel too: "
                         + ", ".join(f.qtype.name for f in embeds if f not in mmq))
    return "\n".join([
        "// embed_kernels.cuh: written by fast/cuda/generated.py from contract/qformats.py when a kernel",
        "// is compiled; there is no such file. X(kernel name, type) for each type with an embed_kernel.",
        "#ifndef STRATA_EMBED_KERNELS_CUH",
        "#define STRATA_EMBED_KERNELS_CUH",
        "#define EMBED_KERNELS(X) " + " ".join(f"X({f.embed_kernel}, QT_{f.qtype.name})" for f in embeds),
        "#endif",
        "",
    ])


#: the generated headers, by the name an #include gives
HEADERS = {"qformats.cuh": qformats_header, "embed_kernels.cuh": embed_kernels_header}


def header(name: str) -> str | None:
    """The text of generated header ``name``, or None where no header of that name is generated."""
    make = HEADERS.get(name)
    return None if make is None else make()
