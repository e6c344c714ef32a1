"""The tensor names of a qwen3moe pack, from gguf-py's own tables (`gguf.constants`).

A *logical* name is gguf-py's template filled in (`token_embd`, `blk.0.attn_q`): it is what
the project's code asks a `Pack` for. The *file* name is the logical name plus `.weight`, as
llama.cpp's converters write every weight (`token_embd.weight`, `blk.0.ffn_gate_exps.weight`).

The qwen3moe architecture's list gives the model's tensors; qwen3moe has no shared expert, so
the four `_shexp` tensors come from qwen3next, the architecture with qwen3moe's layout that
defines them (qwen2moe lists the same names).
"""
from __future__ import annotations

from gguf.constants import MODEL_ARCH, MODEL_TENSOR, MODEL_TENSORS, TENSOR_NAMES

T = MODEL_TENSOR
SUFFIX = ".weight"

#: the whole-model tensors, then those of every block (qwen3moe's list)
MODEL: tuple[MODEL_TENSOR, ...] = (T.TOKEN_EMBD, T.OUTPUT_NORM, T.OUTPUT)
BLOCK: tuple[MODEL_TENSOR, ...] = (
    T.ATTN_NORM, T.ATTN_Q, T.ATTN_K, T.ATTN_V, T.ATTN_OUT, T.ATTN_Q_NORM, T.ATTN_K_NORM,
    T.FFN_NORM, T.FFN_GATE_INP, T.FFN_GATE_EXP, T.FFN_UP_EXP, T.FFN_DOWN_EXP,
)
#: the shared expert's tensors (qwen3next's list)
SHEXP: tuple[MODEL_TENSOR, ...] = (T.FFN_GATE_INP_SHEXP, T.FFN_GATE_SHEXP, T.FFN_UP_SHEXP,
                                   T.FFN_DOWN_SHEXP)
SHEXP_ARCH = MODEL_ARCH.QWEN3NEXT

# fail at import, not in a pack, if an installed gguf-py no longer lists one of them
for _arch, _wanted in ((MODEL_ARCH.QWEN3MOE, MODEL + BLOCK), (SHEXP_ARCH, SHEXP)):
    _missing = [t.name for t in _wanted if t not in MODEL_TENSORS[_arch]]
    assert not _missing, f"gguf-py's {_arch.name} lists no {_missing}"


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
