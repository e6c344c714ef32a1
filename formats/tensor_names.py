"""Tensor names as llama.cpp writes them, from gguf-py's own tables (`gguf.constants`).

A *logical* name is gguf-py's template filled in (`token_embd`, `blk.0.attn_q`): it is what
the project's code asks a `Pack` for. The *file* name is the logical name plus `.weight`, as
llama.cpp's converters write every weight (`token_embd.weight`, `blk.0.ffn_gate_exps.weight`).
A bias is named by its file name itself (`blk.0.attn_q.bias`): its logical name keeps the
`.bias` suffix, so the weight and the bias of one gguf-py kind stay two names.

Which tensors a pack holds is its architecture's table (formats/archs/<name>.py,
`MODEL_TENSORS` and `BLOCK_TENSORS`).
"""
from __future__ import annotations

from gguf.constants import MODEL_TENSOR, TENSOR_NAMES

T = MODEL_TENSOR
SUFFIX = ".weight"
BIAS = ".bias"  # a bias tensor's suffix, kept in its logical name


def name(tensor: MODEL_TENSOR, bid: int | None = None, suffix: str = SUFFIX) -> str:
    """The logical name of `tensor` (of block `bid` for a block tensor): `blk.3.attn_q`, or
    with suffix BIAS its bias's, `blk.3.attn_q.bias`."""
    template = TENSOR_NAMES[tensor]
    base = template.format(bid=bid) if "{bid}" in template else template
    return base if suffix == SUFFIX else base + suffix


def file_name(logical: str) -> str:
    """The name a llama.cpp converter writes for a logical name: `blk.3.attn_q.weight`
    (`blk.3.attn_q.bias` for a bias's)."""
    return logical if logical.endswith(BIAS) else logical + SUFFIX


def logical_name(file: str) -> str | None:
    """The logical name of a file's tensor name, None for a name with neither suffix."""
    if file.endswith(BIAS):
        return file
    return file[:-len(SUFFIX)] if file.endswith(SUFFIX) else None
