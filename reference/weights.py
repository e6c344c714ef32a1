"""The reference engine's decoded weights, kept between chunks (reference/model.py)."""
from __future__ import annotations

import threading

import numpy as np

from strata_prefill.contract import dense
from strata_prefill.contract.mmq import PreparedWeights, prepare


class PreparedCache:
    """Prepared weights by key, up to a byte budget. Decoding a matrix costs more than
    multiplying a short chunk by it, so keeping them pays. A prefill asks for the matrices
    in the same order every chunk, so once the budget is spent the entries kept stay and a
    new one is not kept (dropping the least recently used instead would drop each matrix
    just before its next use, and nothing would hit). Safe to share between threads: two
    threads asking for one missing key may both decode it (the same bytes), and the
    bookkeeping is under a lock. A float matrix (F32, F16, BF16: a float expert's, or a dense
    one) is kept as its float32 values (strata_prefill.contract.dense.decode_float, exact), under the same budget."""

    def __init__(self, max_bytes: int = 1 << 30):
        self.max_bytes = max_bytes
        self._items: dict = {}
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key, qtype, raw: np.ndarray) -> PreparedWeights | np.ndarray:
        with self._lock:
            pw = self._items.get(key)
        if pw is not None:
            return pw
        # outside the lock: decodes run in parallel
        pw = dense.decode_float(qtype, raw) if dense.is_float(qtype) else prepare(qtype, raw)
        with self._lock:
            if key not in self._items and self._bytes + pw.nbytes <= self.max_bytes:
                self._items[key] = pw
                self._bytes += pw.nbytes
        return pw
