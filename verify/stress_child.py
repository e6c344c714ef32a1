"""The planted races' runs for verify/test_stress_cuda.py: the stress schedules, the plants and
the child that runs one plant in a process of its own (a planted run computes from wrong bytes,
which can reach a NaN, a top-K of NaNs and an out-of-bounds write that ends the CUDA context).

The child is a fork of a zygote (one a test process): the zygote has imported NumPy and the
fast path, the child starts its own CUDA context, so a plant that breaks one breaks nothing
else. This module must not initialize CUDA at import (the zygote imports it before it forks).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

from strata_prefill.verify.cases import settled_arm
from strata_prefill.verify.common import run_engine

SEED = 7
RESULT = "stress-result "  # the child's one line of result on stdout
DONE = "stress-done "  # the zygote's line after each child: its exit code

# (stress.Config options): spins ten times longer and more than the host takes between the two
# operations that race (microseconds to a millisecond), and at least that long: a cycle count
# taken at the driver's peak clock lasts longer at any lower clock, and a spin another process
# time-slices out lasts longer too. A plant needs one of its run's races to show (a run has 32
# copies, and a counts read per layer), not every one.
SCHEDULES = {
    "late_copies": dict(copy_us=(10_000.0, 10_000.0), compute_share=0.0),
    "late_compute": dict(copy_us=(0.0, 0.0), compute_us=(5_000.0, 5_000.0), compute_share=1.0),
    "late_counts": dict(copy_us=(10_000.0, 10_000.0), compute_share=0.0),
}

# the planted runs: the tiny pack (Q8_0: any bytes in a slot decode to finite weights), one
# streamed chunk of 64 tokens through a ring of 4 slots, so slots are refilled within a layer
STREAMED = dict(expert_cache=0, ring=4, stream_min=64, group_gather=1, copy_coalesce=0, ring_in_place=0)
# the same, its streamed experts multiplied in their ring slots (the default ring_in_place 1)
STREAMED_RIP = {**STREAMED, "ring_in_place": 1}
# the same chunk staged (below the stream threshold): each layer's routed experts through a
# 4-slot ring (the default staged walk's, stage_in_ring 1), refilled within the layer too; and
# through the 8-slot staging ring of stage_in_ring 0
STAGED = dict(expert_cache=0, ring=4, stream_min=1024, group_gather=1, copy_coalesce=0, ring_in_place=0)
STAGED8 = {**STAGED, "ring": None, "stage_in_ring": 0}
RESIDENT = dict(expert_cache=10**6, stream_min=64)  # capped at every expert: no ring, no copies


# ---- the plants: each replaces one method with a copy that lacks (or moves) one line -----------
def _gather_without_copy_wait(self, *, event, what):
    """CudaBackend.wait: counted, never waited for (planted: no stream.wait_for_event)."""
    self.counters["waits"] += 1


def _wait_on_first_copy(self, batch):
    """LayerWalk.gather waiting on the copy of the flush's first streamed member, not its last."""
    be, ring_pass = self.be, self.ring_pass
    streamed = [m.entry for m in batch if m.entry is not None]
    if streamed:
        be.wait(event=ring_pass.ring.copied_of[ring_pass.slot_of(streamed[0])], what="the first member's copy")
    be.gather(layer=self.layer, members=self._places(batch), q0=batch[0].q)
    if streamed:
        ring_pass.release(streamed, be.record())


def _release_before_gather(self, batch):
    """LayerWalk.gather releasing its slots (the event the refills wait for) before the gather."""
    be, ring_pass = self.be, self.ring_pass
    streamed = [m.entry for m in batch if m.entry is not None]
    if streamed:
        be.wait(event=ring_pass.ring.copied_of[ring_pass.slot_of(streamed[-1])], what="the last member's copy")
        ring_pass.release(streamed, be.record())
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
    from strata_prefill.fast.cuda import backend, tiers
    from strata_prefill.fast.walk import LayerWalk

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
    "a_no_copy_wait_rip": ("no_copy_wait", "late_copies", STREAMED_RIP),
    "b_refill_without_wait": ("refill_without_wait", "late_compute", STREAMED),
    "b_refill_without_wait_rip": ("refill_without_wait", "late_compute", STREAMED_RIP),
    "b_refill_without_wait_staged": ("refill_without_wait", "late_compute", STAGED),
    "b_refill_without_wait_staged8": ("refill_without_wait", "late_compute", STAGED8),
    "b_release_before_gather": ("release_before_gather", "late_compute", STREAMED),
    # a resident layer reads its counts only where it is planned on the host (device_plan 0:
    # planned on the device, the counts never come back, so there is no read to plant early)
    "c_counts_read_early_overlap1": ("counts_read_early", "late_counts", {**RESIDENT, "overlap_plan": 1, "device_plan": 0}),
    "c_counts_read_early_overlap0": ("counts_read_early", "late_counts", {**RESIDENT, "overlap_plan": 0, "device_plan": 0}),
    "c_counts_read_early_streamed": ("counts_read_early", "late_counts", {**STREAMED, "overlap_plan": 1}),
}


def prompt(n_vocab: int, n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, n_vocab, n).astype(np.int32)


def _same(a, b) -> bool:
    return (a.logits.tobytes() == b.logits.tobytes() and a.residuals == b.residuals
            and list(a.greedy) == list(b.greedy))


def child(args: dict) -> None:
    """In a fresh process (a fork of the zygote, or the sim test's own): the run without stress,
    then one engine under the plant's schedule: its run before the plant (must be the same
    bytes) and after it. Prints RESULT + JSON. (args' "backend", default cuda:
    tests/test_stress.py runs the harness on the sim.)"""
    from strata_prefill.fast import make_fast_engine
    from strata_prefill.fast.cuda import stress
    from strata_prefill.formats.pack import Pack

    plant, schedule, options = PLANTS[args["case"]]
    backend = args.get("backend", "cuda")
    pack = Pack.open(args["pack"])
    # as the switch table's rule takes them on this pack (RESIDENT's cache capped at every expert)
    options = settled_arm(backend, pack.config.n_layer, pack.config.n_expert, options)
    out = Path(args["out"])
    ids = prompt(pack.config.n_vocab, 64, seed=64)

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


# ---- the zygote: the imports paid once a worker, a fresh process (a fork) per planted run ------
def zygote() -> None:
    """Read one case (JSON) a line from stdin; for each, fork a child that runs child() with
    its stderr in <out>/child-stderr.txt, and print DONE and the child's exit code. The zygote
    imports the fast path and NumPy but never touches the driver (a process that initialized
    CUDA cannot fork a child that uses it), so each child starts its own CUDA context."""
    import traceback

    try:
        import pycuda.driver  # noqa: F401 - loads the library; only cuInit (in the child) touches the driver
    except ImportError:  # the sim's test of the zygote, on a machine without PyCUDA
        pass
    import strata_prefill.fast  # noqa: F401 - imported once here, inherited by every fork
    import strata_prefill.fast.cuda.backend  # noqa: F401
    import strata_prefill.fast.cuda.stress  # noqa: F401
    import strata_prefill.formats.pack  # noqa: F401

    for line in sys.stdin:
        args = json.loads(line)
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                err = open(Path(args["out"]) / "child-stderr.txt", "w")
                os.dup2(err.fileno(), 2)
                child(args)
                code = 0
            except BaseException:  # noqa: BLE001 - reported through the stderr file and the exit code
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        print(f"{DONE} {os.waitstatus_to_exitcode(status)}", flush=True)


class Zygote:
    """The parent's side: one zygote process a test process, started on first use and again
    if it died; ask() sends a case and returns the child's stdout lines and exit code."""

    proc = None

    @classmethod
    def ask(cls, args: dict, env: dict, cwd: Path, timeout: float = 600.0) -> tuple[list[str], int]:
        import selectors
        import subprocess
        import time

        if cls.proc is None or cls.proc.poll() is not None:
            cls.proc = subprocess.Popen([sys.executable, "-c", "from strata_prefill.verify.stress_child import zygote; zygote()"],
                                        cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.DEVNULL)
        proc = cls.proc
        proc.stdin.write((json.dumps(args) + "\n").encode())
        proc.stdin.flush()
        fd, buf, lines = proc.stdout.fileno(), b"", []
        sel = selectors.DefaultSelector()
        sel.register(fd, selectors.EVENT_READ)
        end = time.monotonic() + timeout
        try:
            while True:
                if not sel.select(max(0.0, end - time.monotonic())):
                    proc.kill()
                    raise TimeoutError(f"no answer from the planted run in {timeout:.0f} s")
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise RuntimeError(f"the zygote ended (exit {proc.wait()}) before the child's answer")
                buf += chunk
                *done, buf = buf.split(b"\n")
                for ln in (d.decode(errors="replace") for d in done):
                    if ln.startswith(DONE):
                        return lines, int(ln.split()[1])
                    lines.append(ln)
        finally:
            sel.close()
