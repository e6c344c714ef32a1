"""Progress of long work on stderr, naming the step in progress.

On a terminal (or with `enabled=True`): a tqdm bar (tqdm comes with gguf) whose description
names the step ("prefill chunk 2/4, layer 1/2"), redrawn in place and cleared at the end.
Off a terminal (CI logs, pipes): no bar; work that lasts gets one line every `HEARTBEAT_S`
seconds naming the step, from a timer thread so that a single long step is named too, and
work shorter than that prints nothing. `enabled=False` prints nothing at all.

    with Progress(n_chunks * n_layer, "prefill", "chunk-layer") as bar:
        for ...:
            bar.at(f"chunk {c}/{n}, layer {l}/{L}")   # before the step runs
            ...
            bar.step()                                # after it
"""
from __future__ import annotations

import sys
import threading
import time

HEARTBEAT_S = 10.0  # off a terminal: a line this often while work lasts
MIN_INTERVAL_S = 0.1  # on a terminal: the bar is redrawn at most this often for a new step


class Progress:
    """`total` steps of `unit` (singular) under the name `desc`, on `stream` (stderr)."""

    def __init__(self, total: int, desc: str, unit: str, enabled: bool | None = None,
                 stream=None, **tqdm_kwargs):
        self.stream = sys.stderr if stream is None else stream
        self.total, self.desc, self.unit = int(total), desc, unit
        self.done = 0
        self.where = "starting"  # until the first step is named
        self._t0 = time.monotonic()
        self._drawn = 0.0
        self._bar = None
        self._stop: threading.Event | None = None
        self._thread: threading.Thread | None = None
        if enabled is False or self.total <= 0:
            return
        if enabled or _is_terminal(self.stream):
            try:
                from tqdm import tqdm
            except ImportError:  # pragma: no cover - tqdm comes with gguf
                tqdm = None
            if tqdm is not None:
                self._bar = tqdm(total=self.total, desc=desc, unit=unit, leave=False,
                                 file=self.stream, dynamic_ncols=True, **tqdm_kwargs)
                return
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"progress {desc}", daemon=True)
        self._thread.start()

    # ---- the steps ------------------------------------------------------------------
    def at(self, where: str) -> None:
        """The step that is starting: named on the bar and in the next heartbeat line."""
        self.where = where
        if self._bar is not None:
            self._bar.set_description_str(f"{self.desc} {where}", refresh=False)
            now = time.monotonic()
            if now - self._drawn >= MIN_INTERVAL_S:
                self._drawn = now
                self._bar.refresh()

    def step(self, n: int = 1) -> None:
        self.done += n
        if self._bar is not None:
            self._bar.update(n)

    def write(self, line: str) -> None:
        """A line of its own on the stream, the bar (if any) redrawn below it."""
        if self._bar is not None:
            self._bar.write(line, file=self.stream)
        else:
            print(line, file=self.stream, flush=True)

    def line(self) -> str:
        """What a heartbeat says: the step, the count, the time so far."""
        where = f" {self.where}" if self.where else ""  # "" when a caller names no steps
        if self.unit == "B":
            count = f"{self.done / 2**30:,.2f} of {self.total / 2**30:,.2f} GiB"
        else:
            count = f"{self.done:,}/{self.total:,} {self.unit}s"
        return f"{self.desc}{where} ({count}, {time.monotonic() - self._t0:.0f} s)"

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self._stop is not None:
            self._stop.set()
            self._thread.join(timeout=1.0)  # no line after the work is done
            self._stop = self._thread = None

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- off a terminal -------------------------------------------------------------
    def _beat(self) -> None:
        stop = self._stop
        while stop is not None and not stop.wait(HEARTBEAT_S):
            try:
                print(self.line(), file=self.stream, flush=True)
            except (OSError, ValueError):  # the stream closed under us: nothing to say it on
                return


def _is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False
