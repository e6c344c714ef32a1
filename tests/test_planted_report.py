"""Bugs planted in the sim backend are reported at the op, layer and chunk where they start,
with the expert and its group for expert-sorted buffers."""
import re
from pathlib import Path

import numpy as np
import pytest

from strata_prefill.fast import make_fast_engine, walk
from strata_prefill.fast.sim import SimBackend
from strata_prefill.reference import ReferenceEngine
from strata_prefill.formats.dumps import iter_records
from strata_prefill.formats.records import GLOBALS, HEADERS, OPS, read_timeline, routed_groups
from strata_prefill.report import compare_timelines
from strata_prefill.session import Session


def run(pack, ids, out, chunk=32, **switches):
    Session(make_fast_engine(pack, "sim", **switches), chunk=chunk, dump_dir=out, dump_level="ops",
            progress=False).run(ids, greedy=1)
    return read_timeline(out / "layers.spd")


@pytest.fixture
def runs(make_test_pack, tmp_path, monkeypatch):
    """(clean, planted) timelines of the sim on a 64-expert pack, prompt in 2 chunks."""
    pack = make_test_pack("small", "Q8_0")
    ids = np.random.default_rng(9).integers(0, pack.config.n_vocab, 48)
    clean = run(pack, ids, tmp_path / "clean")

    def planted(attr, wrapper, owner=SimBackend, **switches):
        monkeypatch.setattr(owner, attr, wrapper(getattr(owner, attr)))
        try:
            return run(pack, ids, tmp_path / attr, **switches)
        finally:
            monkeypatch.undo()

    return clean, planted


def test_wrong_resident_bound_is_named_at_the_gate_product(runs):
    """The in-place batch's bound of one resident expert one row short (strata_prefill.fast.walk.split_resident)."""
    clean, planted = runs

    def off_by_one(orig):
        def split_resident(*args):
            batch, streamed = orig(*args)
            bounds = batch.bounds.copy()
            bounds[20, 1] -= 1  # the 21st routed expert loses its last row
            return walk.Batch(batch.experts, bounds), streamed
        return split_resident

    # planned on the host: with every expert resident the device would cut the bounds itself
    miss = compare_timelines(clean, planted("split_resident", off_by_one, owner=walk, device_plan=0))
    text = str(miss)
    assert miss.record == "L00.gate", text
    ids = clean[0].records["L00.topk_ids"]
    e = int(np.unique(ids)[20])
    assert f"expert {e}," in text
    assert f"shape: one expert ({e}, group 1): 1 of its" in text
    assert "resident experts in place" in miss.kernel


def test_attention_error_is_named_at_attention_of_layer_0(runs):
    clean, planted = runs

    def bump(orig):
        def attend(self, layer, q, positions):
            o = orig(self, layer, q, positions)
            if layer == 0 and positions[0] == 32:  # chunk 1, one element of its token 3
                o.reshape(len(positions), -1)[3, 5] += np.float32(1e-3)
            return o
        return attend

    miss = compare_timelines(clean, planted("attend", bump))
    text = str(miss)
    assert miss.record == "L00.attn_out", text
    assert "layer 0, chunk 1, position 35 (token 3 of the chunk)" in text
    assert "shape: one token (position 35): 1 element of" in text
    assert "attention" in miss.kernel


def test_wrong_group_bound_is_named_at_the_gate_product_with_expert_and_group(runs, monkeypatch):
    """A gathered group's bound (every expert gathered: in_place 0; the clean run multiplies
    them in place, the same bytes)."""
    clean, planted = runs
    monkeypatch.setenv("STRATA_PREFILL_IN_PLACE", "0")

    def off_by_one(orig):
        def group_bounds(bounds_list):
            out = [b.copy() for b in bounds_list]
            out[1][-1, 1] -= 1  # the last expert of the second group loses its last row
            return orig(out)
        return staticmethod(group_bounds)

    bad = planted("group_bounds", off_by_one)
    miss = compare_timelines(clean, bad)
    text = str(miss)
    assert miss.record == "L00.gate", text
    assert "chunk 0," in text
    ids = clean[0].records["L00.topk_ids"]
    groups = routed_groups(ids, 16)
    second = sorted(e for e, g in groups.items() if g == 1)
    e = second[-1]
    slot = clean[0].records["L00.slot"]
    last_pair = int(np.argmax(np.where(ids.reshape(-1) == e, slot, -1)))  # e's last sorted row
    t, k = divmod(last_pair, ids.shape[1])
    assert f"pair row {last_pair} (rank {k}), expert {e}, group 1 (routed experts {second[0]}..{e})" in text
    assert f"position {t} (token {t} of the chunk)" in text
    assert f"shape: one expert ({e}, group 1): 1 of its" in text
    assert miss.kernel.startswith("fast/cuda/kernels/mmq.cu")


def test_wrong_scatter_slot_order_is_named_at_the_moe_input(runs):
    clean, planted = runs

    def swapped(orig):
        def quantize_scatter(self, *, x, slot, n_tok, k_used, layout, out):
            s = np.asarray(slot).reshape(n_tok, k_used)[[1, 0, *range(2, n_tok)]]  # tokens 0, 1 swap
            return orig(self, x=x, slot=np.ascontiguousarray(s.reshape(-1)), n_tok=n_tok, k_used=k_used,
                        layout=layout, out=out)
        return quantize_scatter

    miss = compare_timelines(clean, planted("quantize_scatter", swapped))
    text = str(miss)
    assert miss.record == "L00.moe_in_q8_1", text
    assert "layer 0, chunk 0, position 0 (token 0 of the chunk), pair row 0 (rank 0), expert" in text
    assert "shape: one token" not in text  # tokens 0 and 1 both differ
    assert "quantize_q8_1.cu" in miss.kernel


def test_the_same_run_cut_into_other_chunks_agrees(make_test_pack, tmp_path):
    pack = make_test_pack("tiny", "Q4_1")
    ids = np.random.default_rng(3).integers(0, pack.config.n_vocab, 70)
    a = run(pack, ids, tmp_path / "a", chunk=32)
    b = run(pack, ids, tmp_path / "b", chunk="auto")
    assert [c.index for c in a] == [0, 1, 2] and [len(c.positions) for c in b] == [70]
    assert compare_timelines(a, b) is None and compare_timelines(b, a) is None


def test_both_engines_write_every_op_of_the_table_and_the_kernels_exist(make_test_pack, tmp_path):
    """The names both engines write at the op level are the table's, and each kernel file it
    names is a kernel of the fast path (fast/cuda/kernels/)."""
    pack = make_test_pack("tiny", "Q8_0")
    ids = np.random.default_rng(4).integers(0, pack.config.n_vocab, 20)
    want = {f"L{l:02d}.{op.name}" for l in range(pack.config.n_layer) for op in OPS} | set(GLOBALS) | set(HEADERS)
    for eng in (ReferenceEngine(pack), make_fast_engine(pack, "sim")):
        Session(eng, dump_dir=tmp_path / eng.name.replace("/", "-"), dump_level="ops", progress=False).run(ids)
        got = {name for name, _ in iter_records(tmp_path / eng.name.replace("/", "-") / "layers.spd")}
        assert got == want, eng.name
    root = Path(__file__).resolve().parent.parent
    for op in (*OPS, *GLOBALS.values()):
        for kernel in re.findall(r"(\w+\.cu)\b", op.kernel):
            assert (root / "fast/cuda/kernels" / kernel).exists(), op

