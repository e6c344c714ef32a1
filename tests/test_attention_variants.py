"""Which attention kernel `attend` runs (fast/cuda/attention.py): the warpgroup kernel for a
prefill where the card runs it (sm_90), the pair kernel elsewhere, the split-K kernels for a
few queries; a kernel the card cannot run is refused before any work. No GPU: the card's
architecture is stood in for."""
import pytest

from strata_prefill.contract.errors import InputError
from strata_prefill.fast.cuda import attention, kernel_paths, runtime


@pytest.mark.parametrize("arch, prefill", [("sm_90", "wgmma"), ("sm_80", "pair"), ("sm_89", "pair"), ("sm_100", "pair")])
def test_the_prefill_kernel_is_the_first_the_card_runs(monkeypatch, arch, prefill):
    monkeypatch.setattr(runtime, "arch", lambda: arch)
    assert attention.prefill_variant() == prefill
    assert attention._attend_variant("auto", attention.ATTEND_SPLIT_MAX_T + 1) == prefill
    assert attention._attend_variant(None, 1000) == prefill
    assert attention._attend_variant("auto", attention.ATTEND_SPLIT_MAX_T) == "split"
    assert attention._attend_variant("pair", 1000) == "pair"
    if prefill != "wgmma":
        with pytest.raises(InputError, match=f"the wgmma kernel \\(attention_wgmma.cu\\) does not run on {arch}"):
            attention._attend_variant("wgmma", 1000)
    with pytest.raises(InputError, match="unknown variant"):
        attention._attend_variant("nope", 1000)


def test_each_tile_kernel_has_its_file_and_table():
    assert set(attention.ATTEND_TILE_MODULES) == set(attention.ATTEND_TILE_CONFIGS)
    assert set(attention.ATTEND_TILE_MODULES) <= set(attention.ATTEND_VARIANTS)
    assert set(attention.ATTEND_PREFILL) == set(attention.ATTEND_TILE_MODULES)
    assert attention.ATTEND_PREFILL[-1] == "pair"  # the last one runs on every card
    for module in attention.ATTEND_TILE_MODULES.values():
        assert module in kernel_paths.kernel_names()
    assert kernel_paths.target_arch(attention.ATTEND_TILE_MODULES["pair"], "sm_80") == "sm_80"
