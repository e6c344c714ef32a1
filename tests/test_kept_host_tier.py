"""fast/cuda/tiers.py's kept host tier (no GPU needed for its bookkeeping): its key changes
with anything the tier's bytes depend on, and at most one tier is kept."""
import os

import numpy as np

from strata_prefill.fast.cuda import tiers
from strata_prefill.fast.experts import place_experts


def test_the_key_follows_the_file_and_the_placement(make_test_pack, tmp_path):
    pack = make_test_pack("tiny", "Q8_0")
    cfg = pack.config
    p1, p2 = (place_experts(cfg.n_layer, cfg.n_expert, n) for n in (5, 9))
    sizes = [100, 100]
    k1 = tiers._host_key(pack, p1, sizes)
    assert k1 == tiers._host_key(pack, place_experts(cfg.n_layer, cfg.n_expert, 5), sizes)
    assert k1 != tiers._host_key(pack, p2, sizes)
    assert k1 != tiers._host_key(pack, p1, [100, 101])
    st = os.stat(pack.path)
    try:
        os.utime(pack.path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # the file "rewritten"
        assert k1 != tiers._host_key(pack, p1, sizes)
    finally:
        os.utime(pack.path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_one_tier_is_kept_the_newest(monkeypatch):
    monkeypatch.setattr(tiers, "_kept_host", {})
    monkeypatch.setattr(tiers, "_exit_clear", [True])  # no exit hook from a test
    a, b = np.zeros(4, np.uint8), np.ones(4, np.uint8)
    tiers._keep_host("a", a)
    tiers._keep_host("b", b)
    assert list(tiers._kept_host) == ["b"] and tiers._kept_host["b"] is b
