"""The architecture seam (docs/architectures.md): one registry (formats/archs) that both
implementations follow, a pack of an unknown architecture refused naming the known ones, the
shared modules free of any one architecture's names, and one tensor table feeding the
reference's Layer and the fast engine's per-layer weights."""
from __future__ import annotations

import dataclasses
import re
import types
from pathlib import Path

import pytest
from gguf import GGUFWriter

from strata_prefill.fast import archs as fast_archs
from strata_prefill.fast.weights import LayerWeights
from strata_prefill.reference import archs as reference_archs
from strata_prefill.formats import archs
from strata_prefill.contract import moe
from strata_prefill.formats.archs import qwen3moe
from strata_prefill.formats.archs.spec import MoeParams, layer_names
from strata_prefill.formats.config import PRESETS, ModelConfig
from strata_prefill.contract.errors import PackError
from strata_prefill.formats.pack import Pack

ROOT = Path(__file__).resolve().parent.parent
SHARED = ("contract", "formats", "reference", "fast")  # the rooms whose shared modules name no architecture
SOURCES = ("*.py", "*.cu", "*.cuh")
# an architecture's name, or the single-architecture constant config.py held
NAMED = re.compile(r"(?i:qwen3moe)|^\s*ARCH\s*=|\bimport\b[^\n]*\bARCH\b|config\.ARCH\b", re.M)


def arch_files(package: str) -> set[str]:
    """The module names of package/archs/ (less __init__)."""
    return {p.stem for p in (ROOT / package / "archs").glob("*.py") if p.stem != "__init__"}


def test_both_implementations_follow_the_registry():
    modules = {archs.module_name(name) for name in archs.ARCHS}
    assert modules and archs.DEFAULT in archs.ARCHS
    assert arch_files("formats") == modules | {"spec"}
    assert arch_files("reference") == modules
    assert arch_files("fast") == modules
    for name, spec in archs.ARCHS.items():
        assert spec.NAME == name
        for impl in (reference_archs, fast_archs):
            assert callable(impl.module(name).attention_half), (impl.__name__, name)


def test_every_layer_class_matches_its_table():
    for spec in archs.ARCHS.values():
        table = [t.field for t in spec.BLOCK_TENSORS]
        fields = [f.name for f in dataclasses.fields(spec.Layer)]
        assert fields == ["index"] + table
        assert len(set(table)) == len(table)
        assert not moe.unsupported(spec.MOE), spec.NAME  # a registered architecture runs


def two_known(monkeypatch) -> None:
    """A second architecture in the registry (qwen3moe's module under another name)."""
    monkeypatch.setitem(archs.ARCHS, "other-moe", qwen3moe)


def test_unknown_architecture_is_refused_naming_the_known_ones(monkeypatch):
    with pytest.raises(PackError, match=r"^wrong architecture: expected qwen3moe or gpt-oss, got llama$"):
        ModelConfig.from_metadata({"general.architecture": "llama"})
    two_known(monkeypatch)
    with pytest.raises(PackError, match=r"^f\.gguf: wrong architecture: expected qwen3moe, gpt-oss or other-moe, got gptx$"):
        ModelConfig.from_metadata({"general.architecture": "gptx"}, where="f.gguf: ")
    with pytest.raises(PackError, match="expected qwen3moe, gpt-oss or other-moe, got gptx"):
        ModelConfig(**{**dataclasses.asdict(PRESETS["tiny"]), "arch": "gptx"}).spec  # noqa: B018


def test_pack_of_unknown_architecture_is_refused_alone(tmp_path):
    """A pack naming an architecture no module describes is refused with that alone: its tensors
    are not judged against another architecture's table."""
    path = tmp_path / "odd.gguf"
    w = GGUFWriter(str(path), "mamba9")
    w.add_uint32("mamba9.block_count", 1)
    w.add_tensor("blk.0.ssm_in.weight", __import__("numpy").ones(32, dtype="float32"))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(PackError) as exc:
        Pack.open(path)
    assert str(exc.value) == f"{path}: wrong architecture: expected qwen3moe or gpt-oss, got mamba9"


def test_moe_parameters_the_half_lacks_are_refused(monkeypatch):
    spec = types.SimpleNamespace(**{k: getattr(qwen3moe, k) for k in dir(qwen3moe) if k.isupper() or k == "Layer"})
    spec.MOE = dataclasses.replace(qwen3moe.MOE, scoring="sigmoid", activation="geglu")
    monkeypatch.setitem(archs.ARCHS, "other-moe", spec)
    problems = PRESETS["tiny"].replace(arch="other-moe").problems()
    assert problems == [
        "other-moe: the MoE half does not compute scoring='sigmoid' (it computes 'softmax' or 'softmax_selected')",
        "other-moe: the MoE half does not compute activation='geglu' (it computes 'swiglu' or 'swiglu_oai')"]
    spec.MOE = dataclasses.replace(qwen3moe.MOE, scoring="softmax_selected")  # renormalizing goes with softmax
    assert PRESETS["tiny"].replace(arch="other-moe").problems() == [
        "other-moe: the MoE half does not compute renormalize=True with scoring='softmax_selected' "
        "(it computes renormalize=False)"]
    assert PRESETS["tiny"].problems() == []
    assert isinstance(qwen3moe.MOE, MoeParams)


def shared_sources() -> list[Path]:
    skip = {ROOT / "formats" / "archs" / "__init__.py"}  # the registry names each architecture
    out = []
    for package in SHARED:
        for pattern in SOURCES:
            for path in (ROOT / package).rglob(pattern):
                in_archs = path.parent.name == "archs" and path.stem in arch_files(package)
                if not in_archs and path not in skip and path.stem != "spec":
                    out.append(path)
    return sorted(out)


def test_shared_modules_name_no_architecture():
    sources = shared_sources()
    assert len(sources) > 50 and ROOT / "formats" / "pack.py" in sources
    named = [f"{p.relative_to(ROOT)}:{p.read_text().count(chr(10), 0, m.start()) + 1}: {m.group(0).strip()}"
             for p in sources for m in NAMED.finditer(p.read_text())]
    assert not named, "an architecture named outside formats/archs, reference/archs, fast/archs:\n" + "\n".join(named)
    # the pattern finds what it looks for where it is
    assert NAMED.search((ROOT / "formats" / "archs" / "qwen3moe.py").read_text())
    assert NAMED.search("from strata_prefill.formats.config import ARCH, PRESETS") and NAMED.search('ARCH = "x"')
    assert not NAMED.search("runtime.DEFAULT_ARCH")


class _Recorder:
    """A backend whose w() hands back the name it was asked for, and counts the asks."""

    def __init__(self):
        self.asked = []

    def w(self, name):
        self.asked.append(name)
        return ("handle", name)


@pytest.mark.parametrize("preset", ["tiny", "small"])  # with and without a shared expert
def test_one_table_feeds_the_reference_layer_and_the_fast_weights(make_test_pack, preset):
    pack = make_test_pack(preset)
    spec = pack.config.spec
    for l in range(pack.config.n_layer):
        lay = pack.layer(l)
        be = _Recorder()
        W = LayerWeights(be, pack, l)
        names = layer_names(spec, l, set(pack.tensor_names()).__contains__)
        assert lay.has_shexp == W.has_shexp == (pack.config.n_ff_shexp > 0)
        for t in spec.BLOCK_TENSORS:
            name = names.get(t.field)
            held = getattr(lay, t.field)
            if name is None:
                assert held is None and getattr(W, t.field) is None and t.group == "shexp"
                continue
            assert name == f"blk.{l}.{t.field}"
            if t.is_vector:
                assert held is pack.vector(name) and pack.is_vector(name)
            else:
                assert held is pack.matrix(name) and not pack.is_vector(name)
            if t.role.startswith("expert_"):
                with pytest.raises(AttributeError, match="through the walk"):
                    getattr(W, t.field)
            else:
                assert getattr(W, t.field) == ("handle", name)
        assert len(be.asked) == len([f for f in names if not f.endswith("_exps")])  # one ask per use, lazily
        with pytest.raises(AttributeError, match="no weight 'attn_qq'"):
            W.attn_qq  # noqa: B018
