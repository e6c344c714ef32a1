"""RoPE scaling (strata_prefill.formats.config.RopeScaling, contract/numerics.py:rope_table, docs/numerics.md
"RoPE scaling"): the table against a float64 computation written here from llama.cpp's
formulas, the keys read from a real GGUF, the reference and the sim fast path on a YaRN pack,
`info`, and one-line refusals of what no path runs."""
from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader, GGUFWriter
from hypothesis import given, settings, strategies as st

from strata_prefill.contract import numerics
from strata_prefill.formats.config import PRESETS, RopeScaling
from strata_prefill.contract.errors import PackError
from strata_prefill.formats.make_pack import make_pack
from strata_prefill.formats.pack import Pack

ROOT = Path(__file__).resolve().parent.parent
YARN = RopeScaling("yarn", 4.0, 4096)


def expected_table(n_pos, hd, base, kind="none", factor=1.0, orig=0, attn=1.0):
    """cos and sin, float64, one element at a time from the formulas of llama.cpp's
    ggml_rope_yarn_corr_dims, rope_yarn_ramp and rope_yarn (beta_fast 32, beta_slow 1,
    ext_factor 1 for yarn, else 0; mscale attn_factor * (1 + 0.1 ln factor) when ext_factor
    is not 0)."""
    ext = 1.0 if kind == "yarn" else 0.0
    scale = 1.0 if kind == "none" else factor
    mscale = attn * ((1.0 + 0.1 * math.log(factor)) if ext else 1.0)

    def corr_dim(n_rot):
        return hd * math.log(orig / (n_rot * 2 * math.pi)) / (2 * math.log(base))

    if kind == "yarn":
        low = max(0.0, math.floor(corr_dim(32.0)))
        high = min(hd - 1.0, math.ceil(corr_dim(1.0)))
    cos = np.empty((n_pos, hd // 2))
    sin = np.empty((n_pos, hd // 2))
    for p in range(n_pos):
        for i in range(hd // 2):
            extrap = p * base ** (-2.0 * i / hd)
            theta = extrap / scale
            if ext:
                y = (i - low) / max(0.001, high - low)
                mix = (1.0 - min(1.0, max(0.0, y))) * ext
                theta = theta * (1.0 - mix) + extrap * mix
            cos[p, i] = math.cos(theta) * mscale
            sin[p, i] = math.sin(theta) * mscale
    return cos.astype(np.float32), sin.astype(np.float32)


def same_bits(a, b):
    return a.dtype == b.dtype == np.float32 and a.tobytes() == b.tobytes()


@settings(max_examples=40, deadline=None)
@given(factor=st.sampled_from([1.0, 1.5, 2.0, 4.0, 8.0, 32.0]),
       orig=st.sampled_from([64, 512, 2048, 4096, 32768]),
       hd=st.sampled_from([16, 32, 64, 128]),
       base=st.sampled_from([10000.0, 500000.0, 1e6]),
       attn=st.sampled_from([1.0, 0.5, 1.25]))
def test_yarn_table_is_the_formulas_bit_for_bit(factor, orig, hd, base, attn):
    got = numerics.rope_table(70, hd, base, RopeScaling("yarn", factor, orig, attn))
    want = expected_table(70, hd, base, "yarn", factor, orig, attn)
    assert same_bits(got[0], want[0]) and same_bits(got[1], want[1])


@settings(max_examples=20, deadline=None)
@given(factor=st.sampled_from([0.5, 2.0, 4.0]), hd=st.sampled_from([16, 64, 128]),
       base=st.sampled_from([10000.0, 1e6]), attn=st.sampled_from([1.0, 0.75]))
def test_linear_and_none_tables(factor, hd, base, attn):
    got = numerics.rope_table(40, hd, base, RopeScaling("linear", factor, 0, attn))
    want = expected_table(40, hd, base, "linear", factor, attn=attn)
    assert same_bits(got[0], want[0]) and same_bits(got[1], want[1])
    got = numerics.rope_table(40, hd, base, RopeScaling("none", attn_factor=attn))
    want = expected_table(40, hd, base, "none", attn=attn)
    assert same_bits(got[0], want[0]) and same_bits(got[1], want[1])


def test_unscaled_tables_are_todays():
    plain = numerics.rope_table(300, 64, 1e6)
    for scaling in (RopeScaling(), RopeScaling("linear", 1.0)):
        table = numerics.rope_table(300, 64, 1e6, scaling)
        assert same_bits(table[0], plain[0]) and same_bits(table[1], plain[1])
    # and the yarn table differs from it: the scaling is not a no-op
    yarn = numerics.rope_table(300, 64, 1e6, YARN)
    assert not np.array_equal(yarn[0], plain[0])
    assert np.array_equal(yarn[0][0], np.full(32, np.float32(1 + 0.1 * math.log(4.0))))


def test_rope_table_growth_keeps_the_scaling():
    t = numerics.RopeTable(64, 1e6, scaling=YARN)
    small = [a.copy() for a in t.covering(10)]
    big = t.covering(1000)
    assert t.rows >= 1000
    assert same_bits(big[0][:len(small[0])], small[0])
    want = numerics.rope_table(t.rows, 64, 1e6, YARN)
    assert same_bits(big[0], want[0]) and same_bits(big[1], want[1])


# ---- packs ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def packs(tmp_path_factory):
    d = tmp_path_factory.mktemp("rope-scaling")
    plain = make_pack(d / "plain.gguf", "tiny", seed=3, progress=False)
    yarn = make_pack(d / "yarn.gguf", "tiny", seed=3, progress=False,
                     config=PRESETS["tiny"].replace(rope_scaling=YARN))
    return {"plain": plain, "yarn": yarn, "dir": d}


def test_the_yarn_pack_holds_llama_cpps_keys(packs):
    fields = GGUFReader(packs["yarn"]).fields
    assert fields["qwen3moe.rope.scaling.type"].contents() == "yarn"
    assert fields["qwen3moe.rope.scaling.factor"].contents() == 4.0
    assert fields["qwen3moe.rope.scaling.original_context_length"].contents() == 4096
    assert "qwen3moe.rope.scaling.type" not in GGUFReader(packs["plain"]).fields
    with Pack.open(packs["yarn"]) as p:
        assert p.config.rope_scaling == YARN
    with Pack.open(packs["plain"]) as p:
        assert p.config.rope_scaling == RopeScaling()


def _run(engine, pack, tmp_path, name):
    from strata_prefill.verify.common import run_engine

    ids = np.random.default_rng(4).integers(0, pack.config.n_vocab, 40).astype(np.int32)
    return run_engine(engine, ids, 64, tmp_path / name, greedy=2)


def test_reference_uses_the_scaling_and_the_sim_matches_it(packs, tmp_path):
    from strata_prefill.fast import make_fast_engine
    from strata_prefill.reference import ReferenceEngine
    from strata_prefill.verify.common import assert_same_run

    with Pack.open(packs["yarn"]) as yarn, Pack.open(packs["plain"]) as plain:
        ref_yarn = _run(ReferenceEngine(yarn), yarn, tmp_path, "ref-yarn")
        ref_plain = _run(ReferenceEngine(plain), plain, tmp_path, "ref-plain")
        assert not np.array_equal(ref_yarn.logits, ref_plain.logits)
        fast_yarn = _run(make_fast_engine(yarn, "sim"), yarn, tmp_path, "sim-yarn")
        assert_same_run(ref_yarn, fast_yarn, yarn, "sim vs reference on a yarn pack")


def _write_header(path, extra):
    """A qwen3moe header with the rope keys `extra` (key -> value) and no tensors: the config
    is read, and refused, before any tensor is looked at."""
    w = GGUFWriter(str(path), "qwen3moe")
    a = "qwen3moe."
    for key, value in (("block_count", 1), ("context_length", 4096), ("embedding_length", 64),
                       ("attention.head_count", 2), ("expert_count", 4),
                       ("expert_used_count", 2), ("expert_feed_forward_length", 64)):
        w.add_uint32(a + key, value)
    w.add_float32(a + "attention.layer_norm_rms_epsilon", 1e-6)
    for key, value in extra.items():
        if isinstance(value, str):
            w.add_string(a + key, value)
        else:
            w.add_float32(a + key, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("extra, needle", [
    ({"rope.scaling.type": "longrope"},
     "qwen3moe.rope.scaling.type 'longrope' is not supported (supported: none, linear, yarn)"),
    ({"rope.scaling.type": "yarn", "rope.scaling.factor": 0.5},
     "qwen3moe.rope.scaling.factor 0.5: must be a finite float32 number >= 1 for yarn"),
    ({"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scaling.yarn_beta_fast": 16.0},
     "qwen3moe.rope.scaling.yarn_beta_fast 16: llama.cpp's qwen3moe loader does not read it"),
])
def test_what_no_path_runs_is_refused_on_open(tmp_path, extra, needle):
    path = _write_header(tmp_path / "bad.gguf", extra)
    assert GGUFReader(path).fields["qwen3moe.rope.scaling.type"].contents() == extra["rope.scaling.type"]
    with pytest.raises(PackError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        Pack.open(path)


def _cli(args, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.pop("STRATA_DUMP_FIRST_LOGITS", None)
    env.pop("STRATA_PREFILL_DUMP_R", None)
    return subprocess.run([sys.executable, "-m", "strata_prefill", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("command", [["info"], ["run", "--greedy", "0", "--pack"]])
def test_an_unknown_type_is_one_line_from_the_cli(tmp_path, command):
    path = _write_header(tmp_path / "odd.gguf", {"rope.scaling.type": "dynamic"})
    proc = _cli([*command, str(path)], tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1, proc.stderr
    assert err[0].startswith("strata-prefill: error: ")
    assert "qwen3moe.rope.scaling.type 'dynamic' is not supported (supported: none, linear, yarn)" in err[0]


def test_info_shows_the_rope_settings(packs, tmp_path):
    proc = _cli(["info", str(packs["yarn"])], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "rope base 1e+06" in proc.stdout
    assert ("rope scaling:   yarn, factor 4, original context 4096, attn factor 1, beta fast 32, "
            "beta slow 1, ext factor 1") in proc.stdout.splitlines()
    proc = _cli(["info", str(packs["plain"])], tmp_path)
    assert "rope scaling:   none" in proc.stdout.splitlines()


def test_make_pack_writes_the_scaling_it_is_given(tmp_path):
    proc = _cli(["make-pack", "y.gguf", "--rope-scaling", "yarn:8:2048", "--no-progress"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    with Pack.open(tmp_path / "y.gguf") as p:
        assert p.config.rope_scaling == RopeScaling("yarn", 8.0, 2048)
    proc = _cli(["make-pack", "l.gguf", "--rope-scaling", "linear:2", "--no-progress"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    with Pack.open(tmp_path / "l.gguf") as p:
        assert p.config.rope_scaling == RopeScaling("linear", 2.0)


@pytest.mark.parametrize("spec, needle", [
    ("yarn:0.5:4096", "--rope-scaling: qwen3moe.rope.scaling.factor 0.5: must be a finite float32 number >= 1"),
    ("yarn:4:0", "--rope-scaling: ORIG_CTX must be a positive integer, got '0'"),
    ("dynamic:2", "'dynamic:2' is not yarn:FACTOR:ORIG_CTX or linear:FACTOR"),
    ("yarn:4", "'yarn:4' is not yarn:FACTOR:ORIG_CTX or linear:FACTOR"),
    # past what the header's fields hold: a uint32 context, float32 factors (no struct.error)
    ("yarn:4:4294967296", "ORIG_CTX must be at most 4,294,967,295 (the pack's header holds it as a uint32)"),
    ("linear:1e39", "qwen3moe.rope.scaling.factor 1e+39: must be a finite float32 number > 0"),
    ("yarn:1e39:4096", "qwen3moe.rope.scaling.factor 1e+39: must be a finite float32 number >= 1"),
    ("linear:1e-46", "qwen3moe.rope.scaling.factor 1e-46: must be a finite float32 number > 0"),
    ("yarn:nan:4096", "'yarn:nan:4096' is not yarn:FACTOR:ORIG_CTX"),
    ("linear:1_0", "'linear:1_0' is not yarn:FACTOR:ORIG_CTX"),
])
def test_make_pack_refuses_a_bad_scaling_in_one_line(tmp_path, spec, needle):
    proc = _cli(["make-pack", "bad.gguf", "--rope-scaling", spec, "--no-progress"], tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and needle in err[0], proc.stderr
    assert not (tmp_path / "bad.gguf").exists()
