"""strata_prefill.contract.dense: the float product's definition against a literal scalar loop of the same
order (byte for byte) and against float64 (within a bound derived below); exact decoding of
F16/BF16; the reference's router is that product on the decoded weights; the CUDA kernel's
source names it."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf import quants as gq
from hypothesis import given, settings
from hypothesis import strategies as st

from strata_prefill.contract import dense, numerics

F32 = np.float32


def literal_matmul(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The order written out one float32 operation at a time."""
    N, K = w.shape
    T = x.shape[0]
    y = np.empty((T, N), F32)
    for t in range(T):
        for n in range(N):
            lanes = [F32(0.0)] * 32
            for k in range(K):  # ascending k visits each lane's k = j, j+32, ... in order
                p = F32(w[n, k] * x[t, k])
                lanes[k % 32] = F32(lanes[k % 32] + p)
            v = lanes
            while len(v) > 1:
                h = len(v) // 2
                v = [F32(v[i] + v[i + h]) for i in range(h)]
            y[t, n] = v[0]
    return y


def rand(rng, shape, spread):
    return (rng.standard_normal(shape) * np.exp2(rng.integers(-spread, spread + 1, shape))).astype(F32)


@settings(max_examples=60, deadline=None)
@given(T=st.integers(1, 4), N=st.integers(1, 5), K=st.integers(1, 140), spread=st.integers(0, 12),
       seed=st.integers(0, 2**32 - 1))
def test_float_matmul_equals_literal_loop(T, N, K, spread, seed):
    rng = np.random.default_rng(seed)
    w, x = rand(rng, (N, K), spread), rand(rng, (T, K), spread)
    got = dense.float_matmul(w, x)
    assert got.dtype == F32 and got.shape == (T, N)
    assert np.array_equal(got.view(np.uint32), literal_matmul(w, x).view(np.uint32))


@settings(max_examples=60, deadline=None)
@given(T=st.integers(1, 6), N=st.integers(1, 6), K=st.integers(1, 3000), seed=st.integers(0, 2**32 - 1))
def test_float_matmul_close_to_float64(T, N, K, seed):
    """Each product rounds once, each lane adds ceil(K/32) terms starting from 0 (ceil(K/32)-1
    roundings after the first exact add) and the tree adds 5 levels: every term passes
    through at most m = ceil(K/32) + 5 roundings, so with u = 2^-24 the standard bound
    |y - sum w x| <= gamma_m * sum |w x|, gamma_m = m u / (1 - m u), holds. The float64
    reference of the same float32 inputs errs by at most K * 2^-53 * sum |w x|, added in."""
    rng = np.random.default_rng(seed)
    w, x = rand(rng, (N, K), 4), rand(rng, (T, K), 4)
    got = dense.float_matmul(w, x).astype(np.float64)
    w64, x64 = w.astype(np.float64), x.astype(np.float64)
    want = x64 @ w64.T
    mag = np.abs(x64) @ np.abs(w64).T
    m = -(-K // 32) + 5
    u = 2.0 ** -24
    bound = (m * u / (1 - m * u) + K * 2.0 ** -53) * mag
    assert (np.abs(got - want) <= bound).all()


def test_float_matmul_pads_and_refuses():
    rng = np.random.default_rng(0)
    w, x = rand(rng, (3, 45), 2), rand(rng, (2, 45), 2)
    wp = np.concatenate([w, np.zeros((3, 19), F32)], axis=1)
    xp = np.concatenate([x, rand(rng, (2, 19), 2) * F32(0)], axis=1)  # zeros
    assert np.array_equal(dense.float_matmul(w, x).view(np.uint32), dense.float_matmul(wp, xp).view(np.uint32))
    with pytest.raises(TypeError):
        dense.float_matmul(w.astype(np.float64), x)
    with pytest.raises(ValueError):
        dense.float_matmul(w, x[:, :44])


def test_float_matmul_large_rows_split_into_slabs_same_bits():
    """Rows are computed in slabs (bounded scratch); the slab boundary changes no bit."""
    rng = np.random.default_rng(4)
    w, x = rand(rng, (300, 96), 3), rand(rng, (700, 96), 3)
    full = dense.float_matmul(w, x)
    for n0, n1 in ((0, 1), (17, 18), (299, 300)):
        assert np.array_equal(full[:, n0:n1], dense.float_matmul(w[n0:n1], x))


@pytest.mark.parametrize("qtype", [QT.F32, QT.F16, QT.BF16])
def test_decode_float_exact(qtype):
    rng = np.random.default_rng(5)
    v = rand(rng, (7, 64), 10)  # within F16 range
    if qtype == QT.F32:
        raw = v.view(np.uint8)
    elif qtype == QT.F16:
        raw = v.astype("<f2").view(np.uint8)
    else:
        raw = (v.view("<u4") >> np.uint32(16)).astype("<u2").view(np.uint8)
    got = dense.decode_float(qtype, raw)
    assert got.dtype == F32 and got.shape == (7, 64)
    assert np.array_equal(got, gq.dequantize(raw, qtype).reshape(7, 64))


@pytest.mark.parametrize("router", ["F32", "BF16"])
def test_reference_router_is_float_matmul(make_test_pack, monkeypatch, router):
    """The reference's router logits are float_matmul of the decoded router (gguf's
    dequantize as oracle) with the normed hidden state itself: no quantization."""
    import strata_prefill.reference.moe_half as moe_half
    from strata_prefill.reference import ReferenceEngine

    pack = make_test_pack("tiny", "Q8_0", router_type=router)
    L = pack.layer(0)
    assert L.ffn_gate_inp.qtype == QT[router]
    seen = []
    real_top_k = moe_half.top_k
    monkeypatch.setattr(moe_half, "top_k", lambda logits, k, **kw: (seen.append(logits), real_top_k(logits, k, **kw))[1])
    rng = np.random.default_rng(6)
    x = rng.standard_normal((37, pack.config.n_embd)).astype(F32)
    moe_half.moe_half(ReferenceEngine(pack), 0, x)
    raw = np.asarray(pack.tensor("blk.0.ffn_gate_inp").data)
    w = gq.dequantize(raw.view(np.uint8) if router == "BF16" else raw, QT[router])
    w = w.reshape(pack.config.n_expert, pack.config.n_embd).astype(F32)
    h = numerics.rmsnorm(x, L.ffn_norm, pack.config.rms_eps)
    assert len(seen) == 1
    assert np.array_equal(seen[0].view(np.uint32), dense.float_matmul(w, h).view(np.uint32))


def test_kernel_names_its_definition():
    src = (Path(__file__).resolve().parents[1] / "fast/cuda/kernels/float_dense.cu").read_text()
    head = "\n".join(src.splitlines()[:20])
    assert "strata_prefill.contract.dense.float_matmul" in head
    assert callable(dense.float_matmul)
    # the butterfly's offsets descend from 16: the halving tree's order
    assert re.search(r"for \(int o = 16; o > 0; o >>= 1\)", src)


@given(st.integers(0, 2**32 - 1), st.sampled_from([QT.F32, QT.F16, QT.BF16]))
@settings(max_examples=30, deadline=None)
def test_encode_float_is_ggufs_bytes(seed, qtype):
    """strata_prefill.contract.dense.encode_float (the packs' float tensors) writes gguf.quants.quantize's bytes,
    and decode_float reads them back to gguf.quants.dequantize's values."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((3, 64)) * np.exp2(rng.integers(-20, 10, (3, 1)))).astype(F32)
    got = dense.encode_float(x, qtype)
    want = np.ascontiguousarray(gq.quantize(x, qtype)).view(np.uint8).reshape(3, -1)
    assert np.array_equal(got, want)
    assert np.array_equal(dense.decode_float(qtype, got), gq.dequantize(want, qtype).astype(F32))
