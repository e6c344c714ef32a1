"""How the fast path picks an MMQ tile configuration (fast/cuda/products.py): the automatic
table by rows per expert, STRATA_MMQ_CONFIG over it, and STRATA_MMQ_DEFINES added to either
(an A/B of a kernel form kept behind a define, such as MMQ_MIX=0). Host code only: no GPU."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strata_prefill.fast.cuda import products
from strata_prefill.contract.errors import InputError


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    monkeypatch.delenv("STRATA_MMQ_CONFIG", raising=False)
    monkeypatch.delenv("STRATA_MMQ_DEFINES", raising=False)


def _expected_auto(rows: float) -> dict:
    for bound, cfg in products.AUTO_CONFIGS:
        if bound is None or rows < bound:
            return cfg
    raise AssertionError("the last AUTO_CONFIGS entry has no bound")


@settings(max_examples=60, deadline=None)
@given(rows=st.floats(0.5, 1e5, allow_nan=False))
def test_auto_config_follows_the_table(rows):
    assert products.auto_config(rows) == _expected_auto(rows)
    assert products.tile_config(rows) == _expected_auto(rows)


@settings(max_examples=40, deadline=None)
@given(rows=st.floats(0.5, 1e5, allow_nan=False), mix=st.integers(0, 1), at=st.integers(0, 3))
def test_defines_are_added_to_the_automatic_choice(rows, mix, at):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STRATA_MMQ_DEFINES", f'{{"MMQ_MIX": {mix}, "MMQ_MIX_AT": {at}}}')
        got = products.auto_config(rows)
    assert got == {**_expected_auto(rows), "MMQ_MIX": mix, "MMQ_MIX_AT": at}
    assert "MMQ_MIX" not in _expected_auto(rows)  # the table itself is left alone


def test_defines_are_added_to_an_explicit_config(monkeypatch):
    monkeypatch.setenv("STRATA_MMQ_CONFIG", '{"MMQ_BN": 64, "MMQ_WM": 4}')
    monkeypatch.setenv("STRATA_MMQ_DEFINES", '{"MMQ_MIX": 0}')
    assert products.default_config() == {"MMQ_BN": 64, "MMQ_WM": 4, "MMQ_MIX": 0}
    assert products.tile_config(500.0) == {"MMQ_BN": 64, "MMQ_WM": 4, "MMQ_MIX": 0}
    # a define given in both: STRATA_MMQ_DEFINES wins
    monkeypatch.setenv("STRATA_MMQ_DEFINES", '{"MMQ_BN": 128}')
    assert products.default_config()["MMQ_BN"] == 128


@pytest.mark.parametrize("raw, what", [
    ("{MMQ_MIX: 0}", "not JSON"),
    ("[1, 2]", "JSON object of integers"),
    ('{"MMQ_MIX": "0"}', "JSON object of integers"),
    ('{"MMQ_MIX": 0.5}', "JSON object of integers"),
])
def test_bad_defines_are_named(monkeypatch, raw, what):
    monkeypatch.setenv("STRATA_MMQ_DEFINES", raw)
    with pytest.raises(InputError, match=what) as e:
        products.auto_config(100.0)
    assert "STRATA_MMQ_DEFINES" in str(e.value)


def test_unset_or_blank_defines_change_nothing(monkeypatch):
    monkeypatch.setenv("STRATA_MMQ_DEFINES", "   ")
    assert products.extra_defines() == {}
    assert products.auto_config(20.0) is products.auto_config(20.0)


def _ctas(cfg, N, R):
    return -(-N // (16 * cfg.get("MMQ_WM", 8))) * -(-R // cfg.get("MMQ_BN", 128))


def _rounds(cfg, N, R, sms):
    return -(-_ctas(cfg, N, R) // (sms * cfg.get("MMQ_MINB", 1)))


@settings(max_examples=200, deadline=None)
@given(N=st.integers(1, 20000), R=st.integers(1, 40000), sms=st.integers(1, 200))
def test_dense_config_takes_the_cheaper_rounds(N, R, sms):
    got = products.dense_config(N, R, sms)
    auto = products.auto_config(float(R))
    big, small = products.AUTO_CONFIGS[-1][1], products.AUTO_CONFIGS[-2][1]
    if auto != big:
        assert got == auto  # few rows: a smaller tile already
        return
    cost_big, cost_small = _rounds(big, N, R, sms), products.SMALL_TILE_COST * _rounds(small, N, R, sms)
    assert got == (small if cost_small < cost_big else big)
    if _ctas(big, N, R) < sms:  # under one CTA an SM: one round either way, the small tile
        assert got == small


def test_dense_config_on_the_model_shapes():
    big, small = products.AUTO_CONFIGS[-1][1], products.AUTO_CONFIGS[-2][1]
    # 132 SMs, two CTAs an SM. The strata shape: key/value (512 rows) at 1K tokens, 8 x 8 = 64
    # CTAs: the small tile; the query product (4,096 rows), 64 x 8 = 512 in two rounds, against
    # 1,024 small ones in four: the large one
    assert products.dense_config(512, 1024, 132) == small
    assert products.dense_config(640, 1024, 132) == small
    assert products.dense_config(4096, 1024, 132) == big
    assert products.dense_config(512, 4096, 132) == big
    assert products.dense_config(512, 40, 132) == products.auto_config(40.0)
    # the shared expert's down product (2,560 rows) at 1K: 320 large CTAs in two rounds, 640
    # small ones in three
    assert products.dense_config(2560, 1024, 132) == small
    # qwen3-30b-a3b at 1,030 tokens: the output projection (2,048 rows) 288 large tiles in two
    # rounds or 544 small in three: small; the query product (4,096) 576 in three or 1,088 in
    # five: a tie, the large tile; at 2,048 tokens both large
    assert products.dense_config(2048, 1030, 132) == small
    assert products.dense_config(4096, 1030, 132) == big
    assert products.dense_config(2048, 2048, 132) == big
    assert products.dense_config(4096, 2048, 132) == big


def test_dense_config_carries_the_defines(monkeypatch):
    monkeypatch.setenv("STRATA_MMQ_DEFINES", '{"MMQ_MIX": 0}')
    assert products.dense_config(512, 1024, 132) == {**products.AUTO_CONFIGS[-2][1], "MMQ_MIX": 0}
    assert products.dense_config(4096, 8192, 132) == {**products.AUTO_CONFIGS[-1][1], "MMQ_MIX": 0}


def test_each_type_is_launched_from_its_own_module(monkeypatch):
    """mmq.cu is built one module a type (MMQ_ONLY): a launch of a type's kernel finds it in
    the build of that type under the launch's tile configuration, each build loaded once, the
    geometry read from the configuration's first build. The runtime is a stand-in that holds
    exactly the kernels signatures.py reads in each build (no GPU here)."""
    from strata_prefill.fast.cuda import products, runtime, signatures
    from strata_prefill.contract import qformats

    loads = []

    class Module:
        def __init__(self, defines):
            self.defines, self.kernels = defines, signatures.kernels("mmq", defines)

        def get_function(self, name):
            assert name in self.kernels, f"{name} is not in the build {self.defines}"
            return type("F", (), {"prepare": lambda self, fmt: None})()

    def load_module(name, defines=None):
        assert name == "mmq"
        loads.append(dict(defines))
        return Module(dict(defines))

    monkeypatch.setattr(products, "_mmq_state", {})
    monkeypatch.setattr(runtime, "load_module", load_module)
    monkeypatch.setattr(runtime, "module_ints", lambda mod, name, n: (64, 128, 256, 16)[:n])
    monkeypatch.setattr(runtime, "allow_dynamic_smem", lambda f, nbytes: f)
    monkeypatch.setattr(runtime, "to_device", lambda arr, what: object())
    cfg = products.auto_config(1e9)
    fmts = [f for f in qformats.formats() if f.mmq_kernel is not None]
    for _ in range(2):  # a second round loads nothing
        for fmt in fmts:
            st = products._mmq_mod(cfg)
            f = products._mmq_func(st, fmt)
            assert f.kernel == fmt.mmq_kernel
    assert loads == [{**cfg, "MMQ_ONLY": int(f.qtype)} for f in fmts]  # once each, the first for the geometry too
    assert products.mmq_geometry(cfg) == {"BM": 64, "BN": 128, "threads": 256, "max_exp": 16}
    assert products.mmq_modules(cfg) == [("mmq", d) for d in loads]
