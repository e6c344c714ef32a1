"""Packs: make-pack writes real GGUF files (checked with plain gguf.GGUFReader), Pack.open
reads them in place, broken packs give one-line PackErrors, `info` describes them."""
from __future__ import annotations

import hashlib
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader, GGUFValueType, GGUFWriter
from gguf import quants as gq

from strata_prefill.contract import qformats, quants
from strata_prefill.cli import main as cli
from strata_prefill.formats.config import PRESETS, ModelConfig
from strata_prefill.contract.constants import PACK_FORMAT
from strata_prefill.contract.errors import InputError, PackError
from strata_prefill.formats.make_pack import FALLBACK_TYPE, make_pack
from strata_prefill.formats.pack import Pack, QMatrix

W = ".weight"  # llama.cpp's converters name every weight <logical name>.weight

EXPERT_TYPES = [t.name for t in quants.SUPPORTED_TYPES]


# ---------------------------------------------------------------------------------------
# Helpers: what a pack must hold, written independently of strata_prefill.formats.pack


def expected_ne(cfg: ModelConfig, tied: bool = False) -> dict[str, list[int]]:
    """file name -> ggml ne."""
    D, E, F, V = cfg.n_embd, cfg.n_expert, cfg.n_ff_exp, cfg.n_vocab
    q, kv = cfg.n_head * cfg.head_dim, cfg.n_head_kv * cfg.head_dim
    ne = {"token_embd": [D, V], "output_norm": [D]}
    if not tied:
        ne["output"] = [D, V]
    for l in range(cfg.n_layer):
        p = f"blk.{l}."
        ne.update({
            p + "attn_norm": [D], p + "attn_q": [D, q], p + "attn_k": [D, kv],
            p + "attn_v": [D, kv], p + "attn_output": [q, D], p + "attn_q_norm": [cfg.head_dim],
            p + "attn_k_norm": [cfg.head_dim], p + "ffn_norm": [D], p + "ffn_gate_inp": [D, E],
            p + "ffn_gate_exps": [D, F, E], p + "ffn_up_exps": [D, F, E],
            p + "ffn_down_exps": [F, D, E],
        })
        if cfg.n_ff_shexp:
            S = cfg.n_ff_shexp
            ne.update({p + "ffn_gate_inp_shexp": [D], p + "ffn_gate_shexp": [D, S],
                       p + "ffn_up_shexp": [D, S], p + "ffn_down_shexp": [S, D]})
    return {name + W: v for name, v in ne.items()}


def expected_type(name: str, expert: QT, down: QT, dense: QT, router: QT = QT.F32) -> QT:
    name = name.removesuffix(W)
    if name.endswith("_norm"):
        return QT.F32
    if name.endswith("ffn_gate_inp"):
        return router
    if name.endswith("ffn_gate_inp_shexp"):
        return router if router in (QT.F32, QT.BF16) else QT.F32
    if name.endswith(("ffn_gate_exps", "ffn_up_exps")):
        return expert
    if name.endswith("ffn_down_exps"):
        return down
    return dense


def fields_of(r: GGUFReader) -> dict:
    return {k: f.contents() for k, f in r.fields.items()}


def check_reader(path: Path, cfg: ModelConfig, expert: str, dense: str = "Q8_0",
                 tied: bool = False, router: str = "F32") -> GGUFReader:
    """Plain gguf-py view of a pack: names, shapes, types, llama.cpp's metadata."""
    r = GGUFReader(path)
    f = fields_of(r)
    a = "qwen3moe."
    assert f["general.architecture"] == "qwen3moe"
    assert f["tokenizer.ggml.model"] == "none"
    want = {
        a + "block_count": cfg.n_layer, a + "embedding_length": cfg.n_embd,
        a + "attention.head_count": cfg.n_head, a + "attention.head_count_kv": cfg.n_head_kv,
        a + "attention.key_length": cfg.head_dim, a + "attention.value_length": cfg.head_dim,
        a + "expert_count": cfg.n_expert, a + "expert_used_count": cfg.n_expert_used,
        a + "expert_feed_forward_length": cfg.n_ff_exp, a + "context_length": cfg.context_length,
        a + "vocab_size": cfg.n_vocab,
    }
    for k, v in want.items():
        assert f[k] == v, k
        assert r.fields[k].types == [GGUFValueType.UINT32], k
    assert f[a + "rope.freq_base"] == pytest.approx(cfg.rope_base)
    assert f[a + "attention.layer_norm_rms_epsilon"] == pytest.approx(cfg.rms_eps)
    if cfg.n_ff_shexp:
        assert f[a + "expert_shared_feed_forward_length"] == cfg.n_ff_shexp
    else:
        assert a + "expert_shared_feed_forward_length" not in f

    et = QT[expert]
    blk = quants.block_size(et)[0]
    gu = et if cfg.n_embd % blk == 0 else FALLBACK_TYPE
    down = et if cfg.n_ff_exp % blk == 0 else FALLBACK_TYPE
    ne = expected_ne(cfg, tied)
    got = {t.name: t for t in r.tensors}
    assert set(got) == set(ne)
    for name, t in got.items():
        assert [int(d) for d in t.shape] == ne[name], name
        assert t.tensor_type == expected_type(name, gu, down, QT[dense], QT[router]), name
        assert t.data_offset % 32 == 0
    fallbacks = [f"blk.{l}.{n}" for l in range(cfg.n_layer)
                 for n, t in (("ffn_gate_exps", gu), ("ffn_up_exps", gu), ("ffn_down_exps", down))
                 if t != et]
    assert f.get("strata.fallback", []) == fallbacks
    assert f["strata.expert_type"] == expert
    assert f["strata.router_type"] == router
    assert f["strata.pack_format"] == PACK_FORMAT
    return r


def check_experts(pack: Pack, reader: GGUFReader, raw: np.memmap, l: int, experts) -> None:
    """expert_blob = gate|up|down slices; expert_offsets point at those bytes in the file."""
    t = {x.name: x for x in reader.tensors}
    p = f"blk.{l}."
    gu_bytes, d_bytes = pack.expert_blob_bytes(l)
    for e in experts:
        slices = [np.asarray(t[p + n + W].data[e]).reshape(-1)
                  for n in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")]
        assert [s.size for s in slices] == [gu_bytes, gu_bytes, d_bytes]
        blob = pack.expert_blob(l, e)
        assert blob.dtype == np.uint8 and blob.size == 2 * gu_bytes + d_bytes == pack.expert_blob_size(l)
        assert np.array_equal(blob, np.concatenate(slices))
        for part, s in zip(pack.expert_parts(l, e), slices):  # the views the cuda tiers copy from
            assert np.array_equal(part, s)
        for (off, n), s in zip(pack.expert_offsets(l, e), slices):
            assert n == s.size
            assert np.array_equal(raw[off:off + n], s)


# ---------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory) -> Path:
    return make_pack(tmp_path_factory.mktemp("tiny") / "tiny.gguf", "tiny")


# ---------------------------------------------------------------------------------------
# Presets and config


def test_presets_shapes():
    t, s, q, st = (PRESETS[n] for n in ("tiny", "small", "qwen3-30b-a3b", "strata"))
    assert (t.n_embd, t.n_head, t.n_head_kv, t.head_dim, t.n_layer, t.n_expert, t.n_expert_used,
            t.n_ff_exp, t.n_ff_shexp, t.n_vocab) == (256, 4, 2, 64, 2, 16, 4, 256, 256, 512)
    assert (s.n_embd, s.n_head, s.n_head_kv, s.head_dim, s.n_layer, s.n_expert, s.n_expert_used,
            s.n_ff_exp, s.n_ff_shexp, s.n_vocab) == (512, 8, 4, 64, 4, 64, 8, 384, 0, 2048)
    assert (q.n_embd, q.n_head, q.n_head_kv, q.head_dim, q.n_layer, q.n_expert, q.n_expert_used,
            q.n_ff_exp, q.n_ff_shexp, q.n_vocab) == (2048, 32, 4, 128, 48, 128, 8, 768, 0, 151936)
    assert (st.n_embd, st.n_head, st.n_head_kv, st.head_dim, st.n_layer, st.n_expert,
            st.n_expert_used, st.n_ff_exp, st.n_ff_shexp, st.n_vocab) == (
        2560, 32, 4, 128, 4, 512, 10, 640, 640, 151936)
    for c in PRESETS.values():  # qwen3moe's (gpt-oss's: tests/test_gpt_oss_table.py)
        if c.arch == "qwen3moe":
            assert (c.rope_base, c.rms_eps, c.context_length) == (1e6, 1e-6, 32768)


def test_config_from_plain_metadata():
    md = {"general.architecture": "qwen3moe", "qwen3moe.block_count": 3,
          "qwen3moe.embedding_length": 64, "qwen3moe.attention.head_count": 2,
          "qwen3moe.expert_count": 8, "qwen3moe.expert_used_count": 2,
          "qwen3moe.expert_feed_forward_length": 32, "qwen3moe.context_length": 128,
          "qwen3moe.attention.layer_norm_rms_epsilon": 1e-6}
    c = ModelConfig.from_metadata(md)
    assert (c.n_layer, c.n_head_kv, c.head_dim, c.n_ff_shexp, c.rope_base) == (3, 2, 32, 0, 10000.0)
    with pytest.raises(PackError, match="missing metadata key qwen3moe.expert_count"):
        ModelConfig.from_metadata({k: v for k, v in md.items() if k != "qwen3moe.expert_count"})
    with pytest.raises(PackError, match="expected qwen3moe or gpt-oss, got llama"):
        ModelConfig.from_metadata({**md, "general.architecture": "llama"})


# ---------------------------------------------------------------------------------------
# Writing and reading back


@pytest.mark.parametrize("expert", EXPERT_TYPES)
def test_tiny_every_expert_type(tmp_path, expert):
    cfg = PRESETS["tiny"]
    path = make_pack(tmp_path / f"tiny-{expert}.gguf", "tiny", expert_type=expert, seed=1)
    r = check_reader(path, cfg, expert)
    pack = Pack.open(path)
    c = pack.config
    assert c.replace(expert_gu_type=QT.Q8_0, expert_down_type=QT.Q8_0) == cfg
    assert c.expert_gu_type == c.expert_down_type == QT[expert]
    assert pack.file_size == path.stat().st_size
    assert pack.fallbacks == []
    raw = np.memmap(path, mode="r")
    for l in range(cfg.n_layer):
        check_experts(pack, r, raw, l, [0, 7, cfg.n_expert - 1])
    lay = pack.layer(1)
    g = lay.ffn_gate_exps
    assert isinstance(g, QMatrix) and g.qtype == QT[expert]
    assert (g.n_rows, g.n_cols, g.n_expert) == (cfg.n_ff_exp, cfg.n_embd, cfg.n_expert)
    assert g.data.shape == (cfg.n_expert, cfg.n_ff_exp, quants.row_bytes(QT[expert], cfg.n_embd))
    assert lay.ffn_down_exps.data.shape[:2] == (cfg.n_expert, cfg.n_embd)
    # a view into the map, not a copy
    assert not g.data.flags.writeable and not g.data.flags.owndata
    # dequantized experts: the gguf oracle, and a sane spread
    t = {x.name: x for x in r.tensors}
    w = quants.dequantize(g.qtype, g.data[3])
    assert np.array_equal(w, gq.dequantize(np.asarray(t["blk.1.ffn_gate_exps" + W].data[3]), QT[expert]))
    assert np.isfinite(w).all() and 0.01 < w.std() < 0.2


def test_tiny_layer_api(tiny_path):
    cfg = PRESETS["tiny"]
    pack = Pack.open(tiny_path)
    r = GGUFReader(tiny_path)
    t = {x.name: x for x in r.tensors}
    lay = pack.layer(0)
    assert (lay.attn_q.n_rows, lay.attn_q.n_cols) == (cfg.n_head * cfg.head_dim, cfg.n_embd)
    assert (lay.attn_k.n_rows, lay.attn_v.n_rows) == (cfg.n_head_kv * cfg.head_dim,) * 2
    assert (lay.attn_output.n_rows, lay.attn_output.n_cols) == (cfg.n_embd, cfg.n_head * cfg.head_dim)
    assert np.array_equal(lay.attn_q.data, t["blk.0.attn_q" + W].data)
    for v, n in ((lay.attn_norm, cfg.n_embd), (lay.ffn_norm, cfg.n_embd),
                 (lay.attn_q_norm, cfg.head_dim), (lay.attn_k_norm, cfg.head_dim)):
        assert v.dtype == np.float32 and v.shape == (n,)
        assert 0.5 < v.mean() < 1.5 and 0.02 < v.std() < 0.3
    # router: stored F32 and kept so (a view of the file's bytes)
    router = np.asarray(t["blk.0.ffn_gate_inp" + W].data, np.float32)
    assert lay.ffn_gate_inp.qtype == QT.F32 and lay.ffn_gate_inp.is_float
    assert (lay.ffn_gate_inp.n_rows, lay.ffn_gate_inp.n_cols) == (cfg.n_expert, cfg.n_embd)
    assert not lay.ffn_gate_inp.data.flags.owndata
    assert np.array_equal(lay.ffn_gate_inp.dequantize().view(np.uint32), router.view(np.uint32))
    assert 0.03 < router.std() < 0.2
    # shared expert
    assert lay.has_shexp and lay.shexp is not None
    gi = lay.ffn_gate_inp_shexp
    assert gi.qtype == QT.F32 and (gi.n_rows, gi.n_cols) == (1, cfg.n_embd)
    assert np.array_equal(gi.dequantize(), np.asarray(t["blk.0.ffn_gate_inp_shexp" + W].data)[None])
    assert (lay.ffn_down_shexp.n_rows, lay.ffn_down_shexp.n_cols) == (cfg.n_embd, cfg.n_ff_shexp)
    assert lay.shexp.up is lay.ffn_up_shexp
    # embeddings: exact dequantized rows
    ids = np.array([0, 5, 511, 5])
    emb = pack.embedding_rows(ids)
    assert emb.shape == (4, cfg.n_embd) and emb.dtype == np.float32
    assert np.array_equal(emb, gq.dequantize(np.asarray(t["token_embd" + W].data)[ids], QT.Q8_0))
    assert 0.3 < emb.std() < 0.8
    with pytest.raises(InputError):
        pack.embedding_rows([512])
    # output
    assert np.array_equal(pack.output().data, t["output" + W].data)
    assert pack.matrix("blk.0.attn_q") is lay.attn_q  # cached
    with pytest.raises(PackError, match="missing tensor blk.9.attn_q"):
        pack.matrix("blk.9.attn_q")


def test_small_falls_back(tmp_path):
    cfg = PRESETS["small"]
    path = make_pack(tmp_path / "small.gguf", "small", expert_type="IQ3_S")
    r = check_reader(path, cfg, "IQ3_S")
    pack = Pack.open(path)
    assert pack.config.expert_gu_type == QT.IQ3_S and pack.config.expert_down_type == QT.Q8_0
    assert pack.fallbacks == [f"blk.{l}.ffn_down_exps" for l in range(cfg.n_layer)]
    assert pack.fallback_type == "Q8_0"
    assert not pack.layer(0).has_shexp and pack.layer(0).shexp is None
    gu, d = pack.expert_blob_bytes(2)
    assert gu == cfg.n_ff_exp * quants.row_bytes(QT.IQ3_S, cfg.n_embd)
    assert d == cfg.n_embd * quants.row_bytes(QT.Q8_0, cfg.n_ff_exp)
    check_experts(pack, r, np.memmap(path, mode="r"), 3, [0, 63])
    # Q4_1 has 32-value blocks: no fallback
    path2 = make_pack(tmp_path / "small-q41.gguf", "small", expert_type="Q4_1", layers=1)
    check_reader(path2, cfg.replace(n_layer=1), "Q4_1")
    assert Pack.open(path2).fallbacks == []


@pytest.mark.parametrize("router", ["BF16", "Q8_0"])
def test_router_types(tmp_path, router):
    cfg = PRESETS["tiny"].replace(n_layer=1)
    path = make_pack(tmp_path / f"r-{router}.gguf", "tiny", layers=1, router_type=router)
    r = check_reader(path, cfg, "Q8_0", router=router)
    t = {x.name: x for x in r.tensors}
    m = Pack.open(path).layer(0).ffn_gate_inp
    assert m.qtype == QT[router]
    want = gq.dequantize(np.asarray(t["blk.0.ffn_gate_inp" + W].data), QT[router])
    assert np.array_equal(m.dequantize(), want.reshape(cfg.n_expert, cfg.n_embd))
    with pytest.raises(InputError, match="unsupported router type F16"):
        make_pack(tmp_path / "bad.gguf", "tiny", router_type="F16")


@pytest.mark.parametrize("preset,expert", [("qwen3-30b-a3b", "IQ3_XXS"), ("strata", "IQ2_XS")])
def test_big_presets_one_layer(tmp_path, preset, expert):
    """The real shapes with one layer (tied embeddings keep the files at 0.6 and 1.4 GB)."""
    cfg = PRESETS[preset].replace(n_layer=1)
    path = make_pack(tmp_path / f"{preset}.gguf", preset, layers=1, expert_type=expert,
                     tie_embeddings=True, progress=False)
    try:
        r = check_reader(path, cfg, expert, tied=True, router="BF16" if preset == "strata" else "F32")
        pack = Pack.open(path)
        c = pack.config
        assert (c.n_layer, c.n_embd, c.n_expert, c.n_expert_used, c.n_ff_exp, c.n_ff_shexp,
                c.n_vocab) == (1, cfg.n_embd, cfg.n_expert, cfg.n_expert_used, cfg.n_ff_exp,
                               cfg.n_ff_shexp, cfg.n_vocab)
        fell = cfg.n_ff_exp % 256 != 0
        assert c.expert_down_type == (QT.Q8_0 if fell else QT[expert])
        assert pack.fallbacks == (["blk.0.ffn_down_exps"] if fell else [])
        assert pack.tied_embeddings
        assert pack.output().data is pack.matrix("token_embd").data
        check_experts(pack, r, np.memmap(path, mode="r"), 0, [0, 1, cfg.n_expert // 2, cfg.n_expert - 1])
        lay = pack.layer(0)
        assert lay.has_shexp == (cfg.n_ff_shexp > 0)
        assert pack.embedding_rows([0, cfg.n_vocab - 1]).shape == (2, cfg.n_embd)
        # well-scaled weights
        down = quants.dequantize(lay.ffn_down_exps.qtype, lay.ffn_down_exps.data[5])
        assert 0.01 < down.std() < 0.06
        del pack, r
    finally:
        path.unlink()


def test_write_tiny_is_fast(tmp_path):
    make_pack(tmp_path / "warm.gguf", "tiny")
    t0 = time.perf_counter()
    make_pack(tmp_path / "t.gguf", "tiny", seed=5)
    assert time.perf_counter() - t0 < 1.0


# ---------------------------------------------------------------------------------------
# Determinism


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_deterministic(tmp_path, tiny_path):
    a = make_pack(tmp_path / "a.gguf", "tiny", workers=1)
    assert _digest(a) == _digest(tiny_path)  # same seed, other thread count: same bytes
    b = make_pack(tmp_path / "b.gguf", "tiny", seed=1)
    assert _digest(b) != _digest(a)
    ra, rb = GGUFReader(a), GGUFReader(b)
    for ta, tb in zip(ra.tensors, rb.tensors):
        assert ta.name == tb.name
        assert not np.array_equal(ta.data, tb.data), ta.name


def test_tensor_bytes_independent_of_file(tmp_path, tiny_path):
    """A tensor's bytes depend on (seed, name) only: not on the layer count, tying, or order."""
    one = make_pack(tmp_path / "one.gguf", "tiny", layers=1, tie_embeddings=True)
    full = {t.name: t for t in GGUFReader(tiny_path).tensors}
    for t in GGUFReader(one).tensors:
        assert np.array_equal(t.data, full[t.name].data), t.name


# ---------------------------------------------------------------------------------------
# Float dense types


@pytest.mark.parametrize("dense", ["F16", "BF16", "F32"])
def test_float_dense_kept_in_their_type(tmp_path, dense):
    """Float matrices are views of the file in their own type; decoded exactly (gguf's
    dequantize as the oracle)."""
    cfg = PRESETS["tiny"]
    path = make_pack(tmp_path / f"d-{dense}.gguf", "tiny", dense_type=dense, layers=1)
    r = check_reader(path, cfg.replace(n_layer=1), "Q8_0", dense=dense)
    t = {x.name: x for x in r.tensors}
    pack = Pack.open(path)
    assert pack.config.dense_type == QT[dense]
    for name in ("blk.0.attn_q", "blk.0.attn_output", "blk.0.ffn_down_shexp", "output", "token_embd"):
        vals = gq.dequantize(np.asarray(t[name + W].data), QT[dense]).reshape(-1, t[name + W].shape[0])
        m = pack.matrix(name)
        assert m.qtype == QT[dense] and m.is_float and (m.n_rows, m.n_cols) == vals.shape
        assert not m.data.flags.owndata, name
        got = m.dequantize()
        assert got.dtype == np.float32 and np.array_equal(got, vals), name
    emb = gq.dequantize(np.asarray(t["token_embd" + W].data), QT[dense]).reshape(cfg.n_vocab, -1)
    assert np.array_equal(pack.embedding_rows([3, 9]), emb[[3, 9]])
    lay = pack.layer(0)
    assert lay.attn_q.qtype == QT[dense]
    assert 0.02 < emb.std() and 0.3 < emb.std() < 0.8


# ---------------------------------------------------------------------------------------
# Broken packs


MICRO = ModelConfig(n_layer=1, n_embd=256, n_head=2, n_head_kv=1, head_dim=128, n_expert=4,
                    n_expert_used=2, n_ff_exp=256, n_ff_shexp=0, n_vocab=32)


def write_micro(path: Path, arch: str = "qwen3moe", drop: tuple[str, ...] = (),
                ne: dict[str, list[int]] | None = None, types: dict[str, QT] | None = None,
                drop_keys: tuple[str, ...] = (), old_names: bool = False) -> Path:
    """A small hand-made GGUF (random codes under finite scales: validation does not decode them).
    drop, ne and types take names without `.weight`; old_names writes them so."""
    cfg = MICRO
    rng = np.random.default_rng(0)
    w = GGUFWriter(path, arch)
    a = arch + "."
    keys = {"block_count": cfg.n_layer, "context_length": 128, "embedding_length": cfg.n_embd,
            "attention.head_count": cfg.n_head, "attention.head_count_kv": cfg.n_head_kv,
            "attention.key_length": cfg.head_dim, "expert_count": cfg.n_expert,
            "expert_used_count": cfg.n_expert_used, "expert_feed_forward_length": cfg.n_ff_exp}
    for k, v in keys.items():
        if a + k not in drop_keys:
            w.add_uint32(a + k, v)
    w.add_float32(a + "attention.layer_norm_rms_epsilon", 1e-6)
    w.add_float32(a + "rope.freq_base", 1e6)
    shapes = {**expected_ne(cfg), **{k + W: v for k, v in (ne or {}).items()}}
    for fname, shape in shapes.items():
        name = fname.removesuffix(W)
        if name in drop:
            continue
        qt = (types or {}).get(name, expected_type(name, QT.Q8_0, QT.Q8_0, QT.Q8_0))
        name = name if old_names else fname
        n = int(np.prod(shape))
        if qt == QT.F32:
            w.add_tensor(name, rng.standard_normal(tuple(reversed(shape))).astype(np.float32))
        else:
            vals, nbytes = gq.GGML_QUANT_SIZES[qt]
            byte_shape = (*reversed(shape[1:]), shape[0] // vals * nbytes)
            data = rng.integers(0, 256, byte_shape, dtype=np.uint8)
            fmt = qformats.lookup(qt)
            if fmt is not None:  # finite scales: a pack holding NaN is refused at open
                blocks = data.reshape(-1, nbytes)
                fmt.set_scales(blocks, np.full(blocks.shape[0], 0.01, np.float32))
            w.add_tensor(name, data, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def assert_cli_error(path: Path, capsys, *needles: str) -> None:
    capsys.readouterr()
    assert cli(["info", str(path)]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("strata-prefill: error: ")
    assert "Traceback" not in err
    for n in needles:
        assert n in lines[0], (n, lines[0])


def test_micro_pack_is_valid(tmp_path):
    pack = Pack.open(write_micro(tmp_path / "ok.gguf"))
    assert pack.config.n_vocab == MICRO.n_vocab and pack.tied_embeddings is False
    pack.layer(0)


def test_old_spelling_refused(tmp_path, capsys):
    """A pack written before the names carried `.weight` is refused with one line."""
    path = write_micro(tmp_path / "old.gguf", old_names=True)
    with pytest.raises(PackError) as ei:
        Pack.open(path)
    msg = str(ei.value)
    assert "\n" not in msg and "token_embd.weight" in msg
    assert "remake it with `strata-prefill make-pack`" in msg
    assert_cli_error(path, capsys, "old pack", "remake it with `strata-prefill make-pack`")


def test_missing_file(tmp_path, capsys):
    path = tmp_path / "nope.gguf"
    with pytest.raises(PackError, match="not found"):
        Pack.open(path)
    assert_cli_error(path, capsys, "not found", "nope.gguf")


def test_not_gguf(tmp_path, capsys):
    path = tmp_path / "junk.gguf"
    path.write_bytes(b"this is not a model\n" * 10)
    with pytest.raises(PackError, match="not a GGUF file"):
        Pack.open(path)
    assert_cli_error(path, capsys, "not a GGUF file")
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    assert_cli_error(empty, capsys, "not a GGUF file")


@pytest.mark.parametrize("where", ["data", "last-byte", "header"])
def test_truncated(tmp_path, tiny_path, capsys, where):
    data = tiny_path.read_bytes()
    r = GGUFReader(tiny_path)
    last = max(r.tensors, key=lambda t: t.data_offset)
    cut = {"data": len(data) // 2, "last-byte": last.data_offset + last.n_bytes - 1,
           "header": 2000}[where]
    path = tmp_path / f"cut-{where}.gguf"
    path.write_bytes(data[:cut])
    with pytest.raises(PackError) as ei:
        Pack.open(path)
    msg = str(ei.value)
    assert "\n" not in msg
    assert "truncated" in msg
    if where != "header":
        assert "tensor " in msg and f"{cut} bytes" in msg
    if where == "last-byte":
        assert last.name in msg
    assert_cli_error(path, capsys, "truncated")


def test_wrong_architecture(tmp_path, capsys):
    path = write_micro(tmp_path / "llama.gguf", arch="llama")
    with pytest.raises(PackError, match="expected qwen3moe or gpt-oss, got llama"):
        Pack.open(path)
    assert_cli_error(path, capsys, "expected qwen3moe or gpt-oss, got llama")


def test_missing_metadata(tmp_path, capsys):
    path = write_micro(tmp_path / "nokey.gguf", drop_keys=("qwen3moe.expert_count",))
    assert_cli_error(path, capsys, "missing metadata key qwen3moe.expert_count")


@pytest.mark.parametrize("name", ["blk.0.ffn_up_exps", "blk.0.attn_k_norm", "output_norm"])
def test_missing_tensor(tmp_path, capsys, name):
    path = write_micro(tmp_path / "missing.gguf", drop=(name,))
    with pytest.raises(PackError, match=f"missing tensor {name}"):
        Pack.open(path)
    assert_cli_error(path, capsys, f"missing tensor {name}")


def test_wrong_shape(tmp_path, capsys):
    path = write_micro(tmp_path / "shape.gguf", ne={"blk.0.ffn_down_exps": [256, 256, 3]})
    with pytest.raises(PackError) as ei:
        Pack.open(path)
    msg = str(ei.value)
    assert "blk.0.ffn_down_exps" in msg and "[256, 256, 4]" in msg and "[256, 256, 3]" in msg
    assert_cli_error(path, capsys, "blk.0.ffn_down_exps", "wrong shape", "expected [256, 256, 4]",
                     "got [256, 256, 3]")
    path = write_micro(tmp_path / "shape2.gguf", ne={"blk.0.attn_q": [256, 128]})
    assert_cli_error(path, capsys, "blk.0.attn_q", "expected [256, 256]", "got [256, 128]")


def test_unsupported_type(tmp_path, capsys):
    path = write_micro(tmp_path / "tq2_0.gguf", types={"blk.0.ffn_gate_exps": QT.TQ2_0,
                                                         "blk.0.ffn_up_exps": QT.TQ2_0})
    with pytest.raises(PackError) as ei:
        Pack.open(path)
    msg = str(ei.value)
    assert "blk.0.ffn_gate_exps" in msg and "TQ2_0" in msg
    for t in EXPERT_TYPES:
        assert t in msg
    assert_cli_error(path, capsys, "unsupported types (TQ2_0: blk.0.ffn_gate_exps.weight, "
                     "blk.0.ffn_up_exps.weight)", "IQ2_XS")
    # a float expert tensor opens (multiplied in float32, docs/numerics.md section 6)
    path = write_micro(tmp_path / "f32x.gguf", types={"blk.0.ffn_down_exps": QT.F32})
    assert Pack.open(path).expert_types(0)[1] == QT.F32
    # a quantized norm
    path = write_micro(tmp_path / "qnorm.gguf", types={"blk.0.attn_norm": QT.Q8_0})
    assert_cli_error(path, capsys, "unsupported types (Q8_0: blk.0.attn_norm.weight)",
                     "norms and vectors F32")


def test_corrupt_header(tmp_path, tiny_path, capsys):
    data = bytearray(tiny_path.read_bytes())
    data[8:16] = (2**40).to_bytes(8, "little")  # absurd tensor count
    path = tmp_path / "corrupt.gguf"
    path.write_bytes(bytes(data))
    with pytest.raises(PackError):
        Pack.open(path)
    assert_cli_error(path, capsys, "corrupt.gguf")


# ---------------------------------------------------------------------------------------
# CLI: make-pack and info


def test_cli_make_pack_and_info(tmp_path, capsys):
    out = tmp_path / "cli.gguf"
    assert cli(["make-pack", "--preset", "small", "--layers", "2", "--expert-type", "Q2_K",
                "--seed", "3", "--no-progress", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    ref = make_pack(tmp_path / "ref.gguf", "small", layers=2, expert_type="Q2_K", seed=3)
    assert _digest(out) == _digest(ref)
    assert cli(["info", str(out)]) == 0
    text = capsys.readouterr().out
    pack = Pack.open(out)
    gu, d = pack.expert_blob_bytes(0)
    for needle in ("qwen3moe", "layers:         2", "hidden:         512", "64, top-8",
                   "expert ff 384", "gate/up Q2_K", "down Q8_0", "dense Q8_0", "router F32",
                   f"gate {gu:,} + up {gu:,} + down {d:,} = {2 * gu + d:,} bytes",
                   f"{out.stat().st_size:,} bytes", "shared expert:  no",
                   "fallbacks:      Q2_K -> Q8_0: ffn_down_exps in 2 layers", "384 values"):
        assert needle in text, needle


def test_cli_info_tiny(tiny_path, capsys):
    assert cli(["info", str(tiny_path)]) == 0
    text = capsys.readouterr().out
    for needle in ("qwen3moe", "layers:         2", "hidden:         256", "16, top-4",
                   "heads:          4 (kv 2), head_dim 64", "vocab:          512",
                   "shared expert:  yes (ff 256)", "gate 69,632 + up 69,632 + down 69,632 = 208,896",
                   "fallbacks:      none", f"{tiny_path.stat().st_size:,} bytes"):
        assert needle in text, needle


def test_cli_make_pack_bad_args(tmp_path, capsys):
    assert cli(["make-pack", "--expert-type", "TQ2_0", str(tmp_path / "x.gguf")]) == 2
    assert cli(["make-pack", "--layers", "0", str(tmp_path / "x.gguf")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2
    assert err[0].startswith("strata-prefill: error: make-pack: argument --expert-type")
    assert err[1].startswith("strata-prefill: error: make-pack: argument --layers")
    assert not (tmp_path / "x.gguf").exists() and not (tmp_path / "x.gguf.tmp").exists()


# ---------------------------------------------------------------------------------------
# The tensor table against the data (formats/pack.py:_layout_problems): refused at open


def _table(path: Path) -> dict:
    """file tensor name -> (offset of its type id, offset of its data offset) in the header,
    read with gguf-py (the entry's last two fields)."""
    r = GGUFReader(path)
    return {t.name: (int(t.field.offset) + 8 + len(t.name.encode()) + 4 + 8 * len(t.shape),
                     int(t.field.offset) + 8 + len(t.name.encode()) + 4 + 8 * len(t.shape) + 4)
            for t in r.tensors}


def _edited(tiny_path: Path, folder: Path, name: str, at: str, value: int, size: int) -> Path:
    data = bytearray(tiny_path.read_bytes())
    where = _table(tiny_path)[name][0 if at == "type" else 1]
    data[where:where + size] = value.to_bytes(size, "little")
    out = folder / f"{name}-{at}-{value}.gguf"
    out.write_bytes(bytes(data))
    return out


def _data_offset(tiny_path: Path, name: str) -> int:
    r = GGUFReader(tiny_path)
    return next(int(t.data_offset) - int(r.data_offset) for t in r.tensors if t.name == name)


@pytest.mark.parametrize("case", ["type into the next", "same offset as another", "off the alignment",
                                  "a gap", "out of order", "past the file"])
def test_a_table_that_does_not_describe_the_data_is_refused(tmp_path, tiny_path, capsys, monkeypatch, case):
    """Each in one line naming the tensors, by `run` before any session and by `info`."""
    import strata_prefill.session
    from strata_prefill.cli import main

    q, k = "blk.0.attn_q.weight", "blk.0.attn_k.weight"
    q_at, k_at = _data_offset(tiny_path, q), _data_offset(tiny_path, k)
    edit, needle = {
        # F16 takes 2 bytes a value where Q8_0 takes 34 per 32: attn_q's bytes run into attn_k's
        "type into the next": ((q, "type", int(QT.F16), 4),
                               f"tensor {q} (data bytes {q_at:,} to {q_at + 256 * 256 * 2:,}) overlaps tensor {k}"),
        "same offset as another": ((k, "offset", q_at, 8), f"tensor {k} (data bytes {q_at:,} to {q_at + 34816:,}) overlaps "
                                                           f"tensor {q} (from byte {q_at:,})"),
        "off the alignment": ((k, "offset", k_at + 4, 8), f"tensor {k} starts at data byte {k_at + 4:,}, "
                                                          "not a multiple of the alignment (32)"),
        "a gap": ((k, "offset", k_at + 64, 8), f"a gap of 64 bytes after tensor {q}'s end (padded), before "
                                               f"tensor {k}"),
        "out of order": ((q, "offset", 0, 8), "overlaps"),
        "past the file": ((k, "offset", 2**40, 8), f"tensor {k} ends at byte "),
    }[case]
    path = _edited(tiny_path, tmp_path, *edit)
    before = path.read_bytes()
    monkeypatch.setattr(strata_prefill.session.Session, "__init__", lambda *a, **kw: pytest.fail("work started"))
    assert main(["run", "--pack", str(path), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"strata-prefill: error: {path}: its tensor table does not "
                                               "describe its data: "), err
    assert needle in err[0], err[0]
    assert_cli_error(path, capsys, needle)
    assert path.read_bytes() == before


def test_the_layout_rule_against_hand_made_spans():
    from strata_prefill.formats.pack import _layout_problems as problems

    assert problems([("a", 0, 10), ("b", 32, 40), ("c", 64, 64)], 32) == []  # padding, an empty tensor
    assert problems([("a", 0, 40), ("b", 32, 40)], 32) == ["tensor a (data bytes 0 to 40) overlaps tensor b "
                                                           "(from byte 32)"]
    assert problems([("a", 32, 40)], 32)[0].startswith("a gap of 32 bytes at the start of the data")
    got = problems([("a", 64, 70), ("b", 0, 10)], 32)
    assert len(got) == 2 and "tensor b lies before tensor a's end, listed before it" in got[1]
    many = problems([(f"t{i}", 33 * i + 1, 33 * i + 2) for i in range(8)], 32)
    assert len(many) == 4 and many[-1] == "5 more"  # three named, the rest counted


def test_names_the_format_forbids_are_refused(tmp_path, tiny_path, capsys):
    """A duplicate tensor name, one that is not UTF-8, and one no qwen3moe pack holds (a renamed
    output.weight would otherwise make a pack of tied embeddings)."""
    data = tiny_path.read_bytes()
    for old, new, needle in (
            (b"blk.0.attn_q.weight", b"blk.0.attn_k.weight", "tensor name blk.0.attn_k.weight appears twice"),
            (b"blk.0.attn_q.weight", b"blk.0.attn_q.weigh\xff", "a metadata key or tensor name is not UTF-8 text: "
                                                          "b'blk.0.attn_q.weigh\\xff'"),
            (b"\x0d\0\0\0\0\0\0\0output.weight", b"\x0d\0\0\0\0\0\0\0outpux.weight",  # its length first
             "1 tensor a qwen3moe pack does not hold (outpux.weight;")):
        assert data.count(old) == 1
        path = tmp_path / "renamed.gguf"
        path.write_bytes(data.replace(old, new))
        assert_cli_error(path, capsys, needle)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 3000), st.integers(1, 300), st.integers(0, 2**32 - 1))
def test_rows_in_parts_are_one_call(n, per_thread, seed):
    """A long prompt's embedding rows are dequantized in parts on threads (formats/pack.py
    _rows_in_parts): the same bytes, in the same order, as one call over every id."""
    import strata_prefill.formats.pack as pack_module

    rng = np.random.default_rng(seed)
    table = rng.standard_normal((97, 5)).astype(np.float32)
    ids = rng.integers(0, 97, n)
    calls = []

    def rows(part):
        calls.append(len(part))
        return table[part] * np.float32(3.0)

    old = pack_module.EMBED_ROWS_PER_THREAD
    pack_module.EMBED_ROWS_PER_THREAD = per_thread
    try:
        got = pack_module._rows_in_parts(ids, rows)
    finally:
        pack_module.EMBED_ROWS_PER_THREAD = old
    assert got.tobytes() == (table[ids] * np.float32(3.0)).tobytes()
    assert sum(calls) == n and (len(calls) == 1 or min(calls) >= per_thread)
