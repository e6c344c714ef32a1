"""CUDA kernels against their NumPy definitions, byte for byte.

- fast/cuda/kernels/quantize_q8_1.cu against strata_prefill.contract.q8_1.gather_quantize / scatter_quantize,
  all three layouts (random x, random routings, one all-zero token);
- fast/cuda/kernels/mmq.cu against strata_prefill.contract.mmq.mmq (mmq_prepared), every registered weight type (random valid
  blocks, random activations, several experts with uneven row counts including 0 and 1,
  the tiny and strata shapes); its pair launch (gate and up, gridDim.y = 2) against two
  single launches;
- fast/cuda/kernels/swiglu_q8_1.cu against swiglu.cu then quantize_q8_1.cu (the two-step
  path) and against strata_prefill.contract.moe.swiglu + strata_prefill.contract.q8_1.quantize_rows, every down layout; its
  gpt-oss form (swiglu_oai_q8_1) likewise against swiglu_oai_rows then the quantize, and against
  strata_prefill.contract.moe.swiglu_oai of the biased rows + strata_prefill.contract.q8_1.quantize_rows.

Output buffers are poisoned before each launch and compared whole, as uint8; at the sizes the
GPU suites time (rows with `check`), a spread of rows (tokens, experts) is compared with the
NumPy definition and the rest must be written (no poison left). Every case is a row of
verify/cases.py (`KERNEL_CASES`); the slow NumPy expectations come from the reference cache
(verify/kernel_refs.py). Without a GPU (or without PyCUDA) every test here skips with the
backend's one-line reason.
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from strata_prefill.fast.cuda.runtime import cuda_available
from strata_prefill.contract import moe, mmq, q8_1, quants
from strata_prefill.contract.constants import GROUP_TAIL_BYTES, MMQ_GROUP, WEIGHT_TAIL_BYTES
from strata_prefill.contract.routing import routing_tables
from strata_prefill.fast.tiles import routed_row_lists
from strata_prefill.verify.cases import kernel_rows, mmq_configs, params, sample_index
from strata_prefill.verify.device_checks import POISON, rows as device_rows, unwritten_words
from strata_prefill.verify.kernel_inputs import around_clamp, normal
from strata_prefill.verify.kernel_refs import kept, worth_keeping

_OK, _WHY = cuda_available()
pytestmark = pytest.mark.skipif(not _OK, reason=_WHY)



@pytest.fixture(scope="module")
def cu():
    from strata_prefill.fast.cuda import runtime

    runtime.context()
    import pycuda.driver as cuda

    return cuda


@pytest.fixture(scope="module")
def dev(cu):
    """The launch object the wrappers take (counters, default stream, memory pool)."""
    from strata_prefill.fast.cuda import runtime

    return runtime.Device()


def _dev(cu, arr, what="test buffer"):
    from strata_prefill.fast.cuda import runtime

    return runtime.to_device(np.ascontiguousarray(arr), what)


def _poisoned(cu, nbytes):
    from strata_prefill.fast.cuda import runtime

    buf = runtime.alloc(nbytes, "test output")
    cu.memset_d8(buf, POISON, max(int(nbytes), 1))
    return buf


def _get(cu, buf, nbytes) -> np.ndarray:
    cu.Context.synchronize()
    h = np.empty(int(nbytes), np.uint8)
    if nbytes:
        cu.memcpy_dtoh(h, buf)
    return h


# ---------------------------------------------------------------- mismatch reports


def _q8_report(got: np.ndarray, want: np.ndarray, n_rows: int, K: int, layout) -> str:
    diff = np.nonzero(got != want)[0]
    i = int(diff[0])
    blk, off = divmod(i, q8_1.BLOCK_BYTES)
    kb, row = divmod(blk, n_rows)
    base = blk * q8_1.BLOCK_BYTES
    if off < q8_1.HEADER_BYTES:
        # D4: four float32 scales (one a 32-value column block); the others: halves
        width, name = (4, "d") if layout == q8_1.Layout.D4 else (2, "half")
        f = off // width
        g, w = (b[base + width * f: base + width * (f + 1)].view(f"<f{width}")[0] for b in (got, want))
        col = f" (column {kb * 128 + 32 * f})" if width == 4 else ""
        bits = lambda v: f"0x{int(v.view(f'<u{width}')):0{2 * width}x}"  # noqa: E731
        what = f"header {name}[{f}]{col}: got {float(g)!r} ({bits(g)}) want {float(w)!r} ({bits(w)})"
    else:
        col = kb * 128 + off - q8_1.HEADER_BYTES
        g, w = got[i].view(np.int8), want[i].view(np.int8)
        what = f"column {col}: got {int(g)} (0x{int(got[i]):02x}) want {int(w)} (0x{int(want[i]):02x})"
    return (f"{diff.size} bytes differ; first at byte {i}: row {row}, block {kb}, byte {off}: {what}"
            f"\n{q8_1.describe_block(got[base:base + 144], layout)}"
            f"\nwant\n{q8_1.describe_block(want[base:base + 144], layout)}")


def _f32_report(got: np.ndarray, want: np.ndarray, ncols: int) -> str:
    g32, w32 = got.view("<f4"), want.view("<f4")
    bad = np.nonzero(g32.view("<u4") != w32.view("<u4"))[0]
    i = int(bad[0])
    r, c = divmod(i, ncols)
    return (f"{bad.size} of {g32.size} float32 elements differ; first at row {r}, column {c}: "
            f"got {float(g32[i])!r} (0x{int(g32.view('<u4')[i]):08x}) "
            f"want {float(w32[i])!r} (0x{int(w32.view('<u4')[i]):08x})")


# ---------------------------------------------------------------- quantize


def _random_x(rng, T, K):
    x = normal(rng, (T, K))
    scale = np.exp(rng.uniform(-6, 6, size=(T, 1))).astype(np.float32)
    x *= scale
    x[T // 2] = 0.0  # one all-zero token
    # some exact halves after scaling and some repeated maxima
    x[1, :8] = np.float32(0.5)
    if K > 64:
        x[2, 32:64] = np.float32(-3.0)
    return x


def _routing(rng, T, E, k):
    keys = rng.random((T, E), dtype=np.float32)  # k distinct experts a token, in random order: the k smallest keys
    top = np.argpartition(keys, k - 1, axis=1)[:, :k]
    ids = np.take_along_axis(top, np.argsort(np.take_along_axis(keys, top, axis=1), axis=1), axis=1).astype(np.int32)
    return routing_tables(ids, E)


def _with_rows(got: np.ndarray, n_rows: int, sel: np.ndarray, want_rows: np.ndarray) -> np.ndarray:
    """A q8_1 buffer equal to `got` but for rows `sel`, which hold `want_rows` (the NumPy
    definition of the rows a sampled check compares): so that the whole-buffer comparison and
    its report name the first byte that differs in those rows."""
    want = got.copy()
    q8_1.unpack_rows(want, n_rows)[sel] = want_rows
    return want


def _no_poisoned_block(buf: np.ndarray, n_rows: int, what: str) -> None:
    """Every 144-byte block of the buffer was written (none is still all poison). The buffer
    is column-block-major: block i is column block i // n_rows of row i % n_rows."""
    blocks = buf.reshape(-1, q8_1.BLOCK_BYTES)
    # the blocks whose header (16 bytes) is all poison, then of those the ones all poison: the
    # same blocks as testing every byte, at a ninth of the bytes read (a 32K buffer is 840 MB)
    heads = np.flatnonzero((blocks[:, :q8_1.HEADER_BYTES] == POISON).all(axis=1))
    left = heads[(blocks[heads] == POISON).all(axis=1)]
    assert left.size == 0, f"{what}: {left.size} blocks never written; first at row {int(left[0]) % n_rows}, " \
                           f"block {int(left[0]) // n_rows}"


@pytest.mark.parametrize("case", params(kernel_rows("quantize")))
def test_quantize_gather_scatter(cu, dev, case):
    from strata_prefill.fast.cuda import products

    T, K, E, k = (case.shape[n] for n in ("T", "K", "E", "k"))
    layout = q8_1.Layout[case.config]
    rng = np.random.default_rng(1000 * T + K + int(layout))
    x = _random_x(rng, T, K)
    rt = _routing(rng, T, E, k)
    R = T * k
    nbytes = q8_1.buffer_nbytes(R, K)

    if case.check is None:
        want_g = q8_1.gather_quantize(x, rt.src, layout, q8_1.alloc_buffer(R, K))
        want_s = q8_1.scatter_quantize(x, rt.slot, k, layout, q8_1.alloc_buffer(R, K))
        assert np.array_equal(want_g, want_s)
    else:  # the benchmarked sizes: a spread of rows against the definition, gather against scatter whole
        sel = sample_index(R, case.check)
        want_rows = q8_1.quantize_rows(x[rt.src[sel]], layout)

    xd = _dev(cu, x)
    srcd = _dev(cu, rt.src.astype(np.int32))
    slotd = _dev(cu, rt.slot.astype(np.int32))

    out = _poisoned(cu, nbytes)
    products.quantize_gather(dev, xd, srcd, n_rows=R, K=K, layout=layout, out=out)
    got = _get(cu, out, nbytes)
    if case.check is None:
        assert np.array_equal(got, want_g), "gather: " + _q8_report(got, want_g, R, K, layout)
    else:  # every block written, the sampled rows the definition's (the report as for a whole buffer)
        _no_poisoned_block(got, R, "gather")
        if not np.array_equal(q8_1.unpack_rows(got, R)[sel], want_rows):
            want_g = _with_rows(got, R, sel, want_rows)
            pytest.fail("gather: " + _q8_report(got, want_g, R, K, layout))
        want_s = got  # scatter must equal gather whole

    out2 = _poisoned(cu, nbytes)
    products.quantize_scatter(dev, xd, slotd, T=T, K_used=k, K=K, layout=layout, out=out2)
    got2 = _get(cu, out2, nbytes)
    what = "scatter" if case.check is None else "scatter vs gather"
    assert np.array_equal(got2, want_s), f"{what}: " + _q8_report(got2, want_s, R, K, layout)


# ---------------------------------------------------------------- mmq


# MMQ tile configurations every mmq case runs (the reference computed once): verify/cases.py's
# mmq_configs, the default, each automatic choice and any from STRATA_MMQ_TEST_CONFIGS.
def _slice_rows(act: q8_1.Q8Rows, r0: int, r1: int) -> q8_1.Q8Rows:
    f = {k: (v[r0:r1] if isinstance(v, np.ndarray) else v) for k, v in vars(act).items()}
    return q8_1.Q8Rows(**f)


def _extreme_blocks(qt, n_blocks: int, rng) -> np.ndarray:
    """Random valid blocks pushed to the largest block sums: every integer sub-scale at its
    maximum (31; IQ1's 15; Q2_K 15; Q6_K -128 with every code -32; IQ4_XS -32 with every code
    -127) and, for the grid types but IQ3_S, every grid index at the grid entry of largest
    magnitude; signs (IQ1's deltas) and
    block scales stay random."""
    blk = quants.random_blocks(qt, n_blocks, rng)
    if qt in (QT.IQ2_XS, QT.IQ3_XXS, QT.IQ2_XXS, QT.IQ2_S, QT.IQ1_S, QT.IQ1_M):
        gmax = int(np.argmax(np.abs(quants._grid(qt).astype(np.int32)).sum(axis=1)))
    if qt == QT.IQ2_XS:  # d | 32 x u16 (9-bit grid index, 7-bit sign index) | 8 scale bytes
        qs = np.ascontiguousarray(blk[:, 2:66]).view("<u2")
        blk[:, 2:66] = ((qs & np.uint16(0xFE00)) | np.uint16(gmax)).view(np.uint8)
        blk[:, 66:74] = 0xFF
    elif qt == QT.IQ3_XXS:  # d | 64 grid indices | 8 x u32 (4 sign indices, 4-bit scale on top)
        blk[:, 2:66] = gmax
        a32 = np.ascontiguousarray(blk[:, 66:98]).view("<u4")
        blk[:, 66:98] = (a32 | np.uint32(0xF0000000)).view(np.uint8)
    elif qt == QT.Q2_K:  # 16 scale bytes (low nibble the scale) | 64 code bytes | d | dmin
        blk[:, 0:16] |= 0x0F
        blk[:, 16:80] = 0xFF
    elif qt == QT.Q6_K:  # 128 low-bit bytes | 64 high-bit bytes | 16 int8 scales | d: codes 0 - 32
        blk[:, 0:192] = 0
        blk[:, 192:208] = 0x80
    elif qt == QT.IQ4_XS:  # d | scales_h u16 | scales_l[4] | 128 index bytes: ls 0 (u -32), index 0 (-127)
        blk[:, 2:136] = 0
    elif qt == QT.IQ2_XXS:  # d | 8 x (4 grid indices, u32 of 4 sign indices and the scale on top)
        q = blk[:, 2:66].reshape(-1, 8, 8)
        q[:, :, :4] = gmax
        q[:, :, 7] |= 0xF0
    elif qt == QT.IQ2_S:  # d | 32 index bytes | 32 sign bytes | 8 qh (2 index bits an entry) | 8 scales
        blk[:, 2:34] = gmax & 255
        blk[:, 66:74] = (gmax >> 8) * 0x55
        blk[:, 74:82] = 0xFF
    elif qt == QT.IQ1_S:  # d | 32 index bytes | 8 x u16 (3 index bits an entry, the scale, the delta's sign)
        blk[:, 2:34] = gmax & 255
        qh = np.ascontiguousarray(blk[:, 34:50]).view("<u2")
        blk[:, 34:50] = ((qh & np.uint16(0x8000)) | np.uint16(0x7000 | (gmax >> 8) * 0o1111)).view(np.uint8)
    elif qt == QT.IQ1_M:  # 32 index bytes | 16 qh (a nibble an entry: 3 index bits, the delta's sign) | 4 scale words
        blk[:, 0:32] = gmax & 255
        blk[:, 32:48] = (blk[:, 32:48] & 0x88) | ((gmax >> 8) * 0x11)
        sc = np.ascontiguousarray(blk[:, 48:56]).view("<u2")
        blk[:, 48:56] = (sc | np.uint16(0x0FFF)).view(np.uint8)  # every 3-bit scale 7, d kept
    return blk


def _mmq_case(cu, dev, qt, N, K, rows, *, lead=3, gap=2, stride_pad=2, tile_rows=(128,), seed=0,
              extreme=False, keep=False):
    """Experts with `rows` activation rows each, laid out after `lead` unused rows with `gap`
    unused rows between experts; weights in one group buffer with odd-ish stride. extreme:
    weights from _extreme_blocks and each activation row the signs of one weight row (+ or -),
    so its q8_1 codes are +-127 aligned with that row: the largest block sums. keep: the NumPy
    expectation from the reference cache. Returns the largest |sumi| of a block over the case
    (from the reference's folded codes)."""
    from strata_prefill.fast.cuda import products

    rng = np.random.default_rng(seed)
    vpb, bpb = quants.block_size(qt)
    rb = quants.row_bytes(qt, K)
    n_exp = len(rows)
    stride = N * rb + stride_pad
    wbuf = np.zeros(n_exp * stride + 64, np.uint8)  # + a zeroed tail
    wq = []
    for q in range(n_exp):
        make = _extreme_blocks if extreme else quants.random_blocks
        blk = make(qt, N * K // vpb, rng).reshape(N, rb)
        wbuf[q * stride: q * stride + N * rb] = blk.reshape(-1)
        wq.append(blk)
    bounds = []
    r = lead
    for n in rows:
        bounds.append((r, r + n))
        r += n + gap
    R_total = r
    layout = q8_1.layout_for(qt)
    x = rng.standard_normal((R_total, K)).astype(np.float32)
    x *= np.exp(rng.uniform(-3, 3, size=(R_total, 1))).astype(np.float32)
    if extreme:
        folded = quants.folded_codes(quants.decode(qt, wq[0])).reshape(N, K)
        sign = np.where(folded[np.arange(R_total) % N] < 0, -1.0, 1.0).astype(np.float32)
        x = sign * np.where(np.arange(R_total) % 2 == 0, 1.0, -1.0).astype(np.float32)[:, None]
    elif R_total > lead:
        x[lead] = 0.0
    act_rows = q8_1.quantize_rows(x, layout)
    abuf = q8_1.pack_rows(act_rows)
    dec_act = q8_1.decode_rows(act_rows, R_total, layout)

    def definition():
        want = np.full(R_total * N * 4, POISON, np.uint8)
        wf = want.view("<f4").reshape(R_total, N)
        for q, (b, e) in enumerate(bounds):
            if e > b:
                wf[b:e] = mmq.mmq(qt, wq[q], _slice_rows(dec_act, b, e))
        return {"want": want}

    key = dict(type=qt.name, N=N, K=K, rows=list(rows), lead=lead, gap=gap, stride_pad=stride_pad, seed=seed,
               extreme=extreme)
    want = (kept("kernel-mmq", key, definition, (_mmq_case, _extreme_blocks)) if keep else definition())["want"]

    wd = _dev(cu, wbuf)
    ad = _dev(cu, abuf)
    bd = _dev(cu, np.array(bounds, np.int32).reshape(-1))
    for cfg in mmq_configs():
        bn = products.mmq_geometry(cfg)["BN"]
        for tr in sorted({min(t, bn) for t in tile_rows}, reverse=True):
            out = _poisoned(cu, R_total * N * 4)
            products.mmq_group(dev, qt, wd, w_stride=stride, N=N, K=K, act=ad, R_total=R_total, bounds=bd,
                               n_exp=n_exp, out=out, tile_rows=tr, config=cfg)
            got = _get(cu, out, R_total * N * 4)
            assert np.array_equal(got, want), (
                f"{qt.name} N={N} K={K} rows={rows} tile_rows={tr} config={cfg}: "
                + _f32_report(got, want, N))
    pw = mmq.prepare(qt, wq[0])  # w: [nb, N, 32] exact integers
    codes = np.ascontiguousarray(dec_act.codes[:, :pw.n_blocks].transpose(1, 0, 2), dtype=np.float32)
    return float(np.abs(np.matmul(codes, pw.w.transpose(0, 2, 1).astype(np.float32))).max())


def _mmq_options(case) -> dict:
    """_mmq_case's keyword arguments that a row of "mmq" or "mmq_extreme" gives."""
    return {k: case.shape[k] for k in ("lead", "gap", "stride_pad", "tile_rows", "seed") if k in case.shape}


@pytest.mark.parametrize("case", params(kernel_rows("mmq")))
def test_mmq_group(cu, dev, case):
    """Grouped launches: the tiny shapes (gate/up 512 x 256, down 256 x 256), the strata gate/up
    and down, K a multiple of 32 but not of 128 (a partial last chunk) with N not a multiple of
    128, ~150 rows an expert (the default picks its large-tile configuration, 2 row tiles
    each), sixteen experts of uneven rows."""
    s = case.shape
    _mmq_case(cu, dev, QT[case.weight_type], s["N"], s["K"], list(s["rows"]), keep=worth_keeping(case),
              **_mmq_options(case))


@pytest.mark.parametrize("case", params(kernel_rows("mmq_extreme")))
def test_mmq_extreme_sub_scaled_sums(cu, dev, case):
    """The largest block sums the sub-scale step carries (u * S as one exact fused
    multiply-add, scaled_magic): maximal sub-scales and grid entries, activations +-127 aligned
    with the weights' signs. IQ2_XS's sub-scaled sum of a block passes 2^22 here, the range no
    single magic-number conversion of the integer sum could carry."""
    tname, s = case.weight_type, case.shape
    top = _mmq_case(cu, dev, QT[tname], s["N"], s["K"], list(s["rows"]), extreme=True, **_mmq_options(case))
    floor = s["floor"]
    assert top > floor, f"{tname}: the largest block sum {top:.0f} does not reach {floor}"


@pytest.mark.parametrize("case", params(kernel_rows("mmq_dense")))
def test_mmq_dense(cu, dev, case):
    from strata_prefill.fast.cuda import products

    qt = QT[case.weight_type]
    rng = np.random.default_rng(case.shape["seed"])
    N, K, R = case.shape["N"], case.shape["K"], case.shape["R"]
    vpb, _ = quants.block_size(qt)
    w = quants.random_blocks(qt, N * K // vpb, rng).reshape(N, -1)
    layout = q8_1.layout_for(qt)
    x = rng.standard_normal((R, K)).astype(np.float32)
    act_rows = q8_1.quantize_rows(x, layout)
    want = mmq.mmq(qt, w, q8_1.decode_rows(act_rows, R, layout))
    want = want.astype("<f4").view(np.uint8).reshape(-1)
    wpad = np.concatenate([w.reshape(-1), np.zeros(WEIGHT_TAIL_BYTES, np.uint8)])
    wd, ad = _dev(cu, wpad), _dev(cu, q8_1.pack_rows(act_rows))
    out = _poisoned(cu, R * N * 4)
    products.mmq_dense(dev, qt, wd, N=N, K=K, act=ad, R=R, out=out)
    got = _get(cu, out, R * N * 4)
    assert np.array_equal(got, want), f"dense {qt.name}: " + _f32_report(got, want, N)


@pytest.mark.parametrize("case", params(kernel_rows("mmq_counters")))
def test_counters(cu, case):
    """Each Device counts its own launches: one dense product is one "mmq" launch there and
    none on another Device."""
    from strata_prefill.fast.cuda import runtime

    mine, other = runtime.Device(), runtime.Device()
    test_mmq_dense(cu, mine, kernel_rows("mmq_dense", weight_type=case.weight_type)[0])
    assert mine.counters["launches"] == 1 and mine.counters["mmq"] == 1
    assert other.counters["launches"] == 0


# ---------------------------------------------------------------- the walk's fused launches


def _gpu(a):
    from pycuda import gpuarray

    return gpuarray.to_gpu(np.ascontiguousarray(a))


@pytest.mark.parametrize("case", params(kernel_rows("mmq_pair")))
def test_mmq_pair_is_two_launches_in_one(cu, dev, case):
    """gate and up of each expert ([gate | up] per expert, as the group buffers hold them) in
    one launch: the same bytes as two single launches, every tile configuration, uneven
    bounds (empty, one row, more than a tile); counted as one "mmq" launch."""
    from strata_prefill.fast.cuda import products

    tname = case.weight_type
    qt = QT[tname]
    rng = np.random.default_rng(40 + int(qt))
    N, K = case.shape["N"], case.shape["K"]
    vpb, _ = quants.block_size(qt)
    rb = quants.row_bytes(qt, K)
    mat = N * rb
    rows = list(case.shape["rows"])
    stride = 2 * mat + 2
    wbuf = np.zeros(len(rows) * stride + WEIGHT_TAIL_BYTES, np.uint8)
    for q in range(len(rows)):
        wbuf[q * stride: q * stride + 2 * mat] = quants.random_blocks(qt, 2 * N * K // vpb, rng).reshape(-1)
    bounds, r = [], 2
    for n in rows:
        bounds.append((r, r + n))
        r += n + 3
    R_total = r
    layout = q8_1.layout_for(qt)
    x = rng.standard_normal((R_total, K)).astype(np.float32)
    x *= np.exp(rng.uniform(-3, 3, size=(R_total, 1))).astype(np.float32)
    act_rows = q8_1.quantize_rows(x, layout)
    wd, ad = _dev(cu, wbuf), _dev(cu, q8_1.pack_rows(act_rows))
    bd = _dev(cu, np.array(bounds, np.int32).reshape(-1))
    dec = q8_1.decode_rows(act_rows, R_total, layout)
    b0, b1 = bounds[3]  # the definition, for one expert's rows: the pair is not merely self-consistent
    want_up = mmq.mmq(qt, wbuf[3 * stride + mat: 3 * stride + 2 * mat].reshape(N, rb), _slice_rows(dec, b0, b1))
    nbytes = R_total * N * 4
    for cfg in mmq_configs():
        tr = products.mmq_geometry(cfg)["BN"]  # a configuration's tiles hold at most BN rows
        one_g, one_u, pair_g, pair_u = (_poisoned(cu, nbytes) for _ in range(4))
        products.mmq_group(dev, qt, wd, w_stride=stride, N=N, K=K, act=ad, R_total=R_total, bounds=bd,
                           n_exp=len(rows), out=one_g, config=cfg, tile_rows=tr)
        products.mmq_group(dev, qt, int(wd) + mat, w_stride=stride, N=N, K=K, act=ad, R_total=R_total, bounds=bd,
                           n_exp=len(rows), out=one_u, config=cfg, tile_rows=tr)
        before = dict(dev.counters)
        products.mmq_group(dev, qt, wd, w_stride=stride, N=N, K=K, act=ad, R_total=R_total, bounds=bd,
                           n_exp=len(rows), out=pair_g, config=cfg, tile_rows=tr, pair=(mat, pair_u))
        assert dev.counters["launches"] - before.get("launches", 0) == 1
        assert dev.counters["mmq"] - before.get("mmq", 0) == 1
        for what, got, want in (("gate", pair_g, one_g), ("up", pair_u, one_u)):
            g, w = _get(cu, got, nbytes), _get(cu, want, nbytes)
            assert np.array_equal(g, w), f"{tname} pair {what} config={cfg}: " + _f32_report(g, w, N)
        up = _get(cu, pair_u, nbytes).view("<f4").reshape(R_total, N)[b0:b1]
        assert np.array_equal(up.view(np.uint32), want_up.astype("<f4").view(np.uint32)), f"{tname} up vs strata_prefill.contract.mmq"


def _tile_list_case(cu, dev, qt, N, K, rows, seed, keep=False):
    """mmq.cu's tile-list form (products.mmq_tiles): experts lying at scattered even offsets in
    one buffer (as in the expert cache: blobs of [gate | up | down]), their rows scattered and
    in shuffled order, more experts than a group holds; gate and up in one launch. Every
    written row against strata_prefill.contract.mmq.mmq, every other byte still poison. keep: the NumPy
    expectation from the reference cache."""
    from strata_prefill.fast.cuda import products

    rng = np.random.default_rng(seed)
    vpb, _ = quants.block_size(qt)
    rb = quants.row_bytes(qt, K)
    mat = N * rb
    n_exp = len(rows)
    slots = rng.permutation(n_exp)  # expert i's blob at slot slots[i], not in id order
    blob = 2 * mat + 2 * int(rng.integers(0, 9))  # an even blob size, rarely 16-aligned
    cache = np.zeros(n_exp * blob + 16, np.uint8)  # 16 readable bytes after the last blob
    for i in range(n_exp):
        cache[slots[i] * blob: slots[i] * blob + 2 * mat] = quants.random_blocks(qt, 2 * N * K // vpb, rng).reshape(-1)
    starts, r, order = {}, 1, rng.permutation(n_exp)  # row ranges in another order, with gaps
    for i in order:
        starts[i] = r
        r += rows[i] + int(rng.integers(0, 3))
    R_total = r
    bounds = np.array([(starts[i], starts[i] + rows[i]) for i in range(n_exp)], np.int32)
    layout = q8_1.layout_for(qt)
    x = rng.standard_normal((R_total, K)).astype(np.float32) * np.exp(rng.uniform(-3, 3, (R_total, 1))).astype(np.float32)
    act_rows = q8_1.quantize_rows(x, layout)
    dec = q8_1.decode_rows(act_rows, R_total, layout)

    def definition():
        want = [np.full(R_total * N * 4, POISON, np.uint8) for _ in range(2)]
        for m in range(2):
            wf = want[m].view("<f4").reshape(R_total, N)
            for i, (b, e) in enumerate(bounds):
                if e > b:
                    w = cache[slots[i] * blob + m * mat: slots[i] * blob + (m + 1) * mat].reshape(N, rb)
                    wf[b:e] = mmq.mmq(qt, w, _slice_rows(dec, int(b), int(e)))
        return {"gate": want[0], "up": want[1]}

    key = dict(type=qt.name, N=N, K=K, rows=list(rows), seed=seed)
    got_def = kept("kernel-mmq-tiles", key, definition, (_tile_list_case,)) if keep else definition()
    want = [got_def["gate"], got_def["up"]]
    cd, ad = _dev(cu, cache), _dev(cu, q8_1.pack_rows(act_rows))
    mean = float(np.mean(rows))
    for cfg in mmq_configs():
        c = products.tile_config(mean) if cfg is None else cfg
        tiles = products.row_tiles(bounds, slots.astype(np.int64) * blob, products.tile_rows_for(c))
        td = _dev(cu, tiles)
        g, u = _poisoned(cu, R_total * N * 4), _poisoned(cu, R_total * N * 4)
        before = dev.counters["launches"]
        products.mmq_tiles(dev, qt, cd, N=N, K=K, act=ad, R_total=R_total, tiles=td, n_tiles=len(tiles), out=g,
                           tile_rows_mean=mean, config=cfg, pair=(mat, u))
        assert dev.counters["launches"] - before == 1
        for what, got, w in (("gate", g, want[0]), ("up", u, want[1])):
            gb = _get(cu, got, R_total * N * 4)
            assert np.array_equal(gb, w), f"{qt.name} tile list {what} N={N} K={K} config={cfg}: " + _f32_report(gb, w, N)

    # device_plan's form: the lists cut from the counts (strata_prefill.fast.tiles.routed_row_lists), one a
    # configuration the rows could call for (products.routed_tile_plans), each launched over its
    # worst-case length with its live count: the lists not chosen write nothing, and a grid
    # smaller than the tiles (STRATA_MMQ_LIST_CTAS 1) walks them all, as does one a tile (0)
    cnt, woff = np.array(rows, np.int64), slots.astype(np.int64) * blob
    plans = products.routed_tile_plans(int(cnt.sum()), n_exp)
    lists, live = routed_row_lists(cnt, bounds[:, 0], woff, [p for _cfg, p in plans])
    ld, lv = _dev(cu, lists), _dev(cu, live)
    saved = os.environ.get(products.LIST_CTAS_ENV)
    for ctas in ("1", "0", str(products.DEFAULT_LIST_CTAS)):
        g, u = _poisoned(cu, R_total * N * 4), _poisoned(cu, R_total * N * 4)
        os.environ[products.LIST_CTAS_ENV] = ctas
        try:
            at = 0
            for i, (cfg, p) in enumerate(plans):
                products.mmq_tiles(dev, qt, cd, N=N, K=K, act=ad, R_total=R_total, tiles=int(ld) + 16 * at,
                                   n_tiles=p.n_max, out=g, config=cfg, pair=(mat, u), live=int(lv) + 4 * i)
                at += p.n_max
        finally:
            os.environ.pop(products.LIST_CTAS_ENV)
            if saved is not None:
                os.environ[products.LIST_CTAS_ENV] = saved
        for what, got, w in (("gate", g, want[0]), ("up", u, want[1])):
            gb = _get(cu, got, R_total * N * 4)
            assert np.array_equal(gb, w), (f"{qt.name} device-cut lists {what} N={N} K={K} {len(plans)} lists, "
                                           f"{ctas} CTAs an SM: " + _f32_report(gb, w, N))


@pytest.mark.parametrize("case", params(kernel_rows("mmq_tiles")))
def test_mmq_tile_list_in_place(cu, dev, case):
    """40 experts of ~15 rows (the small-rows configuration), 9 of up to 300 (the large-rows
    one, several row tiles an expert), 24 at the strata gate/up shape."""
    s = case.shape
    _tile_list_case(cu, dev, QT[case.weight_type], s["N"], s["K"], list(s["rows"]), seed=s["seed"],
                    keep=worth_keeping(case))


@pytest.mark.parametrize("case", params(kernel_rows("mmq_layer")))
def test_mmq_layer(cu, dev, case):
    """One MoE layer's grouped products as the walk (and bench/test_bench_mmq_cuda.py) launches
    them: tokens routed top-k over 512 experts (verify/kernel_inputs.Routing), one launch a
    group of 16 consecutive experts, gate and up in one launch, the group weight buffers taken
    in turn, the q8_1 activations quantized on the device. Every routed row is written (no
    poison left), and the rows of `check` routed experts spread over the layer equal
    strata_prefill.contract.mmq.mmq of their weights and the NumPy quantize of their tokens."""
    from strata_prefill.fast.cuda import products
    from strata_prefill.verify.kernel_inputs import N_GROUPS, Routing

    s, tname = case.shape, case.weight_type
    qt, N, K, mats, tokens = QT[tname], s["N"], s["K"], s["mats"], s["tokens"]
    r = Routing(tokens)
    vals, _ = quants.block_size(qt)
    mat = quants.row_bytes(qt, K) * N
    rng = np.random.default_rng(int(qt))
    n_buf = 2  # the suite takes more buffers in turn (to exceed L2): the bytes do not depend on how many
    bufs = [np.concatenate([quants.random_blocks(qt, MMQ_GROUP * mats * N * K // vals, rng).reshape(-1),
                            np.zeros(GROUP_TAIL_BYTES, np.uint8)]) for _ in range(n_buf)]
    x = normal(np.random.default_rng(tokens), (tokens, K))
    layout = q8_1.layout_for(qt)
    act = _poisoned(cu, q8_1.buffer_nbytes(r.rows, K))
    products.quantize_gather(dev, _dev(cu, x), _dev(cu, r.src), n_rows=r.rows, K=K, layout=layout, out=act)
    wd = [_dev(cu, b) for b in bufs]
    bd = _dev(cu, r.bounds.reshape(-1))
    nbytes = r.rows * N * 4
    outs = [_poisoned(cu, nbytes) for _ in range(mats)]
    for g in range(N_GROUPS):
        pair = (mat, outs[1]) if mats == 2 else None  # up sits after gate in each expert's slot
        products.mmq_group(dev, qt, int(wd[g % n_buf]), w_stride=mats * mat, N=N, K=K, act=act, R_total=r.rows,
                           bounds=int(bd) + g * MMQ_GROUP * 8, n_exp=MMQ_GROUP, out=outs[0],
                           rows=int(r.group_rows[g]), pair=pair)
    names = ("gate", "up") if mats == 2 else ("down",)
    for what, o in zip(names, outs):  # looked for where they lie: a 32K layer's outputs run to gigabytes
        left, first = unwritten_words(o, nbytes)
        assert left == 0, f"{tname} layer {what}: {left} outputs never written; first at row " \
                          f"{first // N}, column {first % N}"
    routed = np.nonzero(r.counts)[0]
    experts = [int(e) for e in routed[sample_index(len(routed), case.check)]]

    def definition():
        out = {}
        for e in experts:
            b0, b1 = r.expert_rows(e)
            grp, q = divmod(e, MMQ_GROUP)
            dec = q8_1.decode_rows(q8_1.quantize_rows(x[r.src[b0:b1]], layout), b1 - b0, layout)
            for m, what in enumerate(names):
                at = q * mats * mat + m * mat
                w = bufs[grp % n_buf][at:at + mat].reshape(N, -1)
                out[f"{what}_e{e}"] = mmq.mmq(qt, w, dec).astype("<f4")
        return out

    key = dict(type=tname, N=N, K=K, mats=mats, tokens=tokens, routing_seed=0, x_seed=tokens, weight_seed=int(qt),
               buffers=n_buf, experts=experts)
    want = kept("kernel-mmq-layer", key, definition, (test_mmq_layer, Routing, normal))
    for e in experts:
        b0, b1 = r.expert_rows(e)
        for what, o in zip(names, outs):
            gb = device_rows(o, N * 4, b0, b1)
            wb = want[f"{what}_e{e}"].reshape(-1).view(np.uint8)
            assert np.array_equal(gb, wb), f"{tname} layer {what} expert {e} (rows {b0}..{b1}): " + \
                _f32_report(gb, wb, N)


def _gate_up(rng, R, n):
    """Random float32 gate and up rows: magnitudes from 1e-3 to 1e4, gate values below -88
    (silu -0.0) and above 88, an all-zero 32-block in a gate row and in an up row, exact zeros."""
    g = rng.standard_normal((R, n)).astype(np.float32) * np.exp(rng.uniform(-7, 9, (R, 1))).astype(np.float32)
    u = rng.standard_normal((R, n)).astype(np.float32) * np.exp(rng.uniform(-7, 9, (R, 1))).astype(np.float32)
    g[0, : min(n, 40)] = rng.uniform(-300.0, -88.5, min(n, 40)).astype(np.float32)
    g[1, 5] = np.float32(-1e30)
    g[1, 6] = np.float32(90.0)
    g[2 % R, 32:64] = 0.0
    u[3 % R, 64:96] = 0.0
    g[4 % R, ::7] = 0.0
    return g, u


@pytest.mark.parametrize("case", params(kernel_rows("swiglu_quantize")))
def test_swiglu_quantize_is_the_two_steps(cu, dev, case):
    """swiglu_q8_1.cu writes the same bytes as swiglu.cu followed by quantize_q8_1.cu's
    gather over H's rows in order, and as strata_prefill.contract.moe.swiglu + strata_prefill.contract.q8_1.quantize_rows; the
    rest of the buffer stays untouched (poison). The rows' shapes: the whole buffer; a group's
    rows, in place (as the walk calls it); n not a multiple of 128 (padded blocks), rows moved;
    one row; n below one block (float4 loads off 16-byte alignment)."""
    from strata_prefill.fast.cuda import elementwise, products

    layout = q8_1.Layout[case.config]
    n, R, r0, r1, row0, R_total = (case.shape[k] for k in ("n", "R", "r0", "r1", "row0", "R_total"))

    rng = np.random.default_rng(n * 1000 + R + int(layout))
    g, u = _gate_up(rng, R, n)
    gd, ud = _gpu(g), _gpu(u)
    rows = r1 - r0
    nbytes = q8_1.buffer_nbytes(R_total, n)
    two, one = _poisoned(cu, nbytes), _poisoned(cu, nbytes)
    h = elementwise.swiglu(dev, gd, ud, r0=r0, r1=r1)
    products.quantize_gather(dev, h, _gpu(np.arange(rows, dtype=np.int32)), n_rows=rows, K=n, layout=layout,
                             out=int(two) + row0 * q8_1.BLOCK_BYTES, R_total=R_total)
    before = dev.counters["launches"]
    products.swiglu_quantize(dev, gd, ud, r0=r0, r1=r1, layout=layout, out=one, row0=row0, R_total=R_total)
    assert dev.counters["launches"] - before == 1
    got, want = _get(cu, one, nbytes), _get(cu, two, nbytes)
    assert np.array_equal(got, want), f"fused vs two steps, {layout.name}: " + _q8_report(got, want, R_total, n, layout)
    with np.errstate(over="ignore"):
        h_np = moe.swiglu(g[r0:r1], u[r0:r1])
    want_np = np.full(nbytes, POISON, np.uint8)
    q8_1.unpack_rows(want_np, R_total)[row0:row0 + rows] = q8_1.quantize_rows(h_np, layout)
    assert np.array_equal(got, want_np), f"fused vs NumPy, {layout.name}: " + _q8_report(got, want_np, R_total, n, layout)


@pytest.mark.parametrize("case", params(kernel_rows("swiglu_oai_quantize")))
def test_swiglu_oai_quantize_is_the_two_steps(cu, dev, case):
    """swiglu_oai_q8_1 (gpt-oss's clamped SwiGLU with the expert gate/up biases) writes the same
    bytes as swiglu.cu's swiglu_oai_rows followed by quantize_q8_1.cu's gather, and as
    strata_prefill.contract.moe.swiglu_oai(add_expert_bias(...)) + strata_prefill.contract.q8_1.quantize_rows; the rest of the
    buffer stays poisoned. Shapes as test_swiglu_quantize_is_the_two_steps', plus gpt-oss's
    n_ff (2880: 22.5 blocks of 128)."""
    from strata_prefill.fast.cuda import elementwise, products

    layout = q8_1.Layout[case.config]
    n, R, r0, r1, row0, R_total = (case.shape[k] for k in ("n", "R", "r0", "r1", "row0", "R_total"))
    rng = np.random.default_rng(n * 1000 + R + int(layout) + 17)
    g, u = around_clamp(rng, (R, n)), around_clamp(rng, (R, n))
    E = 6
    rexp = np.sort(rng.integers(0, E, R)).astype(np.int32)
    bg, bu = (rng.standard_normal((E, n)) * 3).astype(np.float32), (rng.standard_normal((E, n)) * 3).astype(np.float32)
    act, eb = moe.SwigluOai(), (_gpu(rexp), _gpu(bg), _gpu(bu))
    gd, ud = _gpu(g), _gpu(u)
    rows = r1 - r0
    nbytes = q8_1.buffer_nbytes(R_total, n)
    two, one = _poisoned(cu, nbytes), _poisoned(cu, nbytes)
    h = elementwise.swiglu(dev, gd, ud, r0=r0, r1=r1, act=act, expert_bias=eb)
    products.quantize_gather(dev, h, _gpu(np.arange(rows, dtype=np.int32)), n_rows=rows, K=n, layout=layout,
                             out=int(two) + row0 * q8_1.BLOCK_BYTES, R_total=R_total)
    before = dev.counters["launches"]
    products.swiglu_quantize(dev, gd, ud, r0=r0, r1=r1, layout=layout, out=one, row0=row0, R_total=R_total,
                             act=act, expert_bias=eb)
    assert dev.counters["launches"] - before == 1
    got, want = _get(cu, one, nbytes), _get(cu, two, nbytes)
    assert np.array_equal(got, want), f"fused vs two steps, {layout.name}: " + _q8_report(got, want, R_total, n, layout)
    gb = moe.add_expert_bias(g[r0:r1], bg, rexp[r0:r1])
    ub = moe.add_expert_bias(u[r0:r1], bu, rexp[r0:r1])
    want_np = np.full(nbytes, POISON, np.uint8)
    q8_1.unpack_rows(want_np, R_total)[row0:row0 + rows] = q8_1.quantize_rows(moe.swiglu_oai(gb, ub), layout)
    assert np.array_equal(got, want_np), f"fused vs NumPy, {layout.name}: " + _q8_report(got, want_np, R_total, n, layout)


# ---------------------------------------------------------------- special-domain numerics


def _probe(cu, kernel: str, lo: int, hi: int) -> tuple[int, int]:
    """Run numerics_probe.cu's `kernel` over the float bit patterns lo .. hi (inclusive):
    (mismatches, first mismatching bit pattern or 0xFFFFFFFF)."""
    from strata_prefill.fast.cuda import runtime

    f = runtime.function("numerics_probe", kernel, "IIPP")
    bad = _dev(cu, np.zeros(1, np.uint64))
    first = _dev(cu, np.full(1, 0xFFFFFFFF, np.uint32))
    f.prepared_call((132 * 8, 1, 1), (256, 1, 1), lo, hi - lo + 1, bad, first)
    return int(_get(cu, bad, 8).view(np.uint64)[0]), int(_get(cu, first, 4).view(np.uint32)[0])


@pytest.mark.parametrize("case", params(kernel_rows("numerics_probe", form="exp_fused")))
def test_exp_fused_every_float(cu, case):
    """The fused exponential (the kernels' strata_exp_form<1>: x - n * ln2_hi as one exact fused multiply-add, 2^n
    added to p's exponent bits) equals the plain form bit for bit on every float, NaNs and
    infinities included (strata_numerics.cuh says why)."""
    bad, first = _probe(cu, "probe_exp_fused", case.shape["lo"], case.shape["hi"])
    assert bad == 0, f"{bad} floats differ; first {np.uint32(first).view(np.float32)!r} (0x{first:08x})"


@pytest.mark.parametrize("case", params(kernel_rows("numerics_probe", form="values")))
def test_attention_primitives_against_numpy(cu, case):
    """Attention's primitives against their NumPy definitions, bit for bit: strata_exp2c
    (strata_prefill.contract.numerics.exp2c) on every `stride`-th float of [-126, -0.0] plus the
    edges (+-0, -inf, NaN, -125 and its neighbours, halves) and random ones; __fmaf_rn against
    numerics.fma on random triples whose product and addend nearly cancel, and on random
    magnitudes; rint_nonneg_magic against np.rint on [0, 256)."""
    from strata_prefill.fast.cuda import runtime
    from strata_prefill.contract import numerics

    rng = np.random.default_rng(12)
    edges = np.array([0.0, -0.0, -np.inf, np.nan, -125.0, np.nextafter(np.float32(-125.0), np.float32(0)),
                      np.nextafter(np.float32(-125.0), np.float32(-200)), -126.0, -0.5, -1.5, -2.5, -124.5,
                      -0.49999997, -1e-45, -1e-30, -3.4e38], np.float32)
    lo, hi = 0x80000000, 0xC2FC0000  # -0.0 .. -126.0
    grid = np.arange(lo, hi + 1, case.shape["stride"], dtype=np.uint64).astype(np.uint32).view(np.float32)
    n_rand = case.shape["n_random"]
    x = np.concatenate([edges, grid, -rng.exponential(4.0, n_rand).astype(np.float32),
                        -rng.uniform(0, 256, n_rand).astype(np.float32)]).astype(np.float32)
    n = x.size
    # fma operands: b random; c the negated product nudged (cancellation) or of a random magnitude
    b = (rng.standard_normal(n) * np.exp2(rng.integers(-20, 20, n))).astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        near = -(x.astype(np.float64) * b) * (1 + rng.standard_normal(n) * 1e-6)
        c = np.where(rng.random(n) < 0.5, near, rng.standard_normal(n) * np.exp2(rng.integers(-30, 30, n)))
        c = c.astype(np.float32)
    c[~np.isfinite(c)] = 1.0
    outs = [runtime.alloc(4 * n, "probe out") for _ in range(3)]
    f = runtime.function("numerics_probe", "probe_values", "PPPiPPP")
    f.prepared_call(((n + 255) // 256, 1, 1), (256, 1, 1), _dev(cu, x), _dev(cu, b), _dev(cu, c), n, *outs)
    got_exp2c, got_fma, got_rint = (_get(cu, o, 4 * n).view(np.float32) for o in outs)
    with np.errstate(over="ignore", invalid="ignore"):
        want_exp2c = numerics.exp2c(x)
        want_fma = numerics.fma(x, b, c)
    for what, got, want, args in (("exp2c", got_exp2c, want_exp2c, (x,)), ("fma", got_fma, want_fma, (x, b, c))):
        # bit for bit, except that any NaN matches any NaN (the contract defines no payloads)
        differ = np.flatnonzero((got.view(np.uint32) != want.view(np.uint32)) & ~(np.isnan(got) & np.isnan(want)))
        assert differ.size == 0, (f"{what}: {differ.size} of {n} differ; first at "
                                  f"{tuple(a[differ[0]] for a in args)}: got {got[differ[0]]!r}, want {want[differ[0]]!r}")
    y = -x
    ok = np.isfinite(y) & (y >= 0) & (y < 256)
    want_rint = np.rint(y[ok])
    assert np.array_equal(got_rint[ok], want_rint), f"rint differs at y = {y[ok][got_rint[ok] != want_rint][:4]}"
