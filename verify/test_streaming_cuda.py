"""Expert streaming on the GPU: the reference against the `cuda` backend with experts streamed
from the host tier (caches of none, some and all experts; rings of 8 to 384 slots; staged and
streamed chunks; every switch), and on a `strata` pack whose cache holds a third of the
experts, 8K and 32K prompts with every arm byte-equal to the all-resident one. Skips, with the
reason, without a GPU."""
import itertools
import os

import numpy as np
import pytest

from reference import ReferenceEngine
from verify.common import assert_same_run, run_engine

try:
    from fast.cuda.runtime import cuda_available

    _OK, _WHY = cuda_available()
except ImportError as exc:  # pragma: no cover - the runtime module itself is missing
    _OK, _WHY = False, f"the cuda runtime does not import: {exc}"

pytestmark = pytest.mark.skipif(not _OK, reason=f"cuda backend unavailable: {_WHY}")

ARMS = list(itertools.product([1, 0], [0, 1], [0, 1]))  # group gather, quant gather, copy coalesce
RINGS = [8, 16, 96, 128, 384]


def in_place_of(arm: int) -> int:
    """Arm i's in_place switch: 1 1 1 0 0 0 1 1, so that both values meet caches of none, a
    third and all (the cache cycles with i % 3)."""
    return 1 - (arm // 3) % 2


def prompt(pack, n, seed):
    return np.random.default_rng(seed).integers(0, pack.config.n_vocab, n).astype(np.int32)


def _engine(pack, **kw):
    from fast import make_fast_engine

    return make_fast_engine(pack, "cuda", **kw)


@pytest.mark.parametrize("preset,expert_type", [("tiny", "Q8_0"), ("tiny", "IQ2_XS"), ("tiny", "Q2_K"),
                                                ("tiny", "Q4_1"), ("small", "IQ2_XS"), ("small", "Q2_K")])
def test_reference_vs_cuda_streaming(make_test_pack, tmp_path, preset, expert_type):
    """Prompts of 130 (chunks of 64: streamed, streamed, staged) and 1,100 tokens (one streamed
    chunk at the default threshold, then staged greedy tokens)."""
    pack = make_test_pack(preset, expert_type)
    cfg = pack.config
    n_all = cfg.n_layer * cfg.n_expert
    for n, chunk, stream_min in ((130, 64, 64), (1100, "auto", None)):
        if preset == "small" and n == 130:
            continue
        ids = prompt(pack, n, seed=n)
        ref = run_engine(ReferenceEngine(pack), ids, chunk, tmp_path / f"ref{n}")
        for i, (gg, qg, co) in enumerate(ARMS):
            ring = RINGS[i % len(RINGS)]
            cache = (0, n_all // 3, n_all)[i % 3]
            ip = in_place_of(i)
            eng = _engine(pack, group_gather=gg, quant_gather=qg, copy_coalesce=co, expert_cache=cache, ring=ring,
                          stream_min=stream_min, in_place=ip)
            got = run_engine(eng, ids, chunk, tmp_path / f"cuda{n}-{i}")
            assert_same_run(ref, got, pack, f"{preset} {expert_type} T={n} ring {ring} cache {cache} "
                                            f"group_gather={gg} quant_gather={qg} coalesce={co} in_place={ip}")


LONG = [int(t) for t in os.environ.get("STRATA_VERIFY_LONG", "8192,32768").split(",") if t]


@pytest.mark.parametrize("n_tokens", LONG)
def test_long_prompts_streamed_arms_agree(tmp_path_factory, make_test_pack, n_tokens):
    """A 2-layer `strata` pack, a cache of a third of its experts: every streamed arm (and the
    default ring, 96 and 8 slots) gives the all-resident run's bytes."""
    pack = make_test_pack("strata", "IQ2_XS", layers=2)
    cfg = pack.config
    ids = prompt(pack, n_tokens, seed=n_tokens)
    base = run_engine(_engine(pack, expert_cache=cfg.n_layer * cfg.n_expert), ids, "auto",
                      tmp_path_factory.mktemp("resident"), greedy=1, layer_dumps=False)
    third = cfg.n_layer * cfg.n_expert // 3
    for i, (gg, qg, co) in enumerate(ARMS):
        ring = (None, 96, 8)[i % 3]
        ip = in_place_of(i)
        eng = _engine(pack, group_gather=gg, quant_gather=qg, copy_coalesce=co, expert_cache=third, ring=ring,
                      in_place=ip)
        got = run_engine(eng, ids, "auto", tmp_path_factory.mktemp(f"s{i}"), greedy=1, layer_dumps=False)
        assert eng.counters["copies"] > 0 and eng.counters["waits"] > 0
        assert_same_run(base, got, pack, f"strata T={n_tokens} cache {third} ring {ring} group_gather={gg} "
                                         f"quant_gather={qg} coalesce={co} in_place={ip}")
        del eng
