"""The quant format registry (contract/qformats.py) against the places that still state its facts
by hand, and against gguf's own dequantization.

fast/cuda/kernels/mmq.cu is compiled with a header written from the registry
(fast/cuda/generated.py: type numbers, block sizes, q8_1 layouts, half-field offsets, scale
factors, the table buffer's offsets, the kernel list), and states none of those facts itself: the
tests check the header against the registry (planted changes caught) and that it is what the
kernel is compiled with (and digested by the kernel cache). fast/cuda/ keeps no table of its own: the products take
kernel names, block sizes and the table buffer from the registry (checked live, and by a scan of
fast/cuda/*.py for any type named there). Lists of type names kept in verify/cases.py and
conftest.py must equal the registry's too.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf import quants as gq

from strata_prefill.fast.cuda import generated, kernel_cache, runtime, signatures
from strata_prefill.contract import mmq, q8_1, qformats, quants
from strata_prefill.contract.errors import InputError, PackError

ROOT = Path(__file__).resolve().parents[1]
MMQ_CU = ROOT / "fast" / "cuda" / "kernels" / "mmq.cu"
FORMATS = qformats.formats()
NAMES = [f.qtype.name for f in FORMATS]
CUDA_FORMATS = [f for f in FORMATS if f.mmq_kernel is not None]


# --------------------------------------------------------------------------- the header


def header_facts(text: str) -> dict:
    """What a qformats.cuh text states: {"tab": {name: offset}, "tablen": {name: bytes}, "qt":
    {name: value}, "layout": {name: value}, "format": {type name: {field: value}}, "kernels":
    {kernel: type name}}."""
    defs = dict(re.findall(r"^#define (\w+) (-?\d+)\s*$", text, re.M))
    pick = lambda pre: {k[len(pre):]: int(v) for k, v in defs.items() if k.startswith(pre)}  # noqa: E731
    fmt = {}
    for m in re.finditer(r"^template <> struct QFormat<QT_(\w+)> \{ enum \{ ([^}]*) \};(.*)\}", text, re.M):
        fields = dict(f.split(" = ") for f in m[2].split(", "))
        fmt[m[1]] = {k: int(defs.get(v, v)) for k, v in fields.items()}
        dw = re.search(r"DW_FACTOR = ([\d.e+-]+)f;", m[3])
        if dw:
            fmt[m[1]]["DW_FACTOR"] = float(dw[1])
        words = re.findall(r"CODEBOOK(\d) = 0x([0-9A-F]{8})u", m[3])
        if words:
            fmt[m[1]]["CODEBOOK"] = tuple(int(w, 16) for _, w in sorted(words))
    lst = re.search(r"^#define MMQ_KERNELS\(X\) (.*)$", text, re.M)
    each = dict(re.findall(r"^#define MMQ_KERNEL_(\w+)\(X\) X\((\w+), QT_\1\)$", text, re.M))  # type -> kernel
    listed = re.findall(r"MMQ_KERNEL_(\w+)\(X\)", lst[1]) if lst else []
    kernels = {each[t]: t for t in listed if t in each}
    return {"tab": pick("TAB_"), "tablen": pick("TABLEN_"), "qt": pick("QT_"), "layout": pick("LAYOUT_"),
            "format": fmt, "kernels": kernels}


def header_mismatches(facts: dict) -> list[str]:
    """Where a header's facts differ from the registry's."""
    bad = []
    layout = qformats.table_layout()
    want_tab = {name: off for name, (off, _) in layout.items() if name != "BYTES"}
    want_tab["BYTES"] = layout["BYTES"][1]
    if facts["tab"] != want_tab:
        bad.append(f"TAB_*: {facts['tab']} != registry {want_tab}")
    want_len = {name: size for name, (_, size) in layout.items() if name != "BYTES"}
    if facts["tablen"] != want_len:
        bad.append(f"TABLEN_*: {facts['tablen']} != registry {want_len}")
    if facts["layout"] != {lay.name: int(lay) for lay in q8_1.Layout}:
        bad.append(f"LAYOUT_*: {facts['layout']}")
    if facts["qt"] != {f.qtype.name: int(f.qtype) for f in CUDA_FORMATS}:
        bad.append(f"QT_*: {facts['qt']}")
    for f in CUDA_FORMATS:
        want = {"BS": f.block_bytes, "VPB": f.block_values, "LAY": int(f.q8_1_layout),
                "TAB": int(f.table_name is not None), **{f"HALF_{k.upper()}": v for k, v in f.half_fields.items()}}
        if f.table_name is not None:
            off, size = layout[f.table_name]
            want.update(GRID=off, GRID_BYTES=size, SIGNS=int(f.sign_index))
        if getattr(f, "dw_factor", None) is not None:
            want["DW_FACTOR"] = f.dw_factor
        if hasattr(f, "codebook_words"):
            want["CODEBOOK"] = f.codebook_words()
        if facts["format"].get(f.qtype.name) != want:
            bad.append(f"QFormat<QT_{f.qtype.name}>: {facts['format'].get(f.qtype.name)} != registry {want}")
    if facts["kernels"] != {f.mmq_kernel: f.qtype.name for f in CUDA_FORMATS}:
        bad.append(f"MMQ_KERNELS: {facts['kernels']}")
    return bad


# --------------------------------------------------------------------------- the checks


def test_generated_header_states_the_registry():
    facts = header_facts(generated.qformats_header())
    assert facts["tab"] and facts["format"] and facts["kernels"]  # the parser found them at all
    assert header_mismatches(facts) == []


def test_mmq_is_compiled_with_the_generated_header():
    """The source mmq.cu is compiled from (and the kernel cache's digest is taken over) holds the
    header written from the registry, and mmq.cu itself states none of its facts."""
    text = MMQ_CU.read_text()
    assert re.search(r'^#include "qformats\.cuh"', text, re.M)
    assert not (Path(runtime.KERNEL_DIR) / "qformats.cuh").exists()  # no stale copy to find instead
    assert generated.qformats_header() in runtime.kernel_source("mmq")
    code = "\n".join(ln.split("//")[0] for ln in text.splitlines())
    assert not re.search(r"#define (QT|TAB|LAYOUT)_\w+ \d", code)
    assert not re.search(r"\b(BS|VPB|LAY|TAB|HALF_\w+|CODEBOOK\d) = \d", code)  # the formats' facts, in Tr
    assert not re.search(r"^MMQ_ENTRY\(", code, re.M)  # the kernel list is the header's
    # the kernels a launch finds are the registry's, read through the preprocessor
    assert sorted(signatures.kernels("mmq")) == sorted(f.mmq_kernel for f in CUDA_FORMATS)
    # and this kernel's own part of each format: a Tr for every type with a kernel, no other
    assert sorted(re.findall(r"struct Tr<QT_(\w+)>", code)) == sorted(f.qtype.name for f in CUDA_FORMATS)


def test_registry_change_changes_the_compiled_source(monkeypatch):
    """A changed registry fact is a changed source, so a changed cubin digest (never a stale
    cubin), and the header's facts follow it."""
    options, arch = list(runtime.NVCC_OPTIONS), "sm_90"
    before = kernel_cache.digest("mmq", runtime.kernel_source("mmq"), options, arch, "nvcc")
    monkeypatch.setattr(qformats.IQ3_S, "mmq_kernel", "mmq_iq3s")
    src = runtime.kernel_source("mmq")
    assert "X(mmq_iq3s, QT_IQ3_S)" in src
    assert kernel_cache.digest("mmq", src, options, arch, "nvcc") != before
    assert "mmq_iq3s" in signatures.kernels("mmq")  # the signature reader is not stale either
    monkeypatch.setattr(qformats.IQ2_XS, "dw_factor", 0.0625)
    assert header_facts(generated.qformats_header())["format"]["IQ2_XS"]["DW_FACTOR"] == 0.0625
    monkeypatch.setattr(qformats, "table_layout", lambda: {"SIGN": (0, 1024), "IQ3S": (1024, 2048),
                                                           "BYTES": (0, 3072)})
    assert "#define TAB_IQ3S 1024" in runtime.kernel_source("mmq")


@pytest.mark.parametrize("plant", [
    ("#define TAB_IQ3XXS 5120", "#define TAB_IQ3XXS 5124"),
    ("#define TAB_BYTES {}".format(qformats.table_layout()["BYTES"][1]), "#define TAB_BYTES 8448"),
    ("#define TABLEN_IQ2S 8192", "#define TABLEN_IQ2S 4096"),
    ("GRID = TAB_IQ1S, GRID_BYTES = TABLEN_IQ1S, SIGNS = 0, HALF_D", "GRID = TAB_IQ2S, GRID_BYTES = TABLEN_IQ1S, SIGNS = 0, HALF_D"),
    ("GRID = TAB_IQ2XXS, GRID_BYTES = TABLEN_IQ2XXS, SIGNS = 1", "GRID = TAB_IQ2XXS, GRID_BYTES = TABLEN_IQ2XXS, SIGNS = 0"),
    ("#define QT_IQ3_S 21", "#define QT_IQ3_S 22"),
    ("X(mmq_q2_k, QT_Q2_K)", "X(mmq_q2k, QT_Q2_K)"),
    ("HALF_DMIN = 82", "HALF_DMIN = 80"),
    ("DW_FACTOR = 0.25f", "DW_FACTOR = 0.5f"),
    ("LAY = LAYOUT_DS4", "LAY = LAYOUT_D4"),
    ("CODEBOOK0 = 0xBFAD9881u", "CODEBOOK0 = 0xBFAD9882u"),  # IQ4_NL's entry 0, -127, made -126
    ("CODEBOOK3 = 0xF4F8FAFCu", "CODEBOOK3 = 0xF4F8FAFBu"),  # MXFP4's / NVFP4's entry 12
])
def test_planted_header_change_is_caught(plant):
    """The header check is no tautology: a header that says otherwise is caught."""
    text = generated.qformats_header()
    old, new = plant
    assert old in text
    assert header_mismatches(header_facts(text.replace(old, new))) != []


def test_float_factors_are_exact():
    with pytest.raises(ValueError, match="not exactly a float32"):
        generated._float(0.1, "x")
    assert generated._float(0.125, "x") == "0.125f"


def test_products_read_the_registry():
    """The products' kernel names, block checks and table buffer are the registry's."""
    from strata_prefill.fast.cuda import products

    for f in FORMATS:
        if f.mmq_kernel is None:
            with pytest.raises(InputError, match="no CUDA MMQ kernel"):
                products._format(f.qtype)
            continue
        assert products._format(f.qtype) is f and products._format(f.qtype.name.lower()) is f
        for bad_k in (f.block_values + 16, f.block_values + 32 if f.block_values > 32 else 0):
            with pytest.raises(InputError, match=f"multiple of the {f.qtype.name} block"):
                products._checked_pair(f, bad_k, None, None)
        assert products._checked_pair(f, 2 * f.block_values, "out", None) == (0, "out")
    with pytest.raises(InputError, match="no CUDA MMQ kernel"):
        products._format(99999)
    with pytest.raises(InputError, match="unknown weight type"):
        products._format("Q9_9")
    tab = products._tables_host()
    layout = qformats.table_layout()
    assert tab.size == layout["BYTES"][1]
    off, size = layout["SIGN"]
    masks = np.where(qformats.sign_table().reshape(-1) < 0, 0xFF, 0).astype(np.uint8)
    assert np.array_equal(tab[off:off + size], masks)
    for f in FORMATS:
        if f.table_name is not None:
            off, size = layout[f.table_name]
            assert np.array_equal(tab[off:off + size], f.table())
            if f.grid().min() > 0:  # int8 entries as they are (the IQ1 grid's form: tests/test_iq_grids.py)
                assert np.array_equal(tab[off:off + size].view(np.int8), f.grid().reshape(-1))


def _is_type(node: ast.AST) -> bool:
    """A registered type as code names it: QT.Q8_0 (any object's attribute Q8_0), "Q8_0" or its
    kernel's name "mmq_q8_0"."""
    kernels = {f.mmq_kernel for f in FORMATS if f.mmq_kernel}
    if isinstance(node, ast.Attribute):
        return node.attr in NAMES
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and (
        node.value.upper() in NAMES or node.value in kernels)


def type_tables(source: str) -> list[str]:
    """The literal dicts, sets, lists and tuples of source that hold two or more registered types
    (a dict by its keys or its values): each a per-type table, as code."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Dict):
            groups = [[k for k in node.keys if k is not None], node.values]
        elif isinstance(node, (ast.Set, ast.List, ast.Tuple)):
            groups = [node.elts]
        else:
            continue
        if any(sum(map(_is_type, g)) >= 2 for g in groups):
            out.append(ast.unparse(node))
    return out


def test_fast_cuda_keeps_no_type_table():
    """No per-type list in fast/cuda/: a table of quant types there is a second copy of the
    registry's facts."""
    found = {p.name: type_tables(p.read_text()) for p in sorted((ROOT / "fast" / "cuda").glob("*.py"))}
    assert {k: v for k, v in found.items() if v} == {}
    planted = '_K = {QT.Q8_0: "mmq_q8_0", QT.Q2_K: "mmq_q2_k"}\nS = {"q4_1", "IQ3_S"}\nF = {QT.F16: 1, QT.Q8_0: 2}\n'
    assert len(type_tables(planted)) == 2  # the scan finds them (a float type is no registry type)


# --------------------------------------------------------------------------- the registry


def test_registry_names_are_the_supported_types():
    assert quants.SUPPORTED_TYPES == tuple(f.qtype for f in FORMATS)
    assert len(set(NAMES)) == len(NAMES) == len(FORMATS) > 0
    for f in FORMATS:
        assert qformats.lookup(f.qtype) is f and qformats.lookup(int(f.qtype)) is f
        assert quants.block_size(f.qtype) == (f.block_values, f.block_bytes)
        assert quants._F16_OFFSETS[f.qtype] == f.half_fields
        assert q8_1.layout_for(f.qtype) == f.q8_1_layout
    assert qformats.lookup(QT.Q8_K) is None and qformats.lookup(99999) is None  # Q8_K: no weight type


def test_hand_lists_elsewhere_equal_the_registry():
    """verify/cases.py and conftest.py keep their own lists of the types: they must not drift."""
    import conftest
    from strata_prefill.verify import cases

    # cases.py's lists: the types with a CUDA MMQ kernel (its kernel rows and cuda parity rows)
    assert list(cases.MMQ_TYPES) == [f.qtype.name for f in CUDA_FORMATS]
    assert list(cases.EXPERT_TYPES) == [f.qtype.name for f in CUDA_FORMATS]
    assert list(conftest.EXPERT_TYPES) == NAMES


def test_registering_twice_is_refused():
    with pytest.raises(TypeError, match="registered twice"):
        class Again(qformats.QuantFormat, qtype=QT.Q8_0):  # noqa: F841
            mmq_kernel = "mmq_again"
    assert qformats.lookup(QT.Q8_0) is qformats.Q8_0


def test_epilogue_and_unit_sub_follow_the_decoded_form():
    """A format's epilogue kind and unit_sub flag say what its decoded form carries."""
    rng = np.random.default_rng(3)
    for f in FORMATS:
        dec = quants.decode(f.qtype, quants.random_blocks(f.qtype, 64, rng).reshape(4, -1))
        assert (dec.mw is not None) == (f.epilogue in (qformats.Epilogue.MIN, qformats.Epilogue.DMIN))
        assert (dec.msub is not None) == (f.epilogue is qformats.Epilogue.DMIN)
        assert bool(np.all(dec.sub == 1)) == f.unit_sub
        # sub_per_16: a 32-value block's two halves may take different sub-scales (64 random
        # blocks hold such a block), else never
        assert bool(np.any(dec.sub[..., 0] != dec.sub[..., 1])) == f.sub_per_16
        halves = f.epilogue is qformats.Epilogue.HALVES  # a scale for each 16-value half
        assert dec.dw.shape == dec.sub.shape[:-1] + ((2,) if halves else ())
        pw = mmq.prepare(f.qtype, quants.random_blocks(f.qtype, 64, rng).reshape(4, -1))
        assert pw.w.dtype == (np.int8 if f.unit_sub else np.int16)
        assert (pw.wm is not None) == (f.epilogue is qformats.Epilogue.DMIN)
        assert pw.dw.shape == (4, pw.n_blocks) + ((2,) if halves else ())


def test_mmq_split_form_is_the_registrys():
    """mmq.cu's own Tr<QT>::SPLIT (two k16 sums a block in place of one k32 sum) is set exactly
    for the types whose halves take sub-scales or float scales of their own (sub_per_16, HALVES)."""
    code = "\n".join(ln.split("//")[0] for ln in MMQ_CU.read_text().splitlines())
    split = {t: int(v) for t, v in re.findall(r"struct Tr<QT_(\w+)>[^{]*\{ enum \{ SPLIT = (\d)", code)}
    assert sorted(split) == sorted(f.qtype.name for f in CUDA_FORMATS)
    for f in CUDA_FORMATS:
        assert split[f.qtype.name] == int(f.sub_per_16 or f.epilogue is qformats.Epilogue.HALVES), f.qtype.name


def test_grids_are_gguf_grids():
    for f in FORMATS:
        g = f.grid()
        if f.grid_source is None:
            assert g is None
            with pytest.raises(PackError):
                quants._grid(f.qtype)
            continue
        cls = getattr(gq, f.grid_source)
        cls.init_grid()
        assert g.shape == tuple(cls.grid_shape) and g.dtype == np.int8
        assert np.array_equal(g.astype(np.float32), np.asarray(cls.grid, np.float32).reshape(cls.grid_shape))
        assert quants._grid(f.qtype) is g


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


@pytest.mark.parametrize("fmt", FORMATS, ids=NAMES)
def test_every_format_decodes_as_gguf(fmt):
    """gguf.quants.dequantize is the independent oracle: random valid blocks of every
    registered type, and blocks of fully random bytes with finite half scales."""
    rng = np.random.default_rng(int(fmt.qtype))
    for std in (0.02, 1.0, 300.0):
        raw = quants.random_blocks(fmt.qtype, 96, rng, std=std).reshape(8, -1)
        ours = quants.dequantize(fmt.qtype, raw)
        ref = gq.dequantize(raw, fmt.qtype)
        assert ours.shape == ref.shape
        assert np.isfinite(ref).all()
        np.testing.assert_array_equal(_bits(ours), _bits(ref))
    raw = rng.integers(0, 256, (96, fmt.block_bytes), dtype=np.uint8)
    if fmt.half_fields or fmt.qtype == QT.IQ1_M:  # half scales (byte scales are always finite)
        h = fmt.scale_values(raw).astype("<f2").view("<u2")  # the half scales' bits
        h = np.where((h & 0x7C00) == 0x7C00, h ^ 0x4000, h).astype("<u2")  # inf / NaN: finite
        fmt.put_scale_values(raw, h.view("<f2").astype(np.float32))
    elif fmt.qtype == QT.MXFP4:  # its scale byte below 2^125, where a code of 12 would overflow
        raw[:, 0] = np.minimum(raw[:, 0], 252)
    assert np.isfinite(fmt.scale_values(raw)).all()
    raw = raw.reshape(8, -1)
    np.testing.assert_array_equal(_bits(quants.dequantize(fmt.qtype, raw)), _bits(gq.dequantize(raw, fmt.qtype)))


@pytest.mark.parametrize("fmt", FORMATS, ids=NAMES)
def test_random_blocks_have_the_asked_spread(fmt):
    """unit_std is what random blocks' values spread by at scale 1: the asked std comes back."""
    x = quants.dequantize(fmt.qtype, quants.random_blocks(fmt.qtype, 4096, np.random.default_rng(9), std=0.5))
    assert 0.5 * 0.85 < float(np.std(x)) < 0.5 * 1.15
