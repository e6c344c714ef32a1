"""The reference on several threads (contract/parallel.py): the same bytes as on one, for every
output of a run and for the pieces that are split (products, attention, quantization); a bad
STRATA_PREFILL_THREADS is one line before any work; the pool keeps order and errors."""
import threading

import numpy as np
import pytest

from conftest import EXPERT_TYPES
from strata_prefill.reference import ReferenceEngine
from strata_prefill.reference.weights import PreparedCache
from strata_prefill.contract import attention, dense, mmq, parallel, q8_1
from strata_prefill.contract.errors import InputError
from strata_prefill.formats.make_pack import make_pack
from strata_prefill.session import Session

ENV = parallel.ENV


def run_outputs(pack, ids, tmp_path, chunk="auto", level="ops"):
    """Every output of a run as bytes: the record file, the residual dump, the first-token
    logits (file and array), the greedy tokens."""
    tmp_path.mkdir(parents=True)
    s = Session(ReferenceEngine(pack), chunk=chunk, dump_dir=tmp_path, dump_r=tmp_path / "r.bin",
                dump_first_logits=tmp_path / "logits.f32", progress=False, dump_level=level)
    res = s.run(ids, greedy=2)
    out = {f.name: f.read_bytes() for f in sorted(tmp_path.iterdir())}
    out["logits"] = np.asarray(res.logits, np.float32).tobytes()
    out["greedy"] = repr(res.greedy).encode()
    return out


def assert_same(a: dict, b: dict, what: str):
    assert sorted(a) == sorted(b), what
    for name in a:
        assert a[name] == b[name], f"{what}: {name} differs"


@pytest.mark.parametrize("pack_args", [("Q2_K", {}), ("IQ2_XS", {}),
                                       ("Q4_1", {"dense_type": "F16", "router_type": "BF16"})],
                         ids=["Q2_K", "IQ2_XS", "Q4_1-F16-dense"])
def test_four_threads_give_the_bytes_of_one(make_test_pack, tmp_path, monkeypatch, pack_args):
    """300 tokens in one chunk: every split is taken (experts, attention tiles and heads,
    product and quantization row slabs; float products' weight rows in the F16 pack), and
    greedy steps run one-token chunks."""
    expert_type, kw = pack_args
    pack = make_test_pack("tiny", expert_type, **kw)
    ids = np.random.default_rng(11).integers(0, pack.config.n_vocab, 300)
    runs = {}
    for n in ("1", "4"):
        monkeypatch.setenv(ENV, n)
        runs[n] = run_outputs(pack, ids, tmp_path / f"threads-{n}")
    assert len(runs["1"]["layers.spd"]) > 1 << 20  # the op records are all there
    assert_same(runs["1"], runs["4"], f"{expert_type}: 1 vs 4 threads")


def test_chunked_run_on_threads_matches_one_thread(make_test_pack, tmp_path, monkeypatch):
    pack = make_test_pack("tiny", "IQ3_S")
    ids = np.random.default_rng(12).integers(0, pack.config.n_vocab, 150)
    monkeypatch.setenv(ENV, "1")
    one = run_outputs(pack, ids, tmp_path / "one", chunk=64, level="layer")
    monkeypatch.setenv(ENV, "3")
    assert_same(one, run_outputs(pack, ids, tmp_path / "three", chunk=64, level="layer"), "chunk 64")


def _random_rows(rng, n_rows, k, qtype):
    layout = q8_1.layout_for(qtype)
    x = (rng.standard_normal((n_rows, k)) * rng.uniform(0.1, 10, (n_rows, 1))).astype(np.float32)
    return q8_1.decode_rows(q8_1.quantize_rows(x, layout), n_rows, layout)


@pytest.mark.parametrize("expert_type", EXPERT_TYPES)
def test_product_row_slabs_on_threads(tmp_path_factory, monkeypatch, expert_type):
    """mmq_prepared on 1 and 5 threads, for every weight type (its own epilogue), rows that
    do not divide evenly."""
    from strata_prefill.formats.pack import Pack

    path = tmp_path_factory.mktemp("p") / "tiny.gguf"
    make_pack(path, "tiny", expert_type=expert_type, progress=False)
    m = Pack.open(path).layer(1).ffn_gate_exps.expert(5)
    pw = mmq.prepare(m.qtype, m.data)
    act = _random_rows(np.random.default_rng(3), 397, 256, m.qtype)
    monkeypatch.setenv(ENV, "1")
    one = mmq.mmq_prepared(pw, act)
    monkeypatch.setenv(ENV, "5")
    assert len(parallel.slabs(397, parallel.workers(), mmq._MIN_ROWS_PER_THREAD)) == 5
    five = mmq.mmq_prepared(pw, act)
    assert np.isfinite(one).all() and np.abs(one).max() > 0
    assert one.tobytes() == five.tobytes()


def test_attention_quantize_and_float_product_on_threads(monkeypatch):
    rng = np.random.default_rng(4)
    n_tok, n_head, n_kv, hd = 333, 8, 2, 64
    cache = attention.KVCache(1, n_kv, hd)
    pos = np.arange(n_tok)
    cache.write(0, pos, rng.standard_normal((n_tok, n_kv, hd)).astype(np.float32),
                rng.standard_normal((n_tok, n_kv, hd)).astype(np.float32))
    q = (rng.standard_normal((n_tok, n_head, hd)) * 3).astype(np.float32)
    x = rng.standard_normal((1100, 300)).astype(np.float32)
    w = rng.standard_normal((70, 300)).astype(np.float32)
    got = {}
    for n in ("1", "4"):
        monkeypatch.setenv(ENV, n)
        got[n] = (attention.attend(cache, 0, q, pos).tobytes(),
                  *(q8_1.quantize_rows(x, lay).tobytes() for lay in q8_1.Layout),
                  dense.float_matmul(w, x).tobytes())
    for i, (a, b) in enumerate(zip(got["1"], got["4"])):
        assert a == b, f"output {i} differs"


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5", " "])
def test_bad_thread_count_is_one_line_before_any_work(make_test_pack, monkeypatch, value):
    pack = make_test_pack("tiny", "Q8_0")
    monkeypatch.setenv(ENV, value)
    if value.strip() == "":  # blank counts as unset
        assert ReferenceEngine(pack).threads == parallel.available_cpus()
        return
    with pytest.raises(InputError) as err:
        ReferenceEngine(pack)
    msg = str(err.value)
    assert "\n" not in msg and ENV in msg and repr(value) in msg


def test_thread_count_default_is_the_affinity(monkeypatch):
    import os

    monkeypatch.delenv(ENV, raising=False)
    assert parallel.thread_count() == len(os.sched_getaffinity(0))
    monkeypatch.setenv(ENV, "7")
    assert parallel.thread_count() == 7


def test_map_ordered_keeps_order_errors_and_runs_nested_calls_inline(monkeypatch):
    monkeypatch.setenv(ENV, "4")
    names = set()

    def square(i):
        names.add(threading.current_thread().name)
        # a call from inside the pool runs in the calling thread
        inner = parallel.map_ordered(lambda j: (j, threading.current_thread().name), range(3))
        assert {n for _, n in inner} == {threading.current_thread().name}
        return i * i

    assert parallel.map_ordered(square, range(40)) == [i * i for i in range(40)]
    assert all(n.startswith("strata-prefill") for n in names)

    def fail(i):
        if i in (7, 3):
            raise ValueError(f"item {i}")
        return i

    with pytest.raises(ValueError, match="item 3"):
        parallel.map_ordered(fail, range(10))
    monkeypatch.setenv(ENV, "1")
    assert parallel.map_ordered(lambda i: threading.current_thread().name, range(3)) == \
        [threading.current_thread().name] * 3


def test_slabs_cover_the_range():
    for n, pieces, minimum in ((0, 4, 1), (1, 4, 1), (10, 3, 1), (397, 5, 64), (100, 16, 64), (7, 1, 1)):
        s = parallel.slabs(n, pieces, minimum)
        assert [i for a, b in s for i in range(a, b)] == list(range(n))
        assert len(s) <= max(1, pieces) and (n == 0 or all(b - a >= min(n, minimum) for a, b in s[:-1]))



def test_prepared_cache_keeps_what_it_holds_past_its_budget(make_test_pack, monkeypatch):
    """A prefill asks for its matrices in the same order every chunk: past the budget the
    first ones stay (an LRU would drop each just before its next use); the held bytes never
    pass the budget; entries hit from any thread."""
    pack = make_test_pack("tiny", "Q4_1")
    mats = [(("gate", e), pack.layer(0).ffn_gate_exps.expert(e)) for e in range(6)]
    one = mmq.prepare(mats[0][1].qtype, mats[0][1].data).nbytes
    cache = PreparedCache(max_bytes=4 * one)
    monkeypatch.setenv(ENV, "3")
    first = parallel.map_ordered(lambda km: cache.get(km[0], km[1].qtype, km[1].data), mats)
    kept = dict(cache._items)
    assert len(kept) == 4 and cache._bytes == 4 * one
    for _ in range(2):  # two more "chunks", the same order each: the same four stay and hit
        got = parallel.map_ordered(lambda km: cache.get(km[0], km[1].qtype, km[1].data), mats)
        assert cache._items == kept and cache._bytes == 4 * one
        assert all(got[i] is kept[k] for i, (k, _) in enumerate(mats) if k in kept)
    for i, (k, m) in enumerate(mats):
        ref = mmq.prepare(m.qtype, m.data)
        assert first[i].w.tobytes() == ref.w.tobytes() and first[i].mw.tobytes() == ref.mw.tobytes()


def test_a_forked_child_gets_a_pool_of_its_own(monkeypatch):
    """The parent's pool threads do not exist in a fork: the child's first call makes its own
    pool instead of waiting on threads that will never run (the child exits 3 if it hangs)."""
    import os
    import signal

    monkeypatch.setenv(ENV, "2")
    assert parallel.map_ordered(lambda i: i * 2, range(4)) == [0, 2, 4, 6]  # the pool exists
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        signal.signal(signal.SIGALRM, lambda *a: os._exit(3))
        signal.alarm(20)
        ok = parallel.map_ordered(lambda i: i * 3, range(4)) == [0, 3, 6, 9]
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_openblas_is_held_to_one_thread_while_pieces_run_and_restored(monkeypatch):
    """NumPy's OpenBLAS (where this process has one that exports its setter) runs one thread
    of its own inside map_ordered, on the pool's threads and on one thread alike, and gets its
    count back afterwards."""
    before = parallel._blas.counts()
    if not before:
        pytest.skip("no OpenBLAS with a thread setter in this process")
    for n in ("1", "3"):
        monkeypatch.setenv(ENV, n)
        inside = parallel.map_ordered(lambda i: parallel._blas.counts(), range(4))
        assert inside == [[1] * len(before)] * 4
        assert parallel._blas.counts() == before


@pytest.mark.parametrize("tname", ["Q8_0", "Q2_K", "Q4_1", "IQ3_S", "NVFP4"])  # NVFP4: dw [N, nb, 2]
def test_tall_matrix_decoded_in_slabs_is_the_same(monkeypatch, tname):
    """mmq.prepare cuts a matrix of more than _PREPARE_SLAB_ROWS rows into row slabs on the pool:
    every prepared array is the one decoding it whole gives."""
    from gguf import GGMLQuantizationType as QT

    from strata_prefill.contract import mmq, quants

    monkeypatch.setenv("STRATA_PREFILL_THREADS", "4")
    monkeypatch.setattr(mmq, "_PREPARE_SLAB_ROWS", 64)
    qt = QT[tname]
    rng = np.random.default_rng(31)
    n, k = 301, 512
    raw = quants.random_blocks(qt, n * k // quants.block_size(qt)[0], rng).reshape(n, -1)
    cut, whole = mmq.prepare(qt, raw), mmq._prepare_rows(qt, raw)
    for name in ("w", "dw", "mw", "wm"):
        a, b = getattr(cut, name), getattr(whole, name)
        assert (a is None) == (b is None), name
        if a is not None:
            assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), name
