"""gpt-oss in the reference (reference/archs/gpt_oss.py and the shared MoE half with gpt-oss's
MOE): chunk invariance on gpt-oss-tiny, chunk boundaries inside the sliding window included;
each of the architecture's steps changes the result (the sinks, the window, the biases are read
and used where the tables say); `run --pack` prints its logits."""
import dataclasses

import numpy as np
import pytest

from strata_prefill.formats.archs import gpt_oss
from strata_prefill.reference import ReferenceEngine
from strata_prefill.session import Session
from test_reference import assert_same_dumps, prompt, run_with_dumps

PRESET = "gpt-oss-tiny"


@pytest.fixture(scope="module")
def pack(make_test_pack):
    p = make_test_pack(PRESET, "MXFP4")
    assert p.config.arch == gpt_oss.NAME and p.config.sliding_window == 16
    return p


def test_chunk_invariance(pack, tmp_path):
    """One chunk against chunks of 1, 5 (boundaries inside every window of 16 keys), 16 and 40,
    on a prompt of 3 windows and more: every op record, the residuals and the logits, byte for
    byte."""
    ids = prompt(pack, 53, seed=7)
    whole = run_with_dumps(pack, ids, "auto", tmp_path)
    for chunk in (1, 5, 16, 40):
        assert_same_dumps(run_with_dumps(pack, ids, chunk, tmp_path), whole, f"chunk {chunk}")


def _logits(pack, ids):
    return Session(ReferenceEngine(pack), chunk=16).prefill(ids)


def test_each_step_is_used(pack, monkeypatch):
    """Dropping a sink, the window or a bias changes the logits (the test would pass on a half
    that ignored them otherwise); the window only once the prompt is longer than it."""
    ids = prompt(pack, 40, seed=8)
    base = _logits(pack, ids)
    short = _logits(pack, ids[:16])  # within the window: windowed or not, the same keys

    def without(field, value):
        layer = pack.layer(0)
        monkeypatch.setitem(pack._layers, 0, dataclasses.replace(layer, **{field: value(getattr(layer, field))}))
        try:
            return _logits(pack, ids)
        finally:
            monkeypatch.setitem(pack._layers, 0, layer)

    for field in ("attn_sinks", "attn_q_b", "attn_output_b", "ffn_gate_inp_b", "ffn_up_exps_b", "ffn_down_exps_b"):
        changed = without(field, lambda v: np.zeros_like(v))
        assert not np.array_equal(changed, base), field
    no_window = dataclasses.replace(gpt_oss.ATTENTION, swa_every=0)
    monkeypatch.setattr(gpt_oss, "ATTENTION", no_window)
    assert not np.array_equal(_logits(pack, ids), base)
    np.testing.assert_array_equal(_logits(pack, ids[:16]), short)


def test_cli_run_prints_logits(pack, capsys):
    from strata_prefill.cli import main
    rc = main(["run", "--pack", str(pack.path), "--prompt-tokens", "24", "--prefill", "8",
               "--reference-cache", "off", "--no-progress", "--greedy", "2"])
    out = capsys.readouterr().out
    assert rc == 0 and "impl      reference" in out and "next " in out, out
