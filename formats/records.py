"""What the record file (`DIR/layers.spd`, docs/dumps.md) holds, op by op, and how to read it
back as a timeline: chunk by chunk in the order they ran, each chunk's records by name.

Both engines write the names of `OPS` (`L{layer:02d}.{op}`); the first-difference report
(strata_prefill/report.py) compares them in this order and names the kernel that writes each one.

Kinds of record, by what axis 0 counts:
  token   one row per token of the chunk (row t is position positions[t])
  pair    one row per (token, rank) pair, in pair order t*K+k: expert-sorted buffers are put
          into this order through the chunk's `slot`, so they do not depend on chunking
  q8pair  a q8_1 buffer in pair order: uint8 [T*K, blocks, 144]
  sampled the residual at positions pos % 64 == 0 (`resid_pos` holds them)
  chunk   depends on how the prompt was cut (`slot`): written, never compared
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from strata_prefill.contract import q8_1
from strata_prefill.contract.dense import is_float
from strata_prefill.formats.dumps import iter_records

K = "fast/cuda/kernels/"


@dataclass(frozen=True)
class Op:
    name: str
    kind: str
    what: str
    kernel: str  # the kernel file that writes this record on the GPU (its inputs' kernels follow)
    level: str = "ops"  # "layer": written at every dump level; "ops": only at --dump-level ops


# Per layer, in the order the layer computes them.
OPS: tuple[Op, ...] = (
    Op("attn_norm", "token", "RMSNorm of the layer input (attn_norm)", K + "rmsnorm.cu"),
    Op("q", "token", "Q after the head norm and RoPE [T, n_head, head_dim]",
       K + "rope.cu (after mmq.cu, rmsnorm.cu)"),
    Op("k", "token", "K after the head norm and RoPE [T, n_head_kv, head_dim]",
       K + "rope.cu (after mmq.cu, rmsnorm.cu)"),
    Op("v", "token", "V [T, n_head_kv, head_dim]", K + "mmq.cu"),
    Op("attn_out", "token", "attention output before the o-projection [T, n_q]",
       K + "attention_pair.cu (T<=4: attention_split.cu; cache: kv_cache.cu)"),
    Op("attn_proj", "token", "o-projection of the attention output", K + "mmq.cu (input: quantize_q8_1.cu)"),
    Op("attn_resid", "token", "residual after attention", K + "add.cu"),
    Op("ffn_norm", "token", "RMSNorm of the MoE input (ffn_norm)", K + "rmsnorm.cu"),
    Op("router_logits", "token", "router logits [T, n_expert]", K + "mmq.cu (input: quantize_q8_1.cu)"),
    Op("topk_ids", "token", "routed experts per token, rank order", K + "router.cu", "layer"),
    Op("topk_w", "token", "renormalized weights of the routed experts", K + "router.cu", "layer"),
    Op("slot", "chunk", "expert-sorted row of pair t*K+k in this chunk", K + "routing_tables.cu", "layer"),
    Op("moe_in_q8_1", "q8pair", "the MoE input q8_1 buffer",
       K + "quantize_q8_1.cu (rows from routing_tables.cu)", "layer"),
    Op("gate", "pair", "gate product per pair row [T*K, n_ff_exp]",
       K + "mmq.cu (resident experts in place; streamed ones: gather_group.cu)"),
    Op("up", "pair", "up product per pair row [T*K, n_ff_exp]", K + "mmq.cu (resident experts in place; streamed ones: gather_group.cu)"),
    Op("swiglu_h", "pair", "H = silu(gate) * up before its quantize", K + "swiglu.cu"),
    Op("down_in_q8_1", "q8pair", "the down product's input q8_1 buffer",
       K + "swiglu_q8_1.cu (--dump-level ops: quantize_q8_1.cu after swiglu.cu)", "layer"),
    Op("y", "pair", "down product per pair row [T*K, n_embd]", K + "mmq.cu (resident experts in place; streamed ones: gather_group.cu)"),
    Op("shexp_g", "token", "shared expert gate sigmoid(ffn_gate_inp_shexp . h) [T]",
       K + "combine.cu (sigmoid_vec, after mmq.cu)"),
    Op("shexp", "token", "shared expert output [T, n_embd]", K + "mmq.cu (H: swiglu.cu, quantize_q8_1.cu)"),
    Op("moe_out", "token", "residual after the layer (combine)", K + "combine.cu"),
    Op("resid_pos", "sampled", "positions with pos % 64 == 0", "-", "layer"),
    Op("resid", "sampled", "residual after the layer at those positions", K + "combine.cu", "layer"),
)
OP = {op.name: op for op in OPS}
ORDER = {op.name: i for i, op in enumerate(OPS)}

# The q8_1 records, and which expert matrix's type decides each one's layout (Pack.expert_types:
# 0 gate/up, 1 down): how their block headers read. A float type's input is not quantized:
# that record is not written.
Q8_RECORDS = {"moe_in_q8_1": 0, "down_in_q8_1": 1}


def q8_layouts(pack) -> dict:
    """{("Lnn", q8_1 record name): q8_1.Layout} of a pack's layers (its q8_1 records only)."""
    out = {}
    for layer in range(pack.config.n_layer):
        types = pack.expert_types(layer)
        for name, which in Q8_RECORDS.items():
            if not is_float(types[which]):
                out[(f"L{layer:02d}", name)] = q8_1.layout_for(types[which])
    return out


# Records outside the layers: the chunk's input and the run's first-token logits.
GLOBALS = {
    "embed": Op("embed", "token", "token embeddings of the chunk", K + "embed.cu"),
    "first_logits": Op("first_logits", "global", "first-token logits of a run",
                       K + "mmq.cu (output norm: rmsnorm.cu)", "layer"),
}
HEADERS = ("chunk", "positions")  # written by the session at the start of every chunk

LEVELS = ("layer", "ops")


def op_of(name: str) -> tuple[int | None, Op | None]:
    """(layer, Op) of a record name; (None, Op) for a global; (layer, None) for an unknown op."""
    m = re.fullmatch(r"L(\d+)\.(.+)", name)
    if m:
        return int(m.group(1)), OP.get(m.group(2))
    return None, GLOBALS.get(name)


@dataclass
class Chunk:
    """One chunk's records: its index in the run (greedy steps count), its positions, and
    its records by name in the order written (same-named records joined along axis 0)."""

    index: int
    positions: np.ndarray
    records: dict = field(default_factory=dict)


def computed_order(name: str):
    """A record's sort key in the order a prefill computes them: the embedding, then each layer's
    ops in OPS order, then what follows the last layer (the first-difference report walks this)."""
    layer, op = op_of(name)
    if layer is None:
        return (-1 if name == "embed" else 10**9, 0, name)
    return (layer, ORDER[op.name] if op else len(ORDER), name)


def read_timeline(path: str | Path) -> list[Chunk]:
    """The chunks of a record file in the order they ran. Records written before any chunk
    header (files of an older writer) form one chunk of index -1 with no positions."""
    chunks: list[Chunk] = []
    cur = None
    pending_index = None
    for name, array in iter_records(path):
        if name == "chunk":
            pending_index = int(array[0])
            continue
        if name == "positions":
            cur = Chunk(pending_index if pending_index is not None else len(chunks), array.astype(np.int64))
            chunks.append(cur)
            continue
        if cur is None:
            cur = Chunk(-1, np.zeros(0, np.int64))
            chunks.append(cur)
        prev = cur.records.get(name)
        cur.records[name] = array if prev is None else np.concatenate([prev, array], axis=0)
    return chunks


def routed_groups(ids: np.ndarray, group: int) -> dict[int, int]:
    """expert -> group index, for the experts routed in a chunk (groups of `group`
    consecutive routed experts in ascending id, as the walk cuts them)."""
    return {int(e): i // group for i, e in enumerate(np.unique(np.asarray(ids).reshape(-1)))}
