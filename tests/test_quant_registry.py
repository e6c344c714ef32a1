"""The quant format registry (strata/qformats.py) against the places that still state its facts
by hand, and against gguf's own dequantization.

fast/cuda/kernels/mmq.cu states each type's block size, values, q8_1 layout and table use
(``Tr<QT_...>``), the type numbers (``QT_...``), its kernels (``MMQ_ENTRY``) and the table
buffer's offsets (``TAB_*``); fast/cuda/products.py names the kernels (``_MMQ_KERNEL``), the
256-value types (``_SUPER``) and fills the table buffer (``_tables_host``). All are read here
as text (the .cu) or with ast (products.py, so no device library is needed), and must agree
with the registry; planted changes on either side must be caught. Lists of type names kept in
verify/cases.py and conftest.py must equal the registry's too.
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
from strata.errors import PackError

ROOT = Path(__file__).resolve().parents[1]
MMQ_CU = ROOT / "fast" / "cuda" / "kernels" / "mmq.cu"
PRODUCTS = ROOT / "fast" / "cuda" / "products.py"
FORMATS = qformats.formats()
NAMES = [f.qtype.name for f in FORMATS]


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


def _qt_name(node: ast.AST) -> str:
    """'Q8_0' from the expression QT.Q8_0."""
    assert isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name), ast.dump(node)
    assert node.value.id == "QT", ast.dump(node)
    return node.attr


def products_facts(source: str) -> dict:
    """What products.py states, read with ast: {"kernel": {type name: kernel}, "super": set of
    type names, "tables": [(type name, offset, bytes)] from _tables_host's grid loop}."""
    tree = ast.parse(source)
    out: dict = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name, value = node.targets[0].id, node.value
            if name == "_MMQ_KERNEL":
                out["kernel"] = {_qt_name(k): ast.literal_eval(v) for k, v in zip(value.keys, value.values)}
            elif name == "_SUPER":
                out["super"] = {_qt_name(e) for e in value.elts}
        elif isinstance(node, ast.FunctionDef) and node.name == "_tables_host":
            for sub in ast.walk(node):
                if isinstance(sub, ast.For) and isinstance(sub.iter, ast.Tuple):
                    out["tables"] = [(_qt_name(t.elts[0]), ast.literal_eval(t.elts[1]), ast.literal_eval(t.elts[2]))
                                     for t in sub.iter.elts]
    return out


# --------------------------------------------------------------------------- comparisons


def cu_mismatches(facts: dict) -> list[str]:
    bad = []
    layout = qformats.table_layout()
    want_tab = {name: off for name, (off, _) in layout.items() if name != "BYTES"}
    want_tab["BYTES"] = layout["BYTES"][1]
    if facts["tab"] != want_tab:
        bad.append(f"TAB_*: mmq.cu {facts['tab']} != registry {want_tab}")
    for f in FORMATS:
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
    extra = set(facts["entries"].values()) - set(NAMES)
    if extra:
        bad.append(f"mmq.cu has kernels for unregistered types {sorted(extra)}")
    return bad


def products_mismatches(facts: dict) -> list[str]:
    bad = []
    want_kernel = {f.qtype.name: f.mmq_kernel for f in FORMATS}
    if facts.get("kernel") != want_kernel:
        bad.append(f"_MMQ_KERNEL {facts.get('kernel')} != registry {want_kernel}")
    want_super = {f.qtype.name for f in FORMATS if f.block_values != 32}
    if facts.get("super") != want_super:
        bad.append(f"_SUPER {facts.get('super')} != registry's 256-value types {want_super}")
    layout = qformats.table_layout()
    want_tables = [(f.qtype.name, *layout[f.table_name]) for f in FORMATS if f.table_name is not None]
    if facts.get("tables") != want_tables:
        bad.append(f"_tables_host grids {facts.get('tables')} != registry {want_tables}")
    return bad


# --------------------------------------------------------------------------- the checks


def test_mmq_cu_agrees_with_registry():
    facts = cu_facts(MMQ_CU.read_text())
    assert facts["tab"] and facts["tr"] and facts["entries"]  # the parser found them at all
    assert cu_mismatches(facts) == []


def test_products_agrees_with_registry():
    facts = products_facts(PRODUCTS.read_text())
    assert products_mismatches(facts) == []


def test_products_imported_agrees_with_its_source():
    """Where products.py imports (it needs no device library to), its live tables equal what
    the ast read: the ast reading is of the tables actually used."""
    try:
        from fast.cuda import products
    except ImportError:
        pytest.skip("fast.cuda.products does not import here")
    facts = products_facts(PRODUCTS.read_text())
    assert {qt.name: k for qt, k in products._MMQ_KERNEL.items()} == facts["kernel"]
    assert {qt.name for qt in products._SUPER} == facts["super"]
    tab = products._tables_host()
    layout = qformats.table_layout()
    assert tab.size == layout["BYTES"][1]
    signs = quants._sign_table()
    off, size = layout["SIGN"]
    assert np.array_equal(tab[off:off + size], np.where(signs.reshape(-1) < 0, 0xFF, 0).astype(np.uint8))
    for f in FORMATS:
        if f.table_name is not None:
            off, size = layout[f.table_name]
            assert np.array_equal(tab[off:off + size].view(np.int8), f.grid().reshape(-1))


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


@pytest.mark.parametrize("plant", [
    ('"mmq_iq2_xs"', '"mmq_iq2xs"'),
    ("QT.IQ3_XXS, 5120, 1024", "QT.IQ3_XXS, 5120, 2048"),
])
def test_planted_products_change_is_caught(plant):
    src = PRODUCTS.read_text()
    old, new = plant
    assert old in src
    assert products_mismatches(products_facts(src.replace(old, new, 1))) != []


def test_planted_super_change_is_caught():
    src = PRODUCTS.read_text()
    m = re.search(r"^_SUPER = \{(.*)\}", src, re.M)
    assert m
    assert products_mismatches(products_facts(src.replace(m[0], "_SUPER = {QT.Q2_K}"))) != []


def test_planted_registry_change_is_caught(monkeypatch):
    """The other side: a format whose kernel name or layout changes no longer matches."""
    cu, pr = cu_facts(MMQ_CU.read_text()), products_facts(PRODUCTS.read_text())
    monkeypatch.setattr(qformats.IQ3_S, "mmq_kernel", "mmq_iq3s")
    assert cu_mismatches(cu) != [] and products_mismatches(pr) != []
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
