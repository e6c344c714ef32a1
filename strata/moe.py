"""The MoE half's elementwise pieces and the expert-group layout: NumPy definitions that the
reference uses directly and the fast path's kernels name (docs/numerics.md, sections 6-7)."""
from __future__ import annotations

import numpy as np

from strata import numerics
from strata.constants import MMQ_GROUP  # noqa: F401  (fast/ imports it from here)

F32 = np.float32

#: what the shared MoE half (reference/moe_half.py; fast/engine.py with fast/walk.py and the
#: kernels) computes, as the fields of strata.archs.spec.MoeParams it reads: softmax over every
#: expert's logit then top-k, the k weights renormalized, no router or expert biases, SwiGLU.
#: An architecture asking for another value is refused (`unsupported`) until the half has it.
IMPLEMENTED = {"scoring": ("softmax",), "renormalize": (True,), "router_bias": (False,),
               "expert_bias": (False,), "activation": ("swiglu",),
               "shared_expert": ("never", "optional")}


def unsupported(params) -> list[str]:
    """One phrase per MoeParams field (strata/archs) whose value the MoE half does not compute."""
    return [f"the MoE half does not compute {field}={getattr(params, field)!r} (it computes "
            f"{' or '.join(map(repr, values))})"
            for field, values in IMPLEMENTED.items() if getattr(params, field) not in values]


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """H = silu(gate) * up, elementwise."""
    return numerics.silu(gate) * up


def gather_rows(x: np.ndarray, src) -> np.ndarray:
    """The MoE input of float gate/up experts: float32 [R, K], row r = x[src[r]] (the normed
    rows themselves, never quantized; docs/numerics.md section 6)."""
    return np.ascontiguousarray(np.asarray(x, F32)[np.asarray(src, np.int64)])


def scatter_rows(x: np.ndarray, slot, k_used: int) -> np.ndarray:
    """The same rows written per token: row slot[t*k_used + k] = x[t] for every k (the bytes of
    gather_rows over the same routing, since slot and src are inverse)."""
    x = np.asarray(x, F32)
    out = np.empty((x.shape[0] * int(k_used), x.shape[1]), F32)
    out[np.asarray(slot, np.int64)] = np.repeat(x, int(k_used), axis=0)
    return out


def combine(x, weights, slot, y, shared=None) -> np.ndarray:
    """x + (sum_k w[t,k] * Y[slot[t*K+k]] in rank order, then + g_t * Ysh[t]).

    x [T, D] residual, weights [T, K], slot [T*K], y [T*K, D] expert-sorted outputs,
    shared: None or (g [T], ysh [T, D])."""
    n_tok, k_used = weights.shape
    acc = np.zeros_like(x, dtype=F32)
    rows = np.asarray(slot).reshape(n_tok, k_used)
    for k in range(k_used):
        acc = acc + weights[:, k, None] * y[rows[:, k]]
    if shared is not None:
        g, ysh = shared
        acc = acc + g[:, None] * ysh
    return x + acc


def group_buffers(blobs: list[np.ndarray], gu_bytes: int, d_bytes: int, tail_bytes: int):
    """The MMQ group buffers of up to MMQ_GROUP experts, as `gather_native_group` fills them.

    Each blob is an expert's bytes [gate | up | down] (2*gu_bytes + d_bytes). Expert q's
    gate|up lands at q * (2*gu_bytes) of the gate/up buffer, its down at q * d_bytes of the
    down buffer; after the last expert, `tail_bytes` zero bytes in each (the MMQ kernel
    reads past the last row of a tile there). Returns (gu_buf, d_buf) uint8."""
    n = len(blobs)
    gu = np.zeros(n * 2 * gu_bytes + tail_bytes, np.uint8)
    dn = np.zeros(n * d_bytes + tail_bytes, np.uint8)
    for q, blob in enumerate(blobs):
        gu[q * 2 * gu_bytes:(q + 1) * 2 * gu_bytes] = blob[: 2 * gu_bytes]
        dn[q * d_bytes:(q + 1) * d_bytes] = blob[2 * gu_bytes:]
    return gu, dn
