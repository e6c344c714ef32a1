"""Expert routing: top-K selection and the routing tables (docs/numerics.md, section 4).

These are the NumPy definitions that the router and routing-table kernels name. Two scorings
(GATINGS): ``softmax`` (a softmax over every expert, top-K by probability, renormalized) and
``softmax_selected`` (top-K on the logits themselves, then a softmax over the K selected logits
only; llama.cpp's SOFTMAX_WEIGHT gating). An architecture's MOE names its scoring
(formats/archs/). Either may add a router bias to the
logits first.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from strata_prefill.contract import numerics

F32 = np.float32
# The floor under the sum of the selected probabilities before renormalizing.
RENORM_FLOOR = F32(6.1035e-5)

#: the router scorings top_k knows (docs/numerics.md section 4)
SOFTMAX = "softmax"
SOFTMAX_SELECTED = "softmax_selected"
GATINGS = (SOFTMAX, SOFTMAX_SELECTED)


def top_k(logits: np.ndarray, k: int, *, bias=None, gating: str = SOFTMAX) -> tuple[np.ndarray, np.ndarray]:
    """Softmax over all experts, top-k by probability (ties to the lower id), renormalized.

    logits [T, E] float32 -> (ids int32 [T, k] in rank order, weights float32 [T, k]).
    ``bias`` (float32 [E], the router's bias): added to every row's logits first, one float32
    addition each. ``gating`` SOFTMAX_SELECTED: top-k on the (biased) logits themselves, and
    the weights a softmax over the k selected logits (:func:`top_k_selected`).
    """
    if gating not in GATINGS:
        raise ValueError(f"top_k: gating must be one of {GATINGS}, got {gating!r}")
    if bias is not None:
        logits = add_router_bias(logits, bias)
    if gating == SOFTMAX_SELECTED:
        return top_k_selected(logits, k)
    probs = numerics.softmax(np.asarray(logits, dtype=F32), axis=-1)
    # A stable sort of -p keeps equal probabilities in ascending id order.
    ids = np.argsort(-probs, axis=-1, kind="stable")[:, :k].astype(np.int32)
    picked = np.take_along_axis(probs, ids, axis=-1)
    total = np.zeros(picked.shape[0], dtype=F32)
    for r in range(k):  # rank order, one rounding per step
        total = total + picked[:, r]
    weights = picked / np.maximum(total, RENORM_FLOOR)[:, None]
    return ids, weights.astype(F32)


def add_router_bias(logits, bias) -> np.ndarray:
    """logits [T, E] + bias [E] per row: one float32 addition per logit."""
    logits, bias = numerics.f32(logits), numerics.f32(bias)
    if bias.shape != (logits.shape[-1],):
        raise ValueError(f"router bias: {bias.shape} values for {logits.shape[-1]} experts")
    return logits + bias


def top_k_selected(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k by logit (descending; ties to the lower id; NaN after every number), then the
    weights ``softmax`` over the k selected logits in rank order (strata_prefill.contract.numerics.softmax:
    m = their max, e = exp(v - m), lane_sum, e / s). No renormalization: they already sum to
    about 1. logits [T, E] float32 (already biased) -> (ids int32 [T, k], weights float32 [T, k]).
    """
    v = numerics.f32(logits)
    # A stable sort of -v keeps equal logits (+0.0 and -0.0 among them) in ascending id order
    # and puts NaN last.
    ids = np.argsort(-v, axis=-1, kind="stable")[:, :k].astype(np.int32)
    picked = np.take_along_axis(v, ids, axis=-1)
    with np.errstate(invalid="ignore"):
        return ids, numerics.softmax(picked, axis=-1)


def row_experts(ids, slot) -> np.ndarray:
    """The expert of each expert-sorted row: ``rexp[slot[i]] = ids[i]`` for pair i = t*K + k
    (the experts' ranges off[e] .. off[e]+cnt[e] of the routing tables, ascending). int32 [T*K]."""
    ids = np.asarray(ids, np.int32).reshape(-1)
    out = np.empty(ids.size, np.int32)
    out[np.asarray(slot, np.int64)] = ids
    return out


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
