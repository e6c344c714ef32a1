"""The warp-specialized MMQ kernel (fast/cuda/kernels/mmq_ws.cu, issue 27) behind the tile-list
launch: :func:`mmq_tiles_ws` takes what :func:`fast.cuda.products.mmq_tiles` takes and writes the
same bytes (strata.mmq.mmq_prepared; verify/test_mmq_ws_cuda.py checks both against each other and
against strata.mmq), so the two can be A/B'd (bench/bench_in_place_cuda.py, arm ``ws``) and the
in-place path swapped to it on the ``mmq_ws`` switch (fast/options.py).

Kept apart from products.py until the A/B: the tables buffer and the format checks are products'
(its helpers ``_format`` and ``_tables_host``), the launch, its configurations and its argument
packing (by parameter name, from mmq_ws.cu's signature: fast/cuda/signatures.py) are here.

A configuration (mmq_ws.cu defines) changes speed only, never a bit. Row tiles must hold at most
the configuration's MMQ_BN rows: build them with ``products.row_tiles(bounds, woff,
tile_rows_for_ws(config))``.
"""
from __future__ import annotations

import json
import os

from strata.errors import DeviceError, InputError

from . import products, runtime, signatures
from .runtime import ptr

__all__ = ["WS_CONFIGS", "ws_config", "tile_rows_for_ws", "ws_geometry", "mmq_tiles_ws", "ws_modules",
           "launch_limits"]

#: named configurations of mmq_ws.cu (A/B candidates; "default" is what config None takes):
#: - default: 8 consumer warps (64 weight rows x 128 activation rows) + 2 producer warps, one CTA
#:   an SM, 168 registers (the most 10 warps may hold at launch: mmq_ws.cu MMQ_WS_REG_CAP; 200,
#:   the first form's, failed every launch with "too many resources requested"), 3 decoded stages,
#:   1 chunk copied ahead;
#: - two: the same warps, two CTAs an SM (96 registers), 2 stages and no copy lookahead (the
#:   shared memory of two CTAs);
#: - big: 16 consumer warps (128 x 128) + 4 producers, one CTA an SM (96 registers);
#: - bn64: default with 64 activation rows a tile (few rows an expert).
WS_CONFIGS = {
    "default": {"MMQ_WM": 4, "MMQ_WN": 2, "MMQ_BN": 128, "MMQ_WS_PW": 2, "MMQ_WS_MAXREG": 168},
    "two": {"MMQ_WM": 4, "MMQ_WN": 2, "MMQ_BN": 128, "MMQ_WS_PW": 2, "MMQ_WS_LA": 0, "MMQ_MINB": 2},
    "big": {"MMQ_WM": 8, "MMQ_WN": 2, "MMQ_BN": 128, "MMQ_WS_PW": 4, "MMQ_MINB": 1},
    "bn64": {"MMQ_WM": 4, "MMQ_WN": 2, "MMQ_BN": 64, "MMQ_WS_PW": 2, "MMQ_WS_MAXREG": 168},
}

_state: dict = {}


def ws_config(config=None) -> dict:
    """A configuration's defines: a dict as given, a name of WS_CONFIGS, or None: the environment
    variable STRATA_MMQ_WS_CONFIG (a name or a JSON object) when set, else "default"."""
    if config is None:
        config = os.environ.get("STRATA_MMQ_WS_CONFIG", "").strip() or "default"
    if isinstance(config, str):
        if config in WS_CONFIGS:
            return dict(WS_CONFIGS[config])
        try:
            got = json.loads(config)
        except ValueError:
            raise InputError(f"mmq_ws configuration {config!r}: neither {sorted(WS_CONFIGS)} nor JSON") from None
        if not isinstance(got, dict):
            raise InputError(f"mmq_ws configuration must be a JSON object, got {config!r}")
        return got
    return dict(config)


def tile_rows_for_ws(config=None) -> int:
    """The most activation rows a row tile may hold under this configuration (its MMQ_BN)."""
    return int(ws_config(config).get("MMQ_BN", 128))


def _defines(cfg: dict, fmt) -> dict:
    return {**cfg, "MMQ_ONLY": int(fmt.qtype)}


def ws_modules(config=None) -> list[tuple[str, dict]]:
    """The (module, defines) builds of mmq_ws.cu a configuration takes: one a type."""
    from strata import qformats  # noqa: PLC0415

    cfg = ws_config(config)
    return [("mmq_ws", _defines(cfg, f)) for f in qformats.with_mmq_kernel()]


def _func(cfg: dict, fmt):
    key = (tuple(sorted(cfg.items())), fmt.qtype)
    f = _state.get(key)
    if f is not None:
        return f
    defines = _defines(cfg, fmt)
    mod = runtime.load_module("mmq_ws", defines)
    name = "ws_" + fmt.mmq_kernel
    (smem,) = runtime.module_ints(mod, name + "_smem", 1)
    geo = runtime.module_ints(mod, "mmq_ws_geometry", 4)
    f = runtime.allow_dynamic_smem(mod.get_function(name), smem)
    params = signatures.kernels("mmq_ws", defines)[name].params
    f.fields = tuple(p.name for p in params)
    f.prepare("".join(p.letters for p in params))
    f.smem, f.kernel = smem, name
    f.BM, f.BN, f.threads = geo[0], geo[1], geo[2]
    f.ctas_per_sm = _ctas_per_sm(f, name, cfg)
    if "tables" not in _state:
        tab = products._mmq_state.get("tables")
        _state["tables"] = tab if tab is not None else runtime.to_device(products._tables_host(), "MMQ tables")
    _state[key] = f
    return f


def launch_limits(regs: int, threads: int, smem_dynamic: int, smem_static: int) -> dict:
    """What an sm_90 SM holds of a kernel's CTAs, by the driver's rules (cuda_occupancy.h):
    registers go to warps in units of 256 and are split over the SM's 4 sub-partitions (16,384
    each); the launch itself is refused (CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES) when regs-per-warp x
    the CTA's warps rounded up to 4 exceeds 65,536 registers (mmq_ws.cu MMQ_WS_REG_CAP). Shared
    memory: 233,472 B an SM, 232,448 a CTA (static + dynamic), 1 KB a CTA reserved.
    {"per_warp", "fits", "by_regs", "by_smem", "by_threads", "ctas"}; ctas 0 where it cannot
    launch."""
    warps = -(-int(threads) // 32)
    per_warp = -(-(int(regs) * 32) // 256) * 256
    smem = int(smem_dynamic) + int(smem_static)
    fits = per_warp * -(-warps // 4) * 4 <= 65536 and smem <= 232448 and threads <= 1024
    by_regs = (16384 // max(1, per_warp)) * 4 // warps
    by_smem = 233472 // (smem + 1024)
    by_threads = 2048 // int(threads)
    ctas = min(by_regs, by_smem, by_threads, 32) if fits else 0
    return {"per_warp": per_warp, "fits": fits, "by_regs": by_regs, "by_smem": by_smem,
            "by_threads": by_threads, "ctas": ctas}


def _ctas_per_sm(f, name: str, cfg: dict) -> int:
    """The CTAs an SM holds of the loaded kernel f; a kernel that cannot launch at f.threads is a
    DeviceError naming why (instead of the launch's "too many resources requested")."""
    regs, static = int(f.num_regs), int(f.shared_size_bytes)
    lim = launch_limits(regs, f.threads, f.smem, static)
    max_threads = int(f.max_threads_per_block)
    if not lim["fits"] or f.threads > max_threads or lim["ctas"] < 1:
        raise DeviceError(
            f"{name} (kernels/mmq_ws.cu, {cfg}) cannot launch: {f.threads} threads a CTA, the driver allows "
            f"{max_threads} at {regs} registers a thread ({lim['per_warp']} a warp x the warps rounded up to 4 "
            f"must be <= 65536); shared memory {f.smem} dynamic + {static} static. Lower MMQ_WS_MAXREG "
            "(mmq_ws.cu MMQ_WS_REG_CAP) or the warps")
    return max(1, lim["ctas"])


def ws_geometry(qtype, config=None) -> dict:
    """{"BM", "BN", "threads", "smem", "regs", "ctas_per_sm"} of a type's kernel."""
    f = _func(ws_config(config), products._format(qtype))
    return {"BM": f.BM, "BN": f.BN, "threads": f.threads, "smem": f.smem, "regs": int(f.num_regs),
            "ctas_per_sm": f.ctas_per_sm}


def mmq_tiles_ws(dev, qtype, w, *, N: int, K: int, act, R_total: int, tiles, n_tiles: int, out,
                 ldo: int | None = None, tile_rows_mean: float | None = None, config=None, pair=None,
                 persistent: bool = True, ctas: int | None = None) -> None:
    """products.mmq_tiles by mmq_ws.cu: for each row tile (row_begin, row_end, offset) of ``tiles``
    (int32 device [n_tiles, 4], products.row_tiles, at most tile_rows_for_ws(config) rows each),
    out[r, n] (r in the tile's rows, n < N) = strata.mmq.mmq(the N x K matrix at w + offset,
    activation row r)[n]; the same bytes as mmq_tiles. pair: (w_pair, out2), gate and up in one
    launch. tile_rows_mean: accepted for mmq_tiles' signature, unused (one configuration).
    persistent: a grid of the CTAs the device holds at once, each walking its share of the tiles
    (False: a CTA a tile, as mmq.cu launches); ctas: exactly this many CTAs (each matrix), each
    walking every ctas-th tile (the tests' way to give a CTA many tiles). None changes a bit."""
    del tile_rows_mean
    fmt = products._format(qtype)
    N, K, R_total, n_tiles = int(N), int(K), int(R_total), int(n_tiles)
    vpb = fmt.block_values
    if K <= 0 or K % vpb:
        raise InputError(f"K = {K} is not a whole number of {fmt.qtype.name} blocks ({vpb} values)")
    if pair is None:
        w_pair, out2 = 0, out
    else:
        w_pair, out2 = int(pair[0]), pair[1]
        if w_pair % 2:
            raise InputError("the second matrix of a pair must lie at an even offset")
    if ptr(w) % 2:
        raise InputError("the weight base must be 2-byte aligned")
    if n_tiles <= 0 or N <= 0:
        return
    f = _func(ws_config(config), fmt)
    tiles_n = n_tiles * -(-N // f.BM)
    gy = 1 if pair is None else 2
    gx = tiles_n
    if ctas is not None:
        gx = min(tiles_n, max(1, int(ctas)))
    elif persistent:
        gx = min(tiles_n, max(1, runtime.multiprocessor_count() * f.ctas_per_sm // gy))
    fields = dict(w=ptr(w), w_stride=0, N=N, K=K, act=ptr(act), R_total=R_total, bounds=0, n_exp=0,
                  out=ptr(out), ldo=int(N if ldo is None else ldo), tab=int(_state["tables"]),
                  tile_rows=f.BN, w_pair=w_pair, out2=ptr(out2), tiles=ptr(tiles), n_tiles=n_tiles)
    if set(fields) != set(f.fields):
        raise InputError(f"{f.kernel} (kernels/mmq_ws.cu): parameters {sorted(f.fields)}, packed {sorted(fields)}")
    args = tuple(fields[n] for n in f.fields)
    dev.launch(f, "mmq", (min(gx, 1 << 30), gy, 1), (f.threads, 1, 1), *args, shared_size=f.smem)
