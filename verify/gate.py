"""How the gate runs: its workers, its test packs, its last lines.

Workers. One GPU time-slices the processes that share it, and every NumPy starts a BLAS thread
per core, so `-n` as large as the core count is the slowest choice there is on a GPU machine
(docs/results/2026-12-01-gate.md has the table measured on the H200). With
pytest-xdist installed and no `-n` given, a run gets `GPU_WORKERS` workers on a machine with a
CUDA device and one per core on a machine without, and each worker its share of the cores for
BLAS and for the reference's own threads. `STRATA_PREFILL_WORKERS=N` (or `off`) overrides the
choice; `-n` on the command line always wins. Benchmarks are never spread (pytest-benchmark
turns itself off under xdist), nor is a run of named test ids. On a GPU machine the workers run
at niceness WORKER_NICE, below the kernels and references computed ahead of them.

Test packs. `make_test_pack` packs are made once per (preset, type, options, pack-making source)
and kept in a folder under the user cache dir (`STRATA_PREFILL_TEST_PACKS=DIR` moves it, `off`
makes them per session), so workers share one file and the reference cache, keyed by a pack's
content, hits across sessions. A file lock keeps two workers from making the same pack; of each
pack the two newest versions are kept (PACK_VERSIONS_KEPT).

Last lines. The gate ends with what passed: kernel rows, parity rows and the cases (pack,
prompt) they cover, the reference cache's hits and misses, the slowest five tests.
"""
from __future__ import annotations

import atexit
import fcntl
import hashlib
import json
import os
import time
from pathlib import Path

GPU_WORKERS = 5  # workers per GPU: the fastest in docs/results/2026-12-02-gate-host-work.md (4 and 5 on one tree)
# Niceness of the workers on a GPU machine: the work started ahead of them (the kernels'
# compiles, the references' long NumPy runs) is what the slowest rows wait for, so it goes
# first where they compete for cores; where nothing competes, niceness changes nothing.
WORKER_NICE = 5
ENV_NICE = "STRATA_PREFILL_GATE_NICE"  # set by the gate for its workers; not a user setting
ENV_WORKERS = "STRATA_PREFILL_WORKERS"
ENV_PACKS = "STRATA_PREFILL_TEST_PACKS"
THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "STRATA_PREFILL_THREADS")
ROOT = Path(__file__).resolve().parent.parent

_plan: dict = {}


# ---------------------------------------------------------------- workers


def cores() -> int:
    from strata_prefill.contract.parallel import available_cpus

    return available_cpus()


def gpu_name() -> str | None:
    """The first CUDA device's name, or None where the cuda backend cannot run."""
    try:
        from strata_prefill.fast.cuda.runtime import cuda_available
    except ImportError:
        return None
    ok, name = cuda_available()
    return name if ok else None


def workers_for(n_cores: int, gpu: str | None, env: str | None) -> tuple[int, str]:
    """(workers, why) for a machine of n_cores with or without a GPU; env: STRATA_PREFILL_WORKERS."""
    if env:
        if env.strip().lower() in ("off", "0"):
            return 0, f"{ENV_WORKERS}={env}"
        try:
            n = int(env)
        except ValueError:
            n = -1
        if n < 1:
            raise ValueError(f"{ENV_WORKERS} must be a positive integer or 'off', got {env!r}")
        return n, f"{ENV_WORKERS}={env}"
    if gpu:
        return min(GPU_WORKERS, n_cores), f"{GPU_WORKERS} per GPU ({gpu})"
    return n_cores, "one per core (no GPU)"


def _named_ids(args) -> bool:
    return any("::" in str(a) for a in args)


def _benchmarks(args) -> bool:
    bench = ROOT / "bench"
    for a in args:
        p = Path(str(a).split("::")[0])
        if p.exists() and (p.resolve() == bench or bench in p.resolve().parents):
            return True
    return False


def plan_workers(config) -> None:
    """Set -n and the per-worker thread counts, unless the user chose or the run is a worker's."""
    if os.environ.get("PYTEST_XDIST_WORKER") or not config.pluginmanager.hasplugin("xdist"):
        return
    opt = config.option
    if getattr(opt, "numprocesses", None) is not None or opt.collectonly or getattr(opt, "usepdb", False):
        return
    args = config.args or []
    if _named_ids(args) or _benchmarks(args):
        return
    n_cores = cores()
    env = os.environ.get(ENV_WORKERS)
    gpu = None if env else gpu_name()
    try:
        n, why = workers_for(n_cores, gpu, env)
    except ValueError as exc:
        import pytest

        raise pytest.UsageError(str(exc)) from None
    if n <= 1:
        return
    threads = max(1, n_cores // n)
    for var in THREAD_VARS:
        os.environ.setdefault(var, str(threads))
    if gpu:
        os.environ[ENV_NICE] = str(WORKER_NICE)
    opt.numprocesses = n
    if getattr(opt, "dist", "no") == "no":
        # tests from 5 ms to 5 s: a worker out of work takes half of the busiest one's queue,
        # so the run does not end with one worker alone on a queue it was handed early
        opt.dist = "worksteal"
    if hasattr(opt, "benchmark_disable"):  # what pytest-benchmark does under xdist anyway, without its warning
        opt.benchmark_disable = True
    _plan.update(workers=n, why=why, threads=os.environ["OPENBLAS_NUM_THREADS"], cores=n_cores)


def report_header() -> list[str]:
    if not _plan:
        return []
    p = _plan
    return [f"gate: {p['workers']} workers ({p['why']}), {p['threads']} BLAS threads each of {p['cores']} cores; "
            f"{ENV_WORKERS}=N or -n N changes it"]


# ---------------------------------------------------------------- work started ahead

_ahead: dict = {}


def _runs_parity(config) -> bool:
    """Whether this run takes the parity rows whole (no -k): then their references are worth
    computing ahead."""
    if config.option.keyword:
        return False
    args = [Path(str(a).split("::")[0]).resolve() for a in (config.args or [])] or [ROOT]
    target = ROOT / "verify" / "test_parity.py"
    return any(a == target or a in target.parents for a in args)


def start_ahead(config) -> None:
    """On a GPU machine, in the process that gathers the results: compile every kernel module
    the gate will load (parallel nvcc, fast/cuda/kernel_cache.py:build_all) and compute the
    parity rows' references (verify/precompute.py, every core), both beside the workers."""
    import subprocess
    import sys
    import threading
    import time

    if os.environ.get("PYTEST_XDIST_WORKER") or config.option.collectonly or gpu_name() is None:
        return
    from strata_prefill.fast.cuda import build_list, kernel_cache, runtime

    from strata_prefill.verify.cases import ahead_modules

    folder = kernel_cache.cache_dir()
    quick = (config.option.markexpr or "").strip() == "quick"
    if folder is not None:
        modules = kernel_cache.check_modules(kernel_cache.distinct(build_list.wanted(folder) + ahead_modules(quick)))
        _ahead["kernels"] = len(modules)

        def build():
            t0 = time.perf_counter()
            try:
                done = kernel_cache.build_all(folder, runtime.device_arch(), modules, progress=lambda *a: None)
                _ahead["compiled"] = sum(d[3] is not None for d in done)
            except Exception as exc:  # the worker that loads the module names the failure
                _ahead["kernel_error"] = " ".join(str(exc).split())[:200]
            _ahead["kernel_s"] = time.perf_counter() - t0

        _ahead["thread"] = threading.Thread(target=build, daemon=True)
        _ahead["thread"].start()
    if _runs_parity(config):
        env = dict(os.environ, **{v: str(cores()) for v in THREAD_VARS if v != "OPENBLAS_NUM_THREADS"})
        env["OPENBLAS_NUM_THREADS"] = "1"
        quick = ["--quick"] if quick else []
        # its own session: an interrupted gate (Ctrl-C, a time limit) does not lose the
        # reference in progress; it is finished and kept for the next run
        _ahead["refs"] = subprocess.Popen([sys.executable, "-m", "strata_prefill.verify.precompute", *quick], cwd=ROOT, env=env,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                          start_new_session=True)


def finish_ahead() -> list[str]:
    out = []
    t = _ahead.pop("thread", None)
    if t is not None:
        t.join(timeout=1.0)  # done long before a whole run ends; an interrupted one does not wait
        if t.is_alive():
            out.append(f"gate: kernels ahead: {_ahead.get('kernels', 0)} modules, still compiling when the run "
                       "stopped (the cubins that finished are kept)")
            t = None
    if t is not None:
        line = (f"gate: kernels ahead: {_ahead.get('kernels', 0)} modules, {_ahead.get('compiled', 0)} compiled, "
                f"{_ahead.get('kernel_s', 0.0):.1f} s")
        if "kernel_error" in _ahead:
            line += f"; {_ahead['kernel_error']}"
        out.append(line)
    p = _ahead.pop("refs", None)
    if p is not None:
        if p.poll() is None:  # the run stopped before its rows needed them all
            out.append(f"gate: references ahead: still computing in process {p.pid}, kept for the next run "
                       f"when done (kill {p.pid} stops it)")
        else:
            err = (p.communicate()[1] or "").strip().splitlines()
            out.append(err[-1] if err else f"gate: references ahead: exit {p.returncode}")
    return out


# ---------------------------------------------------------------- test packs


def packs_dir() -> Path | None:
    env = os.environ.get(ENV_PACKS, "").strip()
    if env.lower() == "off":
        return None
    if env:
        return Path(env)
    from strata_prefill.formats.cache_home import user_cache_dir

    return user_cache_dir() / "test-packs"


def kept_pack(preset: str, expert_type: str, kw: dict, tmp_path_factory) -> Path:
    """The pack's path: from the kept folder, made there first if missing (once, under a lock)."""
    from strata_prefill.formats.make_pack import make_pack
    from strata_prefill import refcache

    name = "-".join(str(p) for p in (preset, expert_type, *(f"{k}{v}" for k, v in sorted(kw.items()))))
    folder = packs_dir()
    if folder is None and tmp_path_factory is None:
        import tempfile

        folder = Path(tempfile.mkdtemp(prefix="strata-prefill-packs-"))
    elif folder is None:
        path = tmp_path_factory.mktemp("packs") / f"{name}.gguf"
        make_pack(path, preset, expert_type=expert_type, progress=False, **kw)
        return path
    key = hashlib.sha256(json.dumps([preset, expert_type, sorted(kw.items()), refcache.source_digest(("contract", "formats"))],
                                    default=str).encode()).hexdigest()[:16]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{key}.gguf"
    lock = open(folder / f"{path.name}.lock", "a")
    try:
        # a shared lock, held while this process lives, on a pack that is there: another
        # tree's gate pruning old versions leaves a pack alone while any process uses it.
        # Missing, it is made under the exclusive lock (no user holds one on a missing pack),
        # then taken shared like any other. The exclusive lock is only tried, never waited for:
        # a process waiting for it after another made the pack would wait for every user of the
        # pack to end. Refused, it looks again under a shared lock, which waits only for the
        # making.
        while True:
            fcntl.flock(lock, fcntl.LOCK_SH)
            if path.exists():
                break
            fcntl.flock(lock, fcntl.LOCK_UN)
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                time.sleep(0.02)
                continue
            if not path.exists():  # make_pack writes it whole (formats/atomic.py)
                make_pack(path, preset, expert_type=expert_type, progress=False, **kw)
                _prune(folder, name, path)
            fcntl.flock(lock, fcntl.LOCK_UN)
    except BaseException:
        lock.close()
        raise
    _in_use.append(lock)
    return path


_in_use: list = []  # the lock files of the kept packs this process uses, each under a shared lock


@atexit.register
def _release_packs() -> None:
    """Close the kept packs' lock files as the process ends (which releases their locks, as the
    end itself would): left to the interpreter's teardown, each is an `unclosed file`
    ResourceWarning printed after the test summary."""
    while _in_use:
        _in_use.pop().close()


# Versions of one test pack kept (one per pack-making source, newest first): two trees compared
# side by side keep theirs, and the folder does not grow with every edit of contract/ or formats/.
PACK_VERSIONS_KEPT = 2


def _prune(folder: Path, name: str, new: Path) -> None:
    """Remove all but the PACK_VERSIONS_KEPT newest versions of the pack `name` (with their
    locks); a version another process holds the lock of (making it, or using it: kept_pack's
    shared lock) is left alone."""
    versions = [p for p in folder.glob(f"{name}-*.gguf") if p != new and p.name[len(name) + 1:-5].isalnum()
                and len(p.name) == len(new.name)]
    versions.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    for old in versions[PACK_VERSIONS_KEPT - 1:]:
        lock_path = folder / f"{old.name}.lock"
        with open(lock_path, "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # being made or read under its lock right now
                continue
            old.unlink(missing_ok=True)
        lock_path.unlink(missing_ok=True)


# ---------------------------------------------------------------- last lines


def _bytes_under(folder: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(folder):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:  # removed while walked (another run pruning)
                pass
    return total


def _size(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.0f} MB"


def cache_lines() -> list[str]:
    """What the run leaves in the cache home for the next one (the kept test packs, the
    reference results, the compiled kernels, the default pack): its size by folder, and how to
    clear it; none where there is no cache home yet."""
    from strata_prefill.formats.cache_home import user_cache_dir

    home = user_cache_dir()
    if not home.is_dir():
        return []
    parts = {p.name: (_bytes_under(p) if p.is_dir() else p.stat().st_size) for p in home.iterdir()}
    total = sum(parts.values())
    shown = ", ".join(f"{name} {_size(n)}" for name, n in sorted(parts.items(), key=lambda kv: -kv[1]) if n >= 1e6)
    return [f"gate: cache: {_size(total)} kept in {home} for the next run ({shown or 'nothing large'}); "
            f"rm -rf {home} clears it, the next run remakes what it needs"]


# ---------------------------------------------------------------- the order of the tests

DURATIONS = "durations.json"  # in packs_dir(): each test's seconds in the last runs of this source
ENV_ORDER = "STRATA_PREFILL_GATE_ORDER"  # set by the gate for its workers; not a user setting
_order: dict = {}


def _durations_path() -> Path | None:
    folder = packs_dir()
    return folder / DURATIONS if folder is not None else None


def _source() -> str:
    from strata_prefill import refcache

    return refcache.source_digest()


def read_durations(path: Path | None) -> dict:
    """{nodeid: seconds} of the runs recorded at `path` for the current reference source
    (a run after an edit of contract/, formats/ or reference/ recomputes references: its slow rows are
    others, so the recorded times do not order it); {} where there are none."""
    if path is None:
        return {}
    try:
        got = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(got, dict) or got.get("source") != _source() or not isinstance(got.get("seconds"), dict):
        return {}
    return {str(k): float(v) for k, v in got["seconds"].items() if isinstance(v, (int, float))}


def share_durations() -> None:
    """In the main process, before the workers start: a copy of the recorded durations for
    the workers to order their collection by (all of them the same order, as pytest-xdist
    needs, even if another run records new durations meanwhile)."""
    import atexit
    import tempfile

    seconds = read_durations(_durations_path())
    if not seconds:
        os.environ.pop(ENV_ORDER, None)
        return
    fd, name = tempfile.mkstemp(prefix="strata-prefill-gate-order-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(seconds, f)
    os.environ[ENV_ORDER] = name
    atexit.register(lambda: Path(name).unlink(missing_ok=True))


def durations_for_order() -> dict:
    """The durations this process orders its collection by (share_durations' copy)."""
    if "seconds" not in _order:
        name = os.environ.get(ENV_ORDER)
        try:
            _order["seconds"] = json.loads(Path(name).read_text()) if name else {}
        except (OSError, ValueError):
            _order["seconds"] = {}
    return _order["seconds"]


def record_durations(tests: dict) -> None:
    """Add this run's seconds per test (passed or failed) to the record (atomically)."""
    from strata_prefill.formats import atomic

    path = _durations_path()
    if path is None or not tests:
        return
    seconds = read_durations(path)
    seconds.update({k: round(t["seconds"], 4) for k, t in tests.items() if t["outcome"] in ("passed", "failed")})
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_text(path, json.dumps({"source": _source(), "seconds": seconds}, sort_keys=True))


def configure(config) -> None:
    config.addinivalue_line("markers", "quick: the quick tier (pytest verify/ -m quick)")
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        share_durations()
    if getattr(config, "pluginmanager", None) is not None and config.pluginmanager.hasplugin("hypothesispytest"):
        # its end-of-run summary imports hypothesis (a second or more), in every worker and then
        # in the main process, after the last test: imported now, beside the run, it is not
        import threading

        threading.Thread(target=_import_hypothesis, daemon=True).start()
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        config.pluginmanager.register(Summary(), "strata-gate-summary")
    elif os.environ.get(ENV_NICE, "").isdigit():
        os.nice(int(os.environ[ENV_NICE]))  # a worker yields to the work ahead (WORKER_NICE)


def _import_hypothesis() -> None:
    try:
        import hypothesis.internal.observability  # noqa: F401
    except Exception:  # its own summary will say what is wrong
        pass


class Summary:
    """Collects every test's outcome, duration and gate properties (set by verify/conftest.py
    in whichever process ran it) and prints the gate's last lines."""

    def __init__(self):
        import time

        self.tests: dict = {}  # nodeid -> {"outcome", "seconds", props...}
        self.t0 = time.time()  # the session's start, as the reports' start and stop are stamped
        self.spans: dict = {}  # worker -> [first start, last stop, seconds in tests]

    def pytest_report_header(self, config):
        return report_header()

    def pytest_runtest_logreport(self, report):
        t = self.tests.setdefault(report.nodeid, {"outcome": "passed", "seconds": 0.0})
        t["seconds"] += report.duration
        start, stop = getattr(report, "start", None), getattr(report, "stop", None)
        if start is not None and stop is not None:
            node = getattr(report, "node", None)
            worker = getattr(getattr(node, "gateway", None), "id", "main")
            span = self.spans.setdefault(worker, [start, stop, 0.0])
            span[0], span[1], span[2] = min(span[0], start), max(span[1], stop), span[2] + (stop - start)
        for k, v in report.user_properties:
            if k.startswith("gate_"):
                t[k[5:]] = v
        if report.failed:
            t["outcome"] = "failed"
        elif report.skipped and t["outcome"] != "failed":
            t["outcome"] = "skipped"

    def lines(self) -> list[str]:
        out = report_header() + finish_ahead() + cache_lines()
        gated = {k: t for k, t in self.tests.items() if "kind" in t}
        if not gated:
            return out
        for kind, what in (("kernel", "kernel rows"), ("parity", "parity rows (arms)")):
            rows = [t for t in gated.values() if t["kind"] == kind]
            if not rows:
                continue
            n = {o: sum(t["outcome"] == o for t in rows) for o in ("passed", "failed", "skipped")}
            extra = ""
            if kind == "parity":
                cases = {t.get("case") for t in rows if t["outcome"] == "passed"}
                extra = f" over {len(cases)} cases (pack, prompt)"
            out.append(f"gate: {what}: {n['passed']} passed{extra}, {n['failed']} failed, {n['skipped']} skipped")
        hits = sum(int(t.get("ref_hits", 0)) for t in gated.values())
        misses = sum(int(t.get("ref_misses", 0)) for t in gated.values())
        out.append(f"gate: reference cache: {hits} hits, {misses} misses")
        slow = sorted(self.tests.items(), key=lambda kv: -kv[1]["seconds"])[:5]
        out.append("gate: slowest: " + "; ".join(f"{t['seconds']:.1f} s {k.split('/')[-1]}" for k, t in slow))
        if self.spans:
            out.append(self.time_line())
        return out

    def time_line(self) -> str:
        """Where the wall time went: when the workers took their first test (start-up:
        imports, collection, the CUDA context), the seconds each spent in tests, and when each
        finished its last (the spread is the tail one worker runs alone)."""
        import time

        wall = time.time() - self.t0
        first = [s[0] - self.t0 for s in self.spans.values()]
        last = [s[1] - self.t0 for s in self.spans.values()]
        busy = [s[2] for s in self.spans.values()]

        def span(v):
            return f"{min(v):.1f}-{max(v):.1f} s" if len(v) > 1 else f"{v[0]:.1f} s"

        return (f"gate: time: {wall:.1f} s wall; {len(self.spans)} workers took their first test at {span(first)}, "
                f"spent {span(busy)} in tests and took their last at {span(last)}")

    def pytest_terminal_summary(self, terminalreporter):
        try:
            record_durations({k: t for k, t in self.tests.items() if "kind" in t or k.startswith("verify/")})
        except OSError:  # a read-only cache folder: the next run keeps the order it has
            pass
        lines = self.lines()
        if lines:
            terminalreporter.write_sep("=", "gate")
            for ln in lines:
                terminalreporter.write_line(ln)
