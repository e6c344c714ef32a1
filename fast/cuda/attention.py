"""Attention on the device: the KV cache (:class:`DeviceKVCache`, :func:`kv_write`) and
causal attention over it (:func:`attend`). GPUArrays in, GPUArrays out; every wrapper takes
the backend's :class:`strata_prefill.fast.cuda.runtime.Device` first, allocates outputs and scratch from its
pool and launches on its stream.

Kernels and the NumPy functions they match bit for bit (docs/numerics.md):
- :func:`kv_write` -> strata_prefill.contract.attention.KVCache.write (kernels/kv_cache.cu)
- :func:`attend`   -> strata_prefill.contract.attention.attend        (kernels/attention_pair.cu for prefill,
  attention_split.cu for few queries: their shared steps in attention_common.cuh). With sinks
  or a window, the same files' *_sinks_window kernels (the options' code compiled in; the plain
  kernels are the same code as before the options existed).
"""
from __future__ import annotations

import numpy as np

from strata_prefill.contract import attention as _attention
from strata_prefill.contract.constants import KEY_BLOCK
from strata_prefill.contract.errors import InputError

from strata_prefill.fast.cuda import runtime
from strata_prefill.fast.cuda.kernel_paths import target_arch
from strata_prefill.fast.cuda.runtime import check, ptr

__all__ = [
    "kv_write",
    "v_transpose",
    "v_blocks_host",
    "attend",
    "DeviceKVCache",
    "ATTEND_HEAD_DIMS",
    "ATTEND_VARIANTS",
    "ATTEND_TILE_MODULES",
    "ATTEND_TILE_CONFIGS",
    "prefill_variant",
    "variant_runs_here",
]

#: head sizes the attention kernels are instantiated for (every variant)
ATTEND_HEAD_DIMS = (64, 128)

#: attention kernels, each bit-exact to strata_prefill.contract.attention.attend, each in its own file:
#: "wgmma" (attention_wgmma.cu, sm_90 only) one CTA per (64 * WG_GROUPS queries, head), a consumer
#:         warpgroup per 64 queries on Hopper's warpgroup MMA (Q.K fp16, P.V int8), a producer
#:         warpgroup filling a cp.async ring under mbarriers;
#: "pair"  (attention_pair.cu, the prefill kernel where "wgmma" does not run) one CTA per
#:         (16 * PAIR_QG queries, head), tensor cores (Q.K fp16, P.V int8), each 16-query group
#:         split between two warps (keys by parity for the scores, output dims by half for
#:         P.V), half the registers a warp, a cp.async ring;
#: "split" (attention_split.cu) split-K over key blocks in three launches (scores and block
#:         maxima, per-block P.V, the ordered merge), for few queries (decode);
#: "auto"  split for T <= ATTEND_SPLIT_MAX_T, else the prefill kernel (prefill_variant()).
ATTEND_VARIANTS = ("wgmma", "pair", "split", "auto")
#: the variant attend() runs when none is asked for
ATTEND_VARIANT = "auto"
#: the most queries "auto" sends to the split-K kernels
ATTEND_SPLIT_MAX_T = 4
#: attention_pair.cu's configuration: PAIR_QG (16-query groups per CTA, two warps each; 8 when
#: absent), PAIR_STAGES (key blocks in the cp.async ring, 2), PAIR_MINB (CTAs per SM, 1)
ATTEND_PAIR_CONFIG: dict = {}
#: attention_wgmma.cu's configuration: WG_GROUPS (consumer warpgroups per CTA, 64 queries each;
#: 3 when absent), WG_STAGES (key blocks in the ring, 3)
ATTEND_WGMMA_CONFIG: dict = {}
#: the prefill kernels "auto" runs for more than ATTEND_SPLIT_MAX_T queries, best first: the
#: first whose kernel file the device can run (kernel_paths.target_arch)
ATTEND_PREFILL = ("wgmma", "pair")
#: each tile kernel's file
ATTEND_TILE_MODULES = {"wgmma": "attention_wgmma", "pair": "attention_pair"}
#: and its configuration table
ATTEND_TILE_CONFIGS = {"wgmma": ATTEND_WGMMA_CONFIG, "pair": ATTEND_PAIR_CONFIG}


def variant_runs_here(variant: str) -> bool:
    """Whether this device can run ``variant``'s kernel file (an sm_90a file needs an sm_90 card)."""
    module = ATTEND_TILE_MODULES.get(variant)
    return module is None or target_arch(module, runtime.arch()) is not None


def prefill_variant() -> str:
    """The kernel "auto" runs for a prefill: the first of ATTEND_PREFILL this device runs."""
    return next(v for v in ATTEND_PREFILL if variant_runs_here(v))


def _cache_shapes(k_codes, k_scale, v_codes, v_scale):
    check(k_codes, "k_codes", np.float16, ndim=3)
    n_kv, cap, hd = (int(s) for s in k_codes.shape)
    if hd % 32:
        raise InputError(f"head_dim {hd} is not a multiple of 32")
    for a, (name, dt, tail) in zip((k_codes, k_scale, v_codes, v_scale), _attention.cache_layout(hd)):
        check(a, name, dt, shape=(n_kv, cap, *tail))
    for a, what in ((k_codes, "k_codes"), (v_codes, "v_codes")):
        if ptr(a) % 16:
            raise InputError(f"{what} must be 16-byte aligned")
    return n_kv, cap, hd


def v_blocks_host(v_codes: np.ndarray) -> np.ndarray:
    """The transposed V blocks (kernels/v_blocks.cuh) of a host v_codes int8 [n_kv, cap, hd]:
    int8 [n_kv, ceil(cap / 64), hd, 64], keys past cap zero. The layout's NumPy definition."""
    n_kv, cap, hd = v_codes.shape
    nblk = -(-cap // KEY_BLOCK)
    v = np.zeros((n_kv, nblk * KEY_BLOCK, hd), np.int8)
    v[:, :cap] = v_codes
    v = v.reshape(n_kv, nblk, KEY_BLOCK, hd)
    kappa = np.arange(KEY_BLOCK)
    lam = kappa >> 1
    slot = 32 * (kappa & 1) + 16 * (lam >> 4) + 4 * ((lam >> 1) & 3) + 2 * ((lam >> 3) & 1) + (lam & 1)
    d = np.arange(hd)
    row = 16 * (d >> 4) + 8 * (d & 1) + ((d & 15) >> 1)
    out = np.zeros((n_kv, nblk, hd, KEY_BLOCK), np.int8)
    out[:, :, row[:, None], slot[None, :]] = v.transpose(0, 1, 3, 2)
    return out


def _vt_shape(n_kv: int, cap: int, hd: int) -> tuple:
    return (n_kv, -(-cap // KEY_BLOCK), hd, KEY_BLOCK)


def v_transpose(dev, v_codes, n_keys: int, out=None):
    """The transposed V blocks of keys 0 .. n_keys - 1 of a device v_codes int8 [n_kv, cap, hd]
    (kernels/kv_cache.cu v_transpose; :func:`v_blocks_host` on the host): for a cache written
    without them. Returns out, int8 [n_kv, ceil(cap / 64), hd, 64] (keys not copied: as before)."""
    check(v_codes, "v_codes", np.int8, ndim=3)
    n_kv, cap, hd = (int(x) for x in v_codes.shape)
    out = dev.output(out, "v_t", _vt_shape(n_kv, cap, hd), np.int8)
    n_keys = min(int(n_keys), cap)
    total = n_kv * n_keys * hd
    if total > 0:
        f = runtime.function("kv_cache", "v_transpose", "PiiiqP")
        dev.launch(f, "v_transpose", (-(-total // 256), 1, 1), (256, 1, 1), ptr(v_codes), n_kv, hd, cap,
                   n_keys, ptr(out))
    return out


def _checked_vt(v_t, n_kv: int, cap: int, hd: int) -> int:
    if v_t is None:
        return 0
    check(v_t, "v_t", np.int8, shape=_vt_shape(n_kv, cap, hd))
    if ptr(v_t) % 16:
        raise InputError("v_t must be 16-byte aligned")
    return ptr(v_t)


def _device_positions(dev, positions, cap: int, T: int, what: str):
    """(positions as an int32 GPUArray [T], the host array or None): host positions are checked
    to lie inside the cache's capacity before the upload; a GPUArray is taken as it is (its
    values never come back to the host)."""
    p = None
    if not hasattr(positions, "gpudata"):
        p = np.asarray(positions)
        if p.size and (p.min() < 0 or p.max() >= cap):
            raise InputError(f"{what}: positions outside the cache capacity {cap}")
    pos = dev.upload_i32(positions, f"{what} positions")
    if tuple(pos.shape) != (T,):
        raise InputError(f"{what}: {tuple(pos.shape)} positions for {T} tokens")
    return pos, p


def kv_write(dev, k, v, positions, k_codes, k_scale, v_codes, v_scale, v_t=None) -> None:
    """Quantize and store k, v float32 [T, n_kv, hd] at absolute positions (int32 GPUArray [T],
    or a host int array: checked against the capacity and uploaded) into one layer's cache:
    k_codes float16 [n_kv, cap, hd], k_scale float32 [n_kv, cap], v_codes int8
    [n_kv, cap, hd], v_scale float32 [n_kv, cap] (strata_prefill.contract.attention.KVCache.write), and where
    given v_t int8 [n_kv, ceil(cap / 64), hd, 64], the same V codes in the pair kernel's
    transposed blocks (kernels/v_blocks.cuh). Positions must be distinct and < cap."""
    n_kv, cap, hd = _cache_shapes(k_codes, k_scale, v_codes, v_scale)
    vt = _checked_vt(v_t, n_kv, cap, hd)
    check(k, "kv_write k", np.float32, shape=(None, n_kv, hd))
    T = int(k.shape[0])
    check(v, "kv_write v", np.float32, shape=(T, n_kv, hd))
    if hd > 256:
        raise InputError(f"kv_write supports head_dim up to 256, got {hd}")
    pos, _ = _device_positions(dev, positions, cap, T, "kv_write")
    if T == 0:
        return
    f = runtime.function("kv_cache", "kv_write", "PqPqPiiiiPPPPP")
    grid = (-(-(T * n_kv) // 8), 1, 1)
    dev.launch(f, "kv_write", grid, (256, 1, 1), ptr(k), n_kv * hd, ptr(v), n_kv * hd, ptr(pos),
               T, n_kv, hd, cap, ptr(k_codes), ptr(k_scale), ptr(v_codes), ptr(v_scale), vt)


_geometry: dict = {}  # (module, defines) -> its geometry ints, read once (a synchronous copy)


def _geometry_of(module: str, name: str, n: int, defines: dict | None = None) -> tuple[int, ...]:
    key = (module, tuple(sorted((defines or {}).items())))
    got = _geometry.get(key)
    if got is None:
        got = _geometry[key] = runtime.module_ints(runtime.load_module(module, defines), name, n)
    return got


def _split_func(name: str, fmt: str):
    """The prepared kernel `name` of attention_split.cu."""
    return runtime.function("attention_split", name, fmt)


def _split_geometry() -> tuple[int, int]:
    """(warps of a split-K scores or P.V CTA, threads of the merge per output dim)
    (attend_split_geometry)."""
    return _geometry_of("attention_split", "attend_split_geometry", 2)


def _split_buffer(dev, nbytes: int):
    """The split-K scratch of this Device, grown on demand; kernels on one stream use it in
    turn."""
    have = dev.scratch.get("attend_split")
    if have is None or have.nbytes < nbytes:
        dev.scratch["attend_split"] = None
        dev.synchronize()  # an earlier launch may still read the old buffer
        n = max(int(nbytes), 2 * (0 if have is None else int(have.nbytes)))
        dev.scratch["attend_split"] = dev.empty((n,), np.uint8)
    return dev.scratch["attend_split"]


def _vt_scratch(dev, n_kv: int, cap: int, hd: int):
    """Scratch for the transposed V blocks of a cache that has none (tests, direct calls)."""
    shape = _vt_shape(n_kv, cap, hd)
    have = dev.scratch.get("attend_vt")
    if have is None or tuple(have.shape) != shape:
        dev.scratch["attend_vt"] = None
        dev.synchronize()  # an earlier launch may still read the old buffer
        dev.scratch["attend_vt"] = dev.empty(shape, np.int8)
    return dev.scratch["attend_vt"]


def _attend_variant(variant, T: int) -> str:
    v = ATTEND_VARIANT if variant is None else variant
    if v not in ATTEND_VARIANTS:
        raise InputError(f"attend: unknown variant {v!r} (one of {ATTEND_VARIANTS})")
    if v == "auto":
        return "split" if T <= ATTEND_SPLIT_MAX_T else prefill_variant()
    if not variant_runs_here(v):
        raise InputError(f"attend: the {v} kernel ({ATTEND_TILE_MODULES[v]}.cu) does not run on {runtime.arch()}")
    return v


_tile_funcs: dict = {}


def _tile_func(variant: str, hd: int, defines: dict, options: bool = False):
    """(prepared attend_<variant>_hd<hd>, or with ``options`` attend_<variant>_sinks_window_hd<hd>,
    dynamic shared bytes, queries per CTA, threads) of a tile kernel ("wgmma", "pair") built with
    ``defines``; its shared memory limit raised once."""
    key = (variant, hd, tuple(sorted(defines.items())), options)
    got = _tile_funcs.get(key)
    if got is None:
        mod = runtime.load_module(ATTEND_TILE_MODULES[variant], defines)
        geo = runtime.module_ints(mod, f"attend_{variant}_geometry", 4)
        smem = geo[0] if hd == 64 else geo[1]
        if options:
            f_opt = runtime.allow_dynamic_smem(mod.get_function(f"attend_{variant}_sinks_window_hd{hd}"), smem)
            f_opt.prepare("PqPiiPPPPPifPqPi")
            f = f_opt
        else:
            f = runtime.allow_dynamic_smem(mod.get_function(f"attend_{variant}_hd{hd}"), smem)
            f.prepare("PqPiiPPPPPifPq")
        got = _tile_funcs[key] = (f, smem, geo[2], geo[3])
    return got


def _options(dev, sinks, window, H: int, p):
    """(sinks pointer or 0, window or 0, the split grid's first block) of attend's options,
    checked: sinks float32 [H] (a GPUArray, or a host array, uploaded), window an int >= 1.
    The first block is the smallest of the host positions' first keys' blocks (0 where the
    positions stay on the device)."""
    if window is not None:
        if isinstance(window, bool) or int(window) != window or int(window) < 1:
            raise InputError(f"attend: the window must be a whole number of keys >= 1, got {window!r}")
        window = int(window)
    sp = 0
    if sinks is not None:
        if not hasattr(sinks, "gpudata"):
            sinks = np.asarray(sinks)
            if sinks.dtype != np.float32 or sinks.shape != (H,):
                raise InputError(f"attend sinks must be float32 [{H}], got {sinks.dtype} {sinks.shape}")
            sinks = dev.upload(np.ascontiguousarray(sinks))
        check(sinks, "attend sinks", np.float32, shape=(H,))
        sp = ptr(sinks)
    c_base = 0
    if window is not None and p is not None and p.size:
        c_base = int(_attention.window_start(p, window).min()) // KEY_BLOCK
    return sp, window or 0, c_base


def attend(dev, q, positions, k_codes, k_scale, v_codes, v_scale, out=None, *, variant=None,
           max_pos=None, config=None, v_t=None, sinks=None, window=None):
    """Causal attention (strata_prefill.contract.attention.attend) of q float32 [T, n_head, hd] (after norm and
    RoPE) at absolute positions (int32 GPUArray [T], or a host int array: checked and uploaded)
    over one layer's cache (see :func:`kv_write`; keys 0..position of each query must be
    written, and position < cap). GQA: head h reads KV head h // (n_head // n_kv).
    hd in ATTEND_HEAD_DIMS. ``variant`` picks the kernel (:data:`ATTEND_VARIANTS`; None =
    :data:`ATTEND_VARIANT`); ``max_pos`` (the largest position) sizes the split-K grid when the
    positions are a GPUArray (else the capacity does); ``config``: the tile kernel's defines over
    its table (ATTEND_WGMMA_CONFIG, ATTEND_PAIR_CONFIG); ``v_t``: the cache's transposed V blocks
    (see :func:`kv_write`), which the tile kernels read; without them one transposes v_codes first
    (:func:`v_transpose`, into scratch). ``sinks`` (float32 [n_head], a GPUArray or a host
    array) and ``window`` (keys a query sees, an int >= 1) as strata_prefill.contract.attention.attend's; either
    one runs the *_sinks_window kernels, neither the plain ones. Returns out, float32
    [T, n_head, hd]."""
    n_kv, cap, hd = _cache_shapes(k_codes, k_scale, v_codes, v_scale)
    vt = _checked_vt(v_t, n_kv, cap, hd)
    check(q, "attend q", np.float32, shape=(None, None, hd))
    T, H = int(q.shape[0]), int(q.shape[1])
    if hd not in ATTEND_HEAD_DIMS:
        raise InputError(f"the attention kernels are built for head_dim in {ATTEND_HEAD_DIMS}, got {hd}")
    if H % n_kv:
        raise InputError(f"n_head {H} is not a multiple of n_head_kv {n_kv}")
    pos, p = _device_positions(dev, positions, cap, T, "attend")
    if p is not None and p.size:
        max_pos = int(p.max())
    opt = sinks is not None or window is not None
    sp, win, c_base = _options(dev, sinks, window, H, p) if opt else (0, 0, 0)
    out = dev.output(out, "attend out", (T, H, hd), np.float32)
    if T == 0 or H == 0:
        return out
    v = _attend_variant(variant, T)
    kq2 = np.float32(_attention.kq2(hd))
    if v in ATTEND_TILE_MODULES:
        defines = {**ATTEND_TILE_CONFIGS[v], **(config or {})}
        f, smem, tile, threads = _tile_func(v, hd, defines, opt)
        if not vt:  # a cache without its transposed V blocks
            top = cap if max_pos is None else min(int(max_pos) + 1, cap)
            vt = ptr(v_transpose(dev, v_codes, top, out=_vt_scratch(dev, n_kv, cap, hd)))
        extra = (sp, win) if opt else ()
        dev.launch(f, "attention", (-(-T // tile), H, 1), (threads, 1, 1), ptr(q), H * hd, ptr(pos), T,
                   H // n_kv, ptr(k_codes), ptr(k_scale), ptr(v_codes), ptr(v_scale), vt, cap,
                   kq2, ptr(out), H * hd, *extra, shared_size=smem)
    else:  # split: three launches, counted as one "attention"
        top = cap - 1 if max_pos is None else min(int(max_pos), cap - 1)
        nblk = top // KEY_BLOCK + 1
        U = T * H
        sizes = (U * nblk * KEY_BLOCK, U * nblk, U * nblk * hd, U * nblk, U * nblk, U * nblk)  # S MC OB LS AL DW
        buf = _split_buffer(dev, 4 * sum(sizes))
        S = ptr(buf)
        MC = S + 4 * sizes[0]
        OB = MC + 4 * sizes[1]
        LS = OB + 4 * sizes[2]
        AL = LS + 4 * sizes[3]
        DW = AL + 4 * sizes[4]
        warps, merge_g = _split_geometry()
        if not opt:
            f1 = _split_func(f"attend_split_scores_hd{hd}", "PqPiiiPPifiPP")
            dev.launch(f1, None, (nblk, n_kv, 1), (32 * warps, 1, 1), ptr(q), H * hd, ptr(pos),
                       T, H, H // n_kv, ptr(k_codes), ptr(k_scale), cap, kq2, nblk, S, MC)
            f2 = _split_func(f"attend_split_pv_hd{hd}", "PiiiPPiiPPPPPP")
            dev.launch(f2, None, (nblk, n_kv, 1), (32 * warps, 1, 1), ptr(pos), T, H, H // n_kv,
                       ptr(v_codes), ptr(v_scale), cap, nblk, S, MC, OB, LS, AL, DW)
            f3 = _split_func(f"attend_split_merge_hd{hd}", "PiiPPPPPq")
            dev.launch(f3, "attention", (T, H, 1), (merge_g * hd, 1, 1), ptr(pos), H, nblk, OB, LS, AL, DW,
                       ptr(out), H * hd)
            return out
        # the options: the grid of passes 1 and 2 from block c_base (the blocks before every
        # query's window are never launched); the scratch stays indexed by absolute block
        c_base = min(c_base, nblk - 1)
        f1 = _split_func(f"attend_split_scores_sinks_window_hd{hd}", "PqPiiiPPifiPPii")
        dev.launch(f1, None, (nblk - c_base, n_kv, 1), (32 * warps, 1, 1), ptr(q), H * hd, ptr(pos),
                   T, H, H // n_kv, ptr(k_codes), ptr(k_scale), cap, kq2, nblk, S, MC, win, c_base)
        f2 = _split_func(f"attend_split_pv_sinks_window_hd{hd}", "PiiiPPiiPPPPPPPii")
        dev.launch(f2, None, (nblk - c_base, n_kv, 1), (32 * warps, 1, 1), ptr(pos), T, H, H // n_kv,
                   ptr(v_codes), ptr(v_scale), cap, nblk, S, MC, OB, LS, AL, DW, sp, win, c_base)
        f3 = _split_func(f"attend_split_merge_sinks_window_hd{hd}", "PiiPPPPPqPi")
        dev.launch(f3, "attention", (T, H, 1), (merge_g * hd, 1, 1), ptr(pos), H, nblk, OB, LS, AL, DW,
                   ptr(out), H * hd, sp, win)
    return out


class DeviceKVCache:
    """The KV cache on the device, laid out as strata_prefill.contract.attention.KVCache: per layer
    ``k_codes[l]`` float16 [n_kv, capacity, hd], ``k_scale[l]`` float32 [n_kv, capacity],
    ``v_codes[l]`` int8 [n_kv, capacity, hd], ``v_scale[l]`` float32 [n_kv, capacity], and
    ``v_t[l]``, the V codes again in the pair kernel's transposed blocks (kernels/v_blocks.cuh),
    int8 [n_kv, capacity / 64, hd, 64]. Zero-initialized (plain allocations, not from the pool: the cache lives as long as the
    engine); the capacity is a whole number of 64-key blocks and grows (doubling, with a
    device copy of what is there) when a write needs more. Writes and attention launch
    through ``dev``."""

    def __init__(self, dev, n_layer: int, n_head_kv: int, head_dim: int, capacity: int = 4 * KEY_BLOCK):
        self.dev = dev
        self.n_layer, self.n_head_kv, self.head_dim = int(n_layer), int(n_head_kv), int(head_dim)
        self.capacity = 0
        self.k_codes: list = []
        self.k_scale: list = []
        self.v_codes: list = []
        self.v_scale: list = []
        self.v_t: list = []
        self._grow(-(-int(capacity) // KEY_BLOCK) * KEY_BLOCK)

    def _grow(self, capacity: int) -> None:
        runtime.context()
        from pycuda import gpuarray as ga  # noqa: PLC0415
        import pycuda.driver as cuda  # noqa: PLC0415

        hkv, hd, old = self.n_head_kv, self.head_dim, self.capacity
        # v_t [n_kv, capacity / 64, hd, 64] is laid out per head as v_codes is (capacity * hd
        # bytes a head, whole blocks), so it is allocated and grown as [n_kv, capacity, hd]
        layout = _attention.cache_layout(hd) + (("v_t", np.int8, (hd,)),)
        for name, dt, tail in layout:
            arrs = getattr(self, name)
            new_list = []
            for layer in range(self.n_layer):
                shape = (hkv, capacity, *tail)
                new = ga.empty(shape, dt)  # zeroed below (gpuarray.zeros has no float16 fill kernel)
                if new.nbytes:
                    cuda.memset_d8(new.gpudata, 0, new.nbytes)
                if old:
                    src = arrs[layer]
                    row = np.dtype(dt).itemsize * int(np.prod(tail))
                    runtime.synchronize()
                    for h in range(hkv):
                        cuda.memcpy_dtod(int(new.gpudata) + h * capacity * row,
                                         int(src.gpudata) + h * old * row, old * row)
                new_list.append(new if name != "v_t" else new.reshape(_vt_shape(hkv, capacity, hd)))
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

    def write(self, layer: int, positions, k, v, *, positions_dev=None) -> None:
        """Store k, v float32 [T, n_kv, hd] at positions (host int array; ``positions_dev`` an
        int32 GPUArray copy of it to skip the upload)."""
        p = np.asarray(positions)
        if p.size:
            self.ensure(int(p.max()) + 1)
        kv_write(self.dev, k, v, p if positions_dev is None else positions_dev, *self.layer(layer),
                 v_t=self.v_t[layer])

    def attend(self, layer: int, q, positions, *, positions_dev=None, out=None, variant=None, config=None,
               sinks=None, window=None):
        """Causal attention of q float32 [T, n_head, hd] at positions (host int array); sinks
        and window as :func:`attend`'s."""
        p = np.asarray(positions)
        if p.size and int(p.max()) >= self.capacity:
            raise InputError(f"attend: position {int(p.max())} past the cache capacity {self.capacity}")
        return attend(self.dev, q, p if positions_dev is None else positions_dev, *self.layer(layer),
                      out=out, variant=variant, max_pos=int(p.max()) if p.size else None, config=config,
                      v_t=self.v_t[layer], sinks=sinks, window=window)
