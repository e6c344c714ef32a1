"""The K-quants and legacy quants of llama-quantize's mixes (contract/kquants.py): their integer
form against gguf.quants.dequantize, the independent oracle.

The exact relation, as float32 operations in this order, per value i of a 32-block with codes
c, sub-scale u of its half (values 0..15 or 16..31), min sub-scale v, scale dw and min mw:

- Q4_0, Q5_0:          x = dw * c
- Q5_1:                x = dw * c + mw
- Q6_K, Q3_K:          x = (dw * u) * c
- Q4_K, Q5_K:          x = (dw * u) * c - mw * v

(u, v integers, so dw * u and mw * v are gguf's own ``d * sc`` and ``dmin * m``.) It holds bit
for bit for every block whose half fields are finite, random valid blocks and fully random
bytes alike.
"""
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as QT
from gguf import quants as gq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strata_prefill.contract import qformats, quants

NEW = [QT.Q4_0, QT.Q5_0, QT.Q5_1, QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.Q3_K]
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def relation(qt, dec) -> np.ndarray:
    """The values from the integer form, by the module docstring's relation for qt."""
    c = dec.codes.astype(np.float32)
    u = np.repeat(dec.sub.astype(np.float32), 16, axis=-1)
    dw = dec.dw[..., None]
    if qt in (QT.Q4_0, QT.Q5_0):
        y = dw * c
    elif qt == QT.Q5_1:
        y = dw * c + dec.mw[..., None]
    elif qt in (QT.Q6_K, QT.Q3_K):
        y = (dw * u) * c
    else:
        v = np.repeat(dec.msub.astype(np.float32), 16, axis=-1)
        y = (dw * u) * c - dec.mw[..., None] * v
    return y.reshape(*y.shape[:-2], -1)


def bits(a):
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


def finite_halves(qt, raw):
    """raw [N, block_bytes] with every half field's inf/NaN exponent made finite."""
    for off in qformats.lookup(qt).half_fields.values():
        h = np.ascontiguousarray(raw[:, off:off + 2]).view("<u2")[:, 0]
        h = np.where((h & 0x7C00) == 0x7C00, h ^ 0x4000, h).astype("<u2")
        raw[:, off:off + 2] = h.view(np.uint8).reshape(-1, 2)
    return raw


@SETTINGS
@given(qt=st.sampled_from(NEW), seed=st.integers(0, 2**32 - 1), rows=st.integers(1, 4),
       nblk=st.integers(1, 3), std=st.sampled_from([1e-3, 0.02, 0.5, 40.0]), valid=st.booleans())
def test_integer_form_is_gguf_dequantize(qt, seed, rows, nblk, std, valid):
    rng = np.random.default_rng(seed)
    _, nbytes = GGML_QUANT_SIZES[qt]
    if valid:
        raw = quants.random_blocks(qt, rows * nblk, rng, std=std)
    else:
        raw = finite_halves(qt, rng.integers(0, 256, (rows * nblk, nbytes), dtype=np.uint8))
    raw = raw.reshape(rows, nblk * nbytes)
    ref = gq.dequantize(raw, qt)
    assert np.isfinite(ref).all()
    dec = quants.decode(qt, raw)
    np.testing.assert_array_equal(bits(relation(qt, dec)), bits(ref))
    np.testing.assert_array_equal(bits(quants.dequantize(qt, raw)), bits(ref))


@pytest.mark.parametrize("qt", NEW, ids=[t.name for t in NEW])
def test_one_field_at_a_time(qt):
    """Flipping one byte of a block changes the values gguf decodes and ours the same way: each
    byte is read from where the layout puts it."""
    rng = np.random.default_rng(int(qt))
    base = quants.random_blocks(qt, 1, rng)
    half = {o + k for o in qformats.lookup(qt).half_fields.values() for k in (0, 1)}
    for j in range(base.shape[1]):
        if j in half:  # a flipped half may be inf or NaN
            continue
        raw = base.copy()
        raw[0, j] ^= np.uint8(1 + rng.integers(0, 255))
        np.testing.assert_array_equal(bits(relation(qt, quants.decode(qt, raw))), bits(gq.dequantize(raw, qt)))


def test_registered_after_the_first_six_each_with_its_cuda_kernel():
    names = [f.qtype for f in qformats.formats()]
    assert names[6:6 + len(NEW)] == NEW  # right after the first six (later modules register after them)
    assert [f.qtype for f in qformats.formats() if f.__module__ == "strata_prefill.contract.kquants"] == NEW
    for qt in NEW:
        fmt = qformats.lookup(qt)
        assert fmt.mmq_kernel == f"mmq_{qt.name.lower()}" and fmt.grid_source is None
        assert fmt in qformats.with_mmq_kernel()
        assert quants.row_bytes(qt, 2 * fmt.block_values) == 2 * fmt.block_bytes
