"""The parity gate: every row of `strata_prefill.verify.cases.PARITY_CASES` is one fast-path run compared byte
for byte with the reference's run of the same prompt (the residual dump, the first-token
logits, the greedy tokens and, where the row records, every record of the record file), or at
32K with the fast path's own all-resident default run.

The reference comes from the reference cache (strata_prefill/refcache.py): computed once per
(pack, prompt, greedy, dump level) and kept, since chunking, switches, ring and cache sizes
change no bit (docs/numerics.md section 9).

`cuda` rows skip without a GPU. `sim` rows (the same walk with NumPy kernels and simulated
streams, hazard-checked) run where there is no GPU, the CPU tier; on a GPU machine the `cuda`
rows check the same walk on the real card, and `STRATA_VERIFY_SIM=1` runs the sim rows too.
"""
from __future__ import annotations

import gc
import shutil
import zlib

import pytest

from strata_prefill import refcache
from strata_prefill.verify.cases import PARITY_CASES, ParityCase
from strata_prefill.verify.common import SIM_SKIP_REASON, Run, assert_same_run, cuda_here, run_engine, sim_here

_CUDA, _WHY = cuda_here()
_SIM_HERE = sim_here()

# (pack, backend, arm, stress) -> FastEngine: the cuda engines of the small packs, kept for the
# rows that share one (most recent last; a worker keeps at most _KEEP, so its device and pinned
# memory stay bounded however many rows it runs)
_engines: dict = {}
_KEEP = 16
_dropped: list = []  # a cuda engine was let go since the last _engine: collect before the next
# (pack, prompt, greedy, dump level) -> the reference's Run, read from the reference cache once
# for the rows of one case that a worker runs one after another (the newest _BASES_KEPT); and
# the all-resident base runs of the 32K rows, computed once for the rows of a case a worker runs
_bases: dict = {}
_BASES_KEPT = 2


def _params():
    out = []
    for c in PARITY_CASES:
        marks = [pytest.mark.quick] if c.quick else []
        if c.backend == "cuda" and not _CUDA:
            marks.append(pytest.mark.skip(reason=f"cuda backend unavailable: {_WHY}"))
        elif c.backend == "sim" and not _SIM_HERE:
            marks.append(pytest.mark.skip(reason=SIM_SKIP_REASON))
        out.append(pytest.param(c, id=c.name, marks=marks))
    return out


def _engine(case: ParityCase, pack, monkeypatch):
    from strata_prefill.fast import make_fast_engine

    if case.stress:
        monkeypatch.setenv("STRATA_PREFILL_STRESS", str(zlib.crc32(case.name.encode()) % 1000 + 1))
    sim = dict(schedule_seed=case.sim_seed) if case.sim_seed is not None else None
    keep = case.backend == "cuda" and case.preset != "strata"
    key = (str(pack.path), case.backend, case.arm, case.stress)
    eng = _engines.get(key) if keep else None
    if eng is None and case.backend == "cuda" and not keep and _engines:
        # a strata pack's engine takes gigabytes of device memory: the kept small engines go
        # first (five workers' kept engines left an 80 GB card too little for it)
        _engines.clear()
        _dropped.append(True)
    _collect_dropped()
    if eng is None:
        eng = make_fast_engine(pack, case.backend, sim_options=sim, **case.options)
    elif case.backend == "cuda":
        eng.be.reset_cache()
    if keep:
        if _remember(_engines, key, eng, _KEEP):
            _dropped.append(True)
    elif case.backend == "cuda":
        _dropped.append(True)  # made for this row alone: collected before the next row's engine
    return eng


def _collect_dropped() -> None:
    """Whatever a dropped cuda engine left to the cyclic collector is collected here, on the
    thread that holds the context, before the row reads or computes its reference: a collection
    that runs on another thread (the reference's NumPy pool) leaves PyCUDA only a warning and a
    leak. The engines hold no cycle (tests/test_engine_cycles.py); this covers any that slips in."""
    if _dropped:
        _dropped.clear()
        gc.collect()


def _remember(kept: dict, key, value, most: int) -> int:
    """kept[key] = value as its newest entry, the oldest dropped beyond `most`; how many were."""
    kept.pop(key, None)
    kept[key] = value
    dropped = 0
    while len(kept) > most:
        kept.pop(next(iter(kept)))
        dropped += 1
    return dropped


def _base(case: ParityCase, pack, ids, tmp_path, monkeypatch) -> Run:
    if case.base == "resident":  # the fast path's own run, kept for the next row of the case (the same code)
        key = ("resident", str(pack.path), case.backend, ids.astype("<i8").tobytes(), case.greedy, case.records)
        if key not in _bases:
            from strata_prefill.fast import make_fast_engine

            cfg = pack.config
            eng = make_fast_engine(pack, case.backend, expert_cache=cfg.n_layer * cfg.n_expert)
            run = run_engine(eng, ids, "auto", tmp_path / "base", greedy=case.greedy, layer_dumps=case.records)
            del eng
            if case.backend == "cuda":
                _dropped.append(True)
            _remember(_bases, key, run, _BASES_KEPT)
        return _bases[key]
    key = (str(pack.path), ids.astype("<i8").tobytes(), case.greedy, case.level)
    if key not in _bases:
        from strata_prefill.formats.records import read_timeline

        with refcache.open_reference_run(pack, ids, greedy=case.greedy, dump_level=case.level) as ref:  # held while read
            _remember(_bases, key, Run(ref.logits, ref.greedy, read_timeline(ref.records) if ref.records else [],
                                       ref.residuals), _BASES_KEPT)
    return _bases[key]


class _SkipCounter:
    """Counts the streamed walk's skips of a ring entry while a group holds streamed slots."""

    def __init__(self, monkeypatch):
        from strata_prefill.fast.walk import LayerWalk

        self.open_skips = 0
        skip = LayerWalk.skip

        def counted(walk, entry):
            self.open_skips += walk.held_streamed() > 0
            return skip(walk, entry)

        monkeypatch.setattr(LayerWalk, "skip", counted)


@pytest.mark.parametrize("case", _params())
def test_parity(case: ParityCase, make_test_pack, tmp_path, monkeypatch):
    _collect_dropped()  # the last row's engine, before this row's threads (its pack, its reference)
    pack = make_test_pack(case.preset, case.expert_type, **dict(case.pack_options))
    ids = case.prompt_ids(pack.config.n_vocab)
    base = _base(case, pack, ids, tmp_path, monkeypatch)
    skips = _SkipCounter(monkeypatch) if case.open_skip else None
    eng = _engine(case, pack, monkeypatch)
    before = dict(eng.counters)
    got = run_engine(eng, ids, case.chunk, tmp_path / "fast", greedy=case.greedy, layer_dumps=case.records,
                     dump_level=case.level)
    assert_same_run(base, got, pack, case.name)
    ran = {k: v - before.get(k, 0) for k, v in eng.counters.items()}
    cfg = pack.config
    if case.options.get("expert_cache", cfg.n_layer * cfg.n_expert) < cfg.n_layer * cfg.n_expert:
        assert ran.get("copies", 0) > 0, f"{case.name}: nothing was streamed"
    if case.stress:
        assert ran.get("stress_spins", 0) > 0, f"{case.name}: the stress mode enqueued no spin"
    if skips is not None:
        assert skips.open_skips > 0, f"{case.name}: no ring entry was skipped inside an open group"
    _check_row_counters(case, pack, eng, ran)
    shutil.rmtree(tmp_path, ignore_errors=True)  # a passed row's dumps (a 32K row's run to a GB); a failed row keeps them


def _check_row_counters(case: ParityCase, pack, eng, ran: dict) -> None:
    """What a row's arm promises beyond the bytes: 16-bit float routers widened to F32, float
    products taken, the fused SwiGLU + quantize run."""
    opts, pack_opts = case.options, dict(case.pack_options)
    router = pack_opts.get("router_type")
    if case.backend == "cuda" and router is not None:
        kinds = {w.qtype.name for n, w in eng.be._weights.items() if n.endswith("ffn_gate_inp")}
        assert kinds == {"F32"}, kinds  # F32 as stored, or a 16-bit router widened
    if case.backend == "sim" and router is not None:
        dense = pack_opts.get("dense_type", "Q8_0")
        floats = (router != "Q8_0") + 4 * (dense != "Q8_0")  # router; q, k, v, o
        assert ran.get("float_dense", 0) >= floats * pack.config.n_layer
    if case.backend == "sim" and case.dump_level == "layer" and opts.get("fuse_group", 1):
        assert ran.get("swiglu_q8_1", 0) > 0, f"{case.name}: the fused SwiGLU + quantize of H did not run"
