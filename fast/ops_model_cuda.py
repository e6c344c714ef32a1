"""Thin wrappers over the model kernels of fast/kernels (everything but q8_1 and MMQ, which are in
fast/ops_cuda.py): ``pycuda.gpuarray.GPUArray`` in, ``GPUArray`` out.

Each wrapper checks shapes and dtypes on the host, allocates its output when ``out`` is None,
launches one kernel on ``stream`` (a ``pycuda.driver.Stream``; None = the default stream) and
returns at once. Every launch is counted in :data:`counters` ("launches" and one entry per
kernel). Arrays must be C-contiguous float32 / int32 / int8 / uint8 as documented.

Kernels and the NumPy functions they match bit for bit (docs/numerics.md):

=====================  =====================================  ===========================
wrapper                NumPy definition                       fast/kernels/
=====================  =====================================  ===========================
rmsnorm                strata.numerics.rmsnorm                rmsnorm.cu
rope_neox              strata.numerics.rope_neox              rope.cu
kv_write               strata.attention.KVCache.write         kv_cache.cu
attend                 strata.attention.attend                attention.cu, attention_mma.cu
top_k                  strata.routing.top_k                   router.cu
routing_tables         strata.routing.routing_tables          routing_tables.cu
swiglu                 strata.moe.swiglu                      swiglu.cu
combine                strata.moe.combine                     combine.cu
sigmoid                strata.numerics.sigmoid                combine.cu
embed_q8_0             strata.quants.dequantize (Q8_0 rows)   embed.cu
gather_native_group    strata.moe.group_buffers               gather_group.cu
gather_native_one      strata.moe.group_buffers               gather_group.cu
add                    x + y (float32)                        add.cu
=====================  =====================================  ===========================

Importing this module needs neither PyCUDA nor a GPU; the first launch does.
"""
from __future__ import annotations

import collections
from typing import NamedTuple

import numpy as np

from strata import attention as _attention
from strata import numerics
from strata.errors import InputError

from fast.cuda import runtime

__all__ = [
    "counters",
    "reset_counters",
    "rmsnorm",
    "rope_table",
    "rope_neox",
    "kv_write",
    "attend",
    "DeviceKVCache",
    "top_k",
    "DeviceRoutingTables",
    "routing_tables",
    "swiglu",
    "combine",
    "sigmoid",
    "embed_q8_0",
    "gather_native_group",
    "gather_native_one",
    "group_buffer_bytes",
    "add",
    "GATHER_MAX",
    "KEY_BLOCK",
    "ATTEND_HEAD_DIMS",
    "ATTEND_VARIANTS",
]

#: experts one gather_native_group launch takes
GATHER_MAX = 16
#: keys per online-softmax step; the cache capacity is a multiple of it
KEY_BLOCK = _attention.KEY_BLOCK
#: head sizes attention.cu is instantiated for
ATTEND_HEAD_DIMS = (64, 128, 256)

_THREADS = 256
_MAX_GRID = 1 << 20

#: launch counters: "launches" (all kernels) and one entry per kernel name
counters: collections.Counter = collections.Counter()


def reset_counters() -> None:
    counters.clear()


def _count(name: str) -> None:
    counters["launches"] += 1
    counters[name] += 1


# --------------------------------------------------------------------------- plumbing

_funcs: dict = {}


def _func(module: str, name: str, fmt: str):
    """The prepared kernel `name` of fast/kernels/<module>.cu (compiled once)."""
    key = (module, name)
    f = _funcs.get(key)
    if f is None:
        f = runtime.load_module(module).get_function(name)
        f.prepare(fmt)
        _funcs[key] = f
    return f


def _gpuarray():
    runtime.context()
    from pycuda import gpuarray  # noqa: PLC0415

    return gpuarray


def _ptr(buf) -> int:
    """Device address of a GPUArray, DeviceAllocation, __cuda_array_interface__ object or int."""
    if buf is None:
        raise InputError("a device buffer is None")
    if isinstance(buf, (int, np.integer)):
        return int(buf)
    gpudata = getattr(buf, "gpudata", None)
    if gpudata is not None:
        return int(gpudata)
    cai = getattr(buf, "__cuda_array_interface__", None)
    if cai:
        return int(cai["data"][0])
    return int(buf)


def _arr(a, what: str, dtype, shape=None, ndim=None):
    """Check a GPUArray argument: dtype, C-contiguity, and shape (None entries are free)."""
    if not hasattr(a, "gpudata") or not hasattr(a, "shape"):
        raise InputError(f"{what} must be a pycuda GPUArray, got {type(a).__name__}")
    if np.dtype(a.dtype) != np.dtype(dtype):
        raise InputError(f"{what} must be {np.dtype(dtype).name}, got {np.dtype(a.dtype).name}")
    if not a.flags.c_contiguous:
        raise InputError(f"{what} must be C-contiguous")
    if ndim is not None and len(a.shape) != ndim:
        raise InputError(f"{what} must have {ndim} dimensions, got shape {tuple(a.shape)}")
    if shape is not None:
        if len(a.shape) != len(shape) or any(s is not None and int(s) != int(d) for s, d in zip(shape, a.shape)):
            raise InputError(f"{what} has shape {tuple(a.shape)}, expected {tuple(shape)}")
    return a


def _out(out, what: str, shape, dtype):
    shape = tuple(int(s) for s in shape)
    if out is None:
        return _gpuarray().empty(shape, dtype)
    _arr(out, what, dtype)
    if tuple(out.shape) != shape:
        raise InputError(f"{what} has shape {tuple(out.shape)}, expected {shape}")
    return out


def _grid1(total: int, threads: int = _THREADS) -> tuple[int, int, int]:
    return (max(1, min(-(-int(total) // threads), _MAX_GRID)), 1, 1)


def _upload_i32(a, what: str):
    """A host int array as an int32 GPUArray (synchronous copy), or a GPUArray as is."""
    if hasattr(a, "gpudata"):
        return _arr(a, what, np.int32)
    return _gpuarray().to_gpu(np.ascontiguousarray(np.asarray(a), dtype=np.int32))


# --------------------------------------------------------------------------- norms, rope, add


def rmsnorm(x, w, eps: float, out=None, *, stream=None):
    """RMSNorm of every row of x along its last axis (strata.numerics.rmsnorm).

    x: float32 [..., n] (rows = x.size / n: [T, n_embd] for the layer norms, [T*n_head, head_dim]
    or [T, n_head, head_dim] for the per-head Q/K norms); w: float32 [n]; eps rounded to float32
    once. Returns out, float32 with x's shape (out may be x)."""
    _arr(x, "rmsnorm x", np.float32)
    n = int(x.shape[-1])
    _arr(w, "rmsnorm w", np.float32, shape=(n,))
    out = _out(out, "rmsnorm out", x.shape, np.float32)
    rows = int(x.size) // n if n else 0
    if rows == 0:
        return out
    f = _func("rmsnorm", "rmsnorm_rows", "PqPPqiiif")
    grid = (-(-rows // 8), 1, 1)
    f.prepared_async_call(grid, (256, 1, 1), stream, _ptr(x), n, _ptr(w), _ptr(out), n, rows, 1, n,
                          np.float32(eps))
    _count("rmsnorm")
    return out


def rope_table(n_pos: int, head_dim: int, base: float):
    """(cos, sin): float32 GPUArrays [n_pos, head_dim/2] of strata.numerics.rope_table
    (computed on the host in float64, rounded once, uploaded synchronously)."""
    cos, sin = numerics.rope_table(int(n_pos), int(head_dim), base)
    ga = _gpuarray()
    return ga.to_gpu(np.ascontiguousarray(cos)), ga.to_gpu(np.ascontiguousarray(sin))


def rope_neox(x, positions, cos, sin, out=None, *, stream=None):
    """NEOX RoPE (strata.numerics.rope_neox) of x float32 [T, n_heads, hd] at positions
    (int32 GPUArray [T], or a host int array: uploaded) with the table (cos, sin) float32
    [n_pos, hd/2] from :func:`rope_table` (positions < n_pos, not checked on the device).
    Returns out, float32 [T, n_heads, hd] (out may be x)."""
    _arr(x, "rope x", np.float32, ndim=3)
    T, H, hd = (int(s) for s in x.shape)
    if hd % 2:
        raise InputError(f"rope: head_dim must be even, got {hd}")
    _arr(cos, "rope cos", np.float32, shape=(None, hd // 2))
    _arr(sin, "rope sin", np.float32, shape=tuple(cos.shape))
    if not hasattr(positions, "gpudata"):
        p = np.asarray(positions)
        if p.size and (p.min() < 0 or p.max() >= cos.shape[0]):
            raise InputError(f"rope: positions outside the table's {cos.shape[0]} rows")
    pos = _upload_i32(positions, "rope positions")
    if tuple(pos.shape) != (T,):
        raise InputError(f"rope: {tuple(pos.shape)} positions for {T} tokens")
    out = _out(out, "rope out", x.shape, np.float32)
    total = T * H * (hd // 2)
    if total == 0:
        return out
    f = _func("rope", "rope_neox", "PqPqPPPiii")
    f.prepared_async_call(_grid1(total), (_THREADS, 1, 1), stream, _ptr(x), H * hd, _ptr(out), H * hd,
                          _ptr(pos), _ptr(cos), _ptr(sin), T, H, hd)
    _count("rope")
    return out


def add(x, y, out=None, *, stream=None):
    """out = x + y elementwise, float32 arrays of one shape (out may be x or y)."""
    _arr(x, "add x", np.float32)
    _arr(y, "add y", np.float32, shape=x.shape)
    out = _out(out, "add out", x.shape, np.float32)
    n = int(x.size)
    if n == 0:
        return out
    px, py, po = _ptr(x), _ptr(y), _ptr(out)
    vec4 = int((px | py | po) % 16 == 0)
    f = _func("add", "add_f32", "PPPqi")
    f.prepared_async_call(_grid1(-(-n // 4) if vec4 else n), (_THREADS, 1, 1), stream, px, py, po, n, vec4)
    _count("add")
    return out


# --------------------------------------------------------------------------- KV cache, attention


def _cache_shapes(k_codes, k_scale, v_codes, v_scale):
    _arr(k_codes, "k_codes", np.int8, ndim=3)
    n_kv, cap, hd = (int(s) for s in k_codes.shape)
    if hd % 32:
        raise InputError(f"head_dim {hd} is not a multiple of 32")
    _arr(k_scale, "k_scale", np.float32, shape=(n_kv, cap, hd // 32))
    _arr(v_codes, "v_codes", np.int8, shape=(n_kv, cap, hd))
    _arr(v_scale, "v_scale", np.float32, shape=(n_kv, cap))
    for a, what in ((k_codes, "k_codes"), (v_codes, "v_codes")):
        if _ptr(a) % 16:
            raise InputError(f"{what} must be 16-byte aligned")
    return n_kv, cap, hd


def kv_write(k, v, positions, k_codes, k_scale, v_codes, v_scale, *, stream=None) -> None:
    """Quantize and store k, v float32 [T, n_kv, hd] at absolute positions (int32 GPUArray [T],
    or a host int array: checked against the capacity and uploaded) into one layer's cache:
    k_codes int8 [n_kv, cap, hd], k_scale float32 [n_kv, cap, hd/32], v_codes int8
    [n_kv, cap, hd], v_scale float32 [n_kv, cap] (strata.attention.KVCache.write).
    Positions must be distinct and < cap."""
    n_kv, cap, hd = _cache_shapes(k_codes, k_scale, v_codes, v_scale)
    _arr(k, "kv_write k", np.float32, shape=(None, n_kv, hd))
    T = int(k.shape[0])
    _arr(v, "kv_write v", np.float32, shape=(T, n_kv, hd))
    if hd > 256:
        raise InputError(f"kv_write supports head_dim up to 256, got {hd}")
    if not hasattr(positions, "gpudata"):
        p = np.asarray(positions)
        if p.size and (p.min() < 0 or p.max() >= cap):
            raise InputError(f"kv_write: positions outside the cache capacity {cap}")
    pos = _upload_i32(positions, "kv_write positions")
    if tuple(pos.shape) != (T,):
        raise InputError(f"kv_write: {tuple(pos.shape)} positions for {T} tokens")
    if T == 0:
        return
    f = _func("kv_cache", "kv_write", "PqPqPiiiiPPPP")
    grid = (-(-(T * n_kv) // 8), 1, 1)
    f.prepared_async_call(grid, (256, 1, 1), stream, _ptr(k), n_kv * hd, _ptr(v), n_kv * hd, _ptr(pos),
                          T, n_kv, hd, cap, _ptr(k_codes), _ptr(k_scale), _ptr(v_codes), _ptr(v_scale))
    _count("kv_write")


_ATT_TILE = 32  # ATT_WARPS * ATT_QPW in attention.cu
_SPLIT_WARPS = 8  # SPL_WARPS in attention_mma.cu (the merge runs MERGE_G = 4 threads per dim)

#: attention kernels, all bit-exact to strata.attention.attend:
#: "dp4a"  attention.cu: one CTA per (32 queries, head), dp4a, key blocks in sequence (the port);
#: "mma"   attention_mma.cu: one CTA per (64 queries, head), int8 tensor cores (hd 64, 128);
#: "split" attention_mma.cu: split-K over key blocks in three launches (scores and block maxima,
#:         per-block P.V, the ordered merge), for few queries (decode);
#: "auto"  split for T <= ATTEND_SPLIT_MAX_T, else mma (dp4a where mma has no instance).
ATTEND_VARIANTS = ("dp4a", "mma", "split", "auto")
#: the variant attend() runs when none is asked for
ATTEND_VARIANT = "auto"
#: the most queries "auto" sends to the split-K kernels
ATTEND_SPLIT_MAX_T = 4
#: head sizes the mma variant is instantiated for
ATTEND_MMA_HEAD_DIMS = (64, 128)
#: attention_mma.cu tile configuration: MMA_WARPS (warps of 16 queries per CTA; 4 when absent),
#: MMA_MINB (__launch_bounds__ minimum CTAs per SM, default 1)
ATTEND_MMA_CONFIG: dict = {"MMA_WARPS": 8}


def _mma_func(name: str, fmt: str):
    """The prepared kernel `name` of attention_mma.cu under ATTEND_MMA_CONFIG."""
    key = ("attention_mma", name, tuple(sorted(ATTEND_MMA_CONFIG.items())))
    f = _funcs.get(key)
    if f is None:
        f = runtime.load_module("attention_mma", dict(ATTEND_MMA_CONFIG)).get_function(name)
        f.prepare(fmt)
        _funcs[key] = f
    return f

# split-K scratch, grown on demand; kernels on one stream use it in turn
_split_scratch: dict = {"buf": None, "nbytes": 0}


def _split_buffer(nbytes: int):
    if _split_scratch["nbytes"] < nbytes:
        _split_scratch["buf"] = None
        runtime.synchronize()  # an earlier launch may still read the old buffer
        n = max(int(nbytes), 2 * int(_split_scratch["nbytes"]))
        _split_scratch["buf"] = _gpuarray().empty((n,), np.uint8)
        _split_scratch["nbytes"] = n
    return _split_scratch["buf"]


def _attend_variant(variant, T: int, hd: int) -> str:
    v = ATTEND_VARIANT if variant is None else variant
    if v not in ATTEND_VARIANTS:
        raise InputError(f"attend: unknown variant {v!r} (one of {ATTEND_VARIANTS})")
    if v == "auto":
        if T <= ATTEND_SPLIT_MAX_T:
            return "split"
        return "mma" if hd in ATTEND_MMA_HEAD_DIMS else "dp4a"
    if v == "mma" and hd not in ATTEND_MMA_HEAD_DIMS:
        raise InputError(f"attend: the mma variant is built for head_dim in {ATTEND_MMA_HEAD_DIMS}, got {hd}")
    return v


def attend(q, positions, k_codes, k_scale, v_codes, v_scale, out=None, *, stream=None, variant=None,
           max_pos=None):
    """Causal attention (strata.attention.attend) of q float32 [T, n_head, hd] (after norm and
    RoPE) at absolute positions (int32 GPUArray [T], or a host int array: checked and uploaded)
    over one layer's cache (see :func:`kv_write`; keys 0..position of each query must be
    written, and position < cap). GQA: head h reads KV head h // (n_head // n_kv).
    hd in (64, 128, 256). ``variant`` picks the kernel (:data:`ATTEND_VARIANTS`; None =
    :data:`ATTEND_VARIANT`); ``max_pos`` (the largest position) sizes the split-K grid when the
    positions are a GPUArray (else the capacity does). Returns out, float32 [T, n_head, hd]."""
    n_kv, cap, hd = _cache_shapes(k_codes, k_scale, v_codes, v_scale)
    _arr(q, "attend q", np.float32, shape=(None, None, hd))
    T, H = int(q.shape[0]), int(q.shape[1])
    if hd not in ATTEND_HEAD_DIMS:
        raise InputError(f"attention.cu is built for head_dim in {ATTEND_HEAD_DIMS}, got {hd}")
    if H % n_kv:
        raise InputError(f"n_head {H} is not a multiple of n_head_kv {n_kv}")
    if not hasattr(positions, "gpudata"):
        p = np.asarray(positions)
        if p.size and (p.min() < 0 or p.max() >= cap):
            raise InputError(f"attend: positions outside the cache capacity {cap}")
        if p.size:
            max_pos = int(p.max())
    pos = _upload_i32(positions, "attend positions")
    if tuple(pos.shape) != (T,):
        raise InputError(f"attend: {tuple(pos.shape)} positions for {T} tokens")
    out = _out(out, "attend out", (T, H, hd), np.float32)
    if T == 0 or H == 0:
        return out
    v = _attend_variant(variant, T, hd)
    kq = np.float32(_attention.kq_scale(hd))
    if v == "dp4a":
        f = _func("attention", f"attend_hd{hd}", "PqPiiPPPPifPq")
        grid = (-(-T // _ATT_TILE), H, 1)
        f.prepared_async_call(grid, (256, 1, 1), stream, _ptr(q), H * hd, _ptr(pos), T, H // n_kv,
                              _ptr(k_codes), _ptr(k_scale), _ptr(v_codes), _ptr(v_scale), cap,
                              kq, _ptr(out), H * hd)
    elif v == "mma":
        f = _mma_func(f"attend_mma_hd{hd}", "PqPiiPPPPifPq")
        warps = int(ATTEND_MMA_CONFIG.get("MMA_WARPS", 4))
        grid = (-(-T // (16 * warps)), H, 1)
        f.prepared_async_call(grid, (32 * warps, 1, 1), stream, _ptr(q), H * hd, _ptr(pos), T,
                              H // n_kv, _ptr(k_codes), _ptr(k_scale), _ptr(v_codes), _ptr(v_scale), cap,
                              kq, _ptr(out), H * hd)
    else:  # split
        top = cap - 1 if max_pos is None else min(int(max_pos), cap - 1)
        nblk = top // KEY_BLOCK + 1
        U = T * H
        sizes = (U * nblk * KEY_BLOCK, U * nblk, U * nblk * hd, U * nblk, U * nblk)  # S MC OB LS AL
        buf = _split_buffer(4 * sum(sizes))
        base = _ptr(buf)
        S = base
        MC = S + 4 * sizes[0]
        OB = MC + 4 * sizes[1]
        LS = OB + 4 * sizes[2]
        AL = LS + 4 * sizes[3]
        f1 = _mma_func(f"attend_split_scores_hd{hd}", "PqPiiiPPifiPP")
        f1.prepared_async_call((nblk, n_kv, 1), (32 * _SPLIT_WARPS, 1, 1), stream, _ptr(q), H * hd, _ptr(pos),
                               T, H, H // n_kv, _ptr(k_codes), _ptr(k_scale), cap, kq, nblk, S, MC)
        f2 = _mma_func(f"attend_split_pv_hd{hd}", "PiiiPPiiPPPPP")
        f2.prepared_async_call((nblk, n_kv, 1), (32 * _SPLIT_WARPS, 1, 1), stream, _ptr(pos), T, H, H // n_kv,
                               _ptr(v_codes), _ptr(v_scale), cap, nblk, S, MC, OB, LS, AL)
        f3 = _mma_func(f"attend_split_merge_hd{hd}", "PiiPPPPq")
        f3.prepared_async_call((T, H, 1), (4 * hd, 1, 1), stream, _ptr(pos), H, nblk, OB, LS, AL, _ptr(out),
                               H * hd)
        counters["launches"] += 2
    _count("attention")
    return out


class DeviceKVCache:
    """The int8 KV cache on the device, laid out as strata.attention.KVCache: per layer
    ``k_codes[l]`` int8 [n_kv, capacity, hd], ``k_scale[l]`` float32 [n_kv, capacity, hd/32],
    ``v_codes[l]`` int8 [n_kv, capacity, hd], ``v_scale[l]`` float32 [n_kv, capacity].
    Zero-initialized; the capacity is a whole number of 64-key blocks and grows (doubling, with a
    device copy of what is there) when a write needs more."""

    def __init__(self, n_layer: int, n_head_kv: int, head_dim: int, capacity: int = 4 * KEY_BLOCK):
        self.n_layer, self.n_head_kv, self.head_dim = int(n_layer), int(n_head_kv), int(head_dim)
        self.capacity = 0
        self.k_codes: list = []
        self.k_scale: list = []
        self.v_codes: list = []
        self.v_scale: list = []
        self._grow(-(-int(capacity) // KEY_BLOCK) * KEY_BLOCK)

    def _grow(self, capacity: int) -> None:
        ga = _gpuarray()
        import pycuda.driver as cuda  # noqa: PLC0415

        hkv, hd, old = self.n_head_kv, self.head_dim, self.capacity
        spec = ((np.int8, hd), (np.float32, hd // 32), (np.int8, hd), (np.float32, None))
        names = ("k_codes", "k_scale", "v_codes", "v_scale")
        for name, (dt, last) in zip(names, spec):
            arrs = getattr(self, name)
            new_list = []
            for layer in range(self.n_layer):
                shape = (hkv, capacity) if last is None else (hkv, capacity, last)
                new = ga.zeros(shape, dt)
                if old:
                    src = arrs[layer]
                    row = np.dtype(dt).itemsize * (1 if last is None else last)
                    runtime.synchronize()
                    for h in range(hkv):
                        cuda.memcpy_dtod(int(new.gpudata) + h * capacity * row,
                                         int(src.gpudata) + h * old * row, old * row)
                new_list.append(new)
            setattr(self, name, new_list)
        runtime.synchronize()
        self.capacity = capacity

    def ensure(self, n_keys: int) -> None:
        """Capacity for keys 0 .. n_keys-1, in whole key blocks (synchronous when it grows)."""
        need = -(-int(n_keys) // KEY_BLOCK) * KEY_BLOCK
        if need > self.capacity:
            self._grow(max(need, 2 * self.capacity))

    def layer(self, layer: int):
        """(k_codes, k_scale, v_codes, v_scale) of one layer."""
        return self.k_codes[layer], self.k_scale[layer], self.v_codes[layer], self.v_scale[layer]

    def write(self, layer: int, positions, k, v, *, positions_dev=None, stream=None) -> None:
        """Store k, v float32 [T, n_kv, hd] at positions (host int array; ``positions_dev`` an
        int32 GPUArray copy of it to skip the upload)."""
        p = np.asarray(positions)
        if p.size:
            self.ensure(int(p.max()) + 1)
        kv_write(k, v, p if positions_dev is None else positions_dev, *self.layer(layer), stream=stream)

    def attend(self, layer: int, q, positions, *, positions_dev=None, out=None, stream=None, variant=None):
        """Causal attention of q float32 [T, n_head, hd] at positions (host int array)."""
        p = np.asarray(positions)
        if p.size and int(p.max()) >= self.capacity:
            raise InputError(f"attend: position {int(p.max())} past the cache capacity {self.capacity}")
        return attend(q, p if positions_dev is None else positions_dev, *self.layer(layer), out=out,
                      stream=stream, variant=variant, max_pos=int(p.max()) if p.size else None)


# --------------------------------------------------------------------------- routing


def top_k(logits, k: int, ids=None, weights=None, *, stream=None):
    """Router top-K (strata.routing.top_k) of logits float32 [T, E]: softmax over E, the k
    largest probabilities (ties to the lower id), renormalized. k <= 32.
    Returns (ids int32 [T, k] in rank order, weights float32 [T, k])."""
    _arr(logits, "top_k logits", np.float32, ndim=2)
    T, E = (int(s) for s in logits.shape)
    k = int(k)
    if not 1 <= k <= min(32, E):
        raise InputError(f"top_k: k must be in [1, min(32, E={E})], got {k}")
    smem = 4 * 4 * E  # ROUTER_WARPS rows of E floats
    if smem > 48 * 1024:
        raise InputError(f"top_k: E={E} experts is more than router.cu's shared memory holds")
    ids = _out(ids, "top_k ids", (T, k), np.int32)
    weights = _out(weights, "top_k weights", (T, k), np.float32)
    if T == 0:
        return ids, weights
    f = _func("router", "router_topk", "PqiiiPP")
    f.prepared_async_call((-(-T // 4), 1, 1), (128, 1, 1), stream, _ptr(logits), E, T, E, k,
                          _ptr(ids), _ptr(weights), shared_size=smem)
    _count("router")
    return ids, weights


class DeviceRoutingTables(NamedTuple):
    """strata.routing.RoutingTables on the device (all int32 GPUArrays):
    cnt [E], off [E], slot [T*K], src [T*K], order [E] (experts with cnt > 0 in id order, then -1),
    n_order [1] (how many of order are experts)."""

    cnt: object
    off: object
    slot: object
    src: object
    order: object
    n_order: object


_rt_smem_set: dict = {}


def routing_tables(ids, n_expert: int, out: DeviceRoutingTables | None = None, *, stream=None):
    """Routing tables (strata.routing.routing_tables) of ids int32 [T, K] (expert ids in
    [0, n_expert)). One single-block launch. Returns a :class:`DeviceRoutingTables`."""
    _arr(ids, "routing ids", np.int32, ndim=2)
    T, K = (int(s) for s in ids.shape)
    E = int(n_expert)
    if E <= 0:
        raise InputError(f"routing_tables: n_expert must be positive, got {E}")
    shapes = ((E,), (E,), (T * K,), (T * K,), (E,), (1,))
    if out is None:
        ga = _gpuarray()
        out = DeviceRoutingTables(*(ga.empty(s, np.int32) for s in shapes))
    else:
        for a, s, name in zip(out, shapes, DeviceRoutingTables._fields):
            _out(a, f"routing {name}", s, np.int32)
    budget = 96 * 1024
    nw = max(1, min(32, budget // (4 * E) - 2))
    smem = (nw + 2) * E * 4
    if smem > 200 * 1024:
        raise InputError(f"routing_tables: E={E} experts is more than one block's shared memory holds")
    f = _func("routing_tables", "routing_tables", "PiiiPPPPPP")
    if smem > 48 * 1024 and _rt_smem_set.get("bytes", 0) < smem:
        import pycuda.driver as cuda  # noqa: PLC0415

        f.set_attribute(cuda.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, smem)
        _rt_smem_set["bytes"] = smem
    f.prepared_async_call((1, 1, 1), (32 * nw, 1, 1), stream, _ptr(ids), T, K, E,
                          *(_ptr(a) for a in out), shared_size=smem)
    _count("routing_tables")
    return out


# --------------------------------------------------------------------------- MoE elementwise


def swiglu(g, u, out=None, *, r0: int = 0, r1: int | None = None, stream=None):
    """H = silu(g) * u (strata.moe.swiglu) over rows r0 .. r1 (default all) of g, u float32
    [R, n]. Returns out float32 [r1 - r0, n] (out may be a GPUArray view of a larger buffer)."""
    _arr(g, "swiglu gate", np.float32, ndim=2)
    R, n = (int(s) for s in g.shape)
    _arr(u, "swiglu up", np.float32, shape=(R, n))
    r1 = R if r1 is None else int(r1)
    r0 = int(r0)
    if not 0 <= r0 <= r1 <= R:
        raise InputError(f"swiglu: rows {r0}..{r1} outside [0, {R}]")
    rows = r1 - r0
    out = _out(out, "swiglu out", (rows, n), np.float32)
    if rows * n == 0:
        return out
    f = _func("swiglu", "swiglu_rows", "PqPqPqii")
    f.prepared_async_call(_grid1(rows * n), (_THREADS, 1, 1), stream, _ptr(g) + 4 * r0 * n, n,
                          _ptr(u) + 4 * r0 * n, n, _ptr(out), n, rows, n)
    _count("swiglu")
    return out


def combine(x, weights, slot, y, shared=None, out=None, *, stream=None):
    """x + (sum_k w[t,k] * y[slot[t*K+k]] in rank order, then + g_t * ysh[t]) (strata.moe.combine).

    x float32 [T, D]; weights float32 [T, K]; slot int32 [T*K]; y float32 [R, D] expert-sorted
    rows; shared None or (g float32 [T] (the sigmoid, see :func:`sigmoid`), ysh float32 [T, D]).
    Returns out float32 [T, D] (out may be x)."""
    _arr(x, "combine x", np.float32, ndim=2)
    T, D = (int(s) for s in x.shape)
    _arr(weights, "combine weights", np.float32, shape=(T, None))
    K = int(weights.shape[1])
    _arr(slot, "combine slot", np.int32, shape=(T * K,))
    _arr(y, "combine y", np.float32, shape=(None, D))
    g_ptr, ysh_ptr = 0, 0
    if shared is not None:
        g, ysh = shared
        if int(g.size) != T or np.dtype(g.dtype) != np.float32:
            raise InputError(f"combine: shared gate must be float32 with {T} values")
        _arr(ysh, "combine ysh", np.float32, shape=(T, D))
        g_ptr, ysh_ptr = _ptr(g), _ptr(ysh)
    out = _out(out, "combine out", (T, D), np.float32)
    if T * D == 0:
        return out
    f = _func("combine", "combine_rows", "PqPPiPqPPqPqii")
    f.prepared_async_call(_grid1(T * D), (_THREADS, 1, 1), stream, _ptr(x), D, _ptr(weights), _ptr(slot),
                          K, _ptr(y), D, g_ptr, ysh_ptr, D, _ptr(out), D, T, D)
    _count("combine")
    return out


def sigmoid(x, out=None, *, stream=None):
    """strata.numerics.sigmoid of every value of x (float32, any shape, e.g. the [T, 1] shared
    expert gate logits). Returns out float32 [x.size]."""
    _arr(x, "sigmoid x", np.float32)
    n = int(x.size)
    out = _out(out, "sigmoid out", (n,), np.float32)
    if n == 0:
        return out
    f = _func("combine", "sigmoid_vec", "PqPq")
    f.prepared_async_call(_grid1(n), (_THREADS, 1, 1), stream, _ptr(x), 1, _ptr(out), n)
    _count("sigmoid")
    return out


# --------------------------------------------------------------------------- embedding, gather


def embed_q8_0(ids, table, n_embd: int, out=None, *, stream=None):
    """Rows ``ids`` (int32 GPUArray [T], or a host int array: uploaded) of a Q8_0 token_embd
    matrix dequantized (strata.quants.dequantize): table is a device buffer (GPUArray or
    address, 2-byte aligned) of rows of n_embd/32 * 34 bytes; ids in range (not checked on the
    device). Returns out float32 [T, n_embd]."""
    n = int(n_embd)
    if n <= 0 or n % 32:
        raise InputError(f"embed: n_embd {n} is not a multiple of 32")
    if _ptr(table) % 2:
        raise InputError("embed: the table must be 2-byte aligned")
    if hasattr(table, "gpudata"):
        _arr(table, "embed table", np.uint8)
        if int(table.size) % (n // 32 * 34):
            raise InputError(f"embed: table of {table.size} bytes is not whole rows of {n // 32 * 34}")
    if not hasattr(ids, "gpudata") and hasattr(table, "gpudata"):
        i = np.asarray(ids)
        n_vocab = int(table.size) // (n // 32 * 34)
        if i.size and (i.min() < 0 or i.max() >= n_vocab):
            raise InputError(f"token id outside [0, {n_vocab})")
    idv = _upload_i32(ids, "embed ids")
    T = int(idv.size)
    out = _out(out, "embed out", (T, n), np.float32)
    if T == 0:
        return out
    f = _func("embed", "embed_q8_0", "PiPqiPq")
    f.prepared_async_call(_grid1(T * n), (_THREADS, 1, 1), stream, _ptr(idv), T, _ptr(table),
                          n // 32 * 34, n, _ptr(out), n)
    _count("embed")
    return out


def group_buffer_bytes(n_exp: int, gu_bytes: int, d_bytes: int, tail_bytes: int) -> tuple[int, int]:
    """Bytes of the (gate/up, down) group buffers for n_exp experts (strata.moe.group_buffers)."""
    return int(n_exp) * 2 * int(gu_bytes) + int(tail_bytes), int(n_exp) * int(d_bytes) + int(tail_bytes)


def _gather_grid(nbytes: int) -> int:
    # ~32 KiB per CTA per pass, at most 256 CTAs per expert
    return max(1, min(256, -(-int(nbytes) // (_THREADS * 16 * 8))))


def gather_native_group(blobs, gu_bytes: int, d_bytes: int, tail_bytes: int, gu_buf, d_buf, *,
                        stream=None) -> None:
    """ONE launch gathering up to 16 experts (strata.moe.group_buffers): blobs is a sequence
    of device addresses (ints, DeviceAllocations or GPUArrays) of each expert's
    [gate | up | down] bytes (2*gu_bytes + d_bytes), passed by value in the kernel parameters.
    Expert q's gate|up goes to gu_buf + q*2*gu_bytes, its down to d_buf + q*d_bytes; tail_bytes
    zeros follow the last expert in each buffer (sizes: :func:`group_buffer_bytes`)."""
    ptrs = [_ptr(b) for b in blobs]
    n = len(ptrs)
    if n > GATHER_MAX:
        raise InputError(f"gather_native_group takes at most {GATHER_MAX} experts, got {n}")
    gu_bytes, d_bytes, tail_bytes = int(gu_bytes), int(d_bytes), int(tail_bytes)
    if min(gu_bytes, d_bytes, tail_bytes) < 0:
        raise InputError("gather: negative sizes")
    ptrs += [0] * (GATHER_MAX - n)
    f = _func("gather_group", "gather_native_group", "P" * GATHER_MAX + "iqqqPP")
    grid = (_gather_grid(max(2 * gu_bytes, d_bytes, tail_bytes)), n + 1, 1)
    f.prepared_async_call(grid, (_THREADS, 1, 1), stream, *ptrs, n, gu_bytes, d_bytes, tail_bytes,
                          _ptr(gu_buf), _ptr(d_buf))
    _count("gather_group")


def gather_native_one(blob, q: int, gu_bytes: int, d_bytes: int, gu_buf, d_buf, tail_bytes: int = 0, *,
                      stream=None) -> None:
    """One expert per launch (the opt-out path): blob (device address of [gate | up | down]) to
    slot q of the group buffers, as :func:`gather_native_group` places it; when tail_bytes > 0,
    also zero tail_bytes after slot q in both buffers (pass it for the group's last expert)."""
    gu_bytes, d_bytes, tail_bytes = int(gu_bytes), int(d_bytes), int(tail_bytes)
    if not 0 <= int(q) < GATHER_MAX:
        raise InputError(f"gather_native_one: slot {q} outside [0, {GATHER_MAX})")
    f = _func("gather_group", "gather_native_one", "PiqqqPP")
    grid = (_gather_grid(max(2 * gu_bytes, d_bytes, tail_bytes)), 2 if tail_bytes > 0 else 1, 1)
    f.prepared_async_call(grid, (_THREADS, 1, 1), stream, _ptr(blob), int(q), gu_bytes, d_bytes,
                          tail_bytes, _ptr(gu_buf), _ptr(d_buf))
    _count("gather_one")
