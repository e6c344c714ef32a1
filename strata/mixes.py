"""Mixed-type packs as llama-quantize writes them: `make-pack --mix Q4_K_M` (or Q2_K) gives
every matrix the type llama.cpp's quantizer picks for that file type (src/llama-quant.cpp:
llama_tensor_get_type_impl and tensor_type_fallback), for a qwen3moe model without an
importance matrix. The rules, for the tensors a qwen3moe pack holds:

- the file type's base type (Q4_K for Q4_K_M, Q2_K for Q2_K) for every matrix not named below;
- `output` (and `token_embd` when the embeddings are tied, as it is then the output head) is
  Q6_K, or Q8_0 where its rows are not a multiple of the base type's block; an untied
  `token_embd` keeps the base type;
- `attn_v`: Q2_K -> Q4_K when the query heads per KV head (n_gqa) are 4 or more, else Q3_K;
  Q4_K_M -> Q6_K in the layers `use_more_bits` picks, else Q4_K;
- `ffn_down` (the experts' and the shared expert's): Q2_K -> Q3_K; Q4_K_M -> Q6_K in the
  layers `use_more_bits` picks, else Q4_K;
- `attn_output`: Q2_K -> Q3_K; Q4_K_M keeps Q4_K;
- a model of exactly 8 experts instead takes Q8_0 for `attn_v` and `attn_k` and Q5_K for
  `attn_output`, as llama.cpp does for Mixtral-like models;
- the router (`ffn_gate_inp`) and every vector are never quantized (make-pack's router type).

`use_more_bits(i, n)`: layer i of n is in the first eighth, the last eighth, or every third
layer between (``i < n/8 or i >= 7n/8 or (i - n/8) % 3 == 2``, integer division). llama.cpp
counts attn_v tensors in its layer-ordered walk, so for attn_v too i is the layer.

Then the fallback of a matrix whose rows are not a multiple of its type's block: Q2_K and Q3_K
-> Q4_0, Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0 (F16 where even 32 does not divide them).
"""
from __future__ import annotations

from gguf import GGMLQuantizationType as QT
from gguf import LlamaFileType

from strata import quants
from strata import tensor_names as tn
from strata.config import ModelConfig

T = tn.T
#: the file types make-pack mirrors, by llama-quantize's name: their base type
MIXES: dict[str, QT] = {"Q4_K_M": QT.Q4_K, "Q2_K": QT.Q2_K}
#: tensor_type_fallback: a type whose block does not fit the rows -> the 32-value type used instead
FALLBACK = {QT.Q2_K: QT.Q4_0, QT.Q3_K: QT.Q4_0, QT.Q4_K: QT.Q5_0, QT.Q5_K: QT.Q5_1, QT.Q6_K: QT.Q8_0}


def file_type(mix: str) -> LlamaFileType:
    """The llama_ftype a file of this mix records as general.file_type (gguf's LlamaFileType)."""
    return LlamaFileType[f"MOSTLY_{parse_mix(mix)}"]


def use_more_bits(i: int, n: int) -> bool:
    """llama-quant.cpp's layer choice for the extra bits of Q4_K_M's attn_v and ffn_down."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def parse_mix(name) -> str:
    """The mix's name (any case), or a one-line InputError naming the mixes."""
    from strata.errors import InputError

    key = str(name).upper()
    if key not in MIXES:
        raise InputError(f"unknown mix {name!r} (mixes: {', '.join(MIXES)})")
    return key


def _fits(qt: QT, n_cols: int) -> QT:
    """qt, or its fallback for rows of n_cols values that are not a multiple of its block."""
    if n_cols % quants.block_size(qt)[0] == 0:
        return qt
    fb = FALLBACK.get(qt)
    if fb is None:  # Q8_0 and the other 32-value types: the rows are not a multiple of 32
        return QT.F16
    return fb if n_cols % quants.block_size(fb)[0] == 0 else QT.F16


def mix_types(cfg: ModelConfig, mix: str, tie_embeddings: bool = False) -> dict[str, QT]:
    """{logical name: type} of every matrix of a pack of cfg the mix quantizes (the module
    docstring's rules), the fallbacks applied."""
    mix = parse_mix(mix)
    out = head_types(cfg, mix, tie_embeddings)
    by_class = {more: layer_types(cfg, mix, more) for more in (False, True)}
    for l in range(cfg.n_layer):
        out.update((tn.name(kind, l), qt) for kind, qt in by_class[use_more_bits(l, cfg.n_layer)].items())
    return out


def head_types(cfg: ModelConfig, mix: str, tie_embeddings: bool = False) -> dict[str, QT]:
    """{logical name: type} of token_embd and output (the whole-model matrices)."""
    base, D = MIXES[parse_mix(mix)], cfg.n_embd
    head = QT.Q8_0 if D % quants.block_size(base)[0] else QT.Q6_K  # the output head
    out = {tn.name(T.TOKEN_EMBD): _fits(head if tie_embeddings else base, D)}
    if not tie_embeddings:
        out[tn.name(T.OUTPUT)] = _fits(head, D)
    return out


def layer_types(cfg: ModelConfig, mix: str, more: bool) -> dict:
    """{MODEL_TENSOR: type} of a block's matrices, in a layer use_more_bits picks (more) or not."""
    mix = parse_mix(mix)
    base, q2, eight, D = MIXES[mix], mix == "Q2_K", cfg.n_expert == 8, cfg.n_embd
    if eight:
        v = QT.Q8_0
    elif q2:
        v = QT.Q4_K if cfg.n_head // cfg.n_head_kv >= 4 else QT.Q3_K
    else:
        v = QT.Q6_K if more else base
    down = QT.Q3_K if q2 else (QT.Q6_K if more else base)
    kinds = {  # kind: (type, values per row)
        T.ATTN_Q: (base, D), T.ATTN_K: (QT.Q8_0 if eight else base, D), T.ATTN_V: (v, D),
        T.ATTN_OUT: (QT.Q5_K if eight else QT.Q3_K if q2 else base, cfg.n_q),
        T.FFN_GATE_EXP: (base, D), T.FFN_UP_EXP: (base, D), T.FFN_DOWN_EXP: (down, cfg.n_ff_exp),
    }
    if cfg.has_shexp:
        kinds.update({T.FFN_GATE_SHEXP: (base, D), T.FFN_UP_SHEXP: (base, D),
                      T.FFN_DOWN_SHEXP: (down, cfg.n_ff_shexp)})
    return {kind: _fits(qt, n_cols) for kind, (qt, n_cols) in kinds.items()}


def more_bits_layers(n: int) -> int:
    """How many of n layers use_more_bits picks, without walking them: the first n/8, the last
    n - 7n/8, and every third of the 7n/8 - n/8 between (the third, sixth, ...)."""
    lo, hi = n // 8, 7 * n // 8
    return lo + (n - hi) + (hi - lo) // 3
