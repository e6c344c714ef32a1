"""The model's elementwise and per-row kernels: norms, RoPE, add, the router (top-K and the
routing tables), SwiGLU, the combine, the shared-expert sigmoid and the token embedding.
GPUArrays in, GPUArrays out; every wrapper takes the backend's
:class:`strata_prefill.fast.cuda.runtime.Device` first, checks shapes and dtypes on the host, allocates its
output from the device's pool when ``out`` is None, launches one kernel on its stream and
returns at once. Arrays must be C-contiguous float32 / int32 / uint8 as documented.

Kernels and the NumPy functions they match bit for bit (docs/numerics.md):

=====================  =====================================  ===========================
wrapper                NumPy definition                       fast/cuda/kernels/
=====================  =====================================  ===========================
rmsnorm                strata_prefill.contract.numerics.rmsnorm                rmsnorm.cu
rope_neox              strata_prefill.contract.numerics.rope_neox              rope.cu
add                    x + y (float32)                        add.cu
add_row_bias           strata_prefill.contract.dense.add_row_bias       add.cu
top_k                  strata_prefill.contract.routing.top_k                   router.cu
routing_tables         strata_prefill.contract.routing.routing_tables          routing_tables.cu
row_experts            strata_prefill.contract.routing.row_experts             routing_tables.cu
routed_row_tiles       strata_prefill.fast.tiles.routed_row_lists              routing_tables.cu
swiglu                 strata_prefill.contract.moe.glu (+ add_expert_bias)     swiglu.cu
combine                strata_prefill.contract.moe.combine                     combine.cu
sigmoid                strata_prefill.contract.numerics.sigmoid                combine.cu
embed                  strata_prefill.contract.quants.dequantize (EMBED_TYPES) embed.cu
nonfinite_mark         strata_prefill.formats.nonfinite.mark                  nonfinite.cu
=====================  =====================================  ===========================

The SwiGLU wrappers take the run's NaN/Inf watch as ``mark``: None, or (first, code_gate,
code_up), first the watch's uint64 [1]; the kernel then marks the gate and up rows it reads as
two :func:`nonfinite_mark` launches over those rows would (strata_prefill.formats.nonfinite.mark);
strata_prefill.fast.cuda.products.swiglu_quantize takes it the same way.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from gguf import GGMLQuantizationType as QT

from strata_prefill.contract import numerics, qformats, quants, routing
from strata_prefill.contract.errors import InputError
from strata_prefill.contract.moe import SwigluOai

from strata_prefill.fast.cuda import runtime
from strata_prefill.fast.cuda.runtime import check, ptr
from strata_prefill.fast.tiles import checked_tile_rows, list_starts

__all__ = [
    "rmsnorm",
    "rope_table",
    "rope_neox",
    "add",
    "add_row_bias",
    "top_k",
    "DeviceRoutingTables",
    "routing_tables",
    "row_experts",
    "routed_row_tiles",
    "swiglu",
    "expert_bias_args",
    "glu_act",
    "combine",
    "sigmoid",
    "EMBED_TYPES",
    "embed",
    "nonfinite_mark",
]

_THREADS = 256
_MAX_GRID = 1 << 20


def _grid1(total: int, threads: int = _THREADS) -> tuple[int, int, int]:
    return (max(1, min(-(-int(total) // threads), _MAX_GRID)), 1, 1)


# --------------------------------------------------------------------------- norms, rope, add


def rmsnorm(dev, x, w, eps: float, out=None):
    """RMSNorm of every row of x along its last axis (strata_prefill.contract.numerics.rmsnorm).

    x: float32 [..., n] (rows = x.size / n: [T, n_embd] for the layer norms, [T*n_head, head_dim]
    or [T, n_head, head_dim] for the per-head Q/K norms); w: float32 [n]; eps rounded to float32
    once. Returns out, float32 with x's shape (out may be x)."""
    check(x, "rmsnorm x", np.float32)
    n = int(x.shape[-1])
    check(w, "rmsnorm w", np.float32, shape=(n,))
    out = dev.output(out, "rmsnorm out", x.shape, np.float32)
    rows = int(x.size) // n if n else 0
    if rows == 0:
        return out
    f = runtime.function("rmsnorm", "rmsnorm_rows", "PqPPqiiif")
    grid = (-(-rows // 8), 1, 1)
    dev.launch(f, "rmsnorm", grid, (256, 1, 1), ptr(x), n, ptr(w), ptr(out), n, rows, 1, n, np.float32(eps))
    return out


def rope_table(dev, n_pos: int, head_dim: int, base: float, scaling=None):
    """(cos, sin): float32 GPUArrays [n_pos, head_dim/2] of strata_prefill.contract.numerics.rope_table
    (computed on the host in float64, rounded once, uploaded on the stream; ``scaling`` a
    strata_prefill.formats.config.RopeScaling, None for none)."""
    cos, sin = numerics.rope_table(int(n_pos), int(head_dim), base, scaling)
    return dev.upload(cos), dev.upload(sin)


def rope_neox(dev, x, positions, cos, sin, out=None):
    """NEOX RoPE (strata_prefill.contract.numerics.rope_neox) of x float32 [T, n_heads, hd] at positions
    (int32 GPUArray [T], or a host int array: uploaded) with the table (cos, sin) float32
    [n_pos, hd/2] from :func:`rope_table` (positions < n_pos, not checked on the device).
    Returns out, float32 [T, n_heads, hd] (out may be x)."""
    check(x, "rope x", np.float32, ndim=3)
    T, H, hd = (int(s) for s in x.shape)
    if hd % 2:
        raise InputError(f"rope: head_dim must be even, got {hd}")
    check(cos, "rope cos", np.float32, shape=(None, hd // 2))
    check(sin, "rope sin", np.float32, shape=tuple(cos.shape))
    if not hasattr(positions, "gpudata"):
        p = np.asarray(positions)
        if p.size and (p.min() < 0 or p.max() >= cos.shape[0]):
            raise InputError(f"rope: positions outside the table's {cos.shape[0]} rows")
    pos = dev.upload_i32(positions, "rope positions")
    if tuple(pos.shape) != (T,):
        raise InputError(f"rope: {tuple(pos.shape)} positions for {T} tokens")
    out = dev.output(out, "rope out", x.shape, np.float32)
    total = T * H * (hd // 2)
    if total == 0:
        return out
    f = runtime.function("rope", "rope_neox", "PqPqPPPiii")
    dev.launch(f, "rope", _grid1(total), (_THREADS, 1, 1), ptr(x), H * hd, ptr(out), H * hd,
               ptr(pos), ptr(cos), ptr(sin), T, H, hd)
    return out


def add(dev, x, y, out=None):
    """out = x + y elementwise, float32 arrays of one shape (out may be x or y)."""
    check(x, "add x", np.float32)
    check(y, "add y", np.float32, shape=x.shape)
    out = dev.output(out, "add out", x.shape, np.float32)
    n = int(x.size)
    if n == 0:
        return out
    px, py, po = ptr(x), ptr(y), ptr(out)
    vec4 = int((px | py | po) % 16 == 0)
    f = runtime.function("add", "add_f32", "PPPqi")
    dev.launch(f, "add", _grid1(-(-n // 4) if vec4 else n), (_THREADS, 1, 1), px, py, po, n, vec4)
    return out


def add_row_bias(dev, y, b, out=None):
    """out = y + b on every row (strata_prefill.contract.dense.add_row_bias): y float32 [..., n], b
    float32 [n] (a dense product and its bias). Returns out with y's shape (out may be y)."""
    check(y, "row bias y", np.float32)
    n = int(y.shape[-1]) if y.ndim else 0
    check(b, "row bias b", np.float32, shape=(n,))
    out = dev.output(out, "row bias out", y.shape, np.float32)
    total = int(y.size)
    if total == 0:
        return out
    f = runtime.function("add", "add_row_bias_f32", "PPPqi")
    dev.launch(f, "add_row_bias", _grid1(total), (_THREADS, 1, 1), ptr(y), ptr(b), ptr(out), total, n)
    return out


# --------------------------------------------------------------------------- routing


def _router_launch(dev, kernel: str, sig: str, logits, k: int, ids, weights, *extra):
    """router.cu's `kernel` over logits [T, E], a warp a row, 4 rows a block, ROUTER_WARPS rows
    of E floats in shared memory (checked first); extra: its arguments after the row stride."""
    T, E = (int(s) for s in logits.shape)
    smem = 4 * 4 * E
    if smem > 48 * 1024:
        raise InputError(f"top_k: E={E} experts is more than router.cu's shared memory holds")
    ids = dev.output(ids, "top_k ids", (T, k), np.int32)
    weights = dev.output(weights, "top_k weights", (T, k), np.float32)
    if T == 0:
        return ids, weights
    f = runtime.function("router", kernel, sig)
    dev.launch(f, "router", (-(-T // 4), 1, 1), (128, 1, 1), ptr(logits), E, *extra, T, E, k,
               ptr(ids), ptr(weights), shared_size=smem)
    return ids, weights


def top_k(dev, logits, k: int, ids=None, weights=None, *, bias=None, gating: str = routing.SOFTMAX):
    """Router top-K (strata_prefill.contract.routing.top_k) of logits float32 [T, E]: softmax over E, the k
    largest probabilities (ties to the lower id), renormalized. k <= 32. gating
    "softmax_selected" (router_topk_selected): top-k on the logits plus ``bias`` (float32 [E] or
    None), then a softmax over the k selected.
    Returns (ids int32 [T, k] in rank order, weights float32 [T, k])."""
    check(logits, "top_k logits", np.float32, ndim=2)
    E = int(logits.shape[1])
    k = int(k)
    if not 1 <= k <= min(32, E):
        raise InputError(f"top_k: k must be in [1, min(32, E={E})], got {k}")
    if gating not in routing.GATINGS:
        raise InputError(f"top_k: gating must be one of {', '.join(routing.GATINGS)}, got {gating!r}")
    if bias is not None or gating != routing.SOFTMAX:
        return _top_k_selected(dev, logits, k, ids, weights, bias, gating)
    return _router_launch(dev, "router_topk", "PqiiiPP", logits, k, ids, weights)


def _top_k_selected(dev, logits, k, ids, weights, bias, gating):
    """router_topk_selected (gating softmax_selected, with or without a bias)."""
    E = int(logits.shape[1])
    if gating == routing.SOFTMAX:  # no architecture biases a softmax over every expert
        raise InputError("top_k: router.cu has no biased softmax over every expert (gating softmax_selected takes a bias)")
    if bias is not None:
        check(bias, "top_k bias", np.float32, shape=(E,))
    return _router_launch(dev, "router_topk_selected", "PqPiiiPP", logits, k, ids, weights,
                          0 if bias is None else ptr(bias))


class DeviceRoutingTables(NamedTuple):
    """strata_prefill.contract.routing.RoutingTables on the device (all int32 GPUArrays):
    cnt [E], off [E], slot [T*K], src [T*K], order [E] (experts with cnt > 0 in id order, then -1),
    n_order [1] (how many of order are experts)."""

    cnt: object
    off: object
    slot: object
    src: object
    order: object
    n_order: object


_rt_smem_set: dict = {}  # the dynamic shared memory the routing kernel is allowed (per process)


def routing_tables(dev, ids, n_expert: int, out: DeviceRoutingTables | None = None):
    """Routing tables (strata_prefill.contract.routing.routing_tables) of ids int32 [T, K] (expert ids in
    [0, n_expert)). One single-block launch. Returns a :class:`DeviceRoutingTables`."""
    check(ids, "routing ids", np.int32, ndim=2)
    T, K = (int(s) for s in ids.shape)
    E = int(n_expert)
    if E <= 0:
        raise InputError(f"routing_tables: n_expert must be positive, got {E}")
    shapes = ((E,), (E,), (T * K,), (T * K,), (E,), (1,))
    if out is None:
        out = DeviceRoutingTables(*(dev.empty(s, np.int32) for s in shapes))
    else:
        for a, s, name in zip(out, shapes, DeviceRoutingTables._fields):
            dev.output(a, f"routing {name}", s, np.int32)
    budget = 96 * 1024
    nw = max(1, min(32, budget // (4 * E) - 2))
    smem = (nw + 2) * E * 4
    if smem > 200 * 1024:
        raise InputError(f"routing_tables: E={E} experts is more than one block's shared memory holds")
    f = runtime.function("routing_tables", "routing_tables", "PiiiPPPPPP")
    if smem > 48 * 1024 and _rt_smem_set.get("bytes", 0) < smem:
        import pycuda.driver as cuda  # noqa: PLC0415

        f.set_attribute(cuda.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, smem)
        _rt_smem_set["bytes"] = smem
    dev.launch(f, "routing_tables", (1, 1, 1), (32 * nw, 1, 1), ptr(ids), T, K, E,
               *(ptr(a) for a in out), shared_size=smem)
    return out


def row_experts(dev, ids, slot, out=None):
    """The expert of each expert-sorted row (strata_prefill.contract.routing.row_experts): out[slot[i]] = ids[i],
    int32 [T*K], from ids int32 [T, K] and the routing tables' slot int32 [T*K]."""
    check(ids, "row_experts ids", np.int32, ndim=2)
    n = int(ids.size)
    check(slot, "row_experts slot", np.int32, shape=(n,))
    out = dev.output(out, "row_experts out", (n,), np.int32)
    if n:
        f = runtime.function("routing_tables", "row_experts", "PPqP")
        dev.launch(f, "row_experts", _grid1(n), (_THREADS, 1, 1), ptr(ids), ptr(slot), n, ptr(out))
    return out


_plans_on_device: dict = {}  # a device cut's plans (int32 [n, 4]), uploaded once a shape


def routed_row_tiles(dev, cnt, off, woff, plans, *, out=None, live=None):
    """The tile lists of a layer's tile-list MMQ launches cut on the device from the routing
    tables' cnt and off (int32 device [E]) and woff (int64 device [E]: each expert's weight byte
    offset, -1 where it has none here), one list per plan (strata_prefill.fast.tiles.ListPlan,
    in the order given), the one the counts choose cut, the others empty: (tiles int32 [sum of
    n_max, 4], live int32 [len(plans)]), strata_prefill.fast.tiles.routed_row_lists. One block.
    The plans are uploaded once per distinct tuple and kept for the process."""
    check(cnt, "routed_row_tiles cnt", np.int32, ndim=1)
    E = int(cnt.shape[0])
    check(off, "routed_row_tiles off", np.int32, shape=(E,))
    check(woff, "routed_row_tiles woff", np.int64, shape=(E,))
    plans = tuple(tuple(int(v) for v in p) for p in plans)
    if not plans:
        raise InputError("routed_row_tiles: no plan")
    for tile_rows, bound, n_max in plans:
        checked_tile_rows(tile_rows, "routed_row_tiles")
        if bound < 0 or n_max < 0:
            raise InputError(f"routed_row_tiles: a plan's bound and length must be >= 0, got {bound}, {n_max}")
    total = sum(p[2] for p in plans)
    out = dev.output(out, "routed_row_tiles out", (total, 4), np.int32)
    live = dev.output(live, "routed_row_tiles live", (len(plans),), np.int32)
    on_dev = _plans_on_device.get(plans)
    if on_dev is None:
        rows = np.array([(t, b, n, f) for (t, b, n), f in zip(plans, list_starts(plans))], np.int32)
        on_dev = _plans_on_device[plans] = runtime.to_device(rows, "routed_row_tiles plans")
    f = runtime.function("routing_tables", "routed_row_tiles", "PPPiPiPP")
    dev.launch(f, "routed_row_tiles", (1, 1, 1), (_THREADS, 1, 1), ptr(cnt), ptr(off), ptr(woff), E,
               int(on_dev), len(plans), ptr(out), ptr(live))
    return out, live


# --------------------------------------------------------------------------- MoE elementwise


def expert_bias_args(expert_bias, R: int, n: int, r0: int, what: str) -> tuple:
    """The (rexp, bg, bu, ldb) kernel arguments of an expert_bias (None, or (rexp int32 [R],
    gate bias float32 [E, n], up bias float32 [E, n])) for rows from r0: NULLs where None."""
    if expert_bias is None:
        return 0, 0, 0, n
    rexp, bg, bu = expert_bias
    check(rexp, f"{what} row experts", np.int32, shape=(R,))
    check(bg, f"{what} gate bias", np.float32, shape=(None, n))
    check(bu, f"{what} up bias", np.float32, shape=tuple(bg.shape))
    return ptr(rexp) + 4 * r0, ptr(bg), ptr(bu), n


def glu_act(act, what: str) -> SwigluOai | None:
    """act checked: None (SiLU) or a strata_prefill.contract.moe.SwigluOai."""
    if act is None or isinstance(act, SwigluOai):
        return act
    raise InputError(f"{what}: act must be None or a SwigluOai, got {act!r}")


def mark_args(mark) -> tuple:
    """The (first, code_gate, code_up) kernel arguments of a SwiGLU wrapper's mark (None, or
    (first uint64 [1], code_gate, code_up)): a NULL first where None (the kernel marks nothing)."""
    if mark is None:
        return 0, np.uint64(0), np.uint64(0)
    first, code_gate, code_up = mark
    check(first, "swiglu mark first", np.uint64, shape=(1,))
    return ptr(first), np.uint64(code_gate), np.uint64(code_up)


def swiglu(dev, g, u, out=None, *, r0: int = 0, r1: int | None = None, act=None, expert_bias=None, mark=None):
    """H = silu(g) * u (strata_prefill.contract.moe.swiglu) over rows r0 .. r1 (default all) of g, u float32
    [R, n]. Returns out float32 [r1 - r0, n] (out may be a GPUArray view of a larger buffer).
    act a strata_prefill.contract.moe.SwigluOai (swiglu_oai_rows): strata_prefill.contract.moe.swiglu_oai, after the expert
    biases where expert_bias is given (:func:`expert_bias_args`; strata_prefill.contract.moe.add_expert_bias).
    The biases need act (no architecture biases the plain SwiGLU). mark: the watch's mark of
    rows r0 .. r1 of g and u (the module's docstring)."""
    act = glu_act(act, "swiglu")
    if expert_bias is not None and act is None:
        raise InputError("swiglu: expert biases come with act=SwigluOai (swiglu_oai_rows)")
    check(g, "swiglu gate", np.float32, ndim=2)
    R, n = (int(s) for s in g.shape)
    check(u, "swiglu up", np.float32, shape=(R, n))
    r1 = R if r1 is None else int(r1)
    r0 = int(r0)
    if not 0 <= r0 <= r1 <= R:
        raise InputError(f"swiglu: rows {r0}..{r1} outside [0, {R}]")
    rows = r1 - r0
    out = dev.output(out, "swiglu out", (rows, n), np.float32)
    marks = mark_args(mark)
    if rows * n == 0:
        return out
    if act is not None:
        f = runtime.function("swiglu", "swiglu_oai_rows", "PqPqPqiiffPPPqPQQ")
        dev.launch(f, "swiglu", _grid1(rows * n), (_THREADS, 1, 1), ptr(g) + 4 * r0 * n, n,
                   ptr(u) + 4 * r0 * n, n, ptr(out), n, rows, n, np.float32(act.alpha), np.float32(act.limit),
                   *expert_bias_args(expert_bias, R, n, r0, "swiglu"), *marks)
        return out
    f = runtime.function("swiglu", "swiglu_rows", "PqPqPqiiPQQ")
    dev.launch(f, "swiglu", _grid1(rows * n), (_THREADS, 1, 1), ptr(g) + 4 * r0 * n, n,
               ptr(u) + 4 * r0 * n, n, ptr(out), n, rows, n, *marks)
    return out


#: combine_rows_vec's K limit (combine.cu COMBINE_MAXK)
COMBINE_MAXK = 64


def combine(dev, x, weights, slot, y, shared=None, out=None, form: str = "auto", *, down_bias=None):
    """x + (sum_k w[t,k] * y[slot[t*K+k]] in rank order, then + g_t * ysh[t]) (strata_prefill.contract.moe.combine).

    x float32 [T, D]; weights float32 [T, K]; slot int32 [T*K]; y float32 [R, D] expert-sorted
    rows; shared None or (g float32 [T] (the sigmoid, see :func:`sigmoid`), ysh float32 [T, D]).
    Returns out float32 [T, D] (out may be x). form: "row" (combine_rows_vec: a CTA a token,
    float4), "element" (combine_rows: a thread an element) or "auto" (row where D % 4 == 0, K
    <= COMBINE_MAXK and the buffers are 16-byte aligned, else element); the same bytes.
    down_bias: None, or (bias float32 [E, D], ids int32 [T, K], the router's): each routed
    output plus its expert's bias row first (combine_rows[_vec]_bias)."""
    check(x, "combine x", np.float32, ndim=2)
    T, D = (int(s) for s in x.shape)
    check(weights, "combine weights", np.float32, shape=(T, None))
    K = int(weights.shape[1])
    check(slot, "combine slot", np.int32, shape=(T * K,))
    check(y, "combine y", np.float32, shape=(None, D))
    g_ptr, ysh_ptr = 0, 0
    if shared is not None:
        g, ysh = shared
        if int(g.size) != T or np.dtype(g.dtype) != np.float32:
            raise InputError(f"combine: shared gate must be float32 with {T} values")
        check(ysh, "combine ysh", np.float32, shape=(T, D))
        g_ptr, ysh_ptr = ptr(g), ptr(ysh)
    bias_args, bias_ptrs = (), ()
    if down_bias is not None:
        bd, ids = down_bias
        check(bd, "combine down bias", np.float32, shape=(None, D))
        check(ids, "combine ids", np.int32, shape=(T, K))
        bias_args, bias_ptrs = (ptr(ids), ptr(bd), D), (ptr(bd),)
    out = dev.output(out, "combine out", (T, D), np.float32)
    if form not in ("auto", "row", "element"):  # before the empty early return: a bad form is always an error
        raise InputError(f"combine: form must be auto, row or element, got {form!r}")
    if T * D == 0:
        return out
    row_ok = D % 4 == 0 and K <= COMBINE_MAXK and all(p % 16 == 0 for p in (ptr(x), ptr(y), ysh_ptr, ptr(out),
                                                                             *bias_ptrs))
    if form == "row" and not row_ok:
        raise InputError(f"combine: the row form needs D % 4 == 0, K <= {COMBINE_MAXK} and 16-byte aligned rows")
    args = (ptr(x), D, ptr(weights), ptr(slot), K, ptr(y), D, g_ptr, ysh_ptr, D, ptr(out), D, T, D) + bias_args
    vec = form != "element" and row_ok
    grid = (min(T, 1 << 20), 1, 1) if vec else _grid1(T * D)
    block = (128, 1, 1) if vec else (_THREADS, 1, 1)
    if down_bias is not None:
        if vec:
            f = runtime.function("combine", "combine_rows_vec_bias", "PqPPiPqPPqPqiiPPq")
        else:
            f = runtime.function("combine", "combine_rows_bias", "PqPPiPqPPqPqiiPPq")
    elif vec:
        f = runtime.function("combine", "combine_rows_vec", "PqPPiPqPPqPqii")
    else:
        f = runtime.function("combine", "combine_rows", "PqPPiPqPPqPqii")
    dev.launch(f, "combine", grid, block, *args)
    return out


def sigmoid(dev, x, out=None):
    """strata_prefill.contract.numerics.sigmoid of every value of x (float32, any shape, e.g. the [T, 1] shared
    expert gate logits). Returns out float32 [x.size]."""
    check(x, "sigmoid x", np.float32)
    n = int(x.size)
    out = dev.output(out, "sigmoid out", (n,), np.float32)
    if n == 0:
        return out
    f = runtime.function("combine", "sigmoid_vec", "PqPq")
    dev.launch(f, "sigmoid", _grid1(n), (_THREADS, 1, 1), ptr(x), 1, ptr(out), n)
    return out


# --------------------------------------------------------------------------- embedding


#: the token_embd types embed.cu dequantizes on the device: the registry's formats with an
#: embed_kernel (contract/qformat_base.py); a pack whose token_embd is of another type has its rows
#: dequantized on the host (fast/cuda/backend.py embed)
EMBED_TYPES = tuple(f.qtype for f in qformats.formats() if f.embed_kernel)


def embed(dev, qtype, ids, table, n_embd: int, out=None):
    """Rows ``ids`` (int32 GPUArray [T], or a host int array: uploaded) of a token_embd matrix of
    type ``qtype`` (one of EMBED_TYPES) dequantized (strata_prefill.contract.quants.dequantize):
    table is a device buffer (GPUArray or address, 2-byte aligned) of rows of n_embd values
    (quants.row_bytes); ids in range (checked here when they and the table's size are on the
    host side; not on the device). Returns out float32 [T, n_embd]."""
    if qtype not in EMBED_TYPES:
        raise InputError(f"embed: no device kernel for {getattr(qtype, 'name', qtype)} rows "
                         f"(it has one for {', '.join(t.name for t in EMBED_TYPES)})")
    qtype = QT(int(qtype))
    n = int(n_embd)
    vpb, _bs = quants.block_size(qtype)
    if n <= 0 or n % vpb:
        raise InputError(f"embed: n_embd {n} is not a multiple of {qtype.name}'s {vpb}-value block")
    rb = quants.row_bytes(qtype, n)
    if ptr(table) % 2:
        raise InputError("embed: the table must be 2-byte aligned")
    if hasattr(table, "gpudata"):
        check(table, "embed table", np.uint8)
        if int(table.size) % rb:
            raise InputError(f"embed: table of {table.size} bytes is not whole rows of {rb}")
    if not hasattr(ids, "gpudata") and hasattr(table, "gpudata"):
        i = np.asarray(ids)
        n_vocab = int(table.size) // rb
        if i.size and (i.min() < 0 or i.max() >= n_vocab):
            raise InputError(f"token id outside [0, {n_vocab})")
    idv = dev.upload_i32(ids, "embed ids")
    T = int(idv.size)
    out = dev.output(out, "embed out", (T, n), np.float32)
    if T == 0:
        return out
    f = runtime.function("embed", qformats.lookup(qtype).embed_kernel, "PiPqiPq")
    dev.launch(f, "embed", _grid1(T * n), (_THREADS, 1, 1), ptr(idv), T, ptr(table), rb, n, ptr(out), n)
    return out


# --------------------------------------------------------------------------- the NaN/Inf watch


def nonfinite_mark(dev, x, first, code: int) -> None:
    """strata_prefill.formats.nonfinite.mark on the device: first (uint64 [1]) becomes code where x (float32,
    any shape) holds a NaN or an Inf and code is below it. Returns at once; the host reads
    first when the run ends."""
    check(x, "nonfinite_mark x", np.float32)
    check(first, "nonfinite_mark first", np.uint64, shape=(1,))
    n = int(x.size)
    if n == 0:
        return
    vec4 = int(int(x.gpudata) % 16 == 0)
    f = runtime.function("nonfinite", "nonfinite_mark", "PqPQi")
    grid = (max(1, min(-(-n // (_THREADS * (4 if vec4 else 1))), 4 * runtime.multiprocessor_count())), 1, 1)
    dev.launch(f, "nonfinite_mark", grid, (_THREADS, 1, 1), ptr(x), n, ptr(first), np.uint64(code), vec4)
