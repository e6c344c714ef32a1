"""The MoE half's architecture values as keywords of the backend's steps (fast/engine.py).

An architecture's `MOE` (formats/archs/spec.py `MoeParams`) says how its router scores, whether
the router and the experts have biases and which gated activation the experts use. The fast
engine's MoE half is the same sequence of steps for every architecture; this module turns those
values into the keywords the steps take (fast/backend.py: `top_k`'s bias and gating, the SwiGLU
steps' act and expert_bias, `combine`'s down_bias). An architecture that asks for none of them
(a plain softmax router, no biases, SwiGLU) gets empty keywords: its calls are the ones the
half made before it had any.

The biases are the layer's weights (fast/weights.py, by field): each is uploaded on its first use
and kept by the backend, never per call; the stacked expert biases are read as [n_expert, n]
views of their float32 vectors.
"""
from __future__ import annotations

from dataclasses import dataclass

from strata_prefill.contract import routing
from strata_prefill.contract.moe import SwigluOai


@dataclass(frozen=True)
class MoeSteps:
    gating: str            # strata_prefill.contract.routing.GATINGS
    router_bias: bool      # ffn_gate_inp_b on the logits (top_k's bias)
    expert_bias: bool      # ffn_{gate,up,down}_exps_b: gate/up in the SwiGLU steps, down in the combine
    act: SwigluOai | None  # the gated activation (strata_prefill.contract.moe.glu's act; None: SwiGLU)

    @classmethod
    def of(cls, params) -> MoeSteps:
        """From an architecture's MoeParams (formats/archs)."""
        if params.scoring not in routing.GATINGS:
            raise ValueError(f"MoE scoring {params.scoring!r} is none of {routing.GATINGS}")
        return cls(params.scoring, bool(params.router_bias), bool(params.expert_bias), params.act)

    def router(self, W) -> dict:
        """top_k's keywords for layer weights W: the router's bias and the gating (none where
        the architecture scores by the plain softmax with no bias)."""
        kw = {}
        if self.router_bias:
            kw["bias"] = W.ffn_gate_inp_b
        if self.gating != routing.SOFTMAX:
            kw["gating"] = self.gating
        return kw

    def glu(self, be, W, rexp, config) -> dict:
        """The SwiGLU steps' keywords (fast/walk.py): act, and the gate and up biases with rexp,
        the expert of each expert-sorted row (the backend's row_experts)."""
        kw = {}
        if self.act is not None:
            kw["act"] = self.act
        if self.expert_bias:
            shape = (config.n_expert, config.n_ff_exp)
            kw["expert_bias"] = (rexp, be.view(W.ffn_gate_exps_b, shape), be.view(W.ffn_up_exps_b, shape))
        return kw

    def combine(self, be, W, ids, config) -> dict:
        """combine's keywords: the down bias with the router's ids."""
        if not self.expert_bias:
            return {}
        return {"down_bias": (be.view(W.ffn_down_exps_b, (config.n_expert, config.n_embd)), ids)}
