"""The MoE half's elementwise pieces and the expert-group layout: NumPy definitions that the
reference uses directly and the fast path's kernels name (docs/numerics.md, sections 6-7)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from strata_prefill.contract import numerics, routing
from strata_prefill.contract.constants import MMQ_GROUP  # noqa: F401  (fast/ imports it from here)

F32 = np.float32

#: what the shared MoE half (reference/moe_half.py; fast/engine.py with fast/walk.py and the
#: kernels) computes, as the fields of strata_prefill.formats.archs.spec.MoeParams it reads: the
#: router's scorings (strata_prefill.contract.routing.GATINGS) with or without a router bias, expert
#: biases or none, SwiGLU or the clamped swiglu_oai, no shared expert or an optional one.
#: Renormalizing goes with the scoring (RENORMALIZE). An architecture asking for another value
#: is refused (`unsupported`) until the half has it.
IMPLEMENTED = {"scoring": routing.GATINGS, "renormalize": (True, False),
               "router_bias": (False, True), "expert_bias": (False, True),
               "activation": ("swiglu", "swiglu_oai"), "shared_expert": ("never", "optional")}
#: scoring -> the renormalize value the half computes with it: softmax's k weights are divided
#: by their sum; the selected softmax's already sum to one (strata_prefill.contract.routing.top_k)
RENORMALIZE = {routing.SOFTMAX: True, routing.SOFTMAX_SELECTED: False}


def unsupported(params) -> list[str]:
    """One phrase per MoeParams field (formats/archs) whose value the MoE half does not compute."""
    out = [f"the MoE half does not compute {field}={getattr(params, field)!r} (it computes "
           f"{' or '.join(map(repr, values))})"
           for field, values in IMPLEMENTED.items() if getattr(params, field) not in values]
    want = RENORMALIZE.get(params.scoring)
    if want is not None and params.renormalize != want:
        out.append(f"the MoE half does not compute renormalize={params.renormalize!r} with "
                   f"scoring={params.scoring!r} (it computes renormalize={want!r})")
    return out


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """H = silu(gate) * up, elementwise."""
    return numerics.silu(gate) * up


@dataclass(frozen=True)
class SwigluOai:
    """The clamped SwiGLU of gpt-oss (ggml's swiglu_oai): :func:`swiglu_oai` with these
    parameters. Passed as ``act`` to :func:`glu` and the backends' SwiGLU steps; None there is
    :func:`swiglu`."""

    alpha: float = 1.702
    limit: float = 7.0


def swiglu_oai(gate: np.ndarray, up: np.ndarray, alpha: float = 1.702, limit: float = 7.0) -> np.ndarray:
    """H = g * sigmoid(alpha * g) * (u + 1) on clamped inputs, elementwise (docs/numerics.md
    section 6):  g = min(gate, limit);  u = min(max(up, -limit), limit);  t = alpha * g;
    s = g / (1.0f + exp(-t));  H = s * (u + 1.0f). alpha and limit are rounded to float32 once;
    a NaN passes the clamps (as torch's clamp lets it); exp is strata_prefill.contract.numerics.exp."""
    g, u = numerics.f32(gate), numerics.f32(up)
    a, lim = F32(alpha), F32(limit)
    with np.errstate(invalid="ignore"):
        g = np.where(g > lim, lim, g)
        u = np.where(u > lim, lim, np.where(u < -lim, -lim, u))
        s = g / (F32(1.0) + numerics.exp(-(a * g)))
        return numerics._check32(s * (u + F32(1.0)))


def glu(gate: np.ndarray, up: np.ndarray, act=None) -> np.ndarray:
    """The MoE half's gated activation: :func:`swiglu` (act None) or :func:`swiglu_oai` (act a
    :class:`SwigluOai`)."""
    if act is None:
        return swiglu(gate, up)
    if isinstance(act, SwigluOai):
        return swiglu_oai(gate, up, act.alpha, act.limit)
    raise TypeError(f"glu: act must be None or SwigluOai, got {act!r}")


def add_expert_bias(v: np.ndarray, bias: np.ndarray, rexp) -> np.ndarray:
    """Expert-sorted rows v [R, n] plus each row's expert's bias row: ``v[r] + bias[rexp[r]]``,
    one float32 addition per value (bias float32 [E, n], rexp int [R]: strata_prefill.contract.routing.row_experts).
    The gate and up biases go onto the products this way before the gated activation."""
    v, bias = numerics.f32(v), numerics.f32(bias)
    if bias.ndim != 2 or bias.shape[1] != v.shape[-1]:
        raise ValueError(f"expert bias: shape {bias.shape} for rows of {v.shape[-1]} values")
    return v + bias[np.asarray(rexp, np.int64)]


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


def combine(x, weights, slot, y, shared=None, down_bias=None) -> np.ndarray:
    """x + (sum_k w[t,k] * Y[slot[t*K+k]] in rank order, then + g_t * Ysh[t]).

    x [T, D] residual, weights [T, K], slot [T*K], y [T*K, D] expert-sorted outputs,
    shared: None or (g [T], ysh [T, D]). down_bias: None or (bias float32 [E, D], ids [T, K]):
    each expert output gets its expert's down bias first, ``w * (Y + bias[ids[t,k]])``."""
    n_tok, k_used = weights.shape
    acc = np.zeros_like(x, dtype=F32)
    rows = np.asarray(slot).reshape(n_tok, k_used)
    if down_bias is not None:
        bd, ids = numerics.f32(down_bias[0]), np.asarray(down_bias[1], np.int64).reshape(n_tok, k_used)
    for k in range(k_used):
        yk = y[rows[:, k]]
        if down_bias is not None:
            yk = yk + bd[ids[:, k]]
        acc = acc + weights[:, k, None] * yk
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
