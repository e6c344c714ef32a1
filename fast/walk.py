"""The host-side walk over a layer's routed experts: which groups, which rows, and in what
order the gathers, products and releases happen. It knows nothing of PyCUDA: a backend
carries out each step (fast/cuda/backend.py on the GPU, fast/sim.py in NumPy).

A walk visits the routed experts in id order in groups of MMQ_GROUP consecutive routed
experts. Per group:

  group mode (default)     one gather launch for all of the group's experts
  per-expert mode          one gather launch per expert (STRATA_PREFILL_GROUP_GATHER=0)

then the gate/up products over the group's rows, SwiGLU, the quantize of H and the down
product. With all experts resident there is nothing to wait for; the expert cache, the ring
and the copy stream slot in at `ExpertSource` (fast/experts.py) without changing this order.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from strata.moe import MMQ_GROUP


@dataclass(frozen=True)
class Group:
    """Up to MMQ_GROUP consecutive routed experts and their expert-sorted rows."""

    experts: tuple[int, ...]
    bounds: np.ndarray  # int32 [n, 2]: (row_begin, row_end) of each expert
    row_begin: int  # the group's rows are contiguous: row_begin .. row_end
    row_end: int

    @property
    def n_rows(self) -> int:
        return self.row_end - self.row_begin


def plan_groups(order: np.ndarray, cnt: np.ndarray, off: np.ndarray, group: int = MMQ_GROUP) -> list[Group]:
    """Cut the routed experts (ascending id) into groups of `group` consecutive ones."""
    out = []
    for g0 in range(0, len(order), group):
        experts = tuple(int(e) for e in order[g0:g0 + group])
        b = np.array([(off[e], off[e] + cnt[e]) for e in experts], dtype=np.int32)
        out.append(Group(experts, b, int(b[0, 0]), int(b[-1, 1])))
    return out
