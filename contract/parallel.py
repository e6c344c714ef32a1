"""One thread pool for the NumPy prefill's independent pieces (experts of a layer, heads of
attention, row slabs of a product).

NumPy releases the GIL inside its array loops and BLAS calls, so threads over independent
pieces use several cores. Every piece computes exactly what it computed alone, in the same
float32 operations per element: splitting rows, columns, experts or heads never changes a bit;
splitting a reduction would, and is never done here.

    STRATA_PREFILL_THREADS=N    N threads (a positive integer); unset: the CPUs this process
                                may run on (its affinity mask)

A call of :func:`map_ordered` from inside a pool thread runs its items in that thread, one
after the other: a piece never waits on the pool it runs in. While pieces run (on one thread
or several), OpenBLAS (NumPy's matmul) is held to one thread of its own, so that the
prefill uses the threads it was given and no more: BLAS threads beside the pool's contend
for the same cores, and its threaded small products (the MMQ blocks are 32 deep) lose more to
waking and waiting than they gain. Its own count is restored afterwards. The only
BLAS products in the prefill are integer-valued (exact in any summation order), so BLAS's
thread count never changes a bit either.
"""
from __future__ import annotations

import ctypes
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, TypeVar

from strata_prefill.contract.errors import InputError

ENV = "STRATA_PREFILL_THREADS"

T = TypeVar("T")
R = TypeVar("R")

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_pool_threads = 0
_inside = threading.local()  # .active: this thread is one of the pool's


def available_cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity on this platform
        return max(1, os.cpu_count() or 1)


def thread_count() -> int:
    """The threads the prefill uses: STRATA_PREFILL_THREADS, else :func:`available_cpus`.
    A value that is not a positive integer is an InputError."""
    raw = os.environ.get(ENV)
    if raw is None or raw.strip() == "":
        return available_cpus()
    try:
        n = int(raw.strip())
    except ValueError:
        raise InputError(f"{ENV} must be a positive integer, got {raw!r}") from None
    if n < 1:
        raise InputError(f"{ENV} must be a positive integer, got {raw!r}")
    return n


def _executor(n: int) -> ThreadPoolExecutor:
    global _pool, _pool_threads
    with _lock:
        if _pool is None or _pool_threads != n:
            if _pool is not None:
                _pool.shutdown(wait=False)
            _pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="strata-prefill",
                                       initializer=_mark_inside)
            _pool_threads = n
        return _pool


def _mark_inside() -> None:
    _inside.active = True


def _forget_pool_in_child() -> None:
    # a forked child has none of the parent's threads: its first map_ordered makes a pool
    global _pool, _pool_threads, _lock
    _pool, _pool_threads, _lock = None, 0, threading.Lock()
    _blas.__init__()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool_in_child)


def in_pool() -> bool:
    """True in one of the pool's threads."""
    return getattr(_inside, "active", False)


def workers() -> int:
    """How many pieces run at once if :func:`map_ordered` is called here: 1 inside a pool
    thread, else :func:`thread_count`."""
    return 1 if in_pool() else thread_count()


class _OpenBlasThreads:
    """The thread counts of the OpenBLAS copies this process has loaded (NumPy's, SciPy's),
    where they export their setter; where none does, nothing is done."""

    _PREFIXES = ("scipy_openblas", "openblas")
    _SUFFIXES = ("64_", "")

    def __init__(self):
        self._libs: list = []  # (get, set) per OpenBLAS copy
        self._held = 0  # regions holding BLAS to one thread
        self._saved: list = []
        self._found = False

    def _find(self) -> None:
        self._found = True
        try:
            with open("/proc/self/maps") as f:
                paths = {line.split()[-1] for line in f if "openblas" in line.rsplit("/", 1)[-1].lower()}
        except OSError:
            return
        for path in sorted(paths):
            try:
                lib = ctypes.CDLL(path)
            except OSError:
                continue
            for pre in self._PREFIXES:
                for suf in self._SUFFIXES:
                    get = getattr(lib, f"{pre}_get_num_threads{suf}", None)
                    put = getattr(lib, f"{pre}_set_num_threads{suf}", None)
                    if get is not None and put is not None:
                        get.restype, put.argtypes = ctypes.c_int, [ctypes.c_int]
                        self._libs.append((get, put))
                        break
                else:
                    continue
                break

    def hold_one(self) -> None:
        with _lock:
            if not self._found:
                self._find()
            if self._held == 0:
                self._saved = [int(get()) for get, _ in self._libs]
                for (_, put), n in zip(self._libs, self._saved):
                    if n != 1:
                        put(1)
            self._held += 1

    def release(self) -> None:
        with _lock:
            self._held -= 1
            if self._held == 0:
                for (_, put), n in zip(self._libs, self._saved):
                    if n != 1:
                        put(n)

    def counts(self) -> list[int]:
        """The thread count of each OpenBLAS copy found (for tests)."""
        with _lock:
            if not self._found:
                self._find()
            return [int(get()) for get, _ in self._libs]


_blas = _OpenBlasThreads()


def map_ordered(fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
    """[fn(item) for item in items], the items run on the pool, the results in item order.

    The first exception raised by an item (in item order) is raised here, after every
    item has finished; an interrupt while waiting cancels the items not yet started."""
    items = list(items)
    n = workers()
    _blas.hold_one()
    try:
        if n <= 1 or len(items) <= 1:
            return [fn(item) for item in items]
        futures = [_executor(n).submit(fn, item) for item in items]
        try:
            errors = [f.exception() for f in futures]  # waits for all of them
        except BaseException:
            for f in futures:
                f.cancel()
            raise
    finally:
        _blas.release()
    for e in errors:
        if e is not None:
            raise e
    return [f.result() for f in futures]


def slabs(n: int, pieces: int, minimum: int = 1) -> list[tuple[int, int]]:
    """[start, stop) ranges cutting 0..n into at most `pieces` nearly equal runs of at least
    `minimum` (one range when n is small); empty for n == 0."""
    if n <= 0:
        return []
    pieces = max(1, min(int(pieces), n // max(1, int(minimum))))
    step = -(-n // pieces)
    return [(s, min(n, s + step)) for s in range(0, n, step)]
