"""fast/cuda/kernels/mmq_ws.cu (warp-specialized MMQ, fast/cuda/products_ws.py mmq_tiles_ws)
against mmq.cu's tile-list kernel (products.mmq_tiles) on the same inputs, byte for byte, and
against strata.mmq.mmq on the rows of a few experts.

Experts lie at scattered even offsets in one buffer (blobs of [gate | up], rarely 16-aligned),
their rows scattered, in shuffled order and with gaps; random valid weight blocks and random
activations (never zeros by construction, scales spread over e^-3..e^3). The shapes hit every
tile edge: expert row counts 0, 1, not a multiple of 8, above one tile (several row tiles an
expert); N not a multiple of the weight-row tile and below it; K whose last chunk holds fewer
than 4 blocks (Q8_0); many experts. Each ws configuration of products_ws.WS_CONFIGS runs with
the device's resident CTAs, with a CTA a tile, and with 3 CTAs each walking many tiles. Output buffers
are poisoned before each launch and compared whole as uint8 (rows outside every tile must stay
poison in both). Without a GPU (or PyCUDA) every test skips with the backend's reason.

    python3 -m pytest -q -p no:cacheprovider verify/test_mmq_ws_cuda.py
"""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from fast.cuda.products_ws import WS_CONFIGS
from fast.cuda.runtime import cuda_available
from strata import mmq, q8_1, quants
from verify.device_checks import POISON

_OK, _WHY = cuda_available()
pytestmark = pytest.mark.skipif(not _OK, reason=_WHY)

#: (type, N, K, expert row counts, seed)
CASES = [
    ("IQ2_XS", 200, 512, [1, 7, 13, 0, 130, 300, 5, 64, 8, 77], 1),
    ("IQ2_XS", 40, 256, [3, 129, 1, 17], 2),  # N below one weight-row tile
    ("IQ2_XS", 640, 2560, [160, 81, 1, 255, 12, 96], 3),  # the strata gate/up shape
    ("IQ2_XS", 136, 512, [int(r) for r in np.random.default_rng(9).integers(0, 40, 48)], 4),  # many experts
    ("Q8_0", 136, 160, [1, 9, 0, 140, 33, 257, 2], 5),  # K = 5 blocks: the last chunk holds one
    ("Q8_0", 2560, 640, [160, 7, 1, 129], 6),  # the strata down shape
    ("Q8_0", 72, 1024, [int(r) for r in np.random.default_rng(10).integers(0, 30, 40)], 7),
]
CHECKED_EXPERTS = 3  # experts (those with rows) whose rows are compared with strata.mmq


@pytest.fixture(scope="module")
def cu():
    from fast.cuda import runtime

    runtime.context()
    import pycuda.driver as cuda

    return cuda


@pytest.fixture(scope="module")
def dev(cu):
    from fast.cuda import runtime

    return runtime.Device()


def _dev(arr, what="test buffer"):
    from fast.cuda import runtime

    return runtime.to_device(np.ascontiguousarray(arr), what)


def _poisoned(cu, nbytes):
    from fast.cuda import runtime

    buf = runtime.alloc(nbytes, "test output")
    cu.memset_d8(buf, POISON, max(int(nbytes), 1))
    return buf


def _get(cu, buf, nbytes) -> np.ndarray:
    cu.Context.synchronize()
    h = np.empty(int(nbytes), np.uint8)
    cu.memcpy_dtoh(h, buf)
    return h


def _report(got: np.ndarray, want: np.ndarray, ncols: int) -> str:
    g32, w32 = got.view("<u4"), want.view("<u4")
    bad = np.nonzero(g32 != w32)[0]
    i = int(bad[0])
    r, c = divmod(i, ncols)
    return (f"{bad.size} of {g32.size} float32 words differ; first at row {r}, column {c}: "
            f"got 0x{int(g32[i]):08x} ({float(got.view('<f4')[i])!r}) want 0x{int(w32[i]):08x} "
            f"({float(want.view('<f4')[i])!r})")


def _slice_rows(act: q8_1.Q8Rows, r0: int, r1: int) -> q8_1.Q8Rows:
    f = {k: (v[r0:r1] if isinstance(v, np.ndarray) else v) for k, v in vars(act).items()}
    return q8_1.Q8Rows(**f)


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-N{c[1]}-K{c[2]}-e{len(c[3])}-s{c[4]}" for c in CASES])
def test_mmq_ws_same_bytes_as_mmq(cu, dev, case):
    from fast.cuda import products, products_ws

    tname, N, K, rows, seed = case
    qt = QT[tname]
    rng = np.random.default_rng(seed)
    vpb, _ = quants.block_size(qt)
    rb = quants.row_bytes(qt, K)
    mat = N * rb
    n_exp = len(rows)
    slots = rng.permutation(n_exp)
    blob = 2 * mat + 2 * int(rng.integers(0, 9))  # even, rarely 16-aligned
    cache = np.zeros(n_exp * blob + 16, np.uint8)  # 16 readable bytes after the last blob
    for i in range(n_exp):
        cache[slots[i] * blob: slots[i] * blob + 2 * mat] = quants.random_blocks(qt, 2 * N * K // vpb, rng).reshape(-1)
    starts, r = {}, 1
    for i in rng.permutation(n_exp):
        starts[i] = r
        r += rows[i] + int(rng.integers(0, 3))
    R_total = r
    bounds = np.array([(starts[i], starts[i] + rows[i]) for i in range(n_exp)], np.int32)
    layout = q8_1.layout_for(qt)
    x = rng.standard_normal((R_total, K)).astype(np.float32) * np.exp(rng.uniform(-3, 3, (R_total, 1))).astype(np.float32)
    act_rows = q8_1.quantize_rows(x, layout)
    cd, ad = _dev(cache), _dev(q8_1.pack_rows(act_rows))
    woff = slots.astype(np.int64) * blob
    nbytes = R_total * N * 4
    mean = float(np.mean(rows))

    # mmq.cu's tile list, its automatic configuration
    c = products.tile_config(mean)
    t_ref = _dev(products.row_tiles(bounds, woff, products.tile_rows_for(c)))
    n_ref = len(products.row_tiles(bounds, woff, products.tile_rows_for(c)))
    g0, u0 = _poisoned(cu, nbytes), _poisoned(cu, nbytes)
    products.mmq_tiles(dev, qt, cd, N=N, K=K, act=ad, R_total=R_total, tiles=t_ref, n_tiles=n_ref, out=g0,
                       tile_rows_mean=mean, pair=(mat, u0))
    want = [_get(cu, g0, nbytes), _get(cu, u0, nbytes)]

    # strata.mmq on the rows of a few experts
    dec = q8_1.decode_rows(act_rows, R_total, layout)
    live = [i for i in range(n_exp) if rows[i] > 0]
    for i in [live[k] for k in np.linspace(0, len(live) - 1, min(CHECKED_EXPERTS, len(live))).astype(int)]:
        b, e = int(bounds[i, 0]), int(bounds[i, 1])
        for m in range(2):
            w = cache[slots[i] * blob + m * mat: slots[i] * blob + (m + 1) * mat].reshape(N, rb)
            ref = mmq.mmq(qt, w, _slice_rows(dec, b, e)).astype("<f4")
            got = want[m].view("<f4").reshape(R_total, N)[b:e]
            assert np.array_equal(got.view(np.uint32), ref.view(np.uint32)), \
                f"{tname} mmq.cu tile list (the reference arm) != strata.mmq, expert {i}, matrix {m}"

    for name in products_ws.WS_CONFIGS:
        cfg = products_ws.ws_config(name)
        tl = products.row_tiles(bounds, woff, products_ws.tile_rows_for_ws(cfg))
        td = _dev(tl)
        # the device's resident CTAs, a CTA a tile, and 3 CTAs walking many tiles each (the
        # producers' copies running ahead across tile boundaries)
        for persistent, ctas in ((True, None), (False, None), (True, 3)):
            g, u = _poisoned(cu, nbytes), _poisoned(cu, nbytes)
            before = dev.counters["launches"]
            products_ws.mmq_tiles_ws(dev, qt, cd, N=N, K=K, act=ad, R_total=R_total, tiles=td, n_tiles=len(tl),
                                     out=g, config=cfg, pair=(mat, u), persistent=persistent, ctas=ctas)
            assert dev.counters["launches"] - before == 1
            for what, got_b, w in (("gate", g, want[0]), ("up", u, want[1])):
                gb = _get(cu, got_b, nbytes)
                assert np.array_equal(gb, w), (f"{tname} ws {name} persistent={persistent} ctas={ctas} {what} N={N} K={K}: "
                                               + _report(gb, w, N))
            g.free()
            u.free()
        td.free()
    for b_ in (g0, u0, cd, ad, t_ref):
        b_.free()


def test_mmq_ws_single_matrix(cu, dev):
    """gridDim.y = 1 (no pair): out written, the same bytes as mmq.cu's single launch."""
    from fast.cuda import products, products_ws

    qt, N, K, rows = QT.Q8_0, 100, 256, [5, 0, 70, 1]
    rng = np.random.default_rng(11)
    rb = quants.row_bytes(qt, K)
    mat = N * rb
    cache = np.zeros(len(rows) * mat + 16, np.uint8)
    cache[:len(rows) * mat] = quants.random_blocks(qt, len(rows) * N * K // 32, rng).reshape(-1)
    off = np.concatenate([[0], np.cumsum(rows)])
    bounds = np.stack([off[:-1], off[1:]], axis=1).astype(np.int32)
    R_total = int(off[-1])
    layout = q8_1.layout_for(qt)
    act_rows = q8_1.quantize_rows(rng.standard_normal((R_total, K)).astype(np.float32), layout)
    cd, ad = _dev(cache), _dev(q8_1.pack_rows(act_rows))
    woff = np.arange(len(rows), dtype=np.int64) * mat
    nbytes = R_total * N * 4
    c = products.tile_config(float(np.mean(rows)))
    tr = products.row_tiles(bounds, woff, products.tile_rows_for(c))
    o0 = _poisoned(cu, nbytes)
    products.mmq_tiles(dev, qt, cd, N=N, K=K, act=ad, R_total=R_total, tiles=_dev(tr), n_tiles=len(tr), out=o0,
                       tile_rows_mean=float(np.mean(rows)))
    want = _get(cu, o0, nbytes)
    tw = products.row_tiles(bounds, woff, products_ws.tile_rows_for_ws())
    o1 = _poisoned(cu, nbytes)
    products_ws.mmq_tiles_ws(dev, qt, cd, N=N, K=K, act=ad, R_total=R_total, tiles=_dev(tw), n_tiles=len(tw), out=o1)
    got = _get(cu, o1, nbytes)
    assert np.array_equal(got, want), _report(got, want, N)


@pytest.mark.parametrize("name", sorted(WS_CONFIGS))
@pytest.mark.parametrize("tname", ["IQ2_XS", "Q8_0"])
def test_ws_config_fits_its_launch(cu, name, tname):
    """Each configuration's kernel holds its block at its register count (the driver's
    MAX_THREADS_PER_BLOCK at NUM_REGS; d7e5400's 200-register default did not: every launch
    failed "too many resources requested"), and one SM holds at least one CTA with its shared
    memory (products_ws.launch_limits, the driver's rules)."""
    from fast.cuda import products, products_ws

    cfg = products_ws.ws_config(name)
    f = products_ws._func(cfg, products._format(QT[tname]))
    regs, max_threads = int(f.num_regs), int(f.max_threads_per_block)
    assert f.threads <= max_threads, f"{name} {tname}: block {f.threads} > {max_threads} at {regs} registers"
    lim = products_ws.launch_limits(regs, f.threads, f.smem, int(f.shared_size_bytes))
    assert lim["fits"] and lim["ctas"] == f.ctas_per_sm >= 1, (name, tname, lim)
