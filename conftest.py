"""Fixtures shared by tests/ and verify/: synthetic packs, made once per session."""
import pytest

from strata.make_pack import make_pack

EXPERT_TYPES = ["Q8_0", "Q4_1", "Q2_K", "IQ2_XS", "IQ3_XXS", "IQ3_S"]


@pytest.fixture(scope="session")
def make_test_pack(tmp_path_factory):
    """make_test_pack(preset, expert_type="Q8_0", **kw) -> Pack, cached per arguments."""
    from strata.pack import Pack

    cache = {}

    def get(preset="tiny", expert_type="Q8_0", **kw):
        key = (preset, expert_type, tuple(sorted(kw.items())))
        if key not in cache:
            name = "-".join(str(p) for p in (preset, expert_type, *kw.values()))
            path = tmp_path_factory.mktemp("packs") / f"{name}.gguf"
            make_pack(path, preset, expert_type=expert_type, progress=False, **kw)
            cache[key] = Pack.open(path)
        return cache[key]

    return get
