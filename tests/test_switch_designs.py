"""The parity gate's switch designs (verify/test_parity_sim.py, verify/test_parity_cuda.py): the
defaults first, and every pair of switches meets all four value pairs. Checked here, where no
GPU is needed, so a design that loses a pair fails CI."""
import pytest

from strata_prefill.arms import SWITCHES as ARM_SWITCHES
from verify import test_parity_cuda, test_parity_sim

DEFAULTS = {"group_gather": 1, "quant_gather": 0, "overlap_plan": 1, "fuse_group": 1, "lean_attention": 1,
            "tiled_dense": 1, "in_place": 1, "widen_float": 1, "pair_attention": 1}


@pytest.mark.parametrize("module,names", [
    (test_parity_sim, ("group_gather", "quant_gather", "overlap_plan", "fuse_group", "in_place")),
    (test_parity_cuda, ("group_gather", "quant_gather", "overlap_plan", "fuse_group", "lean_attention",
                        "tiled_dense", "in_place", "widen_float", "pair_attention")),
])
def test_design_covers_every_pair_defaults_first(module, names):
    design = module.SWITCHES
    assert all(len(sw) == len(names) for sw in design)
    assert design[0] == tuple(DEFAULTS[n] for n in names)
    assert set(names) <= set(ARM_SWITCHES)
    for i in range(len(names)):
        for j in range(i + 1, len(names)):
            assert {(sw[i], sw[j]) for sw in design} == {(0, 0), (0, 1), (1, 0), (1, 1)}, (names[i], names[j])
