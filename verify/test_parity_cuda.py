"""The parity gate on the GPU: the reference against the `cuda` backend, byte for byte, for
every weight type, both switches and a spread of prompt lengths (one chunk, several chunks),
on `tiny` and `small` packs; and at long prompts (8K, 32K tokens, where NumPy is too slow)
the fast path's switch arms against each other. Skips, with the reason, without a GPU."""
import os

import numpy as np
import pytest

from conftest import EXPERT_TYPES
from reference import ReferenceEngine
from verify.common import assert_same_run, run_engine

try:
    from fast.cuda.runtime import cuda_available

    _OK, _WHY = cuda_available()
except ImportError as exc:  # pragma: no cover - the runtime module itself is missing
    _OK, _WHY = False, f"the cuda runtime does not import: {exc}"

pytestmark = pytest.mark.skipif(not _OK, reason=f"cuda backend unavailable: {_WHY}")

# (group_gather, quant_gather, overlap_plan, fuse_group, lean_attention, tiled_dense, in_place,
# widen_float, pair_attention): the defaults first, then every pair of switches takes all four
# value pairs (columns: the 3-of-6 vectors, no two complementary, so every pair of columns meets
# all four)
SWITCHES = [(1, 0, 1, 1, 1, 1, 1, 1, 1), (0, 0, 0, 0, 0, 0, 0, 1, 1), (0, 0, 0, 0, 1, 1, 1, 0, 0),
            (0, 1, 1, 1, 0, 0, 1, 0, 0), (1, 1, 0, 1, 0, 1, 0, 0, 1), (1, 1, 1, 0, 1, 0, 0, 1, 0)]
# (prompt tokens, chunk): one chunk at several sizes, and prompts cut into several chunks
LENGTHS = [(1, "auto"), (63, "auto"), (128, "auto"), (600, "auto"), (1030, "auto"), (2099, "auto"),
           (2099, 700)]


def _engine(pack, gg, qg, op, fg, la, td, ip, wf, pa):
    from fast import make_fast_engine

    return make_fast_engine(pack, "cuda", group_gather=gg, quant_gather=qg, overlap_plan=op, fuse_group=fg,
                            lean_attention=la, tiled_dense=td, in_place=ip, widen_float=wf, pair_attention=pa)


def _arm(sw) -> str:
    return " ".join(f"{k}={v}" for k, v in zip(("group_gather", "quant_gather", "overlap_plan", "fuse_group",
                                                "lean_attention", "tiled_dense", "in_place", "widen_float",
                                                "pair_attention"), sw))


def prompt(pack, n, seed):
    return np.random.default_rng(seed).integers(0, pack.config.n_vocab, n).astype(np.int32)


@pytest.mark.parametrize("preset", ["tiny", "small"])
@pytest.mark.parametrize("expert_type", EXPERT_TYPES)
def test_reference_vs_cuda(make_test_pack, tmp_path, preset, expert_type):
    pack = make_test_pack(preset, expert_type)
    engines = {sw: _engine(pack, *sw) for sw in SWITCHES}
    for n, chunk in LENGTHS:
        if preset == "small" and n in (128, 1030):
            continue  # the small pack's reference is slower: a shorter spread
        ids = prompt(pack, n, seed=n)
        ref = run_engine(ReferenceEngine(pack), ids, chunk, tmp_path / f"ref-{n}-{chunk}")
        for sw, eng in engines.items():
            eng.be.reset_cache()
            got = run_engine(eng, ids, chunk, tmp_path / f"cuda-{n}-{chunk}-{''.join(map(str, sw))}")
            assert_same_run(ref, got, pack, f"{preset} {expert_type} T={n} chunk={chunk} {_arm(sw)}")


LONG = [int(t) for t in os.environ.get("STRATA_VERIFY_LONG", "8192,32768").split(",") if t]


@pytest.mark.parametrize("n_tokens", LONG)
def test_long_prompt_switch_arms_agree(tmp_path_factory, make_test_pack, n_tokens):
    """A `strata` pack of 2 layers (512 experts, top-10, a shared expert): every arm of the
    switch design gives the bytes of the default arm."""
    pack = make_test_pack("strata", "IQ2_XS", layers=2)
    ids = prompt(pack, n_tokens, seed=n_tokens)
    base = None
    for sw in SWITCHES:
        eng = _engine(pack, *sw)
        got = run_engine(eng, ids, "auto", tmp_path_factory.mktemp(f"long{''.join(map(str, sw))}"), greedy=1,
                         layer_dumps=False)
        if base is None:
            base = got
        else:
            assert_same_run(base, got, pack, f"strata T={n_tokens} {_arm(sw)}")
        del eng


@pytest.mark.parametrize("router_type,dense_type", [("BF16", "F16"), ("F32", "F16"), ("BF16", "Q8_0")])
def test_reference_vs_cuda_float_weights_widened_or_not(make_test_pack, tmp_path, router_type, dense_type):
    """Float routers and float attention/shared-expert matrices: read as stored (widen_float 0)
    or widened once to F32 on the device (1), the reference's bytes either way."""
    pack = make_test_pack("tiny", "Q4_1", router_type=router_type, dense_type=dense_type)
    ids = prompt(pack, 70, seed=3)
    ref = run_engine(ReferenceEngine(pack), ids, 64, tmp_path / "ref")
    for wf in (1, 0):
        from fast import make_fast_engine

        eng = make_fast_engine(pack, "cuda", widen_float=wf)
        got = run_engine(eng, ids, 64, tmp_path / f"wf{wf}")
        assert_same_run(ref, got, pack, f"tiny router {router_type} dense {dense_type} widen_float={wf}")
        kinds = {w.qtype.name for n, w in eng.be._weights.items() if n.endswith("ffn_gate_inp")}
        assert kinds == ({"F32"} if wf else {router_type}), kinds
