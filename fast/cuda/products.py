"""The products and what feeds them: q8_1 quantization of activation rows (gather and
scatter), the grouped and dense MMQ launches with their tile configurations, and the
expert-group gathers that build the group weight buffers. Device buffers in, device buffers
out; every wrapper takes the backend's :class:`strata_prefill.fast.cuda.runtime.Device` first, then its
leading inputs (a type, the weights or the rows it reads), everything else by keyword, and
launches through it. The MMQ kernels' 16 arguments (two launch forms) are given by name and
put in the order their C signature declares (:func:`_mmq_args`).

Device buffers may be given as a GPUArray, anything with ``__cuda_array_interface__``, a
``DeviceAllocation`` or a plain int address (``int(buf) + offset``).

Kernels and their NumPy definitions:
- :func:`quantize_gather`  -> strata_prefill.contract.q8_1.gather_quantize   (kernels/quantize_q8_1.cu)
- :func:`quantize_scatter` -> strata_prefill.contract.q8_1.scatter_quantize  (kernels/quantize_q8_1.cu)
- :func:`swiglu_quantize`  -> strata_prefill.contract.moe.swiglu, then strata_prefill.contract.q8_1.quantize_rows
  (kernels/swiglu_q8_1.cu)
- :func:`mmq_group`, :func:`mmq_dense`, :func:`mmq_tiles` -> strata_prefill.contract.mmq.mmq_prepared (kernels/mmq.cu)
- :func:`gather_native_group`, :func:`gather_native_one` -> strata_prefill.contract.moe.group_buffers
  (kernels/gather_group.cu)
"""
from __future__ import annotations

import json
import os
import re

import numpy as np
from gguf import GGMLQuantizationType as QT

from strata_prefill.contract import q8_1, qformats
from strata_prefill.contract.constants import MMQ_GROUP
from strata_prefill.contract.errors import DeviceError, InputError

from strata_prefill.fast.cuda import elementwise, runtime, signatures
from strata_prefill.fast.tiles import DEFAULT_TILE_ROWS, ListPlan, max_row_tiles, routed_row_lists, row_tiles  # noqa: F401
from strata_prefill.fast.cuda.runtime import check, ptr

__all__ = [
    "quantize_gather",
    "quantize_scatter",
    "swiglu_quantize",
    "mmq_group",
    "mmq_dense",
    "mmq_tiles",
    "row_tiles",
    "tile_config",
    "tile_rows_for",
    "routed_tile_plans",
    "list_ctas",
    "with_empty_exit",
    "max_row_tiles",
    "routed_row_lists",
    "mmq_geometry",
    "default_config",
    "auto_config",
    "AUTO_CONFIGS",
    "DEFAULT_TILE_ROWS",
    "gather_native_group",
    "gather_native_one",
    "group_buffer_bytes",
]

#: the default MMQ tile configurations (mmq.cu defines), picked per launch by the mean number
#: of activation rows per expert: (below this mean, config); the last one has no bound. Below
#: 8 rows: 4 warps, 16 activation rows a CTA, three CTAs per SM (bench/bench_in_place_cuda.py;
#: docs/performance.md, "Figures from the kernels' comments"); then 8 warps
#: and two CTAs per SM. Each is checked byte for byte by verify/test_kernels_cuda.py. A
#: configuration changes speed only, never a bit.
AUTO_CONFIGS = (
    (8, {"MMQ_WM": 4, "MMQ_WN": 1, "MMQ_BN": 16, "MMQ_MINB": 3}),
    (64, {"MMQ_WM": 4, "MMQ_BN": 64, "MMQ_MINB": 2}),
    (None, {"MMQ_WM": 4, "MMQ_BN": 128, "MMQ_STAGES": 3, "MMQ_MINB": 2}),
)

_Q8_THREADS = 256
_Q8_WARPS = 8
_GATHER_THREADS = 256

def _format(qtype) -> type[qformats.QuantFormat]:
    """The registered format of a weight type (a name, a GGMLQuantizationType or its int) that
    has a CUDA MMQ kernel (contract/qformats.py: its mmq_kernel), or a one-line InputError."""
    if isinstance(qtype, str):
        try:
            qtype = QT[qtype.upper()]
        except KeyError:
            raise InputError(f"unknown weight type {qtype!r}") from None
    fmt = qformats.lookup(qtype)
    if fmt is None or fmt.mmq_kernel is None:
        try:
            name = QT(int(qtype)).name
        except ValueError:
            name = repr(qtype)
        raise InputError(f"weight type {name} has no CUDA MMQ kernel")
    return fmt


# --------------------------------------------------------------------------- quantize


def _q8_launch(dev, module: str, kernel: str, fmt: str, tasks: int, *args, name: str | None = None) -> None:
    """One launch of a q8_1 quantize kernel: a warp a 128-value block, ``tasks`` blocks; counted
    as ``name`` (default the kernel's)."""
    f = runtime.function(module, kernel, fmt)
    blocks = max(1, min((tasks + _Q8_WARPS - 1) // _Q8_WARPS, 1 << 20))
    dev.launch(f, name or kernel, (blocks, 1, 1), (_Q8_THREADS, 1, 1), *args)


def quantize_gather(dev, x, src, *, n_rows: int, K: int, layout, out, ldx: int | None = None,
                    R_total: int | None = None) -> None:
    """Rows r < n_rows of the q8_1 buffer ``out`` (R_total rows, default n_rows) <- the
    quantized ``x[src[r]]``. x: float32 device rows of ``ldx`` floats (default K);
    src: int32 device [n_rows]. Same bytes as strata_prefill.contract.q8_1.gather_quantize."""
    lay = int(q8_1.Layout(int(layout)))
    R_total = n_rows if R_total is None else int(R_total)
    ldx = K if ldx is None else int(ldx)
    if n_rows <= 0:
        return
    _q8_launch(dev, "quantize_q8_1", "q8_1_gather", "PqPiiiPi", n_rows * q8_1.blocks_per_row(K),
               ptr(x), ldx, ptr(src), int(n_rows), int(K), lay, ptr(out), R_total)


def quantize_scatter(dev, x, slot, *, T: int, K_used: int, K: int, layout, out,
                     ldx: int | None = None) -> None:
    """Token t < T of x (float32 device rows of ``ldx`` floats, default K) quantized once and
    written to rows ``slot[t*K_used + k]`` (slot: int32 device [T*K_used]) of the q8_1 buffer
    ``out`` of T*K_used rows. Same bytes as strata_prefill.contract.q8_1.scatter_quantize."""
    lay = int(q8_1.Layout(int(layout)))
    ldx = K if ldx is None else int(ldx)
    if T <= 0:
        return
    _q8_launch(dev, "quantize_q8_1", "q8_1_scatter", "PqPiiiiPi", T * q8_1.blocks_per_row(K),
               ptr(x), ldx, ptr(slot), int(T), int(K_used), int(K), lay, ptr(out), int(T) * int(K_used))


def swiglu_quantize(dev, g, u, *, r0: int, r1: int, layout, out, row0: int, R_total: int, act=None,
                    expert_bias=None, mark=None) -> None:
    """H = silu(g) * u over rows r0 .. r1 of g, u (float32 device [R, n]), quantized into rows
    row0 .. row0 + (r1 - r0) of the q8_1 buffer ``out`` (R_total rows of n values) in one
    launch. The same bytes as elementwise.swiglu then :func:`quantize_gather` of H's rows in
    order at ``out`` offset by row0 rows (strata_prefill.contract.moe.swiglu, strata_prefill.contract.q8_1.quantize_rows).
    act, expert_bias: as elementwise.swiglu's (swiglu_oai_q8_1: strata_prefill.contract.moe.swiglu_oai of the
    biased rows). mark: as elementwise.swiglu's, through the kernels that take it
    (swiglu_q8_1_mark, swiglu_oai_q8_1_mark; counted under the plain kernels' names)."""
    act = elementwise.glu_act(act, "swiglu_quantize")
    if expert_bias is not None and act is None:
        raise InputError("swiglu_quantize: expert biases come with act=SwigluOai (swiglu_oai_q8_1)")
    lay = int(q8_1.Layout(int(layout)))
    check(g, "swiglu_quantize gate", np.float32, ndim=2)
    R, n = (int(s) for s in g.shape)
    check(u, "swiglu_quantize up", np.float32, shape=(R, n))
    r0, r1, row0, R_total = int(r0), int(r1), int(row0), int(R_total)
    if not 0 <= r0 <= r1 <= R:
        raise InputError(f"swiglu_quantize: rows {r0}..{r1} outside [0, {R}]")
    if not 0 <= row0 <= row0 + (r1 - r0) <= R_total:
        raise InputError(f"swiglu_quantize: output rows {row0}..{row0 + r1 - r0} outside [0, {R_total}]")
    rows = r1 - r0
    if rows == 0 or n == 0:
        return
    tasks = rows * q8_1.blocks_per_row(n)
    args = (ptr(g) + 4 * r0 * n, n, ptr(u) + 4 * r0 * n, n, rows, n, lay, ptr(out) + row0 * q8_1.BLOCK_BYTES, R_total)
    if act is not None:
        args += (np.float32(act.alpha), np.float32(act.limit),
                 *elementwise.expert_bias_args(expert_bias, R, n, r0, "swiglu_quantize"))
        if mark is None:
            _q8_launch(dev, "swiglu_q8_1", "swiglu_oai_q8_1", "PqPqiiiPiffPPPq", tasks, *args)
        else:
            _q8_launch(dev, "swiglu_q8_1", "swiglu_oai_q8_1_mark", "PqPqiiiPiffPPPqPQQ", tasks, *args,
                       *elementwise.mark_args(mark), name="swiglu_oai_q8_1")
    elif mark is None:
        _q8_launch(dev, "swiglu_q8_1", "swiglu_q8_1", "PqPqiiiPi", tasks, *args)
    else:
        _q8_launch(dev, "swiglu_q8_1", "swiglu_q8_1_mark", "PqPqiiiPiPQQ", tasks, *args, *elementwise.mark_args(mark),
                   name="swiglu_q8_1")


# --------------------------------------------------------------------------- mmq

_mmq_state: dict = {}


def _tables_host() -> np.ndarray:
    """The table buffer the MMQ kernel reads (strata_prefill.contract.qformats.table_layout: the sign masks, then
    each registered grid, in the form its decode reads: QuantFormat.table), from strata_prefill.contract.qformats'
    tables."""
    layout = qformats.table_layout()
    t = np.zeros(layout["BYTES"][1], dtype=np.uint8)
    off, size = layout["SIGN"]
    t[off:off + size] = np.where(qformats.sign_table().reshape(-1) < 0, 0xFF, 0x00).astype(np.uint8)
    for f in qformats.formats():
        if f.table_name is None:
            continue
        off, size = layout[f.table_name]
        tb = f.table()
        if tb.size != size:
            raise DeviceError(f"unexpected {f.qtype.name} table from strata_prefill.contract.qformats: {tb.size} bytes, not {size}")
        t[off:off + size] = tb
    return t


#: the environment variables of MMQ tiling, read at each launch (so a benchmark may change them
#: between prefills of one engine: bench/bench_prefill_cuda.py --ab)
CONFIG_ENV = "STRATA_MMQ_CONFIG"
DEFINES_ENV = "STRATA_MMQ_DEFINES"
LIST_CTAS_ENV = "STRATA_MMQ_LIST_CTAS"
LAUNCH_VARIABLES = (CONFIG_ENV, DEFINES_ENV, LIST_CTAS_ENV)
#: CTAs an SM a device-cut list's launch takes at most (list_ctas), and the variable's largest
DEFAULT_LIST_CTAS = 8
LIST_CTAS_MAX = 1024


def default_config() -> dict | None:
    """The MMQ tile configuration used when a call passes none: the compile-time defines in
    the environment variable STRATA_MMQ_CONFIG (JSON, e.g. '{"MMQ_BN": 192, "MMQ_STAGES": 3}';
    '{}' is mmq.cu's own defaults), else None: per launch, by the mean rows per expert, from
    AUTO_CONFIGS (:func:`auto_config`). A configuration changes speed only, never a bit of the
    result."""
    raw = os.environ.get(CONFIG_ENV, "").strip()
    if not raw:
        return None
    try:
        cfg = json.loads(raw)
    except ValueError:
        raise InputError(f"STRATA_MMQ_CONFIG is not JSON: {raw!r}") from None
    if not isinstance(cfg, dict):
        raise InputError(f"STRATA_MMQ_CONFIG must be a JSON object, got {raw!r}")
    return _with_extra(cfg)


def extra_defines() -> dict:
    """mmq.cu defines added to every configuration, automatic or STRATA_MMQ_CONFIG's: the
    environment variable STRATA_MMQ_DEFINES (JSON), for A/B of a tuning define over every
    configuration (e.g. '{"MMQ_MIX_MIN": 0}'); empty when unset. Changes speed only, never a bit."""
    raw = os.environ.get(DEFINES_ENV, "").strip()
    if not raw:
        return {}
    try:
        extra = json.loads(raw)
    except ValueError:
        raise InputError(f"STRATA_MMQ_DEFINES is not JSON: {raw!r}") from None
    if not isinstance(extra, dict) or not all(isinstance(v, int) for v in extra.values()):
        raise InputError(f"STRATA_MMQ_DEFINES must be a JSON object of integers, got {raw!r}")
    return extra


def _with_extra(cfg: dict) -> dict:
    """cfg with STRATA_MMQ_DEFINES on top (cfg itself when that is unset)."""
    extra = extra_defines()
    return {**cfg, **extra} if extra else cfg


def _auto_entry(rows_per_expert: float) -> dict:
    """The AUTO_CONFIGS entry itself for this mean number of rows per expert."""
    for bound, cfg in AUTO_CONFIGS:
        if bound is None or rows_per_expert < bound:
            return cfg
    return AUTO_CONFIGS[-1][1]


def auto_config(rows_per_expert: float) -> dict:
    """The AUTO_CONFIGS entry for a launch with this mean number of rows per expert (with
    STRATA_MMQ_DEFINES)."""
    return _with_extra(_auto_entry(rows_per_expert))


def _mmq_mod(config: dict | None):
    if config is None:
        config = default_config()
        if config is None:
            config = auto_config(float("inf"))
    key = tuple(sorted(config.items()))
    st = _mmq_state.get(key)
    if st is not None:
        return st
    first = qformats.with_mmq_kernel()[0]  # the geometry is the configuration's, the same in each type's module
    mod = runtime.load_module("mmq", _type_defines(dict(key), first))
    geo = runtime.module_ints(mod, "mmq_geometry", 4)
    tab = _mmq_state.get("tables")
    if tab is None:
        tab = runtime.to_device(_tables_host(), "MMQ tables")
        _mmq_state["tables"] = tab
    st = {"config": dict(key), "mods": {first.qtype: mod}, "BM": geo[0], "BN": geo[1], "threads": geo[2],
          "max_exp": geo[3], "funcs": {}}
    _mmq_state[key] = st
    return st


def _type_defines(config: dict, fmt) -> dict:
    """mmq.cu's defines for `fmt`'s kernel alone under a tile configuration (MMQ_ONLY: one
    module a type, qformats.cuh)."""
    return {**config, "MMQ_ONLY": int(fmt.qtype)}


def mmq_modules(config: dict) -> list[tuple[str, dict]]:
    """The (module, defines) builds of mmq.cu a tile configuration takes: one a type."""
    return [("mmq", _type_defines(config, f)) for f in qformats.with_mmq_kernel()]


def _mmq_fields(kernel: str) -> tuple[tuple[str, str], ...]:
    """The MMQ kernel's parameters (kernels/mmq.cu MMQ_ENTRY): (name, PyCUDA letters) in the
    order its C signature declares them, read from it (fast/cuda/signatures.py)."""
    got = _mmq_state.get(("fields", kernel))
    if got is None:
        params = signatures.kernels("mmq")[kernel].params
        got = _mmq_state[("fields", kernel)] = tuple((p.name, p.letters) for p in params)
    return got


def _mmq_args(kernel: str, **fields) -> tuple:
    """The MMQ kernel's arguments in its signature's order, from every parameter by name: a name
    the signature lacks, or one left out, is a one-line error before any launch."""
    names = [n for n, _ in _mmq_fields(kernel)]
    extra, missing = sorted(set(fields) - set(names)), [n for n in names if n not in fields]
    if extra or missing:
        raise InputError(f"{kernel} (kernels/mmq.cu): unknown parameters {extra}, missing {missing}")
    return tuple(fields[n] for n in names)


def _mmq_func(st, fmt):
    f = st["funcs"].get(fmt.qtype)
    if f is None:
        name = fmt.mmq_kernel
        mod = st["mods"].get(fmt.qtype)
        if mod is None:
            mod = st["mods"][fmt.qtype] = runtime.load_module("mmq", _type_defines(st["config"], fmt))
        (smem,) = runtime.module_ints(mod, name + "_smem", 1)
        f = runtime.allow_dynamic_smem(mod.get_function(name), smem)
        f.prepare("".join(letters for _, letters in _mmq_fields(name)))
        f.smem = smem
        f.kernel = name
        st["funcs"][fmt.qtype] = f
    return f


def mmq_geometry(config: dict | None = None) -> dict:
    """{"BM": weight rows per CTA, "BN": activation rows per CTA, "threads", "max_exp"}.
    config None: the default configuration (automatic: its largest-rows entry)."""
    st = _mmq_mod(config)
    return {k: st[k] for k in ("BM", "BN", "threads", "max_exp")}


def _checked_pair(fmt, K: int, out, pair) -> tuple[int, object]:
    """The checks both MMQ launch forms share: K a whole number of the type's blocks, and the
    second matrix of a pair (w_pair, out2) at an even offset. Returns (w_pair, out2); without a
    pair, (0, out): the kernel then never writes out2."""
    if K <= 0 or K % fmt.block_values:
        raise InputError(f"K={K} is not a multiple of the {fmt.qtype.name} block ({fmt.block_values} values)")
    w_pair, out2 = (0, out) if pair is None else (int(pair[0]), pair[1])
    if w_pair % 2:
        raise InputError("the second matrix's offset must be 2-byte aligned")
    return w_pair, out2


def mmq_group(dev, qtype, w, *, w_stride: int, N: int, K: int, act, R_total: int, bounds, n_exp: int,
              out, ldo: int | None = None, rows: int | None = None,
              tile_rows: int = DEFAULT_TILE_ROWS, config: dict | None = None, pair=None) -> None:
    """Grouped product: for q < n_exp (at most MMQ_GROUP), out[r, n] (r in [row_begin_q,
    row_end_q), n < N) = strata_prefill.contract.mmq.mmq(weights of expert q, activation row r)[n].

    w: the group weight buffer; expert q's N x K matrix (GGUF blocks, rows of
       quants.row_bytes(qtype, K) bytes) at byte offset q * w_stride (w_stride even).
       The kernel may read up to 15 bytes past the last expert's last row (and before the
       first): keep strata_prefill.contract.constants.WEIGHT_TAIL_BYTES allocated after the group buffer's data.
    act: q8_1 buffer of R_total rows (layout strata_prefill.contract.q8_1.layout_for(qtype), K values a row).
    bounds: int32 device array [n_exp, 2] of (row_begin, row_end) into act/out, or a host
       array (then uploaded on the stream; prefer uploading a chunk's bounds once).
    out: float32 device [R_total, ldo] (ldo default N); rows outside all bounds untouched.
    rows: total rows over the bounds if known (sizes the grid; default R_total).
    tile_rows: cap on activation rows per CTA tile (multiple of 8, at most BN; with the
       automatic default configuration, capped at its BN); does not change a bit of the result.
    config: mmq.cu defines (a tile configuration); None: default_config(), automatic by the
       mean rows per expert (rows / n_exp) unless STRATA_MMQ_CONFIG is set.
    pair: (w_pair, out2) to multiply a second matrix per expert in the same launch (gate and
       up): expert q's second matrix at byte offset w_pair + q * w_stride (w_pair even), its
       products into out2 (float32 [R_total, ldo]), the same bounds and activation rows; the
       same bytes as a second call with w + w_pair and out2. None: one matrix.
    """
    fmt = _format(qtype)
    N, K, R_total, n_exp = int(N), int(K), int(R_total), int(n_exp)
    if n_exp < 0 or n_exp > MMQ_GROUP:
        raise InputError(f"an MMQ group holds 1..{MMQ_GROUP} experts, got {n_exp}")
    w_pair, out2 = _checked_pair(fmt, K, out, pair)
    if int(w_stride) % 2 or ptr(w) % 2:
        raise InputError("weight buffer and stride must be 2-byte aligned")
    if n_exp == 0 or N <= 0:
        return
    if not hasattr(bounds, "gpudata") and isinstance(bounds, (np.ndarray, list, tuple)):
        hb = np.asarray(bounds, dtype=np.int32).reshape(-1, 2)[:n_exp]
        rows = int(np.maximum(hb[:, 1] - hb[:, 0], 0).sum())
        bounds = dev.upload(hb)  # from the pool: reused only by work queued after this launch
    n_rows = R_total if rows is None else int(rows)
    tile_rows = int(tile_rows)
    if config is None:
        config = default_config()
        if config is None:
            config = auto_config(n_rows / n_exp)
            tile_rows = min(tile_rows, int(config.get("MMQ_BN", 128)))
    st = _mmq_mod(config)
    if tile_rows % 8 or not 8 <= tile_rows <= st["BN"]:
        raise InputError(f"tile_rows must be a multiple of 8 in [8, {st['BN']}], got {tile_rows}")
    f = _mmq_func(st, fmt)
    ntm = -(-N // st["BM"])
    tiles = ntm * (-(-n_rows // tile_rows) + n_exp)
    if tiles <= 0:
        return
    grid = (min(tiles, 1 << 30), 1 if pair is None else 2, 1)  # blockIdx.y 1: the second matrix
    args = _mmq_args(f.kernel, w=ptr(w), act=ptr(act), bounds=ptr(bounds), out=ptr(out), out2=ptr(out2),
                     tab=int(_mmq_state["tables"]), tiles=0, w_stride=int(w_stride),
                     ldo=int(N if ldo is None else ldo), w_pair=w_pair, N=N, K=K, R_total=R_total,
                     n_exp=n_exp, tile_rows=tile_rows, n_tiles=0, live=0)
    dev.launch(f, "mmq", grid, (st["threads"], 1, 1), *args, shared_size=f.smem)


def mmq_tiles(dev, qtype, w, *, N: int, K: int, act, R_total: int, tiles, n_tiles: int, out,
              ldo: int | None = None, tile_rows_mean: float | None = None, config: dict | None = None,
              pair=None, live=None) -> None:
    """Tile-list product: for each row tile (row_begin, row_end, offset) of ``tiles`` (int32
    device [n_tiles, 4], :func:`row_tiles`), out[r, n] (r in the tile's rows, n < N) =
    strata_prefill.contract.mmq.mmq(the N x K matrix at w + offset, activation row r)[n]. Any number of experts,
    each read where it lies (the expert cache, in place): the same bytes as :func:`mmq_group`
    over buffers holding copies of the same matrices. The kernel may read up to 15 bytes past
    a matrix's last row: keep that much allocated after each. tile_rows_mean: the mean rows per
    expert, which picks the automatic configuration (config None and STRATA_MMQ_CONFIG unset);
    pair: (w_pair, out2) as in :func:`mmq_group`. live: a list cut on the device
    (strata_prefill.fast.tiles.routed_row_lists: n_tiles is its worst case, padded with empty
    entries): the device address of its live count (int32), which the launch reads before
    anything else: mmq.cu built with MMQ_EMPTY_EXIT (its own modules; without it the kernels
    are the default ones). Its grid is capped at :func:`list_ctas` CTAs an SM, each taking
    every grid-th tile, so that a list the counts left empty costs a launch of a few CTAs."""
    fmt = _format(qtype)
    N, K, R_total, n_tiles = int(N), int(K), int(R_total), int(n_tiles)
    w_pair, out2 = _checked_pair(fmt, K, out, pair)
    if ptr(w) % 2:
        raise InputError("the weight base must be 2-byte aligned")
    if n_tiles <= 0 or N <= 0:
        return
    if config is None:
        if tile_rows_mean is None:
            raise InputError("mmq_tiles: give a configuration or the mean rows per expert that picks one")
        config = tile_config(tile_rows_mean)
    st = _mmq_mod(config if live is None else with_empty_exit(config))
    f = _mmq_func(st, fmt)
    tiles_n = n_tiles * -(-N // st["BM"])
    cap = 0 if live is None else list_ctas()
    if cap:
        tiles_n = min(tiles_n, cap * runtime.multiprocessor_count())
    grid = (min(tiles_n, 1 << 30), 1 if pair is None else 2, 1)
    args = _mmq_args(f.kernel, w=ptr(w), act=ptr(act), bounds=0, out=ptr(out), out2=ptr(out2),
                     tab=int(_mmq_state["tables"]), tiles=ptr(tiles), w_stride=0,
                     ldo=int(N if ldo is None else ldo), w_pair=w_pair, N=N, K=K, R_total=R_total,
                     n_exp=0, tile_rows=DEFAULT_TILE_ROWS, n_tiles=n_tiles, live=0 if live is None else int(live))
    dev.launch(f, "mmq", grid, (st["threads"], 1, 1), *args, shared_size=f.smem)


def tile_config(rows_per_expert: float) -> dict:
    """The configuration a tile-list launch uses (config None): STRATA_MMQ_CONFIG when set,
    else the automatic one for its mean rows per expert."""
    cfg = default_config()
    return auto_config(rows_per_expert) if cfg is None else cfg


def with_empty_exit(config: dict) -> dict:
    """A tile configuration's defines with mmq.cu's MMQ_EMPTY_EXIT on: the tile-list form of a
    device-cut list (routed_row_lists) reads its live count and skips empty entries. Changes no
    bit of a product."""
    return {**config, "MMQ_EMPTY_EXIT": 1}


def routed_tile_plans(n_rows: int, n_experts: int) -> list[tuple[dict, ListPlan]]:
    """The lists of a device cut (device_plan) over n_rows rows of at most n_experts routed
    experts, each with its configuration: the host does not read the counts, so it cannot see
    the mean rows per routed expert that picks the automatic configuration (tile_config). That
    mean lies between n_rows / min(n_experts, n_rows) and n_rows: one list for each AUTO_CONFIGS
    entry whose span of means meets that range, bounded as the entry is
    (strata_prefill.fast.tiles.routed_choice picks on the device), each as long as its rows can
    cut (max_row_tiles). STRATA_MMQ_CONFIG set: its one configuration. A configuration changes
    speed only, never a bit."""
    n_rows, n_experts = int(n_rows), int(n_experts)
    fixed = default_config()
    if fixed is not None:
        chosen = [(fixed, 0)]
    else:
        lo, chosen, below = n_rows / max(1, min(n_experts, n_rows)), [], 0
        for bound, cfg in AUTO_CONFIGS:  # entry i serves the means in [bound i-1, bound i)
            if n_rows >= below and (bound is None or lo < bound):
                chosen.append((_with_extra(cfg), 0 if bound is None else int(bound)))
            below = below if bound is None else bound
    return [(cfg, ListPlan(tile_rows_for(cfg), bound, max_row_tiles(n_rows, n_experts, tile_rows_for(cfg))))
            for cfg, bound in chosen]


def list_ctas() -> int:
    """CTAs an SM a device-cut list's launch takes at most (0: one a tile):
    STRATA_MMQ_LIST_CTAS, else DEFAULT_LIST_CTAS."""
    raw = os.environ.get(LIST_CTAS_ENV, "").strip()
    if not raw:
        return DEFAULT_LIST_CTAS
    if not re.fullmatch(r"[0-9]{1,4}", raw) or int(raw) > LIST_CTAS_MAX:
        raise InputError(f"{LIST_CTAS_ENV} must be an integer 0..{LIST_CTAS_MAX}, got {raw!r}")
    return int(raw)


def tile_rows_for(config: dict) -> int:
    """The row-tile cap of a tile-list launch with this configuration: its BN (mmq.cu's
    default 128), so a BN above 128 holds an expert's rows in fewer tiles."""
    return int(config.get("MMQ_BN", DEFAULT_TILE_ROWS))


_dense_bounds: dict = {}
_dense_choice: dict = {}  # (N, R, the two environment variables) -> (configuration, tile rows)


#: a BN 64 tile's time against a BN 128 tile's over the same weight rows and K, where whole
#: waves hide the rounding up (docs/results/2026-12-06-dense-waves-and-epilogue-price.md)
SMALL_TILE_COST = 0.6


def dense_waves(cfg: dict, N: int, R: int, sms: int) -> int:
    """The rounds of CTAs a dense product (N weight rows, R activation rows) takes under tile
    configuration cfg: its tiles over the CTAs the device runs at once (MMQ_MINB an SM). A
    round costs a whole tile's time however few of its CTAs run."""
    bm, bn = 16 * int(cfg.get("MMQ_WM", 8)), int(cfg.get("MMQ_BN", 128))
    tiles = -(-int(N) // bm) * -(-int(R) // bn)
    return -(-tiles // (int(sms) * int(cfg.get("MMQ_MINB", 1))))


def dense_config(N: int, R: int, sms: int) -> dict:
    """The automatic configuration of a dense product (N weight rows, R activation rows) on a
    device of `sms` SMs: the rows' AUTO_CONFIGS entry (with STRATA_MMQ_DEFINES), except that
    where that is the BN 128 tile, the BN 64 entry (twice the tiles, each SMALL_TILE_COST of
    the time) takes over when its rounds of CTAs (dense_waves) cost less. So a launch of fewer
    CTAs than SMs takes the small tile (one round either way), and so does one whose last
    round of large tiles would run few CTAs (on 132 SMs, the output projection's 2,048 rows at
    1,030 tokens: 288 large tiles in two rounds of 264, or 544 small ones in three)
    (bench/bench_dense_mmq_ab_cuda.py; docs/performance.md, "The decode mixed into the products")."""
    base = _auto_entry(float(R))
    cfg = _with_extra(base)
    if base is AUTO_CONFIGS[-1][1]:  # (fewer rows already take a smaller tile)
        small = _with_extra(AUTO_CONFIGS[-2][1])
        if dense_waves(small, N, R, sms) * SMALL_TILE_COST < dense_waves(cfg, N, R, sms):
            cfg = small
    return cfg


def mmq_dense(dev, qtype, w, *, N: int, K: int, act, R: int, out, ldo: int | None = None,
              config: dict | None = None) -> None:
    """Plain product of one matrix (N x K, GGUF blocks) with all R rows of a q8_1 buffer:
    out float32 [R, ldo] = strata_prefill.contract.mmq.mmq. One "expert" covering rows [0, R)."""
    R = int(R)
    if R <= 0:
        return
    b = _dense_bounds.get(R)
    if b is None:  # constant per R, kept for the process
        b = runtime.to_device(np.array([0, R], np.int32), "MMQ row bounds")
        _dense_bounds[R] = b
    if config is None:
        # the automatic choice, kept per shape and environment: the host's time before a launch
        # counts where the device waits for it (small products), so it is decided once
        key = (N, R, *(os.environ.get(v) for v in LAUNCH_VARIABLES))
        got = _dense_choice.get(key)
        if got is None:
            cfg = default_config()
            if cfg is None:
                cfg = dense_config(N, R, runtime.multiprocessor_count())
            got = _dense_choice[key] = (cfg, mmq_geometry(cfg)["BN"])
        config, tile_rows = got
    else:  # an explicit configuration tiles rows by its own BN
        tile_rows = mmq_geometry(config)["BN"]
    mmq_group(dev, qtype, w, w_stride=0, N=N, K=K, act=act, R_total=R, bounds=b, n_exp=1, out=out, ldo=ldo,
              rows=R, config=config, tile_rows=tile_rows)


# --------------------------------------------------------------------------- group gathers


def group_buffer_bytes(n_exp: int, gu_bytes: int, d_bytes: int, tail_bytes: int) -> tuple[int, int]:
    """Bytes of the (gate/up, down) group buffers for n_exp experts (strata_prefill.contract.moe.group_buffers)."""
    return int(n_exp) * 2 * int(gu_bytes) + int(tail_bytes), int(n_exp) * int(d_bytes) + int(tail_bytes)


def _gather_grid(nbytes: int) -> int:
    # ~32 KiB per CTA per pass, at most 256 CTAs per expert
    return max(1, min(256, -(-int(nbytes) // (_GATHER_THREADS * 16 * 8))))


def gather_native_group(dev, blobs, *, gu_bytes: int, d_bytes: int, tail_bytes: int, gu_buf, d_buf) -> None:
    """ONE launch gathering up to MMQ_GROUP experts (strata_prefill.contract.moe.group_buffers): blobs is a
    sequence of device addresses (ints, DeviceAllocations or GPUArrays) of each expert's
    [gate | up | down] bytes (2*gu_bytes + d_bytes), passed by value in the kernel parameters.
    Expert q's gate|up goes to gu_buf + q*2*gu_bytes, its down to d_buf + q*d_bytes; tail_bytes
    zeros follow the last expert in each buffer (sizes: :func:`group_buffer_bytes`)."""
    ptrs = [ptr(b) for b in blobs]
    n = len(ptrs)
    if n > MMQ_GROUP:
        raise InputError(f"gather_native_group takes at most {MMQ_GROUP} experts, got {n}")
    gu_bytes, d_bytes, tail_bytes = int(gu_bytes), int(d_bytes), int(tail_bytes)
    if min(gu_bytes, d_bytes, tail_bytes) < 0:
        raise InputError("gather: negative sizes")
    ptrs += [0] * (MMQ_GROUP - n)
    f = runtime.function("gather_group", "gather_native_group", "P" * MMQ_GROUP + "iqqqPP")
    grid = (_gather_grid(max(2 * gu_bytes, d_bytes, tail_bytes)), n + 1, 1)
    dev.launch(f, "gather_group", grid, (_GATHER_THREADS, 1, 1), *ptrs, n, gu_bytes, d_bytes, tail_bytes,
               ptr(gu_buf), ptr(d_buf))


def gather_native_one(dev, blob, *, q: int, gu_bytes: int, d_bytes: int, gu_buf, d_buf,
                      tail_bytes: int = 0) -> None:
    """One expert per launch (the opt-out path): blob (device address of [gate | up | down]) to
    slot q of the group buffers, as :func:`gather_native_group` places it; when tail_bytes > 0,
    also zero tail_bytes after slot q in both buffers (pass it for the group's last expert)."""
    gu_bytes, d_bytes, tail_bytes = int(gu_bytes), int(d_bytes), int(tail_bytes)
    if not 0 <= int(q) < MMQ_GROUP:
        raise InputError(f"gather_native_one: slot {q} outside [0, {MMQ_GROUP})")
    f = runtime.function("gather_group", "gather_native_one", "PiqqqPP")
    grid = (_gather_grid(max(2 * gu_bytes, d_bytes, tail_bytes)), 2 if tail_bytes > 0 else 1, 1)
    dev.launch(f, "gather_one", grid, (_GATHER_THREADS, 1, 1), ptr(blob), int(q), gu_bytes, d_bytes,
               tail_bytes, ptr(gu_buf), ptr(d_buf))
