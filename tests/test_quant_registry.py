"""The quant format registry (strata/qformats.py) against the places that still state its facts
by hand, and against gguf's own dequantization.

fast/cuda/kernels/mmq.cu states each type's block size, values, q8_1 layout and table use
(``Tr<QT_...>``), the type numbers (``QT_...``), its kernels (``MMQ_ENTRY``) and the table
buffer's offsets (``TAB_*``): read here as text, they must agree with the registry, and planted
changes on either side must be caught. fast/cuda/ keeps no table of its own: the products take
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

from strata import mmq, q8_1, qformats, quants
from strata.errors import InputError, PackError

ROOT = Path(__file__).resolve().parents[1]
MMQ_CU = ROOT / "fast" / "cuda" / "kernels" / "mmq.cu"
FORMATS = qformats.formats()
NAMES = [f.qtype.name for f in FORMATS]
CUDA_FORMATS = [f for f in FORMATS if f.mmq_kernel is not None]


# --------------------------------------------------------------------------- parsers


def cu_facts(text: str) -> dict:
    """What mmq.cu states: {"tab": {name: offset}, "qt": {name: value}, "tr": {name: {field:
    value}}, "entries": {kernel: type name}}."""
    tab = {m[1]: int(m[2]) for m in re.finditer(r"^#define TAB_(\w+) (\d+)\s*$", text, re.M)}
    qt = {m[1]: int(m[2]) for m in re.finditer(r"^#define QT_(\w+) (\d+)\s*$", text, re.M)}
    tr = {}
    for m in re.finditer(r"^template <> struct Tr<QT_(\w+)>\s*\{\s*enum\s*\{([^}]*)\}", text, re.M):
        tr[m[1]] = {k.strip(): int(v) for k, v in (f.split("=") for f in m[2].split(","))}
    entries = {m[1]: m[2] for m in re.finditer(r"^MMQ_ENTRY\((\w+), QT_(\w+)\)", text, re.M)}
    return {"tab": tab, "qt": qt, "tr": tr, "entries": entries}


# --------------------------------------------------------------------------- comparisons


def cu_mismatches(facts: dict) -> list[str]:
    bad = []
    layout = qformats.table_layout()
    want_tab = {name: off for name, (off, _) in layout.items() if name != "BYTES"}
    want_tab["BYTES"] = layout["BYTES"][1]
    if facts["tab"] != want_tab:
        bad.append(f"TAB_*: mmq.cu {facts['tab']} != registry {want_tab}")
    for f in CUDA_FORMATS:
        n = f.qtype.name
        if facts["qt"].get(n) != int(f.qtype):
            bad.append(f"QT_{n}: mmq.cu {facts['qt'].get(n)} != {int(f.qtype)}")
        tr = facts["tr"].get(n)
        want = {"BS": f.block_bytes, "VPB": f.block_values, "LAY": int(f.q8_1_layout),
                "TAB": int(f.grid_source is not None)}
        if tr is None or {k: tr.get(k) for k in want} != want:
            bad.append(f"Tr<QT_{n}>: mmq.cu {tr} != registry {want}")
        if facts["entries"].get(f.mmq_kernel) != n:
            bad.append(f"MMQ_ENTRY({f.mmq_kernel}, QT_{n}) missing from mmq.cu")
    extra = set(facts["entries"].values()) - {f.qtype.name for f in CUDA_FORMATS}
    if extra:
        bad.append(f"mmq.cu has kernels for unregistered types {sorted(extra)}")
    return bad


# --------------------------------------------------------------------------- the checks


def test_mmq_cu_agrees_with_registry():
    facts = cu_facts(MMQ_CU.read_text())
    assert facts["tab"] and facts["tr"] and facts["entries"]  # the parser found them at all
    assert cu_mismatches(facts) == []


def test_products_read_the_registry():
    """The products' kernel names, block checks and table buffer are the registry's."""
    from fast.cuda import products

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
        products._format(QT.Q5_K if qformats.lookup(QT.Q5_K) is None else 99999)
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


@pytest.mark.parametrize("plant", [
    ("#define TAB_IQ3XXS 5120", "#define TAB_IQ3XXS 5124"),
    ("#define TAB_BYTES 8192", "#define TAB_BYTES 8448"),
    ("#define QT_IQ3_S 21", "#define QT_IQ3_S 22"),
    ("MMQ_ENTRY(mmq_q2_k, QT_Q2_K)", "MMQ_ENTRY(mmq_q2k, QT_Q2_K)"),
])
def test_planted_cu_change_is_caught(plant):
    text = MMQ_CU.read_text()
    old, new = plant
    assert old in text
    assert cu_mismatches(cu_facts(text.replace(old, new))) != []


def test_planted_tr_change_is_caught():
    text = MMQ_CU.read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith("template <> struct Tr<QT_Q4_1>"))
    assert cu_mismatches(cu_facts(text.replace(line, line.replace("LAY = 1", "LAY = 0")))) != []
    assert cu_mismatches(cu_facts(text.replace(line, line.replace("BS = 20", "BS = 18")))) != []


def test_planted_registry_change_is_caught(monkeypatch):
    """The other side: a format whose kernel name or layout changes no longer matches."""
    cu = cu_facts(MMQ_CU.read_text())
    monkeypatch.setattr(qformats.IQ3_S, "mmq_kernel", "mmq_iq3s")
    assert cu_mismatches(cu) != []
    monkeypatch.undo()
    monkeypatch.setattr(qformats.Q2_K, "q8_1_layout", q8_1.Layout.DS4)
    assert cu_mismatches(cu) != []


# --------------------------------------------------------------------------- the registry


def test_registry_names_are_the_supported_types():
    assert quants.SUPPORTED_TYPES == tuple(f.qtype for f in FORMATS)
    assert len(set(NAMES)) == len(NAMES) == len(FORMATS) > 0
    for f in FORMATS:
        assert qformats.lookup(f.qtype) is f and qformats.lookup(int(f.qtype)) is f
        assert quants.block_size(f.qtype) == (f.block_values, f.block_bytes)
        assert quants._F16_OFFSETS[f.qtype] == f.half_fields
        assert q8_1.layout_for(f.qtype) == f.q8_1_layout
    assert qformats.lookup(QT.Q5_K) is None and qformats.lookup(99999) is None


def test_hand_lists_elsewhere_equal_the_registry():
    """verify/cases.py and conftest.py keep their own lists of the types: they must not drift."""
    import conftest
    from verify import cases

    assert list(cases.MMQ_TYPES) == NAMES
    assert list(cases.EXPERT_TYPES) == NAMES
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
        assert (dec.mw is not None) == (f.epilogue is not qformats.Epilogue.PLAIN)
        assert (dec.msub is not None) == (f.epilogue is qformats.Epilogue.DMIN)
        assert bool(np.all(dec.sub == 1)) == f.unit_sub
        pw = mmq.prepare(f.qtype, quants.random_blocks(f.qtype, 64, rng).reshape(4, -1))
        assert pw.w.dtype == (np.int8 if f.unit_sub else np.int16)
        assert (pw.wm is not None) == (f.epilogue is qformats.Epilogue.DMIN)


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
    registered type, and blocks of fully random bytes with finite half fields."""
    rng = np.random.default_rng(int(fmt.qtype))
    for std in (0.02, 1.0, 300.0):
        raw = quants.random_blocks(fmt.qtype, 96, rng, std=std).reshape(8, -1)
        ours = quants.dequantize(fmt.qtype, raw)
        ref = gq.dequantize(raw, fmt.qtype)
        assert ours.shape == ref.shape
        assert np.isfinite(ref).all()
        np.testing.assert_array_equal(_bits(ours), _bits(ref))
    raw = rng.integers(0, 256, (96, fmt.block_bytes), dtype=np.uint8)
    for off in fmt.half_fields.values():
        h = np.ascontiguousarray(raw[:, off:off + 2]).view("<u2")[:, 0]
        h = np.where((h & 0x7C00) == 0x7C00, h ^ 0x4000, h).astype("<u2")  # inf / NaN: finite
        raw[:, off:off + 2] = h.view(np.uint8).reshape(-1, 2)
    raw = raw.reshape(8, -1)
    np.testing.assert_array_equal(_bits(quants.dequantize(fmt.qtype, raw)), _bits(gq.dequantize(raw, fmt.qtype)))


@pytest.mark.parametrize("fmt", FORMATS, ids=NAMES)
def test_random_blocks_have_the_asked_spread(fmt):
    """unit_std is what random blocks' values spread by at scale 1: the asked std comes back."""
    x = quants.dequantize(fmt.qtype, quants.random_blocks(fmt.qtype, 4096, np.random.default_rng(9), std=0.5))
    assert 0.5 * 0.85 < float(np.std(x)) < 0.5 * 1.15
