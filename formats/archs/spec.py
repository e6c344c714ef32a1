"""What an architecture module (formats/archs/<name>.py) declares, as data the shared code reads.

An architecture is a GGUF `general.architecture` value with its own metadata keys, tensors and
attention, over the steps every architecture shares (norms, dense products, the MoE half, the
layer walk). Its module in formats/archs/ holds:

- `NAME`: the `general.architecture` value;
- `KEYS`, `ROPE_KEYS`, `ROPE_FACTOR_OLD_KEY`, `ROPE_UNREAD_KEYS`, `VALUE_LENGTH_KEY`: the
  metadata keys formats/config.py reads (ModelConfig field -> key);
- `MODEL_TENSORS`, `BLOCK_TENSORS`: its tensor table (`TensorSpec`), the one list the loader,
  make-pack and both implementations' per-layer weights are built from;
- `Layer`: the dataclass of one block's weights, a field per block tensor, named as the tensor
  is less `blk.N.` (`layer_names` fills it from the table: the reference fills it with the
  pack's matrices and vectors, the fast engine with its backend's handles);
- `ATTENTION` (`AttentionParams`) and `MOE` (`MoeParams`): its attention's and its MoE half's
  parameters;
- `write_metadata(writer, cfg)`: the hyperparameter keys make-pack writes.

reference/archs/<module>.py and fast/archs/<module>.py hold its attention half in each
implementation (docs/architectures.md).
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Callable

from gguf.constants import MODEL_TENSOR

from strata_prefill.formats import tensor_names as tn


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of an architecture's table.

    shape: the ggml ne (fastest dimension first) of the tensor for a ModelConfig.
    role: what it is, for the loader and make-pack: "norm" (a float32 vector, read whole),
    "gate" (a float one-row matrix: a scalar gate's weights), "dense" (a matrix in the dense
    type), "router" (the router, in the router type), "embd" (the token embedding, in the dense
    type), "expert_gu" and "expert_down" (stacked experts in the expert types).
    fill: how make-pack draws its values: "norm" (N(1, NORM_STD)), "gate" (N(0, 2/sqrt(n_cols))),
    "embd", "in" or "out" (random valid blocks of the std make-pack gives inputs and outputs).
    group: None for a tensor every block (or the model) holds; else the name of a group of
    tensors a block holds all of or none of (the shared expert's: "shexp").
    """

    kind: MODEL_TENSOR
    shape: Callable[[Any], list[int]]
    role: str
    fill: str
    group: str | None = None

    @property
    def is_vector(self) -> bool:
        """Read as a float32 vector (Pack.vector)."""
        return self.role == "norm"

    @property
    def float_only(self) -> bool:
        """Held in a float type only (norms and gates: never quantized)."""
        return self.role in ("norm", "gate")

    @property
    def field(self) -> str:
        """The Layer field (a block tensor's logical name less `blk.N.`), or the logical name."""
        return tn.name(self.kind, 0).removeprefix("blk.0.")


@dataclass(frozen=True)
class AttentionParams:
    """An architecture's attention, as its attention half (reference/archs, fast/archs) runs it."""

    qk_norm: bool            # RMSNorm per head of q and k (attn_q_norm, attn_k_norm)
    rope: str                # the RoPE rotation: "neox" (halves) or "norm" (pairs)
    qkvo_bias: bool = False  # biases on the q, k, v and o projections
    sinks: bool = False      # a learned sink logit per head in the softmax
    sliding_window: int = 0  # 0: every layer attends to the whole prefix
    swa_every: int = 0       # where sliding_window: every how many layers one is windowed


@dataclass(frozen=True)
class MoeParams:
    """An architecture's MoE half, as the shared MoE half reads it (reference/moe_half.py,
    fast/engine.py with fast/walk.py): one value of each field is implemented today
    (`strata_prefill.contract.moe.IMPLEMENTED`); a pack asking for another is refused when it is opened."""

    scoring: str          # "softmax": over all experts, then top-k; "softmax_topk": over the k picked logits
    renormalize: bool     # top-k weights divided by their sum
    shared_expert: str    # "never", "optional" (a block may hold the shexp group) or "always"
    router_bias: bool     # ffn_gate_inp has a bias
    expert_bias: bool     # gate, up and down experts have biases
    activation: str       # "swiglu": silu(gate) * up; "swiglu_oai": the clamped form


def layer_names(arch, layer: int, present: Callable[[str], bool]) -> dict[str, str]:
    """Layer field -> logical name of block `layer`'s tensors in `arch`'s table; a group's
    tensors only where `present` says its first tensor is held."""
    groups: dict[str, bool] = {}
    out = {}
    for t in arch.BLOCK_TENSORS:
        name = tn.name(t.kind, layer)
        if t.group is not None:
            if t.group not in groups:
                groups[t.group] = present(name)
            if not groups[t.group]:
                continue
        out[t.field] = name
    return out


def check_layer_class(arch) -> None:
    """Fail at import if an architecture's Layer dataclass and its tensor table disagree."""
    have = [f.name for f in fields(arch.Layer) if f.name != "index"]
    want = [t.field for t in arch.BLOCK_TENSORS]
    assert have == want, f"{arch.NAME}: Layer fields {have} differ from the tensor table {want}"
    optional = {f.name for f in fields(arch.Layer) if f.default is None}
    assert optional == {t.field for t in arch.BLOCK_TENSORS if t.group}, \
        f"{arch.NAME}: Layer's optional fields differ from the table's groups"


@dataclass(frozen=True)
class SharedExpert:
    gate_inp: Any  # 1 row of n_embd values: the shared expert's gate
    gate: Any      # [n_ff_shexp rows, n_embd]
    up: Any        # [n_ff_shexp rows, n_embd]
    down: Any      # [n_embd rows, n_ff_shexp]


class MoeLayer:
    """What the shared MoE half asks of any architecture's Layer (its fields ffn_norm,
    ffn_gate_inp, ffn_gate_exps, ffn_up_exps, ffn_down_exps and, where its table has them,
    the shared expert's)."""

    @property
    def has_shexp(self) -> bool:
        return getattr(self, "ffn_gate_shexp", None) is not None

    @property
    def shexp(self) -> SharedExpert | None:
        if not self.has_shexp:
            return None
        return SharedExpert(self.ffn_gate_inp_shexp, self.ffn_gate_shexp,
                            self.ffn_up_shexp, self.ffn_down_shexp)
