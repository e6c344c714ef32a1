"""The model kernels of fast/cuda/kernels (through fast/cuda/elementwise.py, attention.py and
products.py) against their NumPy definitions, byte for byte:

rmsnorm.cu (strata_prefill.contract.numerics.rmsnorm), rope.cu (rope_neox), kv_cache.cu (KVCache.write),
attention_{pair,split}.cu (strata_prefill.contract.attention.attend), router.cu (strata_prefill.contract.routing.top_k), routing_tables.cu,
swiglu.cu (strata_prefill.contract.moe.swiglu), combine.cu (strata_prefill.contract.moe.combine, strata_prefill.contract.numerics.sigmoid),
gpt-oss's variants (router.cu's router_topk_selected: strata_prefill.contract.routing.top_k with a bias and
gating="softmax_selected"; routing_tables.cu's row_experts; swiglu.cu's swiglu_oai_rows:
strata_prefill.contract.moe.swiglu_oai of the biased gate and up; combine.cu's _bias forms: the down bias),
embed.cu (strata_prefill.contract.quants.dequantize of token_embd rows), gather_group.cu (strata_prefill.contract.moe.group_buffers), add.cu
(x + y, and add_row_bias_f32: strata_prefill.contract.dense.add_row_bias).

Random inputs (never zeros; with edge cases: all-zero K/V rows and blocks, ties in router
probabilities, T=1, positions crossing 64-key blocks, GQA, head_dim 64 and 128, n_embd 256 and
2560). Attention runs every kernel variant (pair, split, auto and the default) on each case,
with long prompts crossing many key blocks and T=1 decode at large positions, and again with
gpt-oss' options (sink logits, a sliding window). Outputs are poisoned before each launch and compared whole as bytes; a mismatch reports
the first differing element, both values (float and hex) and the count. At the sizes the GPU
suites time (rows with `check`), a spread of rows (tokens, queries) is compared with the NumPy
definition and the rest must be written. Every case is a row of verify/cases.py
(`KERNEL_CASES`); the slow NumPy expectations come from the reference cache
(verify/kernel_refs.py). Without a GPU (or PyCUDA) every test skips with one line saying why.
"""
from __future__ import annotations

import numpy as np
import pytest

from strata_prefill.fast.cuda import attention as cu_att, elementwise as cu_ew, products as cu_prod
from strata_prefill.contract import attention, dense, moe, numerics, routing
from strata_prefill.contract.errors import InputError
from strata_prefill.verify.device_checks import POISON, POISON_WORD
from strata_prefill.verify.cases import kernel_rows, params, sample_index
from strata_prefill.verify.kernel_inputs import around_clamp, normal
from strata_prefill.verify.kernel_refs import kept, worth_keeping

try:
    from strata_prefill.fast.cuda.runtime import cuda_available
except ImportError:  # the runtime module is not there
    _OK, _WHY = False, "fast/cuda/runtime.py is missing: no CUDA runtime to test against"
else:
    _OK, _WHY = cuda_available()

pytestmark = pytest.mark.skipif(not _OK, reason=_WHY)

F32 = np.float32


@pytest.fixture(scope="module")
def dev():
    """The launch object the wrappers take (counters, default stream, memory pool)."""
    from strata_prefill.fast.cuda import runtime

    return runtime.Device()


# ---------------------------------------------------------------- device helpers


def _up(a):
    from pycuda import gpuarray

    return gpuarray.to_gpu(np.ascontiguousarray(a))


def _poisoned(shape, dtype):
    import pycuda.driver as cuda
    from pycuda import gpuarray

    a = gpuarray.empty(tuple(int(s) for s in shape), dtype)
    if a.nbytes:
        cuda.memset_d8(a.gpudata, POISON, a.nbytes)
    return a


def _get(a) -> np.ndarray:
    import pycuda.driver as cuda

    cuda.Context.synchronize()
    return a.get()


def _poison_like(want: np.ndarray) -> np.ndarray:
    return np.full(want.nbytes, POISON, np.uint8).view(want.dtype).reshape(want.shape)


def assert_same(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """Whole arrays equal as bytes; else the first differing element, both values, the count."""
    got = np.ascontiguousarray(got)
    want = np.ascontiguousarray(want)
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    gb, wb = got.reshape(-1).view(np.uint8), want.reshape(-1).view(np.uint8)
    if np.array_equal(gb, wb):
        return
    size = want.dtype.itemsize
    ge = gb.reshape(-1, size)
    we = wb.reshape(-1, size)
    bad = np.nonzero((ge != we).any(axis=1))[0]
    i = int(bad[0])
    idx = np.unravel_index(i, want.shape)
    g, w = got.reshape(-1)[i], want.reshape(-1)[i]
    hexw = 2 * size
    gh = int.from_bytes(ge[i].tobytes(), "little")
    wh = int.from_bytes(we[i].tobytes(), "little")
    msg = (f"{what}: {bad.size} of {want.size} {want.dtype} elements differ; first at index {idx}: "
           f"got {g!r} (0x{gh:0{hexw}x}) want {w!r} (0x{wh:0{hexw}x})")
    print(msg)
    pytest.fail(msg)


def assert_rows(got: np.ndarray, want_rows: np.ndarray, sel: np.ndarray, what: str) -> None:
    """A sampled check: rows `sel` (the first axis) of `got` equal `want_rows` as bytes, and no
    element of `got` is still poison (every row was written)."""
    got = np.ascontiguousarray(got)
    if got.dtype.itemsize == 4:  # an element all poison bytes is the poison word
        left = np.flatnonzero(got.reshape(-1).view("<u4") == np.uint32(POISON_WORD))
    else:
        left = np.flatnonzero((got.reshape(-1).view(np.uint8).reshape(-1, got.dtype.itemsize) == POISON).all(axis=1))
    assert left.size == 0, f"{what}: {left.size} elements never written; first at index " \
                           f"{tuple(int(i) for i in np.unravel_index(int(left[0]), got.shape))}"
    assert_same(got[sel], want_rows, f"{what} (rows {sel[:4].tolist()}.. of {got.shape[0]})")


def _randn(rng, shape, lo=-4.0, hi=4.0):
    """Normal values with a random power-of-e scale per leading row (never all zeros)."""
    x = normal(rng, shape)  # a 32K attention row's q, k and v are 134M values: drawn fast (verify/kernel_inputs.py)
    x *= np.exp(rng.uniform(lo, hi, size=shape[:1] + (1,) * (len(shape) - 1))).astype(F32)
    return x


# ---------------------------------------------------------------- rmsnorm, rope, add


@pytest.mark.parametrize("case", params(kernel_rows("rmsnorm")))
def test_rmsnorm(dev, case):
    rows, n = case.shape["rows"], case.shape["n"]
    rng = np.random.default_rng(1000 + rows * 7 + n)
    x = _randn(rng, (rows, n))
    w = (rng.standard_normal(n) * 0.5 + 1.0).astype(F32)
    eps = 1e-6
    sel = sample_index(rows, case.check)
    want = numerics.rmsnorm(x[sel], w, eps)
    out = _poisoned((rows, n), F32)
    cu_ew.rmsnorm(dev, _up(x), _up(w), eps, out=out)
    if case.check is None:
        assert_same(_get(out), want, f"rmsnorm rows={rows} n={n}")
    else:
        assert_rows(_get(out), want, sel, f"rmsnorm rows={rows} n={n}")


@pytest.mark.parametrize("case", params(kernel_rows("rmsnorm_heads")))
def test_rmsnorm_heads_in_place(dev, case):
    rng = np.random.default_rng(7)
    T, H, hd = case.shape["T"], case.shape["H"], case.shape["hd"]
    x = _randn(rng, (T, H, hd))
    w = rng.standard_normal(hd).astype(F32)
    want = numerics.rmsnorm(x, w, 1e-6)
    xd = _up(x)
    cu_ew.rmsnorm(dev, xd, _up(w), 1e-6, out=xd)
    assert_same(_get(xd), want, "rmsnorm per head, in place")


@pytest.mark.parametrize("case", params(kernel_rows("rope")))
def test_rope(dev, case):
    T, H, hd = case.shape["T"], case.shape["H"], case.shape["hd"]
    rng = np.random.default_rng(T * 31 + hd)
    x = _randn(rng, (T, H, hd))
    positions = np.sort(rng.choice(4000, size=T, replace=False)).astype(np.int32)
    if T > 1:
        positions[:2] = (63, 64)  # across a key block boundary
    cos, sin = numerics.rope_table(4096, hd, 1_000_000.0)
    want = numerics.rope_neox(x, positions, cos, sin)
    dcos, dsin = cu_ew.rope_table(dev, 4096, hd, 1_000_000.0)
    out = _poisoned((T, H, hd), F32)
    cu_ew.rope_neox(dev, _up(x), positions, dcos, dsin, out=out)
    assert_same(_get(out), want, f"rope T={T} H={H} hd={hd}")
    xd = _up(x)  # in place, device positions
    cu_ew.rope_neox(dev, xd, _up(positions), dcos, dsin, out=xd)
    assert_same(_get(xd), want, f"rope in place T={T} H={H} hd={hd}")


@pytest.mark.parametrize("case", params(kernel_rows("add")))
def test_add(dev, case):
    n = case.shape["n"]
    rng = np.random.default_rng(n)
    x, y = _randn(rng, (n,)), _randn(rng, (n,))
    want = x + y
    out = _poisoned((n,), F32)
    cu_ew.add(dev, _up(x), _up(y), out=out)
    assert_same(_get(out), want, f"add n={n}")
    # unaligned views (the scalar path): offsets of one float
    if n > 2:
        xd, yd = _up(x), _up(y)
        o2 = _poisoned((n,), F32)
        cu_ew.add(dev, xd[1:], yd[1:], out=o2[1:])
        assert_same(_get(o2)[1:], want[1:], f"add unaligned n={n}")


@pytest.mark.parametrize("case", params(kernel_rows("add_row_bias")))
def test_add_row_bias(dev, case):
    """add_row_bias_f32 against strata_prefill.contract.dense.add_row_bias: into a poisoned output,
    and in place (the backend's form); a bias of the wrong width refused."""
    rows, n = case.shape["rows"], case.shape["n"]
    rng = np.random.default_rng(rows * 1000 + n)
    y, b = _randn(rng, (rows, n)), _randn(rng, (n,))
    want = dense.add_row_bias(y, b)
    out = _poisoned((rows, n), F32)
    cu_ew.add_row_bias(dev, _up(y), _up(b), out=out)
    assert_same(_get(out), want, f"add_row_bias rows={rows} n={n}")
    yd = _up(y)
    cu_ew.add_row_bias(dev, yd, _up(b), out=yd)
    assert_same(_get(yd), want, f"add_row_bias in place rows={rows} n={n}")
    with pytest.raises(InputError, match="row bias b"):
        cu_ew.add_row_bias(dev, _up(y), _up(b[:-1]))


# ---------------------------------------------------------------- KV cache and attention


def _kv_inputs(rng, T, n_kv, hd, zero_rows=True):
    k = _randn(rng, (T, n_kv, hd), -2.0, 2.0)
    v = _randn(rng, (T, n_kv, hd), -2.0, 2.0)
    if zero_rows and T > 2:
        k[1, 0, :] = 0.0  # an all-zero K row
        k[2, -1, 32:64] = 0.0  # one all-zero 32-value part of a K row
        v[2, 0, :] = 0.0  # an all-zero V row
        k[0, 0, 5] = F32(-0.0)
    return k, v


def _device_cache_from(cache: attention.KVCache, layer: int):
    return (_up(cache.k_codes[layer]), _up(cache.k_scale[layer]), _up(cache.v_codes[layer]),
            _up(cache.v_scale[layer]))


@pytest.mark.parametrize("case", params(kernel_rows("kv_write")))
def test_kv_write(dev, case):
    n_kv, hd = case.shape["n_kv"], case.shape["hd"]
    rng = np.random.default_rng(n_kv * 100 + hd)
    cap = case.shape["cap"]
    positions = np.array(case.shape["positions"], np.int32)
    T = positions.size
    k, v = _kv_inputs(rng, T, n_kv, hd)
    ref = attention.KVCache(1, n_kv, hd, capacity=cap)
    ref.write(0, positions, k, v)
    cache = [_poisoned((n_kv, cap, hd), np.float16), _poisoned((n_kv, cap), F32),
             _poisoned((n_kv, cap, hd), np.int8), _poisoned((n_kv, cap), F32)]
    vt = _poisoned((n_kv, cap // 64, hd, 64), np.int8)
    cu_att.kv_write(dev, _up(k), _up(v), positions, *cache, v_t=vt)
    names = ("k_codes", "k_scale", "v_codes", "v_scale")
    for name, d in zip(names, cache):
        full = getattr(ref, name)[0]
        want = _poison_like(full)
        want[:, positions] = full[:, positions]  # written rows; the rest keeps its poison
        assert_same(_get(d), want, f"kv_write {name} n_kv={n_kv} hd={hd}")
    # the transposed V blocks: the written keys' bytes where v_blocks_host puts them, poison elsewhere
    written = np.zeros((n_kv, cap, hd), bool)
    written[:, positions] = True
    where = cu_att.v_blocks_host(written.astype(np.int8)).astype(bool)
    want_vt = _poison_like(np.zeros((n_kv, cap // 64, hd, 64), np.int8))
    want_vt[where] = cu_att.v_blocks_host(ref.v_codes[0])[where]
    assert_same(_get(vt), want_vt, f"kv_write v_t n_kv={n_kv} hd={hd}")
    # and v_transpose of the same v_codes gives the same blocks for every key
    full_vt = cu_att.v_transpose(dev, _up(ref.v_codes[0]), cap)
    assert_same(_get(full_vt), cu_att.v_blocks_host(ref.v_codes[0]), f"v_transpose n_kv={n_kv} hd={hd}")


#: the NumPy cache's arrays, as a reference-cache entry of a benchmarked size holds them
KV_NAMES = ("k_codes", "k_scale", "v_codes", "v_scale")


def _attention_case(rng, n_head, n_kv, hd, positions, start, scale, written=None):
    """(NumPy cache, q, k, v) of a chunk at `positions` after `start` earlier keys. written:
    the cache's arrays (KV_NAMES) as a reference-cache entry keeps them, put in place of
    writing the same keys again (the same draws are made, so q is the same)."""
    T = positions.size
    n_keys = int(positions.max()) + 1
    cache = attention.KVCache(1, n_kv, hd, capacity=64)
    if start:  # earlier chunks
        kp, vp = _kv_inputs(rng, start, n_kv, hd)
        if written is None:
            cache.write(0, np.arange(start), kp, vp)
    k, v = _kv_inputs(rng, T, n_kv, hd)
    if written is None:
        cache.write(0, positions, k, v)
    else:
        for name in KV_NAMES:
            getattr(cache, name)[0] = written[name]
        cache.capacity = written["k_codes"].shape[1]
    assert cache.capacity >= n_keys
    q = _randn(rng, (T, n_head, hd), -1.0, 1.0) * F32(scale)
    q = q.astype(F32)
    if T > 3:
        q[3, 0, :] = 0.0  # an all-zero query
    return cache, q, k, v


def _attention_want(case, seed: int):
    """(cache, q, positions, sel, want) of an attention row: the NumPy cache and queries at the
    row's shape and `seed` (_attention_case) and the NumPy reference's output of the queries
    `sel` (all of them, or at a benchmarked size the row's `check` spread over the chunk), from
    the reference cache where it is slow to compute (at a benchmarked size with the cache's
    arrays: writing them is slow there too)."""
    s = case.shape
    positions = np.array(s["positions"], np.int32)
    sel = sample_index(positions.size, case.check)

    def build(written=None):
        rng = np.random.default_rng(seed)
        return _attention_case(rng, s["n_head"], s["n_kv"], s["hd"], positions, s["start"], s["scale"], written)

    def reference(cache, q):
        return attention.attend(cache, 0, q, positions) if case.check is None else \
            attention.attend(cache, 0, q[sel], positions[sel])

    if not worth_keeping(case):
        cache, q, _, _ = build()
        return cache, q, positions, sel, reference(cache, q)
    built = {}

    def definition():
        cache, q, _, _ = built["case"] = build()
        out = {"want": reference(cache, q)}
        if case.check is not None:
            out.update({name: getattr(cache, name)[0] for name in KV_NAMES})
        return out

    key = {k: s[k] for k in ("n_head", "n_kv", "hd", "positions", "start", "scale")}
    key.update(seed=seed, check=case.check)
    kept_ = kept("kernel-attention", key, definition, (_attention_case, _kv_inputs, _randn))
    if "case" in built:
        cache, q = built["case"][:2]
    else:
        cache, q, _, _ = build(kept_ if case.check is not None else None)
    return cache, q, positions, sel, kept_["want"]


_ATT_WANT: dict = {}


def _runs_here(variant) -> None:
    """Skip a row whose attention kernel this card cannot run (attention_wgmma.cu: sm_90 only)."""
    if variant is not None and not cu_att.variant_runs_here(variant):
        pytest.skip(f"the {variant} attention kernel does not run on this card ({cu_att.runtime.arch()})")


@pytest.mark.parametrize("case", params(kernel_rows("attention")))
def test_attention(dev, case):
    """Every kernel variant (strata_prefill.fast.cuda.attention.ATTEND_VARIANTS) and the default (form None) on
    each shape at query scales 1 and 8."""
    s = case.shape
    key = (s["n_head"], s["n_kv"], s["hd"], s["positions"], s["start"], s["scale"])
    if key not in _ATT_WANT:  # the NumPy reference once per case, for every variant (adjacent rows)
        _ATT_WANT.clear()
        seed = s["n_head"] * 1000 + s["hd"] + int(s["positions"][0]) + int(s["scale"])
        _ATT_WANT[key] = _attention_want(case, seed)
    cache, q, positions, sel, want = _ATT_WANT[key]
    variant = case.form
    _runs_here(variant)
    out = _poisoned(q.shape, F32)
    cu_att.attend(dev, _up(q), positions, *_device_cache_from(cache, 0), out=out, variant=variant)
    what = f"attention[{variant}] H={s['n_head']} KV={s['n_kv']} hd={s['hd']} T={positions.size}"
    if case.check is None:
        assert_same(_get(out), want, what)
    else:
        assert_rows(_get(out), want, sel, what)


_ATT_CONFIG_WANT: dict = {}


def _config_case(case):
    """(cache, q, positions, the NumPy reference's output) of a kernel-configuration row's shape
    and seed; the reference runs once per shape and scale."""
    s = case.shape
    key = (s["n_head"], s["n_kv"], s["hd"], s["positions"], s["start"], s["scale"], s["seed"])
    if key not in _ATT_CONFIG_WANT:
        _ATT_CONFIG_WANT.clear()
        cache, q, positions, _, want = _attention_want(case, s["seed"])
        _ATT_CONFIG_WANT[key] = (cache, q, positions, want)
    return _ATT_CONFIG_WANT[key]


@pytest.mark.parametrize("case", params(kernel_rows("attention_tile_config")))
def test_attention_tile_configs(dev, case):
    """Each tile kernel under its other configurations (ATTEND_TILE_CONFIGS: pair's PAIR_QG
    groups a CTA, PAIR_STAGES key blocks in flight, PAIR_MINB CTAs per SM; wgmma's WG_GROUPS
    consumer warpgroups, WG_STAGES ring stages)."""
    _runs_here(case.form)
    cache, q, positions, want = _config_case(case)
    config = dict(case.config)
    out = _poisoned(q.shape, F32)
    cu_att.attend(dev, _up(q), positions, *_device_cache_from(cache, 0), out=out, variant=case.form, config=config)
    assert_same(_get(out), want, f"attention[{case.form}, {config}] {case.name}")


@pytest.mark.parametrize("case", params(kernel_rows("attention_positions")))
def test_attention_positions_on_device(dev, case):
    """Positions as a GPUArray (no host copy: the split grid spans the capacity)."""
    s, variant = case.shape, case.form
    _runs_here(variant)
    rng = np.random.default_rng(5)
    positions = np.array(s["positions"], np.int32)
    cache, q, _, _ = _attention_case(rng, s["n_head"], s["n_kv"], s["hd"], positions, s["start"], s["scale"])
    want = attention.attend(cache, 0, q, positions)
    out = _poisoned(q.shape, F32)
    cu_att.attend(dev, _up(q), _up(positions), *_device_cache_from(cache, 0), out=out, variant=variant)
    assert_same(_get(out), want, f"attention[{variant}] device positions")


def _cache_pair(dev, shape):
    """A chunked case's two empty KV caches: the NumPy one and the device one (capacity 64, so
    that the chunks grow it)."""
    n_layer, n_kv, hd = shape["n_layer"], shape["n_kv"], shape["hd"]
    return attention.KVCache(n_layer, n_kv, hd), cu_att.DeviceKVCache(dev, n_layer, n_kv, hd, capacity=64)


def _chunk_steps(rng, shape, ref, kv):
    """Each (layer, chunk positions, queries) of a chunked case, chunk by chunk and layer by
    layer, with the step's new keys and values already written to both caches."""
    for chunk in shape["chunks"]:
        chunk = np.array(chunk, np.int32)
        for layer in range(shape["n_layer"]):
            k, v = _kv_inputs(rng, chunk.size, shape["n_kv"], shape["hd"])
            q = _randn(rng, (chunk.size, shape["n_head"], shape["hd"]), -1.0, 1.0)
            ref.write(layer, chunk, k, v)
            kv.write(layer, chunk, _up(k), _up(v))
            yield layer, chunk, q


@pytest.mark.parametrize("case", params(kernel_rows("attention_chunks")))
def test_attention_chunks_device_cache(dev, case):
    """Two chunks and a decode step through the device cache (kv_write + attend) against the
    NumPy cache: the cache bytes and every output."""
    rng = np.random.default_rng(77)
    variant = case.form
    _runs_here(variant)
    ref, kv = _cache_pair(dev, case.shape)
    for layer, chunk, q in _chunk_steps(rng, case.shape, ref, kv):
        want = attention.attend(ref, layer, q, chunk)
        out = _poisoned(q.shape, F32)
        kv.attend(layer, _up(q), chunk, out=out, variant=variant)
        assert_same(_get(out), want, f"attention[{variant}] chunk {chunk[0]}.. layer {layer}")
    cap = kv.capacity
    for layer in range(case.shape["n_layer"]):
        for name in ("k_codes", "k_scale", "v_codes", "v_scale"):
            want = getattr(ref, name)[layer][:, :min(cap, ref.capacity)]
            got = _get(getattr(kv, name)[layer])[:, :want.shape[1]]
            assert_same(got, want, f"device cache {name} layer {layer}")
        # the transposed V blocks kept beside them (grown with the cache): the layout of v_codes
        assert_same(_get(kv.v_t[layer]), cu_att.v_blocks_host(_get(kv.v_codes[layer])), f"device cache v_t layer {layer}")


def _sinks(rng, n_head: int, spread):
    """The sink logits of a row (spread: their standard deviation; None: no sinks)."""
    return None if spread is None else (rng.standard_normal(n_head) * spread).astype(F32)


@pytest.mark.parametrize("case", params(kernel_rows("attention_options")))
def test_attention_options(dev, case):
    """Sink logits and a sliding window (gpt-oss' attention; docs/numerics.md section 5) on
    every kernel variant and the default, against strata_prefill.contract.attention.attend with the same
    options: windows of one key, on and off block edges and past the context, a chunk whose
    window reaches into the keys before it, scattered decode positions. The sinks go up as a
    GPUArray for the kernels named, as a host array for the default."""
    s = case.shape
    _runs_here(case.form)
    rng = np.random.default_rng(s["seed"])
    positions = np.array(s["positions"], np.int32)
    cache, q, _, _ = _attention_case(rng, s["n_head"], s["n_kv"], s["hd"], positions, s["start"], s["scale"])
    sinks = _sinks(rng, s["n_head"], s["sinks"])
    want = attention.attend(cache, 0, q, positions, sinks=sinks, window=s["window"])
    out = _poisoned(q.shape, F32)
    dev_sinks = sinks if sinks is None or case.form is None else _up(sinks)
    cu_att.attend(dev, _up(q), positions, *_device_cache_from(cache, 0), out=out, variant=case.form,
                  sinks=dev_sinks, window=s["window"])
    assert_same(_get(out), want, f"attention[{case.form}] options {case.name}")
    if case.form == "split":  # the positions on the device: the grid from block 0
        out = _poisoned(q.shape, F32)
        cu_att.attend(dev, _up(q), _up(positions), *_device_cache_from(cache, 0), out=out, variant="split",
                      sinks=dev_sinks, window=s["window"])
        assert_same(_get(out), want, f"attention[split] options, device positions, {case.name}")


@pytest.mark.parametrize("case", params(kernel_rows("attention_options_chunks")))
def test_attention_options_chunks_device_cache(dev, case):
    """Chunks and a decode step through the device cache with sinks and a window: each chunk's
    window reaches back into the chunks before it, every output the NumPy cache's bytes."""
    rng = np.random.default_rng(78)
    variant = case.form
    _runs_here(variant)
    window = case.shape["window"]
    sinks = [_sinks(rng, case.shape["n_head"], case.shape["sinks"]) for _ in range(case.shape["n_layer"])]
    ref, kv = _cache_pair(dev, case.shape)
    for layer, chunk, q in _chunk_steps(rng, case.shape, ref, kv):
        q = q * F32(4.0)
        want = attention.attend(ref, layer, q, chunk, sinks=sinks[layer], window=window)
        out = _poisoned(q.shape, F32)
        kv.attend(layer, _up(q), chunk, out=out, variant=variant, sinks=_up(sinks[layer]), window=window)
        assert_same(_get(out), want, f"attention[{variant}] options chunk {chunk[0]}.. layer {layer}")


# ---------------------------------------------------------------- routing


def _logits(rng, T, E, ties: bool):
    if ties:
        # a coarse grid: many exactly equal logits, hence equal probabilities
        x = (rng.integers(-6, 7, size=(T, E)) * 0.5).astype(F32)
        x[0] = F32(1.25)  # a row of all-equal probabilities
        if T > 1:
            x[1, ::3] = F32(3.0)
    else:
        x = (rng.standard_normal((T, E)) * rng.uniform(0.5, 6.0, size=(T, 1))).astype(F32)
    return x


@pytest.mark.parametrize("case", params(kernel_rows("top_k")))
def test_top_k(dev, case):
    T, E, K, ties = (case.shape[k] for k in ("T", "E", "K", "ties"))
    rng = np.random.default_rng(T * E + K + ties)
    x = _logits(rng, T, E, ties)
    if case.shape.get("nan"):  # NaN and infinite logits: rows of NaN probabilities, beside sound rows
        x[1, 5], x[2, :], x[3, 7], x[4, 0], x[5, 100:] = np.nan, np.nan, np.inf, -np.inf, -np.inf
    sel = sample_index(T, case.check)
    with np.errstate(invalid="ignore"):  # the NaN rows' softmax (inf - inf): NaN is their definition
        want_ids, want_w = routing.top_k(x if case.check is None else x[sel], K)
    ids, w = _poisoned((T, K), np.int32), _poisoned((T, K), F32)
    cu_ew.top_k(dev, _up(x), K, ids=ids, weights=w)
    if case.shape.get("nan"):  # NaN is outside the byte contract (docs/numerics.md section 3): NaN where NaN
        got_w, nan = _get(w), np.isnan(want_w)
        assert np.isnan(want_w[[1, 2, 3]]).all() and np.isfinite(want_w[[0, 4, 5]]).all()
        assert_same(_get(ids), want_ids, f"top_k ids with NaN rows T={T} E={E} K={K}")
        assert np.array_equal(np.isnan(got_w), nan), f"top_k weights: NaN at {np.argwhere(np.isnan(got_w))[:4]}"
        assert_same(np.where(nan, 0, got_w).astype(F32), np.where(nan, 0, want_w).astype(F32), "top_k weights")
        return
    if case.check is None:
        assert_same(_get(ids), want_ids, f"top_k ids T={T} E={E} K={K} ties={ties}")
        assert_same(_get(w), want_w, f"top_k weights T={T} E={E} K={K} ties={ties}")
    else:
        assert_rows(_get(ids), want_ids, sel, f"top_k ids T={T} E={E} K={K} ties={ties}")
        assert_rows(_get(w), want_w, sel, f"top_k weights T={T} E={E} K={K} ties={ties}")


@pytest.mark.parametrize("case", params(kernel_rows("routing_tables")))
def test_routing_tables(dev, case):
    T, E, K, skew = (case.shape[k] for k in ("T", "E", "K", "skew"))
    rng = np.random.default_rng(T + E + K)
    if skew:  # a few popular experts and long runs of one expert
        pop = rng.choice(E, size=min(E, 3 * K), replace=False)
        ids = np.stack([rng.choice(pop, size=K, replace=False) for _ in range(T)]).astype(np.int32)
    else:
        ids = np.stack([rng.choice(E, size=K, replace=False) for _ in range(T)]).astype(np.int32)
    ref = routing.routing_tables(ids, E)
    out = cu_ew.DeviceRoutingTables(*(_poisoned(s, np.int32) for s in
                                    ((E,), (E,), (T * K,), (T * K,), (E,), (1,))))
    cu_ew.routing_tables(dev, _up(ids), E, out=out)
    order = np.full(E, -1, np.int32)
    order[:ref.order.size] = ref.order
    want = {"cnt": ref.cnt, "off": ref.off, "slot": ref.slot, "src": ref.src, "order": order,
            "n_order": np.array([ref.order.size], np.int32)}
    for name in out._fields:
        assert_same(_get(getattr(out, name)), want[name].astype(np.int32), f"routing {name} T={T} E={E} K={K}")


@pytest.mark.parametrize("case", params(kernel_rows("routed_row_tiles")))
def test_routed_row_tiles(dev, case):
    """routed_row_tiles against strata_prefill.fast.tiles.routed_row_lists: the lists of every
    configuration the rows could call for (cu_prod.routed_tile_plans) and live counts, as
    bytes; then the same counts under plans whose bounds make each list in turn the chosen one."""
    from strata_prefill.fast.tiles import ListPlan, max_row_tiles, routed_row_lists

    T, E, K, skew, streamed = (case.shape[k] for k in ("T", "E", "K", "skew", "streamed"))
    rng = np.random.default_rng(T * 7 + E + K + skew)
    if skew:
        pop = rng.choice(E, size=min(E, 3 * K), replace=False)
        ids = np.stack([rng.choice(pop, size=K, replace=False) for _ in range(T)]).astype(np.int32)
    else:
        ids = np.stack([rng.choice(E, size=K, replace=False) for _ in range(T)]).astype(np.int32)
    tab = routing.routing_tables(ids, E)
    resident = rng.random(E) >= streamed
    woff = np.where(resident, rng.integers(0, 2**33, E) * 2, -1).astype(np.int64)
    routed = resident & (tab.cnt > 0)
    mean = tab.cnt[routed].sum() / max(1, routed.sum())
    auto = [p for _cfg, p in cu_prod.routed_tile_plans(tab.n_rows, E)]
    n = lambda tr: max_row_tiles(tab.n_rows, E, tr)  # noqa: E731
    forced = [[ListPlan(8, int(mean) + 1, n(8)), ListPlan(64, 0, n(64))],  # the first list chosen
              [ListPlan(16, max(1, int(mean)), n(16)), ListPlan(128, 0, n(128))]]  # the last
    for plans in [auto, *forced]:
        want_tiles, want_live = routed_row_lists(tab.cnt, tab.off, woff, plans)
        total = sum(p.n_max for p in plans)
        tiles, live = _poisoned((total, 4), np.int32), _poisoned((len(plans),), np.int32)
        cu_ew.routed_row_tiles(dev, _up(tab.cnt.astype(np.int32)), _up(tab.off.astype(np.int32)), _up(woff), plans,
                               out=tiles, live=live)
        what = f"routed_row_tiles T={T} E={E} K={K} plans={plans}"
        assert_same(_get(live), want_live, what + " live")
        assert_same(_get(tiles), want_tiles, what + " tiles")


@pytest.mark.parametrize("case", params(kernel_rows("top_k_selected")))
def test_top_k_selected(dev, case):
    """router_topk_selected against strata_prefill.contract.routing.top_k(bias=..., gating="softmax_selected"):
    ids and weights as bytes; rows with a NaN or infinite logit: the same ids, NaN weights where
    the definition has them (their bits are outside the contract)."""
    T, E, K, ties, with_bias = (case.shape[k] for k in ("T", "E", "K", "ties", "bias"))
    rng = np.random.default_rng(T * E + K + 7 * ties + with_bias)
    x = _logits(rng, T, E, ties)
    bias = (rng.integers(-4, 5, E) * 0.25 + 0.125).astype(F32) if with_bias else None
    if case.shape.get("nan"):  # a NaN among the picks, a row of NaN, +inf (inf - inf), -inf ones
        x[1, 5], x[2, :], x[3, 7], x[4, 0], x[5, 100:] = np.nan, np.nan, np.inf, -np.inf, -np.inf
        x[6, : E - 3] = np.nan  # fewer numbers than K: NaN picked
    with np.errstate(invalid="ignore"):
        want_ids, want_w = routing.top_k(x, K, bias=bias, gating=routing.SOFTMAX_SELECTED)
    ids, w = _poisoned((T, K), np.int32), _poisoned((T, K), F32)
    cu_ew.top_k(dev, _up(x), K, ids=ids, weights=w, bias=None if bias is None else _up(bias),
                gating=routing.SOFTMAX_SELECTED)
    what = f"top_k_selected T={T} E={E} K={K} ties={ties} bias={with_bias}"
    assert_same(_get(ids), want_ids, what + " ids")
    got_w, nan = _get(w), np.isnan(want_w)
    assert np.array_equal(np.isnan(got_w), nan), f"{what}: NaN at {np.argwhere(np.isnan(got_w))[:4]}"
    assert_same(np.where(nan, 0, got_w).astype(F32), np.where(nan, 0, want_w).astype(F32), what + " weights")


@pytest.mark.parametrize("case", params(kernel_rows("row_experts")))
def test_row_experts(dev, case):
    T, E, K = (case.shape[k] for k in ("T", "E", "K"))
    rng = np.random.default_rng(T + E + K)
    ids = np.stack([rng.choice(E, size=K, replace=False) for _ in range(T)]).astype(np.int32)
    tab = routing.routing_tables(ids, E)
    out = _poisoned((T * K,), np.int32)
    cu_ew.row_experts(dev, _up(ids), _up(tab.slot), out=out)
    assert_same(_get(out), routing.row_experts(ids, tab.slot), f"row_experts T={T} E={E} K={K}")


def _oai_bias(rng, R, n, E=5):
    """(rexp [R], gate bias [E, n], up bias [E, n]): each row an expert, ascending (as sorted rows
    are), biases that move values across the clamp limits."""
    rexp = np.sort(rng.integers(0, E, R)).astype(np.int32)
    return rexp, (rng.standard_normal((E, n)) * 3).astype(F32), (rng.standard_normal((E, n)) * 3).astype(F32)


@pytest.mark.parametrize("case", params(kernel_rows("swiglu_oai")))
def test_swiglu_oai(dev, case):
    """swiglu_oai_rows against strata_prefill.contract.moe.swiglu_oai of the biased gate and up (strata_prefill.contract.moe.
    add_expert_bias), over every row and over a row range (the rows' experts offset with it)."""
    R, n, with_bias = case.shape["R"], case.shape["n"], case.shape["bias"]
    rng = np.random.default_rng(R * n + with_bias)
    g, u = around_clamp(rng, (R, n)), around_clamp(rng, (R, n))
    act = moe.SwigluOai()
    eb = _oai_bias(rng, R, n) if with_bias else None

    def want_rows(r0, r1):
        gg, uu = g[r0:r1], u[r0:r1]
        if eb is not None:
            gg, uu = moe.add_expert_bias(gg, eb[1], eb[0][r0:r1]), moe.add_expert_bias(uu, eb[2], eb[0][r0:r1])
        return moe.swiglu_oai(gg, uu, act.alpha, act.limit)

    deb = None if eb is None else tuple(_up(a) for a in eb)
    out = _poisoned((R, n), F32)
    cu_ew.swiglu(dev, _up(g), _up(u), out=out, act=act, expert_bias=deb)
    assert_same(_get(out), want_rows(0, R), f"swiglu_oai R={R} n={n} bias={with_bias}")
    if R > 4:
        out2 = _poisoned((R - 4, n), F32)
        cu_ew.swiglu(dev, _up(g), _up(u), out=out2, r0=2, r1=R - 2, act=act, expert_bias=deb)
        assert_same(_get(out2), want_rows(2, R - 2), f"swiglu_oai rows 2..{R - 2}")


@pytest.mark.parametrize("case", params(kernel_rows("combine_bias")))
def test_combine_bias(dev, case):
    """combine_rows[_vec]_bias against strata_prefill.contract.moe.combine(..., down_bias=(bias, ids))."""
    T, K, D, E, shared = (case.shape[k] for k in ("T", "K", "D", "E", "shared"))
    form = case.form
    rng = np.random.default_rng(T * K + D + shared + 11)
    ids, w = routing.top_k(_logits(rng, T, E, ties=False), K, gating=routing.SOFTMAX_SELECTED)
    tab = routing.routing_tables(ids, E)
    x, y, bd = _randn(rng, (T, D)), _randn(rng, (T * K, D)), _randn(rng, (E, D))
    sh = (numerics.sigmoid(_randn(rng, (T,), -1.0, 1.0)), _randn(rng, (T, D))) if shared else None
    want = moe.combine(x, w, tab.slot, y, sh, down_bias=(bd, ids))
    dsh = None if sh is None else (_up(sh[0]), _up(sh[1]))
    out = _poisoned((T, D), F32)
    cu_ew.combine(dev, _up(x), _up(w), _up(tab.slot), _up(y), dsh, out=out, form=form, down_bias=(_up(bd), _up(ids)))
    assert_same(_get(out), want, f"combine_bias {form} T={T} K={K} D={D} shared={shared}")
    xd = _up(x)  # in place
    cu_ew.combine(dev, xd, _up(w), _up(tab.slot), _up(y), dsh, out=xd, form=form, down_bias=(_up(bd), _up(ids)))
    assert_same(_get(xd), want, f"combine_bias {form} in place T={T} K={K} D={D} shared={shared}")


# ---------------------------------------------------------------- MoE elementwise


def _wide(rng, shape):
    x = _randn(rng, shape, -3.0, 3.0)
    flat = x.reshape(-1)
    specials = np.array([0.0, -0.0, 88.5, -88.5, 87.0, -87.0, 100.0, -100.0, 1e-30, -1e-30, 20.0, -20.0], F32)
    flat[: specials.size] = specials
    return x


@pytest.mark.parametrize("case", params(kernel_rows("swiglu")))
def test_swiglu(dev, case):
    R, n = case.shape["R"], case.shape["n"]
    rng = np.random.default_rng(R * n)
    g, u = _wide(rng, (R, n)), _randn(rng, (R, n))
    want = moe.swiglu(g, u)
    out = _poisoned((R, n), F32)
    cu_ew.swiglu(dev, _up(g), _up(u), out=out)
    assert_same(_get(out), want, f"swiglu R={R} n={n}")
    if R > 4:  # a row range, as the MoE walk runs it per group
        out2 = _poisoned((R - 4, n), F32)
        cu_ew.swiglu(dev, _up(g), _up(u), out=out2, r0=2, r1=R - 2)
        assert_same(_get(out2), want[2:R - 2], f"swiglu rows 2..{R - 2}")


@pytest.mark.parametrize("case", params(kernel_rows("sigmoid")))
def test_sigmoid(dev, case):
    n = case.shape["n"]
    rng = np.random.default_rng(5)
    x = _wide(rng, (n, 1))
    want = numerics.sigmoid(x.reshape(-1))
    out = _poisoned((n,), F32)
    cu_ew.sigmoid(dev, _up(x), out=out)
    assert_same(_get(out), want, "sigmoid")


@pytest.mark.parametrize("case", params(kernel_rows("combine")))
def test_combine(dev, case):
    T, K, D, E, shared = (case.shape[k] for k in ("T", "K", "D", "E", "shared"))
    form = case.form
    rng = np.random.default_rng(T * K + D + shared)
    logits = _logits(rng, T, E, ties=False)
    ids, w = routing.top_k(logits, K)
    tab = routing.routing_tables(ids, E)
    x = _randn(rng, (T, D))
    y = _randn(rng, (T * K, D))
    sh = None
    if shared:
        g = numerics.sigmoid(_randn(rng, (T,), -1.0, 1.0))
        sh = (g, _randn(rng, (T, D)))
    want = moe.combine(x, w, tab.slot, y, sh)
    out = _poisoned((T, D), F32)
    dsh = None if sh is None else (_up(sh[0]), _up(sh[1]))
    cu_ew.combine(dev, _up(x), _up(w), _up(tab.slot), _up(y), dsh, out=out, form=form)
    assert_same(_get(out), want, f"combine {form} T={T} K={K} D={D} shared={shared}")
    xd = _up(x)  # in place
    cu_ew.combine(dev, xd, _up(w), _up(tab.slot), _up(y), dsh, out=xd, form=form)
    assert_same(_get(xd), want, f"combine {form} in place T={T} K={K} D={D} shared={shared}")
    if form == "auto" and D % 4:  # the row form refuses what it cannot read as float4
        with pytest.raises(InputError, match="row form"):
            cu_ew.combine(dev, _up(x), _up(w), _up(tab.slot), _up(y), dsh, out=out, form="row")


@pytest.mark.parametrize("case", params(kernel_rows("combine_refusal")))
def test_combine_refuses_a_bad_form_even_when_empty(dev, case):
    D, K = case.shape["D"], case.shape["K"]
    for T in (3, 0):
        x = _up(np.ones((T, D), F32))
        with pytest.raises(InputError, match="form must be"):
            cu_ew.combine(dev, x, _up(np.ones((T, K), F32)), _up(np.zeros(K * T, np.int32)),
                          _up(np.ones((K * T, D), F32)), form="rows")


# ---------------------------------------------------------------- embedding, gather


@pytest.mark.parametrize("case", params(kernel_rows("embed")))
def test_embed(dev, case):
    """embed.cu against strata_prefill.contract.quants.dequantize (and gguf's own dequantize, the
    independent oracle) on random valid blocks, with a subnormal and a negative-zero main scale."""
    import gguf
    from gguf import GGMLQuantizationType as QT

    from strata_prefill.contract import qformats, quants

    qt = QT[case.weight_type]
    n_embd, T, n_vocab = case.shape["n_embd"], case.shape["T"], case.shape["n_vocab"]
    rng = np.random.default_rng(n_embd + T + int(qt))
    vpb, bs = quants.block_size(qt)
    nb = n_embd // vpb
    blocks = quants.random_blocks(qt, n_vocab * nb, rng).reshape(n_vocab, nb, bs)
    d0 = qformats.lookup(qt).half_fields["d"]
    blocks[0, 0, d0:d0 + 2] = np.array([6e-8], np.float16).view(np.uint8)  # a subnormal half scale
    blocks[1, nb - 1, d0:d0 + 2] = np.array([-0.0], np.float16).view(np.uint8)
    table = blocks.reshape(n_vocab, nb * bs)
    ids = rng.integers(0, n_vocab, size=T).astype(np.int32)
    ids[:2] = [0, 1][:T]  # the rows holding them
    want = quants.dequantize(qt, table[ids]).astype(F32)
    assert want.tobytes() == gguf.quants.dequantize(table[ids], qt).astype(F32).tobytes()
    out = _poisoned((T, n_embd), F32)
    cu_ew.embed(dev, qt, ids, _up(table), n_embd, out=out)
    assert_same(_get(out), want, f"embed {qt.name} n_embd={n_embd} T={T}")


@pytest.mark.parametrize("case", params(kernel_rows("embed_refusal")))
def test_embed_refuses_a_type_without_a_kernel_a_partial_block_and_an_id_past_the_table(dev, case):
    from gguf import GGMLQuantizationType as QT

    from strata_prefill.contract import quants

    from strata_prefill.contract import qformats

    qt, n, n_vocab = QT[case.weight_type], case.shape["n_embd"], case.shape["n_vocab"]
    table = _up(np.zeros(n_vocab * quants.row_bytes(qt, n), np.uint8))
    none = next(f.qtype for f in qformats.formats() if f.embed_kernel is None)
    with pytest.raises(InputError, match=f"no device kernel for {none.name}"):
        cu_ew.embed(dev, none, np.zeros(1, np.int32), table, n)
    with pytest.raises(InputError, match=f"not a multiple of {qt.name}'s"):
        cu_ew.embed(dev, qt, np.zeros(1, np.int32), table, case.shape["bad_n"])
    with pytest.raises(InputError, match="token id outside"):
        cu_ew.embed(dev, qt, np.array([n_vocab], np.int32), table, n)


@pytest.mark.parametrize("case", params(kernel_rows("gather")))
def test_gather(dev, case):
    n, gu_bytes, d_bytes, tail, offsets = (case.shape[k] for k in ("n", "gu_bytes", "d_bytes", "tail", "offsets"))
    rng = np.random.default_rng(n * gu_bytes + d_bytes)
    blob_bytes = 2 * gu_bytes + d_bytes
    blobs = [rng.integers(0, 256, size=blob_bytes, dtype=np.uint8) for _ in range(n)]
    # every blob in one device arena, at offsets aligned to 16, 4, 2 or 1 bytes
    pad = 64
    if offsets == "aligned":
        offs = [q * (blob_bytes + pad) // 16 * 16 for q in range(n)]
    else:
        offs = [q * (blob_bytes + pad) + int(rng.integers(0, 16)) for q in range(n)]
    arena = np.zeros(offs[-1] + blob_bytes + pad, np.uint8)
    for q in range(n):
        arena[offs[q]:offs[q] + blob_bytes] = blobs[q]
    arena_d = _up(arena)
    ptrs = [int(arena_d.gpudata) + o for o in offs]
    want_gu, want_d = moe.group_buffers(blobs, gu_bytes, d_bytes, tail)
    gu_n, d_n = cu_prod.group_buffer_bytes(n, gu_bytes, d_bytes, tail)
    assert (gu_n, d_n) == (want_gu.size, want_d.size)
    guard = 256  # poisoned bytes past each buffer must stay poisoned
    for mode in ("group", "one"):
        gu = _poisoned((gu_n + guard,), np.uint8)
        dn = _poisoned((d_n + guard,), np.uint8)
        if mode == "group":
            cu_prod.gather_native_group(dev, ptrs, gu_bytes=gu_bytes, d_bytes=d_bytes, tail_bytes=tail, gu_buf=gu,
                                        d_buf=dn)
        else:
            for q in range(n):
                cu_prod.gather_native_one(dev, ptrs[q], q=q, gu_bytes=gu_bytes, d_bytes=d_bytes, gu_buf=gu, d_buf=dn,
                                      tail_bytes=tail if q == n - 1 else 0)
        poison = np.full(guard, POISON, np.uint8)
        assert_same(_get(gu), np.concatenate([want_gu, poison]), f"gather {mode} gate/up n={n} ({offsets})")
        assert_same(_get(dn), np.concatenate([want_d, poison]), f"gather {mode} down n={n} ({offsets})")


@pytest.mark.parametrize("case", params(kernel_rows("gather_count")))
def test_gather_counts_one_launch(dev, case):
    n, gub, db, tail = (case.shape[k] for k in ("n", "gu_bytes", "d_bytes", "tail"))
    rng = np.random.default_rng(3)
    blobs = [_up(rng.integers(0, 256, size=2 * gub + db, dtype=np.uint8)) for _ in range(n)]
    gu = _poisoned((n * 2 * gub + tail,), np.uint8)
    dn = _poisoned((n * db + tail,), np.uint8)
    before = dev.counters["launches"]
    cu_prod.gather_native_group(dev, blobs, gu_bytes=gub, d_bytes=db, tail_bytes=tail, gu_buf=gu, d_buf=dn)
    assert dev.counters["launches"] - before == 1
    want_gu, want_d = moe.group_buffers([b.get() for b in blobs], gub, db, tail)
    assert_same(_get(gu), want_gu, "gather 16 GPUArray blobs gate/up")
    assert_same(_get(dn), want_d, "gather 16 GPUArray blobs down")
