"""Mixed-type packs as llama-quantize writes them: `make-pack --mix NAME` gives every matrix the
type llama.cpp's quantizer picks for that file type (src/llama-quant.cpp:
llama_tensor_get_type_impl and tensor_type_fallback), for a MoE model of formats/archs (with or without a
shared expert) and no importance matrix. The file types (:data:`MIXES`) fall into three
families, each with its rules for the tensors a pack holds:

K (Q4_K_M, Q2_K):
- the base type (Q4_K, Q2_K) for every matrix not named below;
- `attn_v`: Q2_K -> Q4_K when the query heads per KV head (n_gqa) are 4 or more, else Q3_K;
  Q4_K_M -> Q6_K in the layers `use_more_bits` picks, else Q4_K;
- `ffn_down` (the experts' and the shared expert's): Q2_K -> Q3_K; Q4_K_M -> Q6_K in the
  layers `use_more_bits` picks, else Q4_K;
- `attn_output`: Q2_K -> Q3_K; Q4_K_M keeps Q4_K;
- a model of exactly 8 experts instead takes Q8_0 for `attn_v` and `attn_k` and Q5_K for
  `attn_output`.

IQ4 (IQ4_XS):
- the base type (IQ4_XS) for every matrix not named below;
- `attn_v`: Q5_K when n_gqa is 4 or more; Q8_0 in a model of exactly 8 experts (which also
  takes Q8_0 for `attn_k` and Q5_K for `attn_output`);
- `ffn_down` in the first eighth of the layers (``l < n/8``): Q5_K.

IQ low-bit (IQ2_XXS, IQ1_S: llama-quantize asks an importance matrix for these, which does not
change the choices below):
- the base type for every matrix not named below;
- `attn_v`: Q4_K where n_gqa is 4 or more or the model has 4 or more experts (every MoE), else
  Q2_K;
- `attn_k`: Q4_K in a model of exactly 8 experts;
- `ffn_down`: Q2_K for the first n/8 ffn_down tensors in file order (llama.cpp counts the
  tensors, not the layers: with a shared expert, a layer's experts' down then its shared
  expert's, so the first n/16 layers);
- `attn_output`: Q5_K in a model of exactly 8 experts, else IQ1_S -> IQ2_XXS, IQ2_XXS keeps
  its base type;
- an untied `token_embd`: Q2_K.

Every family: `output` (and `token_embd` when the embeddings are tied, as it is then the output
head) is Q8_0 where its rows are not a multiple of the base type's block, else Q5_K for the IQ
low-bit family and Q6_K for the others; an untied `token_embd` keeps the base type (but the IQ
low-bit family's Q2_K); the router (`ffn_gate_inp`) and every vector are never quantized
(make-pack's router type).

`use_more_bits(i, n)`: layer i of n is in the first eighth, the last eighth, or every third
layer between (``i < n/8 or i >= 7n/8 or (i - n/8) % 3 == 2``, integer division). llama.cpp
counts attn_v tensors in its layer-ordered walk, so for attn_v too i is the layer.

Then the fallback of a matrix whose rows are not a multiple of its type's block
(:data:`FALLBACK`): the 256-value IQ types -> IQ4_NL, Q2_K and Q3_K -> Q4_0, Q4_K -> Q5_0,
Q5_K -> Q5_1, Q6_K -> Q8_0 (F16 where even 32 does not divide them).

A pack's layers fall into a few classes that share their types (:func:`layer_key`); make-pack
sizes a pack of any number of layers from the classes' counts (:func:`layer_classes`) without
walking them.
"""
from __future__ import annotations

from collections import Counter

from gguf import GGMLQuantizationType as QT
from gguf import LlamaFileType

from strata_prefill.contract import quants
from strata_prefill.formats import tensor_names as tn
from strata_prefill.formats.config import ModelConfig

T = tn.T
#: the file types make-pack mirrors, by llama-quantize's name: their base type
MIXES: dict[str, QT] = {"Q4_K_M": QT.Q4_K, "Q2_K": QT.Q2_K, "IQ4_XS": QT.IQ4_XS, "IQ2_XXS": QT.IQ2_XXS,
                        "IQ1_S": QT.IQ1_S}
#: each mix's family of rules (the module docstring)
_FAMILY = {"Q4_K_M": "K", "Q2_K": "K", "IQ4_XS": "IQ4", "IQ2_XXS": "IQ_LOW", "IQ1_S": "IQ_LOW"}
#: tensor_type_fallback: a type whose block does not fit the rows -> the 32-value type used instead
FALLBACK = {QT.Q2_K: QT.Q4_0, QT.Q3_K: QT.Q4_0, QT.Q4_K: QT.Q5_0, QT.Q5_K: QT.Q5_1, QT.Q6_K: QT.Q8_0,
            **{t: QT.IQ4_NL for t in (QT.IQ1_S, QT.IQ1_M, QT.IQ2_XXS, QT.IQ2_XS, QT.IQ2_S, QT.IQ3_XXS,
                                      QT.IQ3_S, QT.IQ4_XS)}}


def file_type(mix: str) -> LlamaFileType:
    """The llama_ftype a file of this mix records as general.file_type (gguf's LlamaFileType)."""
    return LlamaFileType[f"MOSTLY_{parse_mix(mix)}"]


def use_more_bits(i: int, n: int) -> bool:
    """llama-quant.cpp's layer choice for the extra bits of Q4_K_M's attn_v and ffn_down."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def parse_mix(name) -> str:
    """The mix's name (any case), or a one-line InputError naming the mixes."""
    from strata_prefill.contract.errors import InputError

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
    by_key: dict = {}
    for l in range(cfg.n_layer):
        key = layer_key(cfg, mix, l)
        if key not in by_key:
            by_key[key] = layer_types(cfg, mix, key)
        out.update((tn.name(kind, l), qt) for kind, qt in by_key[key].items())
    return out


def head_types(cfg: ModelConfig, mix: str, tie_embeddings: bool = False) -> dict[str, QT]:
    """{logical name: type} of token_embd and output (the whole-model matrices)."""
    mix = parse_mix(mix)
    base, D, low = MIXES[mix], cfg.n_embd, _FAMILY[mix] == "IQ_LOW"
    head = QT.Q8_0 if D % quants.block_size(base)[0] else QT.Q5_K if low else QT.Q6_K  # the output head
    embd = QT.Q2_K if low else base
    out = {tn.name(T.TOKEN_EMBD): _fits(head if tie_embeddings else embd, D)}
    if not tie_embeddings:
        out[tn.name(T.OUTPUT)] = _fits(head, D)
    return out


def _downs_per_layer(cfg: ModelConfig) -> int:
    return 2 if cfg.has_shexp else 1


def layer_key(cfg: ModelConfig, mix: str, l: int) -> tuple:
    """The class of layer l of cfg.n_layer under the mix: layers of one class get the same types
    (:func:`layer_types`). K: use_more_bits; IQ4: the first eighth; IQ low-bit: whether the
    layer's experts' and shared expert's ffn_down are among the first n/8 ffn_down tensors."""
    n, family = cfg.n_layer, _FAMILY[parse_mix(mix)]
    if family == "K":
        return (use_more_bits(l, n),)
    if family == "IQ4":
        return (l < n // 8,)
    per = _downs_per_layer(cfg)
    return tuple(per * l + i < n // 8 for i in range(per))


def layer_classes(cfg: ModelConfig, mix: str) -> Counter:
    """{layer_key: how many of cfg.n_layer layers have it}, in closed form (no walk: a pack of
    10^9 layers is counted at once)."""
    n, family = cfg.n_layer, _FAMILY[parse_mix(mix)]
    if family == "K":
        lo, hi = n // 8, 7 * n // 8
        more = lo + (n - hi) + (hi - lo) // 3  # the first n/8, the last n - 7n/8, every third between
        out = Counter({(True,): more, (False,): n - more})
    elif family == "IQ4":
        out = Counter({(True,): n // 8, (False,): n - n // 8})
    else:
        per, m = _downs_per_layer(cfg), n // 8
        if per == 1:
            out = Counter({(True,): m, (False,): n - m})
        else:  # the experts' down is tensor 2l, the shared expert's 2l + 1
            both, first = m // 2, (m + 1) // 2
            out = Counter({(True, True): both, (True, False): first - both, (False, False): n - first})
    return +out  # classes of no layer dropped


def layer_types(cfg: ModelConfig, mix: str, key: tuple) -> dict:
    """{MODEL_TENSOR: type} of a block's matrices in a layer of class `key` (:func:`layer_key`)."""
    mix = parse_mix(mix)
    base, family, D = MIXES[mix], _FAMILY[mix], cfg.n_embd
    eight, gqa4 = cfg.n_expert == 8, cfg.n_head // cfg.n_head_kv >= 4
    k, out_ = base, base
    if family == "K":
        q2, more = mix == "Q2_K", key[0]
        v = QT.Q8_0 if eight else (QT.Q4_K if gqa4 else QT.Q3_K) if q2 else QT.Q6_K if more else base
        downs = (QT.Q3_K if q2 else QT.Q6_K if more else base,) * 2
        k = QT.Q8_0 if eight else base
        out_ = QT.Q5_K if eight else QT.Q3_K if q2 else base
    elif family == "IQ4":
        v = QT.Q8_0 if eight else QT.Q5_K if gqa4 else base
        downs = (QT.Q5_K if key[0] else base,) * 2
        k = QT.Q8_0 if eight else base
        out_ = QT.Q5_K if eight else base
    else:
        v = QT.Q4_K if gqa4 or cfg.n_expert >= 4 else QT.Q2_K
        downs = tuple(QT.Q2_K if low else base for low in key) + (base,)
        k = QT.Q4_K if eight else base
        out_ = QT.Q5_K if eight else QT.IQ2_XXS if mix == "IQ1_S" else base
    kinds = {  # kind: (type, values per row)
        T.ATTN_Q: (base, D), T.ATTN_K: (k, D), T.ATTN_V: (v, D), T.ATTN_OUT: (out_, cfg.n_q),
        T.FFN_GATE_EXP: (base, D), T.FFN_UP_EXP: (base, D), T.FFN_DOWN_EXP: (downs[0], cfg.n_ff_exp),
    }
    if cfg.has_shexp:
        kinds.update({T.FFN_GATE_SHEXP: (base, D), T.FFN_UP_SHEXP: (base, D),
                      T.FFN_DOWN_SHEXP: (downs[1], cfg.n_ff_shexp)})
    return {kind: _fits(qt, n_cols) for kind, (qt, n_cols) in kinds.items()}
