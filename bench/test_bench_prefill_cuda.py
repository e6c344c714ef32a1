"""pytest-benchmark, GPU: the whole fast prefill per implementation, on a small strata pack.

    pytest bench/test_bench_prefill_cuda.py

A 2-layer `strata` pack with IQ2_XS experts (made once per session), every expert resident,
prompts of 2K, 8K and 32K random tokens in chunks of Session's default (8K). Arms: `group`
(every expert gathered, in_place=0: one gather launch per group, scatter quantize),
`per_expert` (in_place=0, group_gather=0), `gather_q` (the defaults, quant_gather=1). With
in_place 1 (the default) no resident expert is gathered, so the gather arms take in_place 0:
group_gather would do nothing otherwise (fast/options.py refuses it). Each round is a fresh prompt on an emptied KV
cache, timed with CUDA events on the engine's compute stream (prefill returns host logits, so
everything is in). extra_info: tokens/s and the launches, gathers, waits and events a prefill
makes. The reference on the CPU: bench/test_bench_reference.py; streamed experts:
bench/bench_streaming_cuda.py.
"""
import numpy as np
import pytest

from strata_prefill.fast import make_fast_engine
from strata_prefill.session import AUTO_CHUNK, Session

pytestmark = pytest.mark.gpu

LAYERS = 2
ARMS = {"group": {"in_place": 0}, "per_expert": {"in_place": 0, "group_gather": 0}, "gather_q": {"quant_gather": 1}}


@pytest.fixture(scope="module")
def engines(make_test_pack):
    """engines(arm) -> a FastEngine on the cuda backend, all experts resident, made once."""
    pack = make_test_pack("strata", "IQ2_XS", layers=LAYERS)
    made = {}

    def get(arm):
        if arm not in made:
            n_all = pack.config.n_layer * pack.config.n_expert
            made[arm] = make_fast_engine(pack, "cuda", expert_cache=n_all, **ARMS[arm])
        return made[arm]

    return get


@pytest.mark.parametrize("tokens", [2048, 8192, 32768])
@pytest.mark.parametrize("arm", list(ARMS))
def test_prefill(gpu_benchmark, benchmark, engines, arm, tokens):
    eng = engines(arm)
    rng = np.random.default_rng(tokens)

    def setup():
        eng.be.reset_cache()
        return (rng.integers(0, eng.config.n_vocab, tokens),), {}

    def prefill(ids):
        Session(eng, chunk=AUTO_CHUNK, progress=False).prefill(ids)

    median = gpu_benchmark(prefill, stream=eng.be.dev.stream, counters=eng.counters, setup=setup, rounds=3,
                           tokens=tokens, chunk=min(tokens, AUTO_CHUNK), layers=LAYERS, arm=arm,
                           expert_type="IQ2_XS")
    if median:
        benchmark.extra_info["tokens_per_s"] = tokens / median
