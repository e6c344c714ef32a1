"""Tensor names as llama.cpp writes them, from gguf-py's own tables (`gguf.constants`).

A *logical* name is gguf-py's template filled in (`token_embd`, `blk.0.attn_q`): it is what
the project's code asks a `Pack` for. The *file* name is the logical name plus `.weight`, as
llama.cpp's converters write every weight (`token_embd.weight`, `blk.0.ffn_gate_exps.weight`).

Which tensors a pack holds is its architecture's table (formats/archs/<name>.py,
`MODEL_TENSORS` and `BLOCK_TENSORS`).
"""
from __future__ import annotations

from gguf.constants import MODEL_TENSOR, TENSOR_NAMES

T = MODEL_TENSOR
SUFFIX = ".weight"


def name(tensor: MODEL_TENSOR, bid: int | None = None) -> str:
    """The logical name of `tensor` (of block `bid` for a block tensor): `blk.3.attn_q`."""
    template = TENSOR_NAMES[tensor]
    return template.format(bid=bid) if "{bid}" in template else template


def file_name(logical: str) -> str:
    """The name a llama.cpp converter writes for a logical name: `blk.3.attn_q.weight`."""
    return logical + SUFFIX


def logical_name(file: str) -> str | None:
    """The logical name of a file's tensor name, None for a name without the suffix."""
    return file[:-len(SUFFIX)] if file.endswith(SUFFIX) else None
