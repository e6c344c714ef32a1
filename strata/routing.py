"""Expert routing: top-K selection and the routing tables (docs/numerics.md, section 4).

These are the NumPy definitions that the router and routing-table kernels name.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from strata import numerics

F32 = np.float32
# The floor under the sum of the selected probabilities before renormalizing.
RENORM_FLOOR = F32(6.1035e-5)


def top_k(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Softmax over all experts, top-k by probability (ties to the lower id), renormalized.

    logits [T, E] float32 -> (ids int32 [T, k] in rank order, weights float32 [T, k]).
    """
    probs = numerics.softmax(np.asarray(logits, dtype=F32), axis=-1)
    # A stable sort of -p keeps equal probabilities in ascending id order.
    ids = np.argsort(-probs, axis=-1, kind="stable")[:, :k].astype(np.int32)
    picked = np.take_along_axis(probs, ids, axis=-1)
    total = np.zeros(picked.shape[0], dtype=F32)
    for r in range(k):  # rank order, one rounding per step
        total = total + picked[:, r]
    weights = picked / np.maximum(total, RENORM_FLOOR)[:, None]
    return ids, weights.astype(F32)


@dataclass
class RoutingTables:
    """Where each (token, rank) pair lives in the expert-sorted rows of a chunk.

    cnt[e]   pairs routed to expert e
    off[e]   first expert-sorted row of expert e (exclusive prefix sum of cnt)
    slot[i]  row of pair i = t*K + k
    src[r]   token whose input row r holds
    order    experts with cnt > 0, ascending id
    """

    n_tokens: int
    k: int
    cnt: np.ndarray
    off: np.ndarray
    slot: np.ndarray
    src: np.ndarray
    order: np.ndarray

    @property
    def n_rows(self) -> int:
        return self.n_tokens * self.k

    def rows_of(self, e: int) -> slice:
        return slice(int(self.off[e]), int(self.off[e] + self.cnt[e]))


def routing_tables(ids: np.ndarray, n_expert: int) -> RoutingTables:
    """Build the tables for ids [T, K] exactly as the sequential definition does:
    `for i ascending: slot[i] = off[e]++; src[slot[i]] = i // K`."""
    ids = np.asarray(ids)
    n_tokens, k = ids.shape
    flat = ids.reshape(-1).astype(np.int64)
    if flat.size and (flat.min() < 0 or flat.max() >= n_expert):
        raise ValueError("expert id out of range")
    cnt = np.bincount(flat, minlength=n_expert).astype(np.int32)
    off = np.zeros(n_expert, dtype=np.int32)
    np.cumsum(cnt[:-1], out=off[1:])
    # A stable sort by expert id lists each expert's pairs in ascending i: the same
    # rows the running `off[e]++` hands out.
    by_expert = np.argsort(flat, kind="stable")
    slot = np.empty(flat.size, dtype=np.int32)
    slot[by_expert] = np.arange(flat.size, dtype=np.int32)
    src = (by_expert // k).astype(np.int32)
    order = np.nonzero(cnt)[0].astype(np.int32)
    return RoutingTables(n_tokens, k, cnt, off, slot, src, order)
