"""Probe of the warp-specialized MMQ kernels (fast/cuda/kernels/mmq_ws.cu, fast/cuda/products_ws.py)
on the GPU: for each products_ws.WS_CONFIGS entry and IQ2_XS / Q8_0, the kernel loaded as
products_ws loads it (the same module, defines and dynamic shared-memory attribute), its function
attributes (NUM_REGS, MAX_THREADS_PER_BLOCK, SHARED_SIZE_BYTES, MAX_DYNAMIC_SHARED_SIZE_BYTES,
LOCAL_SIZE_BYTES), the block and dynamic shared memory it launches with, the driver's resident
CTAs an SM (cuOccupancyMaxActiveBlocksPerMultiprocessor) beside products_ws.launch_limits', then
one small pair launch through products_ws.mmq_tiles_ws, compared byte for byte with mmq.cu's
tile list (products.mmq_tiles): OK, MISMATCH, the error, or HUNG (a launch that does not finish
within HANG_S: the named barriers; the probe stops there, a hung context takes nothing more).

Each (configuration, type) is its own try/except: one run reports all of them.

    python3 dev/ws_probe.py [--configs default,two,legacy200] [--types IQ2_XS,Q8_0]

Exit status 0 when every configuration launched and matched and legacy200 (the first form, 200
registers, built past the kernel's check) was refused.

Nothing runs on import.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

HANG_S = 30.0  # a small launch takes milliseconds; past this it waits on a barrier forever
TYPES = ("IQ2_XS", "Q8_0")
#: type -> (N, K, expert row counts): N not a multiple of the weight-row tile, an expert above one
#: row tile, one with no rows; Q8_0's K leaves one block in its last chunk
SHAPES = {"IQ2_XS": (100, 512, [5, 0, 70, 130]), "Q8_0": (100, 160, [5, 0, 70, 130])}
#: the first form's configuration (d7e5400's "default": 200 registers a thread for 10 warps), built
#: past mmq_ws.cu's register check (MMQ_WS_UNCHECKED) to show the driver refuse it: its raw launch
#: should fail "too many resources requested for launch", products_ws should refuse it (NO LAUNCH)
LEGACY = {"legacy200": {"MMQ_WM": 4, "MMQ_WN": 2, "MMQ_BN": 128, "MMQ_WS_PW": 2, "MMQ_WS_MAXREG": 200,
                        "MMQ_WS_UNCHECKED": 1}}
FUNC_ATTRS = ("NUM_REGS", "MAX_THREADS_PER_BLOCK", "SHARED_SIZE_BYTES", "MAX_DYNAMIC_SHARED_SIZE_BYTES",
              "LOCAL_SIZE_BYTES", "CONST_SIZE_BYTES", "PTX_VERSION", "BINARY_VERSION")
DEV_ATTRS = ("MULTIPROCESSOR_COUNT", "MAX_REGISTERS_PER_BLOCK", "MAX_REGISTERS_PER_MULTIPROCESSOR",
             "MAX_THREADS_PER_BLOCK", "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN", "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR",
             "RESERVED_SHARED_MEMORY_PER_BLOCK")


def _say(*a) -> None:
    print(*a, flush=True)


def _occupancy(f, threads: int, smem: int):
    """The driver's resident CTAs an SM for f at this block and dynamic shared memory, or a note."""
    handle = getattr(f, "handle", None)
    if handle is None:
        return "n/a (pycuda Function has no handle)"
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        n = ctypes.c_int(-1)
        rc = lib.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(n), ctypes.c_void_p(int(handle)),
                                                             ctypes.c_int(int(threads)), ctypes.c_size_t(int(smem)))
        return n.value if rc == 0 else f"CUresult {rc}"
    except Exception as e:  # noqa: BLE001
        return f"n/a ({type(e).__name__}: {e})"


def _attrs(cuda, f) -> dict:
    out = {}
    for a in FUNC_ATTRS:
        try:
            out[a] = int(f.get_attribute(getattr(cuda.function_attribute, a)))
        except Exception as e:  # noqa: BLE001
            out[a] = f"n/a ({type(e).__name__})"
    return out


def _wait(cuda, stream, what: str) -> None:
    """Wait for the stream's work, at most HANG_S; a launch still running then is reported and
    the process exits (status 3): nothing more can run on a context with a hung kernel."""
    ev = cuda.Event()
    ev.record(stream)
    t0 = time.monotonic()
    while not ev.query():
        if time.monotonic() - t0 > HANG_S:
            _say(f"    HUNG: {what} still running after {HANG_S:.0f} s (named barrier deadlock?); stopping")
            sys.stdout.flush()
            os._exit(3)
        time.sleep(0.005)
    ev.synchronize()


def _inputs(tname: str, rng):
    """(cache, act, R_total, bounds, woff, mat, N, K) on the host for a small pair launch."""
    import numpy as np  # noqa: PLC0415
    from gguf import GGMLQuantizationType as QT  # noqa: PLC0415

    from strata import q8_1, quants  # noqa: PLC0415

    qt = QT[tname]
    N, K, rows = SHAPES[tname]
    vpb, _ = quants.block_size(qt)
    mat = N * quants.row_bytes(qt, K)
    blob = 2 * mat + 6  # even, not 16-aligned
    n_exp = len(rows)
    cache = np.zeros(n_exp * blob + 16, np.uint8)
    for i in range(n_exp):
        cache[i * blob: i * blob + 2 * mat] = quants.random_blocks(qt, 2 * N * K // vpb, rng).reshape(-1)
    off = np.concatenate([[1], 1 + np.cumsum(rows)])
    bounds = np.stack([off[:-1], off[1:]], axis=1).astype(np.int32)
    R_total = int(off[-1]) + 1
    layout = q8_1.layout_for(qt)
    act = q8_1.pack_rows(q8_1.quantize_rows(rng.standard_normal((R_total, K)).astype(np.float32), layout))
    woff = np.arange(n_exp, dtype=np.int64) * blob
    return qt, cache, act, R_total, bounds, woff, mat, N, K


def probe_one(cuda, dev, name: str, cfg: dict, tname: str, rng) -> str:
    """One configuration and type: its attributes, then a small launch. Returns "OK", "MISMATCH",
    "NO LAUNCH" (products_ws refused it) or "ERROR"."""
    import numpy as np  # noqa: PLC0415
    from gguf import GGMLQuantizationType as QT  # noqa: PLC0415

    from fast.cuda import products, products_ws, runtime  # noqa: PLC0415

    fmt = products._format(QT[tname])
    defines = products_ws._defines(cfg, fmt)
    kname = "ws_" + fmt.mmq_kernel
    _say(f"[{name} / {tname}] {kname} defines {defines}")
    # as products_ws._func loads it, without its launch check: the attributes of a kernel that
    # cannot launch are what this probe is for
    mod = runtime.load_module("mmq_ws", defines)
    (smem,) = runtime.module_ints(mod, kname + "_smem", 1)
    geo = runtime.module_ints(mod, "mmq_ws_geometry", 4)
    f = runtime.allow_dynamic_smem(mod.get_function(kname), smem)
    at = _attrs(cuda, f)
    threads = geo[2]
    _say("    attributes: " + ", ".join(f"{k} {v}" for k, v in at.items()))
    _say(f"    launch: block ({threads}, 1, 1) = {threads // 32} warps, dynamic smem {smem} B; geometry "
         f"BM {geo[0]} BN {geo[1]} MINB {geo[3]}")
    if isinstance(at["NUM_REGS"], int) and isinstance(at["SHARED_SIZE_BYTES"], int):
        lim = products_ws.launch_limits(at["NUM_REGS"], threads, smem, at["SHARED_SIZE_BYTES"])
        _say(f"    products_ws.launch_limits: {lim}; driver occupancy (CTAs/SM): {_occupancy(f, threads, smem)}")
    if isinstance(at["MAX_THREADS_PER_BLOCK"], int) and threads > at["MAX_THREADS_PER_BLOCK"]:
        _say(f"    NOTE: block {threads} > MAX_THREADS_PER_BLOCK {at['MAX_THREADS_PER_BLOCK']}: the launch must fail")

    # the raw launch at the kernel's own block, outside products_ws's check: the driver's verdict
    try:
        from fast.cuda import signatures  # noqa: PLC0415

        params = signatures.kernels("mmq_ws", defines)[kname].params
        f.prepare("".join(p.letters for p in params))
        # every pointer NULL, tiles too: the kernel returns at once (the driver's checks still run)
        fields = {"N": 1, "K": fmt.block_values, "R_total": 1, "ldo": 1}
        args = tuple(fields.get(p.name, 0) for p in params)
        dev.launch(f, None, (1, 1, 1), (threads, 1, 1), *args, shared_size=smem)
        _wait(cuda, dev.stream, "raw launch")
        _say("    raw launch (tiles NULL): OK")
    except Exception as e:  # noqa: BLE001
        _say(f"    raw launch (tiles NULL): {type(e).__name__}: {e}")

    try:
        g = products_ws.ws_geometry(QT[tname], cfg)
        _say(f"    products_ws.ws_geometry: {g}")
    except Exception as e:  # noqa: BLE001
        _say(f"    products_ws refuses it: {type(e).__name__}: {e}")
        return "NO LAUNCH"

    qt, cache, act, R_total, bounds, woff, mat, N, K = _inputs(tname, rng)
    bufs = []

    def up(a, what):
        b = runtime.to_device(np.ascontiguousarray(a), what)
        bufs.append(b)
        return b

    def poisoned(nbytes):
        b = runtime.alloc(nbytes, "probe output")
        cuda.memset_d8(b, 0xA5, nbytes)
        bufs.append(b)
        return b

    def get(b, nbytes):
        h = np.empty(nbytes, np.uint8)
        cuda.memcpy_dtoh(h, b)
        return h

    try:
        cd, ad = up(cache, "probe weights"), up(act, "probe activations")
        nbytes = R_total * N * 4
        mean = float(np.mean(SHAPES[tname][2]))
        c = products.tile_config(mean)
        tr = products.row_tiles(bounds, woff, products.tile_rows_for(c))
        r0, r1 = poisoned(nbytes), poisoned(nbytes)
        products.mmq_tiles(dev, qt, cd, N=N, K=K, act=ad, R_total=R_total, tiles=up(tr, "probe tiles"),
                           n_tiles=len(tr), out=r0, tile_rows_mean=mean, pair=(mat, r1))
        _wait(cuda, dev.stream, "mmq.cu reference")
        want = [get(r0, nbytes), get(r1, nbytes)]
        tw = products.row_tiles(bounds, woff, products_ws.tile_rows_for_ws(cfg))
        td = up(tw, "probe ws tiles")
        verdict = "OK"
        for persistent, ctas in ((True, None), (True, 2)):
            o0, o1 = poisoned(nbytes), poisoned(nbytes)
            t0 = time.perf_counter()
            products_ws.mmq_tiles_ws(dev, qt, cd, N=N, K=K, act=ad, R_total=R_total, tiles=td, n_tiles=len(tw),
                                     out=o0, config=cfg, pair=(mat, o1), persistent=persistent, ctas=ctas)
            _wait(cuda, dev.stream, f"mmq_tiles_ws ctas={ctas}")
            ms = (time.perf_counter() - t0) * 1e3
            same = [bool(np.array_equal(get(o, nbytes), w)) for o, w in zip((o0, o1), want)]
            ok = all(same)
            verdict = verdict if ok else "MISMATCH"
            _say(f"    launch ({len(tw)} row tiles, ctas={ctas or 'persistent'}, {ms:.1f} ms): "
                 f"{'OK, bytes equal mmq.cu' if ok else 'MISMATCH gate/up equal: ' + str(same)}")
        return verdict
    finally:
        for b in bufs:
            try:
                b.free()
            except Exception:  # noqa: BLE001, S110
                pass


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default="", help="products_ws.WS_CONFIGS names, comma-separated (default: all)")
    ap.add_argument("--types", default=",".join(TYPES), help="types, comma-separated")
    args = ap.parse_args(argv)

    import numpy as np  # noqa: PLC0415

    from fast.cuda import products_ws, runtime  # noqa: PLC0415

    ok, why = runtime.cuda_available()
    if not ok:
        _say(f"no GPU: {why}")
        return 2
    runtime.context()
    import pycuda.driver as cuda  # noqa: PLC0415

    d = cuda.Context.get_device()
    _say(f"device {d.name()} cc {d.compute_capability()}, driver {cuda.get_driver_version()}")
    da = []
    for a in DEV_ATTRS:
        try:
            da.append(f"{a} {d.get_attribute(getattr(cuda.device_attribute, a))}")
        except Exception:  # noqa: BLE001
            da.append(f"{a} n/a")
    _say("    " + ", ".join(da))
    dev = runtime.Device()
    names = [n.strip() for n in args.configs.split(",") if n.strip()] or [*products_ws.WS_CONFIGS, *LEGACY]
    types = [t.strip() for t in args.types.split(",") if t.strip()]
    rng = np.random.default_rng(27)
    results = {}
    for name in names:
        for t in types:
            try:
                cfg = LEGACY[name] if name in LEGACY else products_ws.ws_config(name)
                results[(name, t)] = probe_one(cuda, dev, name, cfg, t, rng)
            except Exception as e:  # noqa: BLE001
                _say(f"    ERROR: {type(e).__name__}: {e}")
                _say("    " + "    ".join(traceback.format_exc().splitlines(True)[-6:]))
                results[(name, t)] = "ERROR"
    _say("summary: " + "; ".join(f"{n}/{t} {v}" for (n, t), v in results.items()))
    return 0 if all(v == ("NO LAUNCH" if n in LEGACY else "OK") for (n, _), v in results.items()) else 1


if __name__ == "__main__":
    sys.exit(main())
