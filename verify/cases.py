"""The one table of cases, in the manner of llama.cpp's test-backend-ops: every kernel case and
every parity case is one row here, and nothing else lists them.

- `KERNEL_CASES`: one CUDA op at one shape, weight type and configuration (or kernel form), with
  the FLOPs and bytes one launch does and moves. `verify/` checks every row byte for byte
  against its NumPy definition; `bench/` times the rows marked `timed` (the shapes timed are the
  shapes checked) and reports TOP/s or GB/s from the row's own figures.
- `PARITY_CASES`: one run of the fast path (pack, prompt, chunking, switch arm, streaming
  setting, backend) compared byte for byte with the reference's run of the same prompt (kept in
  the reference cache: chunking, switches, ring and cache sizes change no bit, docs/numerics.md
  section 9).

Rows marked `quick` make up `pytest verify/ -m quick`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

# ============================================================================ kernel cases

import numpy as np  # noqa: E402
from gguf import GGMLQuantizationType as _QT  # noqa: E402

from strata_prefill.contract import codebooks as _codebooks, q8_1 as _q8_1, qformats as _qformats  # noqa: E402
from strata_prefill.contract import quants as _quants  # noqa: E402
from strata_prefill.fast.cuda.attention import ATTEND_VARIANTS as _ATTEND_VARIANTS  # noqa: E402
from strata_prefill.fast.cuda.elementwise import EMBED_TYPES as _EMBED_TYPES  # noqa: E402
from strata_prefill.formats.config import PRESETS as _PRESETS  # noqa: E402
from strata_prefill.formats.mixes import MIXES as _MIXES  # noqa: E402
from strata_prefill.contract.constants import GROUP_TAIL_BYTES as _GROUP_TAIL, MMQ_GROUP as _MMQ_GROUP  # noqa: E402

#: the weight types with an MMQ kernel (the registry's, contract/qformats.py)
MMQ_TYPES = tuple(f.qtype.name for f in _qformats.with_mmq_kernel())
#: the types that get the full spread: every parity length and switch arm, the streamed arms,
#: the strata-shape and 32K layer kernel rows: the types strata's own packs are made of (the
#: registry's first six)
SPREAD_TYPES = ("Q8_0", "Q4_1", "Q2_K", "IQ2_XS", "IQ3_XXS", "IQ3_S")
assert set(SPREAD_TYPES) <= set(MMQ_TYPES), "a spread type without an MMQ kernel"
#: the codebook types, the formats MoE files carry (IQ4_NL, IQ4_XS, MXFP4, NVFP4: those
#: contract/codebooks.py registers). Their own rows: every MMQ kernel form and tile edge, the strata
#: shapes and the layer rows the GPU suites time, and parity rows per type (_codebook_rows,
#: _cuda_rows, _sim_rows), not the spread's every length and arm
CODEBOOK_TYPES = tuple(f.qtype.name for f in _qformats.with_mmq_kernel() if f.__module__ == _codebooks.__name__)
#: every other type with an MMQ kernel: llama-quantize's, the K-quants and legacy types of its
#: mixes (contract/kquants.py) and the grid types of its low-bit IQ file types (contract/qformats.py,
#: after the K-quants). To keep the GPU gate short they get the small kernel shapes and a few
#: parity rows each (_cuda_rows), not the spread
MIX_TYPES = tuple(t for t in MMQ_TYPES if t not in SPREAD_TYPES and t not in CODEBOOK_TYPES)
#: the mixes' types with an IQ grid: besides the small shapes, the strata gate/up shape, the
#: largest block sums, the pair and the dense launch (their decodes read a staged grid)
MIX_GRID_TYPES = tuple(t for t in MIX_TYPES if _qformats.lookup(_QT[t]).table_name is not None)
#: the kernels strata_prefill.fast.cuda.attention.attend picks between (ATTEND_VARIANTS: the prefill kernel, the
#: split-K kernels, the automatic choice) and None, its default
ATTEND_FORMS = (*_ATTEND_VARIANTS, None)
#: the token counts the GPU suites time the strata shape at
BENCH_TOKENS = (2048, 8192, 32768)
_STRATA = _PRESETS["strata"]


@dataclass(frozen=True)
class KernelCase:
    """One kernel launch checked (and, if `timed`, benchmarked) at one shape."""

    op: str  # the test family: the verify test (or, by form, the few tests) that checks its rows
    name: str  # unique within op; the pytest id is `id`
    shape: dict = field(default_factory=dict)  # the op's own shape arguments (and a seed where the row fixes it)
    weight_type: str | None = None
    form: str | None = None  # the kernel form or variant ("pair", "tile", "gather", ...); None: the default
    config: object = None  # a tile configuration or defines; None: the default (MMQ rows: the test's own sweep)
    flops: int = 0  # one launch; 2 per multiply-add of a product (0: an op that only moves data)
    bytes: int = 0  # one launch's fewest bytes moved (each input read once, each output written once)
    quick: bool = False
    timed: bool = False

    @property
    def id(self) -> str:
        return f"{self.op}-{self.name}"

    @property
    def check(self) -> int | None:
        """How many rows (tokens, queries, experts) of the output the verify test compares with
        the NumPy definition: the benchmarked sizes are too large for it in full (None: all)."""
        return self.shape.get("check")


def sample_index(n: int, count: int | None) -> np.ndarray:
    """`count` indices spread evenly over range(n), the first and the last among them (all n
    where count is None or not below n)."""
    if count is None or count >= n:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, count).round().astype(np.int64))


def key_of(value):
    """`value` (a row's shape, config, ...) as JSON for a reference-cache key: ranges as
    {"range": [start, stop]}, tuples as lists."""
    if isinstance(value, range):
        return {"range": [value.start, value.stop]}
    if isinstance(value, dict):
        return {str(k): key_of(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [key_of(v) for v in value]
    if isinstance(value, np.integer):
        return int(value)
    return value


# ---------------------------------------------------------------- FLOPs and bytes, from a shape


def _weights(wtype: str, N: int, K: int) -> int:
    return _quants.row_bytes(_QT[wtype], K) * N


def product_cost(rows: int, N: int, K: int, wtype: str, n_weights: int = 1, mats: int = 1) -> tuple[int, int]:
    """(flops, bytes) of `mats` MMQ products of `rows` q8_1 rows by N x K weights, over
    `n_weights` weight matrices each (the experts that have rows): 2 * rows * N * K a matrix;
    the weights, the q8_1 rows and the float32 outputs each once."""
    return (2 * rows * N * K * mats,
            n_weights * mats * _weights(wtype, N, K) + _q8_1.buffer_nbytes(rows, K) + mats * rows * N * 4)


def float_product_cost(T: int, N: int, K: int, wtype: str) -> tuple[int, int]:
    """(flops, bytes) of float32 x [T, K] by float weights [N, K] (F32 4 bytes a value, F16 and
    BF16 2)."""
    return 2 * T * N * K, N * K * (4 if wtype == "F32" else 2) + T * K * 4 + T * N * 4


def attention_cost(n_head: int, n_kv: int, hd: int, positions) -> tuple[int, int]:
    """(flops, bytes) of causal attention of the queries at `positions` over the cache's keys
    0 .. max(positions): Q.K and P.V, 2 * hd each per (query head, key) pair; q and the output
    (float32) and each key's int8 K and V with their scales (one per 32 K values, one per V
    row) once."""
    pos = np.asarray(positions, dtype=np.int64)
    pairs = int((pos + 1).sum())
    key_bytes = n_kv * (2 * hd + 4 * (hd // 32) + 4)
    return 4 * n_head * hd * pairs, 2 * pos.size * n_head * hd * 4 + (int(pos.max()) + 1) * key_bytes + 4 * pos.size


def _mmq_group_cost(shape, wtype, mats=1):
    rows = shape["rows"]
    return product_cost(sum(rows), shape["N"], shape["K"], wtype, sum(1 for r in rows if r), mats)


def _routed_experts(tokens: int, n_expert: int, top_k: int) -> int:
    """Experts that get at least one row of `tokens` routed uniformly: all of them from a few
    thousand rows over 512 (the chance one gets none at 20K rows is e^-40), else counted."""
    if tokens * top_k >= 16 * n_expert:
        return n_expert
    from strata_prefill.verify.kernel_inputs import Routing

    return int(np.count_nonzero(Routing(tokens).counts))


def _cost(op: str, s: dict, wtype: str | None) -> tuple[int, int]:
    """(flops, bytes) of one launch of a row of `op` with shape `s`."""
    if op == "quantize":  # x once, the routing table (src or slot), the q8_1 buffer
        R = s["T"] * s["k"]
        return 0, s["T"] * s["K"] * 4 + R * 4 + _q8_1.buffer_nbytes(R, s["K"])
    if op in ("mmq", "mmq_extreme"):
        return _mmq_group_cost(s, wtype)
    if op in ("mmq_pair", "mmq_tiles"):  # gate and up in one launch
        return _mmq_group_cost(s, wtype, mats=2)
    if op == "mmq_dense":
        return product_cost(s["R"], s["N"], s["K"], wtype)
    if op == "mmq_layer":
        rows = s["tokens"] * s["top_k"]
        return product_cost(rows, s["N"], s["K"], wtype, _routed_experts(s["tokens"], s["experts"], s["top_k"]),
                            s["mats"])
    if op == "moe_experts":  # a layer's routed experts (bench/bench_in_place_cuda.py): gate and up, then down
        f1, b1 = product_cost(s["rows"], s["F"], s["D"], wtype, s["experts"], 2)
        f2, b2 = product_cost(s["rows"], s["D"], s["F"], s["down_type"], s["experts"])
        return f1 + f2, b1 + b2
    if op == "swiglu_quantize":  # gate and up rows read, H's q8_1 rows written
        rows = s["r1"] - s["r0"]
        return 0, 2 * rows * s["n"] * 4 + _q8_1.buffer_nbytes(rows, s["n"])
    if op in ("rmsnorm", "rmsnorm_heads"):  # x, the weight, the output
        rows, n = (s["rows"], s["n"]) if op == "rmsnorm" else (s["T"] * s["H"], s["hd"])
        return 0, 2 * rows * n * 4 + n * 4
    if op == "rope":  # x and the output, a cos and a sin row of hd/2 per position, the positions
        T, H, hd = s["T"], s["H"], s["hd"]
        return 0, 2 * T * H * hd * 4 + T * hd * 4 + T * 4
    if op == "add":
        return 0, 3 * s["n"] * 4
    if op == "add_row_bias":  # y and the output, the bias row once
        return 0, 2 * s["rows"] * s["n"] * 4 + s["n"] * 4
    if op == "kv_write":  # float K and V and the positions in; codes, scales and V's blocks out
        T, n_kv, hd = len(s["positions"]), s["n_kv"], s["hd"]
        return 0, 2 * T * n_kv * hd * 4 + T * 4 + T * n_kv * (3 * hd + 4 * (hd // 32) + 4)
    if op in ("attention", "attention_tile_config", "attention_positions", "attention_options"):
        return attention_cost(s["n_head"], s["n_kv"], s["hd"], s["positions"])
    if op in ("attention_chunks", "attention_options_chunks"):
        flops = nbytes = 0
        for chunk in s["chunks"]:
            f, b = attention_cost(s["n_head"], s["n_kv"], s["hd"], chunk)
            flops, nbytes = flops + f * s["n_layer"], nbytes + b * s["n_layer"]
        return flops, nbytes
    if op == "top_k":  # the logits in, ids and weights out
        return 0, s["T"] * s["E"] * 4 + s["T"] * s["K"] * 8
    if op == "routing_tables":  # ids in; cnt, off, order, slot, src and n_order out
        return 0, s["T"] * s["K"] * 4 + 3 * s["E"] * 4 + 2 * s["T"] * s["K"] * 4 + 4
    if op == "swiglu":
        return 0, 3 * s["R"] * s["n"] * 4
    if op == "sigmoid":
        return 0, 2 * s["n"] * 4
    if op == "combine":  # x, K weights and slots, K expert rows, the shared gate and row; out
        T, K, D = s["T"], s["K"], s["D"]
        return 0, 2 * T * D * 4 + T * K * (8 + D * 4) + (T * 4 + T * D * 4 if s["shared"] else 0)
    if op == "embed":  # the rows' blocks, the ids, the float32 rows
        return 0, s["T"] * _quants.row_bytes(_QT[wtype], s["n_embd"]) + s["T"] * 4 + s["T"] * s["n_embd"] * 4
    if op == "gather":  # n blobs read and written, the zeroed tail
        return 0, 2 * s["n"] * (2 * s["gu_bytes"] + s["d_bytes"]) + s["tail"]
    if op in ("float_dense", "float_dense_strided"):
        return float_product_cost(s["T"], s["N"], s["K"], wtype)
    return 0, 0  # refusals, counters, geometry and the every-float probes: no one launch to count


def kernel_case(op: str, name: str, shape: dict, *, weight_type=None, form=None, config=None, quick=False,
                timed=False) -> KernelCase:
    """A row of `op` at `shape`, its FLOPs and bytes counted from the shape (the table's rows,
    and the A/B scripts' rows at the sizes their command lines ask for)."""
    flops, nbytes = _cost(op, shape, weight_type)
    return KernelCase(op, name, dict(shape), weight_type, form, config, int(flops), int(nbytes), quick, timed)


# ---------------------------------------------------------------- the rows, by verify file


def _layout_name(layout) -> str:
    return _q8_1.Layout(layout).name


def _kernels_rows() -> list[KernelCase]:
    """verify/test_kernels_cuda.py: quantize, the MMQ forms, SwiGLU + quantize, the probes."""
    rows = []
    layouts = [_q8_1.Layout.D4, _q8_1.Layout.DS4, _q8_1.Layout.D2S6]
    for T, K, E, k in [(37, 256, 16, 4), (23, 2560, 512, 10), (19, 640, 8, 3), (9, 200, 5, 2)]:
        for lay in layouts:
            rows.append(kernel_case("quantize", f"T{T}-K{K}-E{E}-k{k}-{lay.name}", dict(T=T, K=K, E=E, k=k),
                             config=lay.name, quick=T == 9))
    gu_layout = _layout_name(_q8_1.layout_for(_QT.IQ2_XS))  # the layout the strata gate/up kernel reads
    for T in BENCH_TOKENS:
        rows.append(kernel_case("quantize", f"T{T}-K{_STRATA.n_embd}-strata-{gu_layout}",
                         dict(T=T, K=_STRATA.n_embd, E=_STRATA.n_expert, k=_STRATA.n_expert_used, check=256),
                         config=gu_layout, timed=True))

    for t in MMQ_TYPES:  # tiny: gate/up 512 x 256 (one small row a type: the quick tier), down 256 x 256
        rows.append(kernel_case("mmq", f"tiny-512x256-{t}", dict(N=512, K=256, rows=(0, 1, 9, 130, 0, 40, 3),
                                                          tile_rows=(128, 32, 8), seed=1), weight_type=t, quick=True))
        rows.append(kernel_case("mmq", f"tiny-256x256-{t}", dict(N=256, K=256, rows=(5, 0, 1, 64), stride_pad=0, seed=2),
                         weight_type=t))
    for t in SPREAD_TYPES + MIX_GRID_TYPES:
        rows.append(kernel_case("mmq", f"strata-gate_up-1280x2560-{t}", dict(N=1280, K=2560, rows=(0, 1, 37, 161, 0, 12),
                                                                     tile_rows=(128, 64), seed=3), weight_type=t))
    for t in ("Q8_0", "Q4_1"):
        rows.append(kernel_case("mmq", f"strata-down-2560x640-{t}", dict(N=2560, K=640, rows=(1, 0, 50, 129, 7), seed=4),
                         weight_type=t))
    # K a multiple of 32 but not of 128 (a partial last chunk), N not of 128: each type of 32-value blocks
    for t in ("Q8_0", "Q4_1", *(t for t in MIX_TYPES if _quants.block_size(_QT[t])[0] == 32)):
        rows.append(kernel_case("mmq", f"odd_k-200x96-{t}", dict(N=200, K=96, rows=(3, 17, 0, 33), seed=5), weight_type=t))
    for t in ("Q8_0", "IQ2_XS"):  # ~150 rows an expert (the large-tile configuration), 2 row tiles each
        rows.append(kernel_case("mmq", f"many_rows-320x512-{t}", dict(N=320, K=512, rows=(200, 130, 0, 77, 193),
                                                               tile_rows=(128, 96), seed=8), weight_type=t))
    rows.append(kernel_case("mmq", "sixteen_experts-512x256-IQ2_XS",
                     dict(N=512, K=256, rows=(0, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 1, 0, 7, 160), seed=6),
                     weight_type="IQ2_XS"))
    # Q6_K: sub-scales -128 and codes -32, a block's sum 32 * 127 * 4096, the nearest any type comes to 2^24;
    # IQ1's largest, 15 * 32 * 127 * 9 = 548,640, passes 2^19
    extremes = (("IQ2_XS", 2 ** 22), ("IQ3_XXS", 2 ** 21), ("Q2_K", 2 ** 14), ("Q6_K", 2 ** 23 + 2 ** 22),
                ("IQ2_XXS", 2 ** 21), ("IQ2_S", 2 ** 22), ("IQ1_S", 2 ** 19), ("IQ1_M", 2 ** 19))
    for t, floor in extremes:
        rows.append(kernel_case("mmq_extreme", f"64x512-{t}", dict(N=64, K=512, rows=(40, 0, 24), tile_rows=(128, 16),
                                                            seed=11, floor=floor), weight_type=t, quick=t == "IQ2_XS"))
    for t in ("Q8_0", "IQ3_S", "Q6_K", *MIX_GRID_TYPES):  # Q6_K: the mixes' head
        rows.append(kernel_case("mmq_dense", f"384x512-R300-{t}", dict(N=384, K=512, R=300, seed=7), weight_type=t,
                         quick=t == "Q8_0"))
    for t in ("Q8_0", "IQ2_XS", "Q2_K", "Q4_K", *MIX_GRID_TYPES):  # Q4_K: the activation sums its min reads
        rows.append(kernel_case("mmq_pair", f"384x512-{t}", dict(N=384, K=512, rows=(7, 0, 1, 150, 33)), weight_type=t,
                         form="pair", quick=t == "Q8_0"))
    few = tuple(int(v) for v in np.random.default_rng(11).integers(0, 30, 40))  # 40 experts: the small-rows config
    many = (0, 1, 200, 129, 64, 7, 300, 0, 90)  # the large-rows config, several row tiles an expert
    for t in MMQ_TYPES:
        rows.append(kernel_case("mmq_tiles", f"few-320x512-{t}", dict(N=320, K=512, rows=few, seed=12), weight_type=t,
                         form="tiles", quick=t == "Q8_0"))
        rows.append(kernel_case("mmq_tiles", f"many-200x256-{t}", dict(N=200, K=256, rows=many, seed=13), weight_type=t,
                         form="tiles"))
    strata_rows = tuple(int(v) for v in np.random.default_rng(14).integers(0, 40, 24))
    rows.append(kernel_case("mmq_tiles", "strata-gate_up-640x2560-IQ2_XS", dict(N=640, K=2560, rows=strata_rows, seed=15),
                     weight_type="IQ2_XS", form="tiles"))
    # One MoE layer as the walk launches it on the strata shape: tokens routed top-10 over 512
    # experts, one launch a group of 16 (gate and up: both matrices in one launch).
    E, k, D, F = _STRATA.n_expert, _STRATA.n_expert_used, _STRATA.n_embd, _STRATA.n_ff_exp
    layer = [("gate_up", t, F, D, 2) for t in SPREAD_TYPES] + [("down", t, D, F, 1) for t in ("Q8_0", "Q4_1")]
    for proj, t, N, K, mats in layer:
        for T in BENCH_TOKENS:
            rows.append(kernel_case("mmq_layer", f"{proj}-{t}-T{T}", dict(tokens=T, N=N, K=K, mats=mats, experts=E, top_k=k,
                                                                 check=2), weight_type=t, form="group", timed=True))
    rows.append(kernel_case("mmq_layer", "gate_up-IQ2_XS-T64", dict(tokens=64, N=F, K=D, mats=2, experts=E, top_k=k, check=4),
                     weight_type="IQ2_XS", form="group", quick=True))
    swiglu_shapes = [(256, 40, 0, 40, 0, 40), (640, 57, 9, 50, 9, 57), (200, 33, 3, 30, 11, 45), (1280, 21, 20, 21, 0, 1),
                     (96, 18, 5, 17, 2, 30)]
    for n, R, r0, r1, row0, R_total in swiglu_shapes:
        for lay in sorted({_q8_1.layout_for(_QT[t]) for t in MMQ_TYPES}):
            rows.append(kernel_case("swiglu_quantize", f"n{n}-R{R}-rows{r0}:{r1}-at{row0}-of{R_total}-{_layout_name(lay)}",
                             dict(n=n, R=R, r0=r0, r1=r1, row0=row0, R_total=R_total), config=_layout_name(lay),
                             quick=n == 256))
    for n, R, r0, r1, row0, R_total in swiglu_shapes + [(2880, 12, 1, 11, 0, 10)]:  # + gpt-oss's n_ff
        for lay in sorted({_q8_1.layout_for(_QT[t]) for t in MMQ_TYPES}):
            rows.append(kernel_case("swiglu_oai_quantize",
                                    f"n{n}-R{R}-rows{r0}:{r1}-at{row0}-of{R_total}-{_layout_name(lay)}",
                                    dict(n=n, R=R, r0=r0, r1=r1, row0=row0, R_total=R_total), config=_layout_name(lay),
                                    quick=n == 256))
    probes = [("exp_fused", "positive", 0x00000000, 0x7FFFFFFF), ("exp_fused", "negative", 0x80000000, 0xFFFFFFFF)]
    for form, name, lo, hi in probes:
        rows.append(kernel_case("numerics_probe", f"{form}-{name}", dict(lo=lo, hi=hi), form=form))
    rows.append(kernel_case("numerics_probe", "values-stride-edges-random", dict(stride=251, n_random=2 * 4096),
                            form="values", quick=True))
    rows.append(kernel_case("mmq_counters", "dense-Q8_0", {}, weight_type="Q8_0", quick=True))
    return rows


# (name, n_head, n_kv, hd, chunk positions, keys already in the cache before the chunk)
ATTENTION_SHAPES = [
    ("prefill-100-hd64", 4, 4, 64, range(0, 100), 0),
    ("gqa4-cross64-hd128", 8, 2, 128, range(50, 150), 50),
    ("T1-decode-hd64", 8, 2, 64, (130,), 130),
    ("T1-decode-end-of-block-hd128", 16, 4, 128, (191,), 191),
    ("gqa2-T33-hd128", 6, 3, 128, range(0, 33), 0),
    ("mqa-T200-hd64", 4, 1, 64, range(61, 261), 61),
    # many 64-key blocks, the model's geometry (32 heads, 4 KV heads, head_dim 128)
    ("prefill-1000-gqa8-hd128", 32, 4, 128, range(0, 1000), 0),
    ("chunk-1500-T277-gqa8-hd128", 32, 4, 128, range(1500, 1777), 1500),
    ("T1-decode-4095-gqa8-hd128", 32, 4, 128, (4095,), 4095),
    ("T1-decode-9000-hd64", 8, 2, 64, (9000,), 9000),
    ("T3-3000-gqa8-hd128", 32, 4, 128, (3000, 3001, 3002), 3000),
    ("T5-scattered-mqa-hd128", 8, 1, 128, (700, 5, 64, 1300, 63), 1301),
]


# The options' rows (sink logits, a sliding window: gpt-oss' attention): (name, n_head, n_kv, hd,
# chunk positions, keys already in the cache, sinks' standard deviation or None, window or None)
ATTENTION_OPTION_SHAPES = [
    ("prefill-300-w128-sinks-hd64", 16, 2, 64, range(0, 300), 0, 2.0, 128),
    ("chunk-200-T130-w128-sinks-hd64", 16, 2, 64, range(200, 330), 200, 2.0, 128),  # reaching into the earlier keys
    ("prefill-200-w1-sinks8-hd64", 4, 1, 64, range(0, 200), 0, 8.0, 1),  # a window of the query itself
    ("prefill-260-w64-hd128", 8, 2, 128, range(0, 260), 0, None, 64),  # windows on block edges
    ("prefill-260-w65-hd64", 8, 2, 64, range(0, 260), 0, None, 65),
    ("prefill-150-sinks-hd128", 8, 4, 128, range(0, 150), 0, 4.0, None),
    ("prefill-100-w1000-hd64", 4, 4, 64, range(0, 100), 0, None, 1000),  # past the context: no window
    ("T1-decode-1000-w128-sinks-hd64", 64, 8, 64, (1000,), 1000, 2.0, 128),
    ("T3-scattered-w100-sinks-hd64", 8, 1, 64, (700, 5, 1300), 1301, 2.0, 100),
    # the released models' geometry: 64 query heads, 8 KV heads, head_dim 64, a window of 128
    ("prefill-1000-gqa8-w128-sinks-hd64", 64, 8, 64, range(0, 1000), 0, 2.0, 128),
]


def _attention_shape(i: int, scale: float, **extra) -> tuple[str, dict]:
    name, n_head, n_kv, hd, positions, start = ATTENTION_SHAPES[i]
    return name, dict(n_head=n_head, n_kv=n_kv, hd=hd, positions=positions, start=start, scale=scale, **extra)


def _model_rows() -> list[KernelCase]:
    """verify/test_model_kernels_cuda.py: the model's elementwise, attention and routing kernels."""
    rows = []
    D, E, k = _STRATA.n_embd, _STRATA.n_expert, _STRATA.n_expert_used
    for r, n in [(1, 256), (7, 2560), (5, 256), (3 * 16, 64), (2 * 8, 128), (3, 100)]:
        rows.append(kernel_case("rmsnorm", f"rows{r}-n{n}", dict(rows=r, n=n), quick=(r, n) == (1, 256)))
    for T in BENCH_TOKENS:
        rows.append(kernel_case("rmsnorm", f"rows{T}-n{D}-strata", dict(rows=T, n=D, check=64), timed=True))
    rows.append(kernel_case("rmsnorm_heads", "T5-H8-hd128-in-place", dict(T=5, H=8, hd=128), quick=True))
    for T, H, hd in [(1, 4, 64), (9, 4, 128), (70, 2, 64)]:
        rows.append(kernel_case("rope", f"T{T}-H{H}-hd{hd}", dict(T=T, H=H, hd=hd), quick=T == 1))
    for n in [1, 2560, 3 * 2560 + 3]:
        rows.append(kernel_case("add", f"n{n}", dict(n=n), quick=n == 2560))
    # gpt-oss's q/k/v/o biases (docs/numerics.md section 5): its q, k and o rows, a chunk of
    # 300 tokens, a width no multiple of 4
    for r, n in [(1, 64), (7, 2880), (300, 512), (5, 100)]:
        rows.append(kernel_case("add_row_bias", f"rows{r}-n{n}", dict(rows=r, n=n), quick=r == 1))
    for n_kv, hd in [(2, 64), (4, 128)]:
        rows.append(kernel_case("kv_write", f"kv{n_kv}-hd{hd}", dict(n_kv=n_kv, hd=hd, cap=256,
                                                             positions=(60, 61, 62, 63, 64, 65, 130, 7, 200)),
                         quick=hd == 64))
    for i in range(len(ATTENTION_SHAPES)):
        for scale in (1.0, 8.0):
            name, shape = _attention_shape(i, scale)
            for v in ATTEND_FORMS:
                rows.append(kernel_case("attention", f"{name}-s{scale:g}-{v or 'default'}", shape, form=v,
                                 quick=i == 0 and scale == 1.0))
    for T in (4096, 32768):  # the prefill the GPU suite times: every position over the ones before it
        rows.append(kernel_case("attention", f"prefill-{T}-gqa8-hd128-s1-default",
                         dict(n_head=_STRATA.n_head, n_kv=_STRATA.n_head_kv, hd=_STRATA.head_dim, positions=range(0, T),
                              start=0, scale=1.0, check=8), timed=True))
    # each tile kernel's other configurations (ATTEND_TILE_CONFIGS' defines): the CTA's query
    # groups, the ring's depth, CTAs an SM
    tile_configs = {"pair": [{}, {"PAIR_QG": 6}, {"PAIR_STAGES": 3}, {"PAIR_QG": 4, "PAIR_MINB": 2}],
                    "wgmma": [{"WG_GROUPS": 2}, {"WG_GROUPS": 1, "WG_STAGES": 2}, {"WG_STAGES": 4}]}
    for i in (1, 5, 6, 7):  # gqa4-cross64-hd128, mqa-T200-hd64, prefill-1000, chunk-1500
        for scale in (4.0, 16.0):  # 16: key blocks far below the running maximum
            name, shape = _attention_shape(i, scale, seed=900 + i)
            for v, configs in tile_configs.items():
                for cfg in configs:
                    tag = ",".join(f"{a}{b}" for a, b in cfg.items()) or "default"
                    rows.append(kernel_case("attention_tile_config", f"{name}-s{scale:g}-{v}-{tag}", shape, form=v,
                                            config=cfg, quick=i == 1 and scale == 4.0))
    for v in (v for v in _ATTEND_VARIANTS if v != "auto"):  # each kernel (auto picks one of them)
        rows.append(kernel_case("attention_positions", f"T2-at200-{v}", dict(n_head=8, n_kv=2, hd=128, positions=(200, 201),
                                                                      start=200, scale=4.0), form=v, quick=v == "pair"))
    for i, (name, n_head, n_kv, hd, positions, start, sinks, window) in enumerate(ATTENTION_OPTION_SHAPES):
        shape = dict(n_head=n_head, n_kv=n_kv, hd=hd, positions=positions, start=start, scale=4.0, sinks=sinks,
                     window=window, seed=700 + i)
        for v in ATTEND_FORMS:
            rows.append(kernel_case("attention_options", f"{name}-{v or 'default'}", shape, form=v,
                                    quick=i == 0 and v is None))
    for v in ATTEND_FORMS:
        rows.append(kernel_case("attention_options_chunks", f"3x70+1-w100-sinks-{v or 'default'}",
                                dict(n_layer=2, n_head=8, n_kv=2, hd=64, window=100, sinks=2.0,
                                     chunks=(range(0, 70), range(70, 140), range(140, 210), (210,))),
                                form=v, quick=v is None))
    for v in ATTEND_FORMS:
        rows.append(kernel_case("attention_chunks", f"2x70+1-{v or 'default'}",
                         dict(n_layer=2, n_head=8, n_kv=2, hd=128, chunks=(range(0, 70), range(70, 140), (140,))),
                         form=v, quick=v is None))
    for T, E_, K in [(1, 128, 8), (33, 128, 8), (37, 512, 10), (5, 64, 32)]:
        for ties in (False, True):
            rows.append(kernel_case("top_k", f"T{T}-E{E_}-K{K}-{'ties' if ties else 'spread'}", dict(T=T, E=E_, K=K, ties=ties),
                             quick=(T, ties) == (1, False)))
    for T in BENCH_TOKENS:
        rows.append(kernel_case("top_k", f"T{T}-E{E}-K{k}-spread-strata", dict(T=T, E=E, K=k, ties=False, check=64), timed=True))
    # rows of NaN probabilities (a NaN or an infinite logit): experts 0..K-1, never an id past E
    rows.append(kernel_case("top_k", "T9-E128-K8-nan", dict(T=9, E=128, K=8, ties=False, nan=True)))
    for T, E_, K, skew in [(1, 128, 8, False), (37, 128, 8, False), (1000, 512, 10, False), (4096, 512, 10, True),
                           (300, 64, 4, True)]:
        rows.append(kernel_case("routing_tables", f"T{T}-E{E_}-K{K}-{'skew' if skew else 'uniform'}",
                         dict(T=T, E=E_, K=K, skew=skew), quick=T == 1))
    for T in BENCH_TOKENS:
        rows.append(kernel_case("routing_tables", f"T{T}-E{E}-K{k}-uniform-strata", dict(T=T, E=E, K=k, skew=False),
                         timed=True))
    # device_plan's tile lists: uniform and skewed routing, a share of the experts streamed (no
    # offset), from one token (three lists) to the strata shape at 2K (two)
    for T, E_, K, skew, streamed in [(1, 128, 8, False, 0.0), (5, 512, 10, False, 0.0), (37, 128, 8, False, 0.3),
                                     (300, 64, 4, True, 0.5), (2048, 512, 10, True, 0.0),
                                     (2048, 512, 10, False, 0.0), (4096, 128, 8, False, 0.0)]:
        rows.append(kernel_case("routed_row_tiles", f"T{T}-E{E_}-K{K}-{'skew' if skew else 'uniform'}-s{streamed}",
                                dict(T=T, E=E_, K=K, skew=skew, streamed=streamed), quick=T == 1))
    for R, n in [(1, 640), (37, 768), (13, 100)]:
        rows.append(kernel_case("swiglu", f"R{R}-n{n}", dict(R=R, n=n), quick=R == 1))
    # gpt-oss's MoE pieces (docs/numerics.md sections 4, 6, 7): the router's bias and softmax over
    # the selected logits, the expert of each sorted row, the clamped SwiGLU with the gate/up
    # biases, the combine with the down bias
    for T, E_, K, ties, bias in [(1, 32, 4, False, True), (37, 32, 4, True, True), (300, 128, 8, False, False),
                                 (64, 128, 32, True, True), (4096, 32, 4, False, True)]:
        rows.append(kernel_case("top_k_selected", f"T{T}-E{E_}-K{K}-{'ties' if ties else 'spread'}-{'bias' if bias else 'plain'}",
                                dict(T=T, E=E_, K=K, ties=ties, bias=bias), quick=T == 1))
    rows.append(kernel_case("top_k_selected", "T9-E128-K8-nan", dict(T=9, E=128, K=8, ties=False, bias=True, nan=True)))
    for T, E_, K in [(1, 32, 4), (300, 32, 4), (1000, 512, 10)]:
        rows.append(kernel_case("row_experts", f"T{T}-E{E_}-K{K}", dict(T=T, E=E_, K=K), quick=T == 1))
    for R, n, bias in [(1, 640, True), (37, 2880, True), (13, 100, False), (40, 96, True)]:
        rows.append(kernel_case("swiglu_oai", f"R{R}-n{n}-{'bias' if bias else 'plain'}", dict(R=R, n=n, bias=bias),
                                quick=R == 1))
    for T, K, D_, E_, shared in [(1, 4, 2880, 32, False), (9, 4, 256, 32, False), (17, 10, 2560, 512, True),
                                 (5, 3, 102, 16, False), (300, 4, 2880, 32, False)]:
        for form in ("auto", "element"):
            rows.append(kernel_case("combine_bias", f"T{T}-K{K}-D{D_}-E{E_}-{'shared' if shared else 'routed'}-{form}",
                                    dict(T=T, K=K, D=D_, E=E_, shared=shared), form=form, quick=(T, form) == (9, "auto")))
    rows.append(kernel_case("sigmoid", "n1000", dict(n=1000), quick=True))
    for T, K, D_, E_ in [(1, 8, 256, 64), (9, 8, 256, 64), (17, 10, 2560, 512), (5, 3, 102, 16), (300, 10, 2560, 512)]:
        for shared in (False, True):
            for form in ("auto", "element"):
                rows.append(kernel_case("combine", f"T{T}-K{K}-D{D_}-E{E_}-{'shared' if shared else 'routed'}-{form}",
                                 dict(T=T, K=K, D=D_, E=E_, shared=shared), form=form, quick=(T, shared) == (9, True)))
    rows.append(kernel_case("combine_refusal", "bad-form-T3-and-T0", dict(D=8, K=2), quick=True))
    for qt in _EMBED_TYPES:
        for n_embd, T in [(256, 1), (256, 19), (2560, 7)]:
            rows.append(kernel_case("embed", f"{qt.name}-n{n_embd}-T{T}", dict(n_embd=n_embd, T=T, n_vocab=300),
                                    weight_type=qt.name, quick=T == 1))
    rows.append(kernel_case("embed_refusal", "no-kernel-type-n288-id4", dict(n_embd=256, n_vocab=4, bad_n=288), weight_type="Q4_K",
                            quick=True))
    for n, gu, d, tail, offsets in [(1, 4096, 2048, 1024, "aligned"), (5, 2720 * 3, 1360 * 5, 4096, "aligned"),
                                    (16, 1000, 777, 513, "mixed"), (16, 34 * 64, 34 * 40, 2048, "mixed")]:
        rows.append(kernel_case("gather", f"n{n}-gu{gu}-d{d}-tail{tail}-{offsets}",
                         dict(n=n, gu_bytes=gu, d_bytes=d, tail=tail, offsets=offsets), quick=n == 1))
    # a strata IQ2_XS pack's group: 16 experts of [gate | up | down], down Q8_0 (the GPU suite's)
    gu, d = _weights("IQ2_XS", _STRATA.n_ff_exp, D), _weights("Q8_0", D, _STRATA.n_ff_exp)
    rows.append(kernel_case("gather", f"n{_MMQ_GROUP}-strata-IQ2_XS", dict(n=_MMQ_GROUP, gu_bytes=gu, d_bytes=d,
                                                                    tail=_GROUP_TAIL, offsets="aligned"), timed=True))
    rows.append(kernel_case("gather_count", "n16-GPUArray-blobs", dict(n=16, gu_bytes=512, d_bytes=512, tail=64), quick=True))
    return rows


def _float_dense_rows() -> list[KernelCase]:
    """verify/test_float_dense_cuda.py: float_dense.cu's forms on F32, F16 and BF16 weights."""
    rows = []
    for T, N, K in [(1, 16, 256), (3, 1, 256), (7, 5, 77), (130, 64, 512), (33, 128, 2048), (5, 3, 1), (70, 17, 300),
                    (301, 512, 2560), (64, 1, 640), (40, 33, 31)]:
        for t in ("F32", "F16", "BF16"):
            for v in ("auto", "warp", "tile"):
                rows.append(kernel_case("float_dense", f"T{T}-N{N}-K{K}-{t}-{v}", dict(T=T, N=N, K=K), weight_type=t, form=v,
                                 quick=(T, N, K, t) == (1, 16, 256, "F32")))
    for T in BENCH_TOKENS:  # the router product (512 x 2560; the strata pack's router is BF16)
        for t in ("F32", "BF16"):
            for v in ("warp", "tile"):
                rows.append(kernel_case("float_dense", f"T{T}-N{_STRATA.n_expert}-K{_STRATA.n_embd}-{t}-{v}-router",
                                 dict(T=T, N=_STRATA.n_expert, K=_STRATA.n_embd, check=32), weight_type=t, form=v,
                                 timed=True))
    for t in ("F32", "BF16"):
        for v in ("warp", "tile"):
            rows.append(kernel_case("float_dense_strided", f"T19-N10-K96-ldx100-ldo13-{t}-{v}",
                             dict(T=19, N=10, K=96, ldx=100, ldo=13), weight_type=t, form=v, quick=t == "F32"))
    rows.append(kernel_case("float_dense_geometry", "tile", {}, form="tile", quick=True))
    return rows


def _float_rows_rows() -> list[KernelCase]:
    """verify/test_float_rows_cuda.py: float_rows.cu, the MoE input of float gate/up experts,
    gathered by src or scattered by slot (T tokens of K values routed to k of E experts)."""
    rows = []
    for T, K, E, k in [(1, 256, 16, 4), (37, 256, 16, 4), (23, 2560, 512, 10), (9, 200, 5, 2), (130, 96, 8, 3)]:
        for form in ("gather", "scatter"):
            rows.append(kernel_case("float_rows", f"T{T}-K{K}-E{E}-k{k}-{form}", dict(T=T, K=K, E=E, k=k), form=form,
                                    quick=T == 1))
    return rows


def _codebook_rows() -> list[KernelCase]:
    """verify/test_kernels_cuda.py, the codebook types' MMQ rows beyond the tiny and tile-list
    rows every type has: the strata gate/up and (a block dividing 640) down shapes, K a
    multiple of the block but not of 128 with N not of 128, ~150 rows an expert (the large-tile
    configuration), IQ4_XS's largest block sums (16,516,096, 2^24 less 261,120), the dense and
    pair forms, and the layer rows the GPU suites time (gate/up; down where 640 takes the type)."""
    rows = []
    E, k, D, F = _STRATA.n_expert, _STRATA.n_expert_used, _STRATA.n_embd, _STRATA.n_ff_exp
    downs = [t for t in CODEBOOK_TYPES if F % _quants.block_size(_QT[t])[0] == 0]
    for t in CODEBOOK_TYPES:
        vpb = _quants.block_size(_QT[t])[0]
        rows.append(kernel_case("mmq", f"strata-gate_up-1280x2560-{t}", dict(N=1280, K=2560, rows=(0, 1, 37, 161, 0, 12),
                                                                     tile_rows=(128, 64), seed=3), weight_type=t))
        if t in downs:
            rows.append(kernel_case("mmq", f"strata-down-2560x640-{t}", dict(N=2560, K=640, rows=(1, 0, 50, 129, 7), seed=4),
                                    weight_type=t))
        if vpb < 128:  # three blocks: a partial last chunk (MXFP4's rows of 51 bytes start at odd bytes)
            rows.append(kernel_case("mmq", f"odd_k-200x{3 * vpb}-{t}", dict(N=200, K=3 * vpb, rows=(3, 17, 0, 33), seed=5),
                                    weight_type=t))
        rows.append(kernel_case("mmq", f"many_rows-320x512-{t}", dict(N=320, K=512, rows=(200, 130, 0, 77, 193),
                                                                   tile_rows=(128, 96), seed=8), weight_type=t))
        rows.append(kernel_case("mmq_dense", f"384x512-R300-{t}", dict(N=384, K=512, R=300, seed=7), weight_type=t))
        rows.append(kernel_case("mmq_pair", f"384x512-{t}", dict(N=384, K=512, rows=(7, 0, 1, 150, 33)), weight_type=t,
                                form="pair"))
        for proj, N, K, mats in (("gate_up", F, D, 2), ("down", D, F, 1)):
            if proj == "down" and t not in downs:
                continue
            for T in BENCH_TOKENS:
                rows.append(kernel_case("mmq_layer", f"{proj}-{t}-T{T}", dict(tokens=T, N=N, K=K, mats=mats, experts=E,
                                                                             top_k=k, check=2),
                                        weight_type=t, form="group", timed=True))
    rows.append(kernel_case("mmq_extreme", "64x512-IQ4_XS", dict(N=64, K=512, rows=(40, 0, 24), tile_rows=(128, 16),
                                                               seed=11, floor=2 ** 23 + 2 ** 22 + 2 ** 21 + 2 ** 20),
                            weight_type="IQ4_XS"))
    return rows


KERNEL_CASES: tuple[KernelCase, ...] = tuple(_kernels_rows() + _codebook_rows() + _model_rows() + _float_dense_rows()
                                             + _float_rows_rows())


def kernel_rows(op: str, **where) -> list[KernelCase]:
    """The rows of one op (optionally only those whose attributes equal `where`)."""
    return [c for c in KERNEL_CASES if c.op == op and all(getattr(c, k) == v for k, v in where.items())]


def params(rows) -> list:
    """pytest.param of each row, its id the row's, marked `quick` where the row is: the one way
    a kernel test is parametrized (`@pytest.mark.parametrize("case", params(kernel_rows(op)))`)."""
    import pytest

    return [pytest.param(c, id=c.id, marks=[pytest.mark.quick] if c.quick else []) for c in rows]


def mmq_configs() -> list:
    """The MMQ tile configurations every MMQ row runs under: None (the default), each automatic
    configuration, and any of STRATA_MMQ_TEST_CONFIGS
    (JSON objects separated by ';')."""
    import json
    import os

    from strata_prefill.fast.cuda import products

    return [None] + [c for _, c in products.AUTO_CONFIGS] + [
        json.loads(c) for c in os.environ.get("STRATA_MMQ_TEST_CONFIGS", "").split(";") if c.strip()]


def ahead_modules(quick: bool = False) -> list[tuple[str, dict]]:
    """The (kernel module, defines) pairs the kernel rows (the quick tier's only, when `quick`)
    load besides the fast path's own (fast/cuda/build_list.py:default_modules): the MMQ
    configurations and the pair attention configuration rows', so that the gate compiles them ahead
    of the rows that wait for them."""
    from strata_prefill.fast.cuda import attention, products

    def rows(op):
        return [c for c in kernel_rows(op) if c.quick or not quick]

    out = []
    if any(c.op.startswith("mmq") and (c.quick or not quick) for c in KERNEL_CASES):  # MMQ rows sweep them
        out += [m for c in mmq_configs() if c is not None for m in products.mmq_modules(products._with_extra(c))]
    for c in rows("attention_tile_config"):
        out.append((attention.ATTEND_TILE_MODULES[c.form], {**attention.ATTEND_TILE_CONFIGS[c.form], **c.config}))
    return out


# ============================================================================ parity cases

# The switch design of the resident rows, the same on both backends (no kernel form is a switch
# today: fast/options.py): names, then arms (the defaults first; every pair of switches meets
# all four value pairs; tests/test_switch_designs.py).
SWITCH_NAMES = ("group_gather", "quant_gather", "overlap_plan", "fuse_group", "in_place")
SWITCH_DESIGN = [(1, 0, 1, 1, 1), (0, 0, 0, 0, 0), (0, 1, 0, 1, 0), (0, 1, 1, 0, 0), (1, 1, 0, 0, 0), (0, 1, 0, 0, 1)]
# Streamed arms: (group_gather, quant_gather, copy_coalesce), every combination; rings and caches
# cycle with the arm so that each value meets several of the others.
STREAM_SWITCHES = [(1, 0, 0), (1, 0, 1), (1, 1, 0), (1, 1, 1), (0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1)]
RINGS = [8, 16, 96, 128, 384]
# Whole-model packs that only the GPU runs at length: a 2-layer `strata` pack (512 experts,
# top-10, a shared expert).
STRATA2 = ("strata", "IQ2_XS", (("layers", 2),))
EXPERT_TYPES = MMQ_TYPES  # quantized experts: the types the cuda backend multiplies (SPREAD_TYPES get every arm)
#: float experts: the float product on unquantized rows (docs/numerics.md section 6)
FLOAT_EXPERT_TYPES = ("F16", "BF16", "F32")
# Prompts up to this many tokens record every op (dump level "ops"), so that a failure names the
# first op that went wrong; longer ones the layer level (per-pair products run to hundreds of MB).
OPS_DUMP_MAX_TOKENS = 256


@dataclass(frozen=True)
class ParityCase:
    """One fast-path run compared byte for byte with a base run of the same prompt: the
    reference's (kept in the reference cache), or, where NumPy is too slow (32K), the fast
    path's own all-resident default run."""

    name: str  # the pytest id
    backend: str  # "cuda" or "sim"
    preset: str
    expert_type: str
    tokens: int
    chunk: object = "auto"
    arm: tuple = ()  # (FastEngine keyword, value) pairs: switches, caches, ring, stream threshold
    pack_options: tuple = ()  # (make_pack keyword, value) pairs
    prompt: str = "uniform"  # "uniform": random ids; "few": three ids, so streamed chunks skip experts
    seed: int | None = None  # the prompt's seed (None: the token count)
    greedy: int = 2
    records: bool = True  # compare the record file (off at length: its buffers run to gigabytes)
    dump_level: str | None = None  # None: "ops" up to OPS_DUMP_MAX_TOKENS tokens, else "layer"
    base: str = "reference"  # or "resident"
    sim_seed: int | None = None  # the sim's schedule seed (its streams' interleaving)
    stress: bool = False  # run under STRATA_PREFILL_STRESS (the cuda backend's forced interleavings)
    open_skip: bool = False  # the routing must skip ring entries inside open groups
    quick: bool = False

    @property
    def options(self) -> dict:
        return dict(self.arm)

    @property
    def level(self) -> str | None:
        if not self.records:
            return None
        return self.dump_level or ("ops" if self.tokens <= OPS_DUMP_MAX_TOKENS else "layer")

    @property
    def case_key(self) -> str:
        """The (pack, prompt) this row runs: rows sharing it share one reference run."""
        pack = "-".join([self.preset, self.expert_type, *(f"{k}{v}" for k, v in self.pack_options)])
        return f"{pack}/{self.prompt}{self.tokens}s{self.seed if self.seed is not None else self.tokens}"

    def prompt_ids(self, n_vocab: int):
        """The row's prompt: seeded random ids, or ("few") three ids, so that the first layers
        route the same few experts all chunk long."""
        import numpy as np

        rng = np.random.default_rng(self.tokens if self.seed is None else self.seed)
        if self.prompt == "few":
            return rng.choice(rng.integers(0, n_vocab, 3), self.tokens).astype(np.int32)
        return rng.integers(0, n_vocab, self.tokens).astype(np.int32)

    @property
    def cost(self) -> float:
        """A rough relative cost, so that the longest rows start first."""
        size = {"tiny": 1, "small": 4, "strata": 60, GPT_OSS_TINY: 2}[self.preset]
        return size * (self.tokens + 200) * (2 if self.base == "resident" else 1)


def _arm_name(arm: dict) -> str:
    short = {"group_gather": "gg", "quant_gather": "qg", "overlap_plan": "op", "fuse_group": "fg",
             "in_place": "ip", "copy_coalesce": "co", "expert_cache": "cache", "ring": "ring",
             "stream_min": "smin", "group_size": "gs", "window": "win", "ring_in_place": "rip",
             "stage_head": "sh", "head_predict": "hp", "device_plan": "dp", "choose_ahead": "ca"}
    return ",".join(f"{short.get(k, k)}{v}" for k, v in arm.items()) or "default"


def settled_arm(backend: str, n_layer: int, n_expert: int, arm: dict) -> dict:
    """An arm as the switch table's one rule takes it on a pack of n_layer x n_expert experts
    (strata_prefill.fast.options.settle): a switch that would do nothing there left out, a value past what the
    pack can use set to the most; other keywords (group_size, sim_options) kept. The cuda
    backend's `expert_cache auto` is taken to hold every expert (the gate's GPUs hold each test
    pack whole), so a switch that needs streaming is kept only where the arm sizes the cache
    below the pack."""
    from strata_prefill.fast import options

    switches = {k: v for k, v in arm.items() if k in options.BY_KEYWORD}
    total, cache = n_layer * n_expert, switches.get("expert_cache", options.AUTO)
    slots = total if cache in (options.AUTO, None) else min(int(cache), total)
    facts = options.placed_facts("fast", backend, slots, total, f"expert_cache {cache}", n_layer, n_expert)
    kept = options.settle(switches, facts)
    return {k: kept[k] if k in options.BY_KEYWORD else v for k, v in arm.items()
            if k in kept or k not in options.BY_KEYWORD}


def _settled(backend: str, preset: str, opts: tuple, arm: dict) -> dict:
    """A row's arm, settled on its pack (settled_arm)."""
    from strata_prefill.formats.config import PRESETS

    layers = dict(opts).get("layers") or PRESETS[preset].n_layer
    return settled_arm(backend, layers, PRESETS[preset].n_expert, arm)


def _row(backend, preset, etype, tokens, chunk="auto", arm=None, **kw) -> ParityCase:
    opts = kw.get("pack_options", ())
    arm = _settled(backend, preset, opts, {k: v for k, v in (arm or {}).items() if v is not None})
    bits = [backend, preset, etype, *(f"{k}{v}" for k, v in opts), f"T{tokens}", f"c{chunk}", _arm_name(arm)]
    for flag in ("prompt", "stress", "base"):
        if flag in kw and kw[flag] not in ("uniform", False, "reference"):
            bits.append(str(kw[flag]) if flag != "stress" else "stress")
    if kw.get("sim_seed") is not None:
        bits.append(f"seed{kw['sim_seed']}")
    return ParityCase("-".join(bits), backend, preset, etype, tokens, chunk, tuple(arm.items()), **kw)


#: a llama-quantize mix's expert type (the pack's expert_type of its parity rows)
_MIX_BASE = {mix: base.name for mix, base in _MIXES.items()}
#: the packs every mix's parity rows are made on (formats/mixes.py: tiny's shared expert and 256-value
#: rows, small's 384-value expert rows that fall back)
_MIX_PRESETS = ("tiny", "small")


def _all_experts(preset: str, layers: int | None = None) -> int:
    from strata_prefill.formats.config import PRESETS

    cfg = PRESETS[preset]
    return (layers or cfg.n_layer) * cfg.n_expert


def _codebook_parity(backend: str) -> list[ParityCase]:
    """The codebook types' parity rows (CODEBOOK_TYPES), the same on both backends (their reference
    runs shared): on the tiny pack 63 tokens with the defaults (IQ4_NL's in the quick tier) and
    in the design's second arm; 130 tokens streamed from the host tier with a third of the
    experts cached, once multiplied where they lie (in_place, ring_in_place 1) and once gathered
    (0), the streamed switches rotating over the types; the small pack at 600 tokens (64 experts,
    top-8; IQ4_XS's down rows of 384 fall back to Q8_0); and a mixed row: the type as every dense
    matrix's (attention, shared expert, output; the embedding decoded on the host) beside the
    next type's experts. The cuda rows add 600 tokens on the tiny pack."""
    rows = []
    tiny_all = _all_experts("tiny")
    for i, etype in enumerate(CODEBOOK_TYPES):
        rows.append(_row(backend, "tiny", etype, 63, 64, seed=21, quick=i == 0))
        rows.append(_row(backend, "tiny", etype, 63, 64, dict(zip(SWITCH_NAMES, SWITCH_DESIGN[1])), seed=21))
        for where in (1, 0):
            gg, qg, co = STREAM_SWITCHES[(2 * i + where) % len(STREAM_SWITCHES)]
            arm = dict(group_gather=gg, quant_gather=qg, copy_coalesce=co, expert_cache=tiny_all // 3,
                       ring=(8, 16)[(i + where) % 2], stream_min=64, in_place=where, ring_in_place=where)
            rows.append(_row(backend, "tiny", etype, 130, 64, arm, seed=21, sim_seed=i if backend == "sim" else None))
        rows.append(_row(backend, "small", etype, 600, "auto", seed=24))
        nxt = CODEBOOK_TYPES[(i + 1) % len(CODEBOOK_TYPES)]
        rows.append(_row(backend, "tiny", nxt, 70, 64, seed=22, pack_options=(("dense_type", etype),)))
        if backend == "cuda":
            rows.append(_row(backend, "tiny", etype, 600, "auto"))
    return rows


#: gpt-oss's CPU-tier pack (formats/config.py: 2 layers, 8 experts, top-4, a window of 16 keys on
#: block 0, sinks, q/k/v/o, router and expert biases, swiglu_oai, YaRN) and its experts' type as
#: released and as make-pack writes it by default
GPT_OSS_TINY, GPT_OSS_EXPERTS = "gpt-oss-tiny", "MXFP4"


def _gpt_oss_parity(backend: str) -> list[ParityCase]:
    """gpt-oss's parity rows, the same on both backends (their reference runs shared): every
    chunk crosses the sliding window's edge (16 keys; chunks of 64, 37 and 1). Resident: the
    defaults at 63 (the quick tier) and 200 tokens, every other arm of the switch design,
    chunks of 37 and 1; streamed from the host tier with no cache and a third of the experts,
    rings of 8, 16 and 96, streamed and staged chunks, every streamed arm, in the ring and
    gathered; layer-major windows (streamed, staged, auto); a staged head, predicted from the
    biased router; stream_min auto; a prompt of three ids; float experts (F16, resident and
    streamed) and float dense matrices (the q/k/v/o biases after float products); experts of
    another MMQ type (Q8_0, IQ2_XS)."""
    rows, n_all, et = [], _all_experts(GPT_OSS_TINY), GPT_OSS_EXPERTS
    seed = dict(sim_seed=0) if backend == "sim" else {}

    def row(etype, tokens, chunk, arm=None, **kw):
        rows.append(_row(backend, GPT_OSS_TINY, etype, tokens, chunk, arm, **{"seed": 51, **kw}))

    row(et, 63, 64, quick=True)
    row(et, 200, 64)
    for i in range(1, len(SWITCH_DESIGN)):
        row(et, 130, 64, dict(zip(SWITCH_NAMES, SWITCH_DESIGN[i])))
    row(et, 150, 37)
    row(et, 40, 1)
    for i, (gg, qg, co) in enumerate(STREAM_SWITCHES):
        arm = dict(group_gather=gg, quant_gather=qg, copy_coalesce=co, expert_cache=(0, n_all // 3)[i % 2],
                   ring=(8, 16, 96)[i % 3], stream_min=(64, 1024)[(i // 2) % 2], in_place=1 - (i // 4) % 2,
                   ring_in_place=1 - (i // 4) % 2)
        row(et, 130, 64, arm, quick=i == 0, **({"sim_seed": i} if backend == "sim" else {}))
    for i, (window, stream_min, gg) in enumerate(((128, 64, 1), (96, 1024, 0), ("auto", 64, 1))):
        arm = dict(window=window, expert_cache=(0, n_all // 3)[i % 2], ring=(8, 16)[gg], stream_min=stream_min,
                   group_gather=gg)
        row(et, 200, 32, arm, quick=i == 0, **({"sim_seed": i} if backend == "sim" else {}))
    row(et, 130, 64, dict(expert_cache=n_all // 3, ring=8, stream_min=1024, stage_head=3, head_predict=1), **seed)
    row(et, 130, 64, dict(expert_cache=0, ring=8, stream_min="auto"), **seed)
    row(et, 200, 64, dict(expert_cache=n_all // 3, ring=8, stream_min=16), prompt="few", **seed)
    row("F16", 63, 64)
    row("F16", 130, 64, dict(expert_cache=n_all // 3, ring=8, stream_min=64), **seed)
    row(et, 70, 64, pack_options=(("dense_type", "F16"),))
    for etype in ("Q8_0", "IQ2_XS"):
        row(etype, 130, 64)
    if backend == "cuda":  # the context's length, and the streamed walk under the stress mode
        row(et, 250, "auto")
        row(et, 250, 128, dict(expert_cache=n_all // 3, ring=8))
        row(et, 130, 64, dict(expert_cache=0, ring=8, stream_min=64), stress=True)
    return rows


def _cuda_rows() -> list[ParityCase]:
    rows = []
    defaults = dict(zip(SWITCH_NAMES, SWITCH_DESIGN[0]))

    def arm_of(i):  # arm i of the design, as the switches that differ from the defaults
        return {k: v for k, v in zip(SWITCH_NAMES, SWITCH_DESIGN[i]) if defaults[k] != v}

    # Resident experts: every spread type at every length with the defaults; each other arm of
    # the design at two lengths per type (rotating, so every arm meets every length).
    lengths = {"tiny": [(1, "auto"), (63, "auto"), (128, "auto"), (600, "auto"), (1030, "auto"), (2099, "auto"),
                        (2099, 700)],
               "small": [(1, "auto"), (63, "auto"), (600, "auto"), (2099, "auto"), (2099, 700)]}
    for preset, spread in lengths.items():
        for ti, etype in enumerate(SPREAD_TYPES):
            for n, chunk in spread:
                rows.append(_row("cuda", preset, etype, n, chunk, quick=preset == "tiny" and n == 63))
            for i in range(1, len(SWITCH_DESIGN)):
                for j in (i + ti, i + ti + 3):
                    n, chunk = spread[j % len(spread)]
                    rows.append(_row("cuda", preset, etype, n, chunk, arm_of(i)))
    # Every switch's earlier form once in the quick tier (tiny Q8_0, 130 tokens).
    for k in SWITCH_NAMES:
        rows.append(_row("cuda", "tiny", "Q8_0", 130, 64, {k: 1 - defaults[k]}, quick=True))
    # Float routers and float attention/shared-expert matrices (16-bit ones widened to F32 at load).
    for router, dense in (("BF16", "F16"), ("F32", "F16"), ("BF16", "Q8_0")):
        rows.append(_row("cuda", "tiny", "Q4_1", 70, 64, seed=3, pack_options=(("router_type", router), ("dense_type", dense)),
                         quick=(router, dense) == ("BF16", "F16")))
    # YaRN rope scaling (only the host-built RoPE table changes, docs/numerics.md): a prompt
    # past the original context.
    from strata_prefill.formats.config import RopeScaling

    rows.append(_row("cuda", "tiny", "Q8_0", 600, "auto", seed=5, quick=True,
                     pack_options=(("rope_scaling", RopeScaling("yarn", 4.0, 64)),)))
    # Experts streamed from the host tier: caches of none, a third and all; rings of 8 to 384;
    # streamed and staged chunks; every streamed arm.
    for preset, etype in (("tiny", "Q8_0"), ("tiny", "IQ2_XS"), ("tiny", "Q2_K"), ("tiny", "Q4_1"),
                          ("small", "IQ2_XS"), ("small", "Q2_K")):
        n_all = _all_experts(preset)
        for n, chunk, stream_min in ((130, 64, 64), (1100, "auto", None)):
            if preset == "small" and n == 130:
                continue
            for i, (gg, qg, co) in enumerate(STREAM_SWITCHES):
                arm = dict(group_gather=gg, quant_gather=qg, copy_coalesce=co, expert_cache=(0, n_all // 3, n_all)[i % 3],
                           ring=RINGS[i % len(RINGS)], stream_min=stream_min, in_place=1 - (i // 3) % 2)
                rows.append(_row("cuda", preset, etype, n, chunk, arm,
                                 quick=(preset, etype, n, i) in (("tiny", "Q8_0", 130, 0), ("tiny", "Q8_0", 130, 1))))
    # Streamed chunks whose routing skips ring entries inside open groups: a prompt of three ids.
    # Group mode holds a run of the ring across skips; per-expert mode has open groups only in the
    # gathered walk (a run of the in-ring walk holds one expert), so it takes that walk.
    for preset, etype in (("tiny", "Q8_0"), ("tiny", "IQ2_XS"), ("small", "Q2_K")):
        n_all = _all_experts(preset)
        for gg in (1, 0):
            for ring in (8, 16):
                arm = dict(group_gather=gg, expert_cache=n_all // 3, ring=ring, stream_min=16, ring_in_place=gg)
                rows.append(_row("cuda", preset, etype, 200, 64, arm, prompt="few", open_skip=True,
                                 quick=(preset, etype, gg, ring) == ("tiny", "Q8_0", 1, 8)))
    # Long prompts on the strata pack: 8K against the reference (resident arms of the design and
    # streamed arms, a third of the experts cached); 32K against the all-resident default run.
    preset, etype, opts = STRATA2
    n_all = _all_experts(preset, 2)
    for i in range(len(SWITCH_DESIGN)):
        rows.append(_row("cuda", preset, etype, 8192, "auto", {**arm_of(i), "expert_cache": n_all}, greedy=1,
                         records=False, pack_options=opts))
    for i, (gg, qg, co) in enumerate(STREAM_SWITCHES):
        arm = dict(group_gather=gg, quant_gather=qg, copy_coalesce=co, expert_cache=n_all // 3,
                   ring=(None, 96, 8)[i % 3], in_place=1 - (i // 3) % 2)
        rows.append(_row("cuda", preset, etype, 8192, "auto", arm, greedy=1, records=False, pack_options=opts))
    for arm in ({"expert_cache": n_all // 3}, {"expert_cache": n_all // 3, "ring": 8, "copy_coalesce": 1, "group_gather": 0},
                {**arm_of(1), "expert_cache": n_all}):
        rows.append(_row("cuda", preset, etype, 32768, "auto", arm, greedy=1, records=False, base="resident",
                         pack_options=opts))
    # Float experts: every length with the defaults, every other arm of the design twice, the
    # small pack (64 experts, top-8); streamed from the host tier (no cache and a third, rings
    # of 8 and 16, streamed and staged chunks, every streamed arm), and a routing that skips
    # ring entries inside open groups.
    spread = lengths["tiny"]
    for ti, etype in enumerate(FLOAT_EXPERT_TYPES):
        for n, chunk in spread:
            rows.append(_row("cuda", "tiny", etype, n, chunk, quick=n == 63))
        for i in range(1, len(SWITCH_DESIGN)):
            for j in (i + ti, i + ti + 3):
                n, chunk = spread[j % len(spread)]
                rows.append(_row("cuda", "tiny", etype, n, chunk, arm_of(i)))
        rows.append(_row("cuda", "small", etype, 600, "auto"))
        n_all = _all_experts("tiny")
        for i, (gg, qg, co) in enumerate(STREAM_SWITCHES):
            n, chunk, stream_min = ((130, 64, 64), (1100, "auto", None))[i % 2]
            arm = dict(group_gather=gg, quant_gather=qg, copy_coalesce=co, expert_cache=(0, n_all // 3)[(i // 2) % 2],
                       ring=(8, 16, 96)[i % 3], stream_min=stream_min, in_place=1 - (i // 4) % 2)
            rows.append(_row("cuda", "tiny", etype, n, chunk, arm, quick=(etype, i) == ("BF16", 0)))
        rows.append(_row("cuda", "tiny", etype, 200, 64, dict(expert_cache=n_all // 3, ring=8, stream_min=16),
                         prompt="few", open_skip=True))
    # Under the stress mode: the streaming and overlap cases once.
    for preset, etype, n, chunk, arm in (
            ("tiny", "Q8_0", 130, 64, dict(expert_cache=0, ring=8, stream_min=64)),
            ("tiny", "Q8_0", 130, 64, dict(expert_cache=0, ring=8, stream_min=64, group_gather=0, copy_coalesce=1)),
            ("tiny", "Q2_K", 130, 64, dict(expert_cache=11, ring=16, stream_min=64, overlap_plan=0)),
            ("tiny", "IQ2_XS", 600, "auto", dict(overlap_plan=1)),
            ("tiny", "IQ2_XS", 600, "auto", dict(overlap_plan=0)),
            ("small", "IQ2_XS", 1100, "auto", dict(expert_cache=_all_experts("small") // 3, ring=16))):
        rows.append(_row("cuda", preset, etype, n, chunk, arm, stress=True))
    rows.append(_row("cuda", "tiny", "Q8_0", 200, 64, dict(expert_cache=10, ring=8, stream_min=16), prompt="few",
                     open_skip=True, stress=True))
    # Layer-major windows, streamed: windows that stream where their chunks stage (a last window
    # of fewer chunks), windows and chunks both streamed, per-expert gathers, auto.
    for preset, etype, n, chunk, arm in (
            ("tiny", "Q8_0", 1100, 256, dict(window=1024, expert_cache=_all_experts("tiny") // 3, ring=16)),
            ("tiny", "IQ2_XS", 600, 128, dict(window=384, expert_cache=0, ring=8, stream_min=64, group_gather=0)),
            ("small", "IQ2_XS", 1100, 256, dict(window="auto", expert_cache=_all_experts("small") // 3, ring=16)),
            ("small", "Q2_K", 2099, 700, dict(window=1400, expert_cache=_all_experts("small") // 3, stream_min=700,
                                              copy_coalesce=1))):
        rows.append(_row("cuda", preset, etype, n, chunk, arm, quick=etype == "IQ2_XS" and preset == "tiny"))
    # The mixes' types (MIX_TYPES), a few rows each on the tiny pack: 63 tokens (Q4_K's in the
    # quick tier) and 600 with the defaults, 130 in a streamed arm (the arms rotate over the
    # types), and for the grid types (MIX_GRID_TYPES) one more: the other resident walk, streamed
    # experts gathered; then each llama-quantize mix (formats/mixes.py) on both small packs. The 63- and
    # 130-token prompts and the mixes' are the sim rows' (seeds 21 and 23): their reference runs
    # are shared.
    tiny_all = _all_experts("tiny")
    for i, etype in enumerate(MIX_TYPES):
        rows.append(_row("cuda", "tiny", etype, 63, "auto", seed=21, quick=etype == "Q4_K"))
        rows.append(_row("cuda", "tiny", etype, 600, "auto"))
        gg, qg, co = STREAM_SWITCHES[i % len(STREAM_SWITCHES)]
        arm = dict(group_gather=gg, quant_gather=qg, copy_coalesce=co, expert_cache=(0, tiny_all // 3)[i % 2],
                   ring=RINGS[i % len(RINGS)], stream_min=64, in_place=1 - (i // 2) % 2)
        rows.append(_row("cuda", "tiny", etype, 130, 64, arm, seed=21))
        if etype in MIX_GRID_TYPES:  # the grid types: the other resident walk too, streamed experts gathered
            rows.append(_row("cuda", "tiny", etype, 130, 64, dict(group_gather=1 - gg, expert_cache=tiny_all // 3, ring=16,
                                                                  stream_min=64, in_place=1 - arm["in_place"],
                                                                  ring_in_place=0), seed=21))
    for preset in _MIX_PRESETS:
        for mix in _MIXES:
            rows.append(_row("cuda", preset, _MIX_BASE[mix], 130, 64, seed=23, pack_options=(("mix", mix),)))
    rows += _codebook_parity("cuda")
    # ---- ring_in_place 0 (issue 26, item 2): streamed experts gathered into the group buffers --
    # The default multiplies them in their ring slots (every streamed row above takes that walk);
    # these rows keep the gathers' walk covered: streamed and staged chunks, rings of 8 to 384,
    # caches of none and a third, group and per-expert gathers, skips inside groups, a window,
    # float experts, and the 2-layer strata pack at 8K tokens with a third cached. Arm name: rip0.
    tiny_all, small_all, strata_all = _all_experts("tiny"), _all_experts("small"), _all_experts(STRATA2[0], 2)
    for preset, etype, n, chunk, arm, kw in (
            ("tiny", "Q8_0", 130, 64, dict(expert_cache=0, ring=8, stream_min=64), dict(quick=True)),
            ("tiny", "IQ2_XS", 130, 64, dict(expert_cache=tiny_all // 3, ring=16, stream_min=64, group_gather=0), {}),
            ("tiny", "Q2_K", 130, 64, dict(expert_cache=tiny_all // 3, ring=16, copy_coalesce=1), {}),
            ("tiny", "Q4_1", 1100, "auto", dict(expert_cache=tiny_all // 3, ring=16), {}),
            ("small", "IQ2_XS", 1100, "auto", dict(expert_cache=small_all // 3, ring=96), {}),
            ("small", "Q2_K", 1100, "auto", dict(expert_cache=0, ring=8, group_gather=0), {}),
            ("tiny", "Q8_0", 200, 64, dict(expert_cache=tiny_all // 3, ring=8, stream_min=16),
             dict(prompt="few", open_skip=True)),
            ("tiny", "IQ2_XS", 600, 128, dict(window=384, expert_cache=0, ring=16, stream_min=64), {}),
            ("tiny", "F16", 130, 64, dict(expert_cache=tiny_all // 3, ring=8, stream_min=64), {}),
            ("tiny", "Q8_0", 130, 64, dict(expert_cache=0, ring=8, stream_min=64), dict(stress=True)),
            ("strata", "IQ2_XS", 8192, "auto", dict(expert_cache=strata_all // 3),
             dict(greedy=1, records=False, pack_options=STRATA2[2]))):
        rows.append(_row("cuda", preset, etype, n, chunk, {**arm, "ring_in_place": 0}, **kw))
    # ---- stream_min auto (issue 26, item 4): each layer's walk chosen by coverage ----
    # The default (rows without stream_min take it too; rows naming a number keep the threshold).
    # The tiny pack's chunks of 64: the first chunk stages on the token prior, later chunks stream
    # on the last chunk's routing, the last chunk and greedy steps stage; group and per-expert
    # mode, one a prompt of three ids; the 2-layer strata pack with a third cached at 254 tokens
    # (staged on the prior, its greedy step on the measure). Arm name: sminauto.
    tiny_all, strata_all = _all_experts("tiny"), _all_experts(STRATA2[0], 2)
    for preset, etype, n, chunk, arm, kw in (
            ("tiny", "Q8_0", 130, 64, dict(expert_cache=0, ring=8), dict(quick=True)),
            ("tiny", "IQ2_XS", 200, 64, dict(expert_cache=tiny_all // 3, ring=16, group_gather=0),
             dict(prompt="few")),
            ("strata", "IQ2_XS", 254, "auto", dict(expert_cache=strata_all // 3),
             dict(greedy=2, records=False, pack_options=STRATA2[2]))):
        rows.append(_row("cuda", preset, etype, n, chunk, {**arm, "stream_min": "auto"}, **kw))
    # ---- stage_head (issue 26, item 3): a staged layer's first experts copied before its routing --
    # Staged chunks with heads of none, a few and more than a layer streams (auto is every row's
    # default above), group and per-expert mode, the gathered walk, the 2-layer strata pack at
    # 254 tokens with a third cached (auto: a head of part of each layer). Arm name: sh.
    for preset, etype, n, chunk, arm, kw in (
            ("tiny", "Q8_0", 130, 64, dict(expert_cache=tiny_all // 3, ring=8, stream_min=1024, stage_head=0),
             dict(quick=True)),
            ("tiny", "IQ2_XS", 130, 64, dict(expert_cache=0, ring=8, stream_min=1024, stage_head=3), {}),
            ("tiny", "Q2_K", 200, 64, dict(expert_cache=tiny_all // 3, ring=16, stream_min=1024, stage_head=2,
                                            group_gather=0), dict(prompt="few")),
            ("small", "IQ2_XS", 600, 128, dict(expert_cache=_all_experts("small") // 3, ring=16, stream_min=1024,
                                                stage_head=9, ring_in_place=0), {}),
            ("strata", "IQ2_XS", 254, "auto", dict(expert_cache=strata_all // 3, stage_head=40),
             dict(greedy=1, records=False, pack_options=STRATA2[2]))):
        rows.append(_row("cuda", preset, etype, n, chunk, arm, **kw))
    # ---- head_predict: a staged layer's head from the predicted routing (its own router on the layer
    # before's residual): heads of a few and of more than are named, group and per-expert mode, a
    # window, the 2-layer strata pack at 254 tokens (its layer 1's head predicted). Arm name: hp.
    for preset, etype, n, chunk, arm, kw in (
            ("tiny", "IQ2_XS", 130, 64, dict(expert_cache=tiny_all // 3, ring=8, stream_min=1024, stage_head=3,
                                              head_predict=1), dict(quick=True)),
            ("small", "Q8_0", 300, 64, dict(expert_cache=_all_experts("small") // 3, ring=16, stream_min=1024,
                                             stage_head=100, head_predict=1, group_gather=0), {}),
            ("tiny", "Q4_1", 200, 32, dict(window=96, expert_cache=11, ring=16, stage_head=4, head_predict=1), {}),
            ("strata", "IQ2_XS", 254, "auto", dict(expert_cache=strata_all // 3, head_predict=1),
             dict(greedy=1, records=False, pack_options=STRATA2[2]))):
        rows.append(_row("cuda", preset, etype, n, chunk, arm, **kw))
    rows += _gpt_oss_parity("cuda")
    rows += _device_plan_rows("cuda")
    rows += _choose_ahead_rows("cuda", (1, 3))
    return rows


def _choose_ahead_rows(backend: str, reaches) -> list[ParityCase]:
    """choose_ahead (the coverage rule's reach; the default every other streamed row takes): the
    4-layer small pack in one chunk of 1,100 tokens (layer 0 streams on the prior, the later ones
    by the routing of a layer before), a third of its experts cached. Arm name: ca."""
    n_all = _all_experts("small")
    return [_row(backend, "small", "IQ2_XS", 1100, "auto", dict(expert_cache=n_all // 3, ring=64, choose_ahead=v),
                 seed=33) for v in reaches]


def _device_plan_rows(backend: str) -> list[ParityCase]:
    """device_plan, on and off (the same on both backends): every expert resident (each layer
    planned on the device: tile lists cut from the routing tables, launches over the worst case),
    short and long prompts, the small pack's three chunks, the design's gathered arm beside it; a
    cache one expert short of the pack (its first layer whole and planned on the device, the last
    one streaming one expert). Arm name: dp."""
    rows = []
    for v in (1, 0):
        rows.append(_row(backend, "tiny", "IQ2_XS", 63, 64, dict(device_plan=v), seed=31, quick=v == 1))
        rows.append(_row(backend, "tiny", "Q2_K", 300, 128, dict(device_plan=v, fuse_group=0), seed=31))
        rows.append(_row(backend, "small", "Q4_1", 600, 256, dict(device_plan=v), seed=32))
        rows.append(_row(backend, "tiny", "Q8_0", 130, 64, dict(device_plan=v, expert_cache=_all_experts("tiny") - 1,
                                                               ring=8, window="off"), seed=33))
    return rows


def _sim_rows() -> list[ParityCase]:
    rows = []
    for etype in SPREAD_TYPES:
        for n in (1, 63, 130):
            for sw in SWITCH_DESIGN:
                arm = {k: v for k, v in zip(SWITCH_NAMES, sw)}
                rows.append(_row("sim", "tiny", etype, n, 64, arm, quick=n == 63 and sw == SWITCH_DESIGN[0]))
    for router in ("F32", "BF16", "Q8_0"):  # float routers, float dense matrices; a Q8_0 router the MMQ path
        for dense in ("Q8_0", "F16"):
            rows.append(_row("sim", "tiny", "Q4_1", 70, 64, seed=3,
                             pack_options=(("router_type", router), ("dense_type", dense))))
    for etype in ("Q2_K", "IQ3_XXS"):  # 64 experts, top-8, a fallback down type, three chunks
        for gg, qg in ((1, 0), (0, 1)):
            rows.append(_row("sim", "small", etype, 600, 256, dict(group_gather=gg, quant_gather=qg), seed=11))
    for gs in (1, 3, 16):
        rows.append(_row("sim", "tiny", "IQ2_XS", 97, 64, dict(group_size=gs), seed=5))
    for chunk in (1, 37, "auto"):
        rows.append(_row("sim", "tiny", "Q4_1", 150, chunk, seed=6))
    for etype in ("Q8_0", "Q4_1", "Q2_K"):  # the fused SwiGLU + quantize of H, every down layout
        rows.append(_row("sim", "tiny", etype, 90, 64, seed=12, dump_level="layer"))
    for etype in ("Q8_0", "IQ2_XS", "Q2_K"):
        for ring in RINGS:
            for i, (gg, qg, co) in enumerate(STREAM_SWITCHES):
                arm = dict(group_gather=gg, quant_gather=qg, copy_coalesce=co, expert_cache=(0, 11, 32)[(i + ring) % 3],
                           ring=ring, stream_min=64)
                rows.append(_row("sim", "tiny", etype, 130, 64, arm, seed=ring, sim_seed=i,
                                 quick=(etype, ring, i) == ("Q8_0", 8, 0)))
    # Float experts: every arm of the design; streamed (no cache and some, rings of 8 and 16,
    # streamed and staged chunks, every streamed arm); the small pack; skips in open groups.
    n_all = _all_experts("tiny")
    for etype in FLOAT_EXPERT_TYPES:
        for sw in SWITCH_DESIGN:
            rows.append(_row("sim", "tiny", etype, 63, 64, dict(zip(SWITCH_NAMES, sw)), seed=21,
                             quick=sw == SWITCH_DESIGN[0]))
        for i, (gg, qg, co) in enumerate(STREAM_SWITCHES):
            arm = dict(group_gather=gg, quant_gather=qg, copy_coalesce=co, expert_cache=(0, 11)[(i // 2) % 2],
                       ring=(8, 16)[i % 2], stream_min=(64, 256)[(i // 4) % 2], in_place=1 - i % 2)
            rows.append(_row("sim", "tiny", etype, 130, 64, arm, seed=22, sim_seed=i))
        rows.append(_row("sim", "small", etype, 130, 64, dict(expert_cache=_all_experts("small") // 3, ring=16,
                                                               stream_min=64), seed=23))
        rows.append(_row("sim", "tiny", etype, 200, 64, dict(expert_cache=10, ring=8, stream_min=16), prompt="few",
                         open_skip=True, sim_seed=1))
    # The mixes' types (MIX_TYPES): experts of each, at two lengths on two arms of the design,
    # and the dense matrices of each, the grid types also streamed; then the llama-quantize mixes (formats/mixes.py), small's
    # expert rows of 384 falling back to Q4_0, Q5_0 and Q8_0.
    for etype in MIX_TYPES:
        for n in (63, 130):
            for sw in SWITCH_DESIGN[:2]:
                rows.append(_row("sim", "tiny", etype, n, 64, dict(zip(SWITCH_NAMES, sw)), seed=21,
                                 quick=n == 63 and sw == SWITCH_DESIGN[0]))
        rows.append(_row("sim", "tiny", "Q8_0", 70, 64, seed=22, pack_options=(("dense_type", etype),)))
        if etype in MIX_GRID_TYPES:  # the grid types streamed from the host tier too
            rows.append(_row("sim", "tiny", etype, 130, 64, dict(expert_cache=11, ring=8, stream_min=64), seed=21))
    for preset in _MIX_PRESETS:
        for mix in _MIXES:
            rows.append(_row("sim", preset, _MIX_BASE[mix], 130, 64, seed=23, pack_options=(("mix", mix),),
                             quick=(preset, mix) == ("tiny", "Q4_K_M")))
    rows += _codebook_parity("sim")
    rows += _choose_ahead_rows("sim", (1,))
    n_cache = _all_experts("small") // 3
    for gg in (1, 0):
        rows.append(_row("sim", "small", "IQ3_S", 600, 512, dict(group_gather=gg, expert_cache=n_cache, ring=16,
                                                                  stream_min=256), seed=12))
        for ring in (8, 16):  # per-expert mode in the gathered walk, as above
            rows.append(_row("sim", "tiny", "Q8_0", 200, 64, dict(group_gather=gg, expert_cache=10, ring=ring,
                                                                   stream_min=16, ring_in_place=gg),
                             prompt="few", open_skip=True, sim_seed=ring))
    # Layer-major windows (the window switch): windows that stream where their chunks stage,
    # both streamed, both staged, auto (the sim's budget holds the whole prompt); a last window
    # of fewer chunks; group and per-expert gathers.
    for i, (window, stream_min) in enumerate(((96, 64), (64, 16), ("auto", 64), (160, 1024))):
        for gg in (1, 0):
            arm = dict(window=window, group_gather=gg, expert_cache=(0, 11)[i % 2], ring=(8, 16)[gg],
                       stream_min=stream_min)
            rows.append(_row("sim", "tiny", ("Q8_0", "IQ2_XS")[i % 2], 200, 32, arm, seed=31, sim_seed=i,
                             quick=(i, gg) == (0, 1)))
    rows.append(_row("sim", "small", "IQ2_XS", 600, 128, dict(window=384, expert_cache=n_cache, ring=16,
                                                               stream_min=256), seed=12))
    # ---- ring_in_place (issue 26, item 2): streamed experts multiplied in their ring slots ----
    # Every (walk, ring, cache, mode): streamed chunks, staged chunks and layer-major windows;
    # rings of 8 and 16; no cache and a third; group and per-expert runs; the expert types and
    # schedules rotating. Then skips inside runs, float experts and the small pack. Arm name: rip1.
    tiny_all = _all_experts("tiny")
    walks = (("streamed", 130, 64, dict(stream_min=64)), ("staged", 130, 64, dict(stream_min=1024)),
             ("windowed", 200, 32, dict(window=96, stream_min=64)))
    i = 0
    for _walk, n, chunk, walk_arm in walks:
        for ring in (8, 16):
            for cache in (0, tiny_all // 3):
                for gg in (1, 0):
                    arm = dict(**walk_arm, ring=ring, expert_cache=cache, group_gather=gg, ring_in_place=1)
                    rows.append(_row("sim", "tiny", ("Q8_0", "IQ2_XS", "Q2_K")[i % 3], n, chunk, arm, seed=41,
                                     sim_seed=i, quick=i == 0))
                    i += 1
    for gg in (1, 0):  # a per-expert run is complete at once: no skip can fall inside it
        rows.append(_row("sim", "tiny", "Q8_0", 200, 64, dict(group_gather=gg, expert_cache=10, ring=8, stream_min=16,
                                                               ring_in_place=1), prompt="few", open_skip=gg == 1,
                         sim_seed=gg))
    for etype in ("F16", "BF16"):
        rows.append(_row("sim", "tiny", etype, 130, 64, dict(expert_cache=tiny_all // 3, ring=8, stream_min=64,
                                                             ring_in_place=1), seed=42))
    rows.append(_row("sim", "small", "IQ2_XS", 600, 128, dict(window=384, expert_cache=n_cache, ring=16, stream_min=256,
                                                               ring_in_place=1), seed=12))
    # ---- stream_min auto (issue 26, item 4): each layer's walk chosen by coverage ----
    # Each layer streams or stages by its routing's expected coverage (a short first chunk by the
    # token prior, later units by the last one's): chunks of 64 that stream after a first that
    # stages, a last chunk of 2 and greedy steps that stage; a prompt of three ids; layer-major
    # windows; the small pack; ring_in_place; caches of none and a third; group and per-expert
    # mode. Arm name: sminauto.
    for preset, etype, n, chunk, arm, kw in (
            ("tiny", "Q8_0", 130, 64, dict(expert_cache=0, ring=8), dict(quick=True)),
            ("tiny", "IQ2_XS", 130, 64, dict(expert_cache=tiny_all // 3, ring=16, group_gather=0), dict(sim_seed=1)),
            ("tiny", "Q2_K", 200, 64, dict(expert_cache=10, ring=8), dict(prompt="few", sim_seed=2)),
            ("tiny", "Q8_0", 200, 32, dict(window=96, expert_cache=11, ring=16, copy_coalesce=1), dict(sim_seed=3)),
            ("small", "IQ2_XS", 600, 128, dict(expert_cache=n_cache, ring=16), dict(seed=12)),
            ("tiny", "IQ2_XS", 130, 64, dict(expert_cache=tiny_all // 3, ring=8, ring_in_place=1), dict(sim_seed=4)),
            ("tiny", "F16", 130, 64, dict(expert_cache=tiny_all // 3, ring=8, in_place=0), dict(seed=22))):
        rows.append(_row("sim", preset, etype, n, chunk, {**arm, "stream_min": "auto"}, seed=kw.pop("seed", 43), **kw))
    # ---- stage_head (issue 26, item 3): staged chunks with heads of none, a few and every expert;
    # group and per-expert mode; in the ring and gathered; a window. Arm name: sh.
    for i, (etype, n, chunk, arm) in enumerate((
            ("Q8_0", 130, 64, dict(expert_cache=tiny_all // 3, ring=8, stage_head=0)),
            ("IQ2_XS", 130, 64, dict(expert_cache=0, ring=8, stage_head=3)),
            ("Q2_K", 130, 64, dict(expert_cache=10, ring=16, stage_head=5, group_gather=0)),
            ("Q8_0", 130, 64, dict(expert_cache=11, ring=8, stage_head=2, ring_in_place=0)),
            ("IQ2_XS", 200, 32, dict(window=96, expert_cache=11, ring=16, stage_head=4)),
            ("Q4_1", 130, 64, dict(expert_cache=0, ring=16, stage_head=100)))):
        rows.append(_row("sim", "tiny", etype, n, chunk, {**arm, "stream_min": 1024}, seed=44, sim_seed=i,
                         quick=i == 1))
    # ---- head_predict: predicted heads of a few, of every named expert, in per-expert mode and in a
    # window. Arm name: hp.
    for i, (etype, n, chunk, arm) in enumerate((
            ("IQ2_XS", 130, 64, dict(expert_cache=tiny_all // 3, ring=8, stage_head=3)),
            ("Q2_K", 130, 64, dict(expert_cache=10, ring=16, stage_head=100, group_gather=0)),
            ("Q8_0", 200, 32, dict(window=96, expert_cache=11, ring=16, stage_head=4)))):
        rows.append(_row("sim", "tiny", etype, n, chunk, {**arm, "stream_min": 1024, "head_predict": 1}, seed=45,
                         sim_seed=i))
    rows += _gpt_oss_parity("sim")
    rows += _device_plan_rows("sim")
    return rows


def _named_apart(rows: list[ParityCase]) -> list[ParityCase]:
    """Rows whose names the rule made one (a switch dropped or capped by _settled: rings past a
    small pack's experts, streamed arms where every expert is resident) told apart by their
    prompt's seed, which differs: each still runs its own prompt."""
    import collections
    import dataclasses

    count = collections.Counter(c.name for c in rows)
    return [dataclasses.replace(c, name=f"{c.name}-p{c.seed if c.seed is not None else c.tokens}")
            if count[c.name] > 1 else c for c in rows]


PARITY_CASES: tuple[ParityCase, ...] = tuple(_named_apart(_cuda_rows() + _sim_rows()))


def parity_rows(backend: str | None = None, **where) -> list[ParityCase]:
    return [c for c in PARITY_CASES if (backend is None or c.backend == backend)
            and all(getattr(c, k) == v for k, v in where.items())]
