"""Races forced out on the real GPU: the cuda backend's stress mode (fast/cuda/stress.py) changes
no byte of a correct run, and turns each planted race into wrong bytes, every time.

On the card a missing event wait rarely shows: copies take microseconds and the host enqueues
slowly, so a gather that forgot its copy's wait, or a copy that forgot its slot's release, finds
the right bytes anyway. Each planted race (PLANTS) removes or moves one line of the
synchronisation and runs under a schedule of spins chosen so that the race shows whatever the
timing (SCHEDULES):

  late_copies   every copy lands 20 ms after its waits allowed it: a gather that does not wait
                for its slot's copy reads the slot's previous contents (or nothing yet);
  late_compute  5 ms before every compute launch, none before copies: a refill that does not
                wait for its slot's release lands while the gather that reads the old contents
                still waits its turn;
  late_counts   the routing counts' copy to the host lands 20 ms late (no ring: every expert
                resident): a host that does not wait for it plans the walk from the previous
                layer's counts. This is the cuda backend's own host-side synchronisation, which
                the sim cannot model (its routing tables are on the host as soon as they run).

Under the same schedule the correct code gives the run's bytes (each planted test checks that
first, on the engine it then plants). A planted run computes from wrong bytes, which can reach a
NaN, a top-K of NaNs and an out-of-bounds write that ends the CUDA context; so it runs in a
child process (:func:`_child`), which reports back in one line. A CUDA error there counts as
red too (named in the result); a Python error in the plant fails the test. Skips, with the
reason, without a GPU.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from verify.common import assert_same_run, run_engine

try:
    from fast.cuda.runtime import cuda_available

    _OK, _WHY = cuda_available()
except ImportError as exc:  # pragma: no cover - the runtime module itself is missing
    _OK, _WHY = False, f"the cuda runtime does not import: {exc}"

pytestmark = pytest.mark.skipif(not _OK, reason=f"cuda backend unavailable: {_WHY}")

ROOT = Path(__file__).resolve().parent.parent
SEED = 7
RESULT = "stress-result "  # the child's one line of result on stdout

# (stress.Config options): spins far longer than the host takes between the two operations that
# race (microseconds to a millisecond), and at least that long: a cycle count taken at the
# driver's peak clock lasts longer at any lower clock
SCHEDULES = {
    "late_copies": dict(copy_us=(20_000.0, 20_000.0), compute_share=0.0),
    "late_compute": dict(copy_us=(0.0, 0.0), compute_us=(5_000.0, 5_000.0), compute_share=1.0),
    "late_counts": dict(copy_us=(20_000.0, 20_000.0), compute_share=0.0),
}

# the planted runs: the tiny pack (Q8_0: any bytes in a slot decode to finite weights), one
# streamed chunk of 64 tokens through a ring of 4 slots, so slots are refilled within a layer
STREAMED = dict(expert_cache=0, ring=4, stream_min=64, group_gather=1, copy_coalesce=0)
# the same chunk staged (below the stream threshold): each layer's routed experts through the
# 8-slot staging ring, refilled within the layer too
STAGED = dict(expert_cache=0, stream_min=1024, group_gather=1, copy_coalesce=0)
RESIDENT = dict(expert_cache=10**6, stream_min=64)  # capped at every expert: no ring, no copies


# ---- the plants: each replaces one method with a copy that lacks (or moves) one line -----------
def _gather_without_copy_wait(self, *, event, what):
    """CudaBackend.wait: counted, never waited for (planted: no stream.wait_for_event)."""
    self.counters["waits"] += 1


def _wait_on_first_copy(self, batch):
    """LayerWalk.gather waiting on the copy of the flush's first streamed member, not its last."""
    be, stream = self.be, self.stream
    streamed = [m.entry for m in batch if m.entry is not None]
    if streamed:
        be.wait(event=stream.ring.copied_of[stream.slot_of(streamed[0])], what="the first member's copy")
    be.gather(layer=self.layer, members=self._places(batch), q0=batch[0].q)
    if streamed:
        stream.release(streamed, be.record())


def _release_before_gather(self, batch):
    """LayerWalk.gather releasing its slots (the event the refills wait for) before the gather."""
    be, stream = self.be, self.stream
    streamed = [m.entry for m in batch if m.entry is not None]
    if streamed:
        be.wait(event=stream.ring.copied_of[stream.slot_of(streamed[-1])], what="the last member's copy")
        stream.release(streamed, be.record())
    be.gather(layer=self.layer, members=self._places(batch), q0=batch[0].q)


def _refill_without_wait(tiers_copy):
    def copy(self, ring, slots, experts, wait_for, counters, note=None):
        """ExpertTiers.copy not waiting for the slots' releases (planted: wait_for dropped)."""
        return tiers_copy(self, ring, slots, experts, [], counters, note)

    return copy


def _counts_without_wait(self):
    """DevTables.resolve reading the page-locked counts without waiting for their copy's event."""
    if self._cnt is None:
        self._cnt, self._off = self._host[0].copy(), self._host[1].copy()
        self._order = np.nonzero(self._cnt)[0].astype(np.int32)


def _plant(name: str) -> None:
    """Apply the plant `name` in this process (the child)."""
    from fast.cuda import backend, tiers
    from fast.walk import LayerWalk

    if name == "no_copy_wait":
        backend.CudaBackend.wait = _gather_without_copy_wait
    elif name == "wait_on_first_copy":
        LayerWalk.gather = _wait_on_first_copy
    elif name == "refill_without_wait":
        tiers.ExpertTiers.copy = _refill_without_wait(tiers.ExpertTiers.copy)
    elif name == "release_before_gather":
        LayerWalk.gather = _release_before_gather
    elif name == "counts_read_early":
        backend.DevTables.resolve = _counts_without_wait
    else:
        raise KeyError(name)


# (plant, schedule, engine options)
PLANTS = {
    "a_no_copy_wait": ("no_copy_wait", "late_copies", STREAMED),
    "a_no_copy_wait_staged": ("no_copy_wait", "late_copies", STAGED),
    "a_wait_on_first_copy": ("wait_on_first_copy", "late_copies", STREAMED),
    "b_refill_without_wait": ("refill_without_wait", "late_compute", STREAMED),
    "b_refill_without_wait_staged": ("refill_without_wait", "late_compute", STAGED),
    "b_release_before_gather": ("release_before_gather", "late_compute", STREAMED),
    "c_counts_read_early_overlap1": ("counts_read_early", "late_counts", {**RESIDENT, "overlap_plan": 1}),
    "c_counts_read_early_overlap0": ("counts_read_early", "late_counts", {**RESIDENT, "overlap_plan": 0}),
    "c_counts_read_early_streamed": ("counts_read_early", "late_counts", {**STREAMED, "overlap_plan": 1}),
}


def _prompt(n_vocab: int, n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, n_vocab, n).astype(np.int32)


def _same(a, b) -> bool:
    return (a.logits.tobytes() == b.logits.tobytes() and a.residuals == b.residuals
            and list(a.greedy) == list(b.greedy))


def _child() -> None:
    """In a child process: the run without stress, then one engine under the plant's schedule:
    its run before the plant (must be the same bytes) and after it. Prints RESULT + JSON.
    (args' "backend", default cuda: tests/test_stress.py runs the harness on the sim.)"""
    from fast import make_fast_engine
    from fast.cuda import stress
    from strata.pack import Pack

    args = json.loads(sys.argv[1])
    plant, schedule, options = PLANTS[args["case"]]
    backend = args.get("backend", "cuda")
    pack = Pack.open(args["pack"])
    out = Path(args["out"])
    ids = _prompt(pack.config.n_vocab, 64, seed=64)

    def run(eng, name):
        return run_engine(eng, ids, 64, out / name, greedy=0, layer_dumps=False)

    with stress.enabled(None):
        base = run(make_fast_engine(pack, backend, **options), "base")
    with stress.enabled(SEED, **SCHEDULES[schedule]):
        eng = make_fast_engine(pack, backend, **options)
    warm = run(eng, "warm")
    _plant(plant)
    eng.be.reset_cache()
    error = None
    try:
        planted = run(eng, "planted")
        planted_same = _same(base, planted)
    except Exception as e:  # a CUDA error (pycuda.driver.Error) is red; anything else is a bug here
        if not type(e).__module__.startswith("pycuda"):
            raise
        planted_same, error = False, f"{type(e).__name__}: {' '.join(str(e).split())}"  # the context may be gone
    c = eng.counters
    print(RESULT + json.dumps({"warm_same": _same(base, warm), "planted_same": planted_same, "error": error,
                               "spins": c["stress_spins"], "copies": c["copies"], "waits": c["waits"]}),
          flush=True)


@pytest.mark.parametrize("case", sorted(PLANTS))
def test_planted_race_turns_red_under_stress(make_test_pack, tmp_path, case):
    pack = make_test_pack("tiny", "Q8_0")
    env = {k: v for k, v in os.environ.items() if k != "STRATA_PREFILL_STRESS"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    code = "from verify.test_stress_cuda import _child; _child()"
    arg = json.dumps({"case": case, "pack": str(pack.path), "out": str(tmp_path)})
    r = subprocess.run([sys.executable, "-c", code, arg], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=600)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith(RESULT)]
    assert lines, f"{case}: the child gave no result (exit {r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    got = json.loads(lines[-1][len(RESULT):])
    plant, schedule, _options = PLANTS[case]
    assert got["spins"] > 0, got
    assert got["warm_same"], f"{case}: the {schedule} schedule changed the bytes of the correct code: {got}"
    assert not got["planted_same"], f"{case}: the planted race {plant} gave the right bytes under {schedule}: {got}"


# ---- the correct code under the stress mode: the same bytes ----------------------------------
# (preset, expert type, tokens, chunk, engine options): streamed chunks (130 tokens by 64 at a
# stream threshold of 64: streamed, streamed, staged; 1,100 at the default threshold: one
# streamed chunk), staged greedy tokens, rings of 4 to 16 slots, caches of none and a third,
# both overlap_plan values, group and per-expert gathers, coalesced copies
NO_DEFECT = {
    "tiny-streamed-overlap1": ("tiny", "Q8_0", 130, 64, dict(stream_min=64, ring=4, expert_cache=0, overlap_plan=1)),
    "tiny-streamed-overlap0": ("tiny", "Q8_0", 130, 64, dict(stream_min=64, ring=8, expert_cache=10, overlap_plan=0,
                                                            group_gather=0, copy_coalesce=1)),
    "small-streamed-overlap1": ("small", "IQ2_XS", 1100, "auto", dict(ring=16, expert_cache=85, overlap_plan=1)),
    "small-streamed-overlap0": ("small", "IQ2_XS", 1100, "auto", dict(ring=16, expert_cache=85, overlap_plan=0,
                                                                     in_place=0, copy_coalesce=1)),
}


@pytest.mark.parametrize("case", sorted(NO_DEFECT))
def test_stress_mode_changes_no_byte(make_test_pack, tmp_path, case):
    from fast import make_fast_engine
    from fast.cuda import stress

    preset, etype, n, chunk, options = NO_DEFECT[case]
    pack = make_test_pack(preset, etype)
    ids = _prompt(pack.config.n_vocab, n, seed=n)
    with stress.enabled(None):
        plain = make_fast_engine(pack, "cuda", **options)
    base = run_engine(plain, ids, chunk, tmp_path / "base", greedy=2, dump_level="layer")
    assert "stress_spins" not in plain.counters
    del plain
    for seed in (1, 2):
        with stress.enabled(seed):
            eng = make_fast_engine(pack, "cuda", **options)
        got = run_engine(eng, ids, chunk, tmp_path / f"stress{seed}", greedy=2, dump_level="layer")
        assert eng.counters["stress_spins"] > 0 and eng.counters["copies"] > 0, dict(eng.counters)
        assert_same_run(base, got, pack, f"{case} under STRATA_PREFILL_STRESS={seed}")
        del eng


def test_the_variable_turns_it_on_and_a_bad_one_is_named(make_test_pack, monkeypatch):
    from fast import make_fast_engine
    from fast.cuda import stress
    from strata.errors import InputError

    pack = make_test_pack("tiny", "Q8_0")
    monkeypatch.setenv(stress.ENV, "3")
    eng = make_fast_engine(pack, "cuda", expert_cache=0, ring=4)
    assert eng.be.stress is not None and eng.be.stress.cfg == stress.Config(3)
    assert eng.be.dev.stress is eng.be.stress and eng.be.tiers.stress is eng.be.stress
    monkeypatch.setenv(stress.ENV, "three")
    with pytest.raises(InputError, match="STRATA_PREFILL_STRESS must be an integer seed"):
        make_fast_engine(pack, "cuda")
    monkeypatch.delenv(stress.ENV)
    assert make_fast_engine(pack, "cuda", expert_cache=0, ring=4).be.stress is None


def test_a_spin_takes_its_time():
    """The spin kernel and the clock conversion: a 20 ms spin holds its stream about that long
    (at least 15 ms; longer where the SM clock runs under the rate the driver reports)."""
    import collections

    import pycuda.driver as cuda

    from fast.cuda import runtime, stress

    runtime.context()
    stream = cuda.Stream()
    counters = collections.Counter()
    s = stress.Stress(stress.Config(0, copy_us=(20_000.0, 20_000.0)), counters)
    start, end = cuda.Event(), cuda.Event()
    start.record(stream)
    s.before_copy(stream)
    end.record(stream)
    end.synchronize()
    ms = start.time_till(end)
    assert 15.0 <= ms < 1000.0, ms
    assert counters["stress_spins"] == 1
