"""What the two backends share: array plumbing that is the same for NumPy arrays and
pycuda GPUArrays, the phase-timing switch over their PhaseRecorder (fast/phases.py), and the
RoPE table's growth."""
from __future__ import annotations

import contextlib

from strata.numerics import RopeTable


class BackendBase:
    _rope = None  # a strata.numerics.RopeTable, made on first use

    @staticmethod
    def oom_guard(what: str):
        """Where the device can run out of memory, an error that names `what` (cuda)."""
        return contextlib.nullcontext()

    @property
    def timing(self) -> bool:
        """Phase timing on or off (each backend's `phases`, a fast.phases.PhaseRecorder)."""
        return self.phases.timing

    @timing.setter
    def timing(self, on: bool) -> None:
        self.phases.timing = bool(on)

    @staticmethod
    def view(a, shape):
        return a.reshape(shape)

    @staticmethod
    def shape(a):
        return a.shape

    @staticmethod
    def last_row(x):
        n = int(x.shape[0])
        return x[n - 1:n]

    def rope_table(self, need: int):
        """The RoPE table covering positions 0..need-1: strata.numerics.RopeTable's growth, with
        the backend's `_make_rope(n)` building (and, on the GPU, uploading) each size."""
        if self._rope is None:
            cfg = self.config
            self._rope = RopeTable(cfg.head_dim, cfg.rope_base, build=lambda n, _hd, _base: self._make_rope(n))
        return self._rope.covering(need)
