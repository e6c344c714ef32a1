"""The in-place walk's host plans, checked without a GPU: which routed experts form the
resident batch (strata_prefill.fast.walk.split_resident), and the tile list mmq.cu's tile-list form reads
(strata_prefill.fast.tiles.row_tiles), against a plain loop of whole tiles."""
import numpy as np
from hypothesis import given, settings, strategies as st

from strata_prefill.fast.cuda.products import row_tiles
from strata_prefill.fast.walk import split_resident
from test_routing import random_tables


def whole_tiles(b0: int, b1: int, tile_rows: int) -> list[tuple[int, int]]:
    """One expert's rows b0 .. b1 cut from the first row on: tile_rows at a time, the last tile
    what remains."""
    out = []
    b = b0
    while b < b1:
        out.append((b, min(b + tile_rows, b1)))
        b += tile_rows
    return out


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 400), min_size=1, max_size=40), st.sampled_from([8, 16, 64, 128]),
       st.integers(0, 2**16), st.booleans())
def test_row_tiles_cut_whole_tiles_then_the_rest(counts, tile_rows, seed, big_offsets):
    rng = np.random.default_rng(seed)
    begins = np.concatenate([[0], np.cumsum(counts)[:-1]])
    bounds = np.stack([begins, begins + np.array(counts)], axis=1)
    perm = rng.permutation(len(counts))  # a batch's experts need not be in row order
    bounds = bounds[perm]
    scale = 2**33 if big_offsets else 2**20  # offsets past 4 GiB need the high word
    woff = rng.integers(0, scale, len(counts)) * 2
    got = row_tiles(bounds, woff, tile_rows)
    assert got.dtype == np.int32 and got.shape[1] == 4
    want = [(b, e, int(o)) for (b0, b1), o in zip(bounds, woff) for b, e in whole_tiles(int(b0), int(b1), tile_rows)]
    off = got[:, 2].view(np.uint32).astype(np.int64) | (got[:, 3].astype(np.int64) << 32)
    assert list(zip(got[:, 0].tolist(), got[:, 1].tolist(), off.tolist())) == want
    assert np.all(got[:, 1] - got[:, 0] >= 1) and np.all(got[:, 1] - got[:, 0] <= tile_rows)


def test_row_tiles_refuse_odd_offsets_mismatched_lengths_and_tile_rows_off_the_n8_grid():
    import pytest

    from strata_prefill.contract.errors import InputError

    with pytest.raises(InputError, match="even"):
        row_tiles([[0, 8]], [3], 64)
    with pytest.raises(InputError, match="2 bounds but 1 offsets"):
        row_tiles([[0, 8], [8, 9]], [0], 64)
    assert row_tiles(np.zeros((0, 2)), [], 64).shape == (0, 4)
    with pytest.raises(InputError, match="multiple of 8"):
        row_tiles([[0, 8]], [0], 12)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 64), st.integers(1, 40), st.integers(0, 2**31 - 1), st.floats(0, 1))
def test_split_resident_takes_the_routed_resident_experts_in_id_order(n_expert, n_tok, seed, frac):
    rng = np.random.default_rng(seed)
    tab, order = random_tables(n_expert, n_tok, rng)
    resident = rng.random(n_expert) < frac
    batch, streamed = split_resident(order, tab.cnt, tab.off, resident)
    assert list(batch.experts) == [int(e) for e in order if resident[e]]
    assert streamed.tolist() == [int(e) for e in order if not resident[e]]
    assert batch.bounds.dtype == np.int32 and batch.bounds.shape == (len(batch.experts), 2)
    for e, (b, end) in zip(batch.experts, batch.bounds):
        assert (b, end) == (tab.off[e], tab.off[e] + tab.cnt[e])
    assert batch.n_rows == int(tab.cnt[resident].sum())


def test_widened_bytes_count_the_16_bit_matrices_the_cache_must_leave_room_for(make_test_pack):
    """The cuda backend's expert-cache sizing adds 2 bytes a value for each F16/BF16 matrix it
    widens to F32 (the router and float dense matrices, never stacked experts), nothing for a
    pack without 16-bit matrices."""
    from strata_prefill.fast.cuda.backend import CudaBackend

    be = CudaBackend.__new__(CudaBackend)  # no device: the count reads the pack alone

    pack = make_test_pack("tiny", "Q4_1", router_type="BF16", dense_type="F16")
    cfg = pack.config
    want = 0
    for name in pack.tensor_names():
        m = pack.matrix(name)
        if m.qtype.name in ("F16", "BF16") and m.n_expert is None:
            want += 2 * m.n_rows * m.n_cols
    assert want >= 2 * cfg.n_layer * cfg.n_expert * cfg.n_embd  # at least the routers
    assert be.widened_extra_bytes(pack) == want
    assert be.widened_extra_bytes(make_test_pack("tiny", "Q4_1")) == 0
