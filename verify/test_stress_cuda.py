"""Races forced out on the real GPU: the cuda backend's stress mode (fast/cuda/stress.py) changes
no byte of a correct run, and turns each planted race into wrong bytes, every time.

On the card a missing event wait rarely shows: copies take microseconds and the host enqueues
slowly, so a gather that forgot its copy's wait, or a copy that forgot its slot's release, finds
the right bytes anyway. Each planted race (PLANTS) removes or moves one line of the
synchronisation and runs under a schedule of spins chosen so that the race shows whatever the
timing (SCHEDULES):

  late_copies   every copy lands 10 ms after its waits allowed it: a gather that does not wait
                for its slot's copy reads the slot's previous contents (or nothing yet);
  late_compute  5 ms before every compute launch, none before copies: a refill that does not
                wait for its slot's release lands while the gather that reads the old contents
                still waits its turn;
  late_counts   the routing counts' copy to the host lands 10 ms late (no ring: every expert
                resident): a host that does not wait for it plans the walk from the previous
                layer's counts. This is the cuda backend's own host-side synchronisation, which
                the sim cannot model (its routing tables are on the host as soon as they run).

Under the same schedule the correct code gives the run's bytes (each planted test checks that
first, on the engine it then plants). The schedules, the plants and the planted run itself are
in verify/stress_child.py: a planted run computes from wrong bytes, which can end the CUDA
context, so it runs in a process of its own (a fork of a zygote that has the imports done),
which reports back in one line. A CUDA error there counts as red too (named in the result); a
Python error in the plant fails the test. Skips, with the reason, without a GPU.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from strata_prefill.verify.common import assert_same_run, run_engine
from strata_prefill.verify.stress_child import PLANTS, RESULT, Zygote, prompt

try:
    from strata_prefill.fast.cuda.runtime import cuda_available

    _OK, _WHY = cuda_available()
except ImportError as exc:  # pragma: no cover - the runtime module itself is missing
    _OK, _WHY = False, f"the cuda runtime does not import: {exc}"

pytestmark = pytest.mark.skipif(not _OK, reason=f"cuda backend unavailable: {_WHY}")

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("case", sorted(PLANTS))
def test_planted_race_turns_red_under_stress(make_test_pack, tmp_path, case):
    pack = make_test_pack("tiny", "Q8_0")
    env = {k: v for k, v in os.environ.items() if k != "STRATA_PREFILL_STRESS"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    out, code = Zygote.ask({"case": case, "pack": str(pack.path), "out": str(tmp_path)}, env, ROOT)
    lines = [ln for ln in out if ln.startswith(RESULT)]
    err = tmp_path / "child-stderr.txt"
    assert lines, f"{case}: the child gave no result (exit {code}):\n" + "\n".join(out)[-2000:] + "\n" + \
        (err.read_text()[-4000:] if err.exists() else "")
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
    from strata_prefill.fast import make_fast_engine
    from strata_prefill.fast.cuda import stress

    preset, etype, n, chunk, options = NO_DEFECT[case]
    pack = make_test_pack(preset, etype)
    ids = prompt(pack.config.n_vocab, n, seed=n)
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
    from strata_prefill.fast import make_fast_engine
    from strata_prefill.fast.cuda import stress
    from strata_prefill.contract.errors import InputError

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

    from strata_prefill.fast.cuda import runtime, stress

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
    # at most 10 s: the gate's other workers share the card, and its time slices held this stream
    # past a second in one gate (1,029 ms); a spin a thousand times too long (cycles for
    # microseconds) still fails
    assert 15.0 <= ms < 10_000.0, ms
    assert counters["stress_spins"] == 1
