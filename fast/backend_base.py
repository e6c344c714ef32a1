"""What the two backends share: array plumbing that is the same for NumPy arrays and
pycuda GPUArrays, and the RoPE table's growth."""
from __future__ import annotations

import contextlib


class BackendBase:
    _rope = None  # (cos, sin) of the positions covered so far

    @staticmethod
    def oom_guard(what: str):
        """Where the device can run out of memory, an error that names `what` (cuda)."""
        return contextlib.nullcontext()

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
        """The RoPE table covering positions 0..need-1, grown by doubling (an entry depends
        only on its position, so growing never changes one). `_make_rope(n)` builds it."""
        have = 0 if self._rope is None else int(self._rope[0].shape[0])
        if have < need:
            self._rope = self._make_rope(max(need, 2 * have, 256))
        return self._rope
