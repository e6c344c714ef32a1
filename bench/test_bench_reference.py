"""pytest-benchmark: the reference prefill's speed (tokens/s) on `tiny` and `small` packs.

    pytest bench/test_bench_reference.py --benchmark-columns=median,rounds

Each round prefills a fresh prompt of N tokens in one chunk on a fresh engine whose decoded
weights are already cached (the first, untimed call decodes them). The `extra_info` of each
benchmark holds tokens/s (from the median), the tokens, the chunk, the preset and the threads
the reference ran on (contract/parallel.py).

`test_reference_threads` times the small pack at 1,024 tokens on one thread and on the
machine's threads (STRATA_PREFILL_THREADS unset: the CPUs this process may use), so that one
run shows what the threads buy; `test_reference_prefill` runs on the machine's threads.
"""
import numpy as np
import pytest

from strata_prefill.reference import ReferenceEngine
from strata_prefill.contract import parallel
from strata_prefill.session import AUTO_CHUNK, Session

SIZES = [128, 1024, 4096]


def _time_prefill(benchmark, pack, n_tokens):
    engine = ReferenceEngine(pack)
    rng = np.random.default_rng(n_tokens)
    Session(engine, chunk="auto", progress=False).prefill(rng.integers(0, pack.config.n_vocab, 64))

    def setup():
        engine.kv = type(engine.kv)(pack.config.n_layer, pack.config.n_head_kv, pack.config.head_dim)
        ids = rng.integers(0, pack.config.n_vocab, n_tokens)
        return (Session(engine, chunk="auto", progress=False), ids), {}

    rounds = 3 if n_tokens <= 1024 else 1
    benchmark.pedantic(lambda s, ids: s.prefill(ids), setup=setup, rounds=rounds, iterations=1)
    benchmark.extra_info.update(tokens=n_tokens, chunk=min(n_tokens, AUTO_CHUNK), threads=engine.threads)
    if benchmark.stats is not None:  # None under --benchmark-disable
        benchmark.extra_info["tokens_per_s"] = n_tokens / benchmark.stats.stats.median


@pytest.mark.parametrize("preset", ["tiny", "small"])
@pytest.mark.parametrize("n_tokens", SIZES)
def test_reference_prefill(benchmark, make_test_pack, preset, n_tokens):
    _time_prefill(benchmark, make_test_pack(preset, "IQ2_XS"), n_tokens)
    benchmark.extra_info["preset"] = preset


@pytest.mark.parametrize("threads", ["1", "machine"])
def test_reference_threads(benchmark, make_test_pack, monkeypatch, threads):
    if threads == "machine":
        monkeypatch.delenv(parallel.ENV, raising=False)
    else:
        monkeypatch.setenv(parallel.ENV, threads)
    _time_prefill(benchmark, make_test_pack("small", "IQ2_XS"), 1024)
    benchmark.extra_info["preset"] = "small"
