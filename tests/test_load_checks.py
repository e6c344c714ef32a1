"""Every value a pack's metadata gives is checked when the pack is opened, before any work: a
well-formed qwen3moe file this project cannot run (head counts that do not divide, a head size
off the attention blocks, a layer count the tensors contradict, a norm epsilon or RoPE base that
is not a positive number, expert counts out of range, a vocabulary token_embd contradicts) is
refused by `info` and by `run` in one line naming the key, its value and the limit, exit 2.

The packs are written here with gguf-py's GGUFWriter, tensors shaped as the (edited) config
implies, so each refusal is the metadata's own and not a shape check's."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as QT
from gguf import GGUFValueType as VT
from gguf import GGUFWriter

from strata_prefill.contract import limits, qformats, quants
from strata_prefill.formats.config import PRESETS, ModelConfig
from strata_prefill.contract.errors import PackError
from strata_prefill.cli import main

ROOT = Path(__file__).resolve().parent.parent
TINY = PRESETS["tiny"]  # 2 layers, 4 heads (kv 2) of 64, 16 experts top-4, vocabulary 512
A = "qwen3moe."


def tensor_shapes(cfg: ModelConfig, n_layer: int) -> dict[str, list[int]]:
    """file name -> ggml ne (fastest first) of every tensor of a tied-free pack of cfg with
    n_layer blocks (written independently of strata_prefill.formats.pack)."""
    D, E, F, S, V = cfg.n_embd, cfg.n_expert, cfg.n_ff_exp, cfg.n_ff_shexp, cfg.n_vocab
    q, kv, hd = cfg.n_head * cfg.head_dim, cfg.n_head_kv * cfg.head_dim, cfg.head_dim
    ne = {"token_embd": [D, V], "output_norm": [D], "output": [D, V]}
    for l in range(n_layer):
        p = f"blk.{l}."
        ne.update({p + "attn_norm": [D], p + "attn_q": [D, q], p + "attn_k": [D, kv],
                   p + "attn_v": [D, kv], p + "attn_output": [q, D], p + "attn_q_norm": [hd],
                   p + "attn_k_norm": [hd], p + "ffn_norm": [D], p + "ffn_gate_inp": [D, E],
                   p + "ffn_gate_exps": [D, F, E], p + "ffn_up_exps": [D, F, E],
                   p + "ffn_down_exps": [F, D, E], p + "ffn_gate_inp_shexp": [D],
                   p + "ffn_gate_shexp": [D, S], p + "ffn_up_shexp": [D, S],
                   p + "ffn_down_shexp": [S, D]})
    return {k + ".weight": v for k, v in ne.items()}


def q8_0(ne: list[int], rng: np.random.Generator) -> np.ndarray:
    """Random Q8_0 blocks (finite f16 scales, rows of about unit norm): uint8 [..., row bytes]."""
    n_cols, outer = ne[0], tuple(reversed(ne[1:]))
    nb = n_cols // 32
    scale = np.float16(1.0 / (127 * np.sqrt(n_cols / 3)))
    blocks = np.empty((*outer, nb, 34), np.uint8)
    blocks[..., :2] = np.frombuffer(scale.tobytes(), np.uint8)
    blocks[..., 2:] = rng.integers(-127, 128, (*outer, nb, 32), dtype=np.int8).view(np.uint8)
    return blocks.reshape(*outer, nb * 34)


def metadata(cfg: ModelConfig) -> dict[str, tuple[object, VT]]:
    """key -> (value, GGUF type): the metadata llama.cpp's converters write for cfg."""
    u32 = {"block_count": cfg.n_layer, "context_length": cfg.context_length,
           "embedding_length": cfg.n_embd, "attention.head_count": cfg.n_head,
           "attention.head_count_kv": cfg.n_head_kv, "attention.key_length": cfg.head_dim,
           "attention.value_length": cfg.head_dim, "expert_count": cfg.n_expert,
           "expert_used_count": cfg.n_expert_used, "expert_feed_forward_length": cfg.n_ff_exp,
           "expert_shared_feed_forward_length": cfg.n_ff_shexp, "vocab_size": cfg.n_vocab}
    md = {A + k: (v, VT.UINT32) for k, v in u32.items()}
    md[A + "attention.layer_norm_rms_epsilon"] = (cfg.rms_eps, VT.FLOAT32)
    md[A + "rope.freq_base"] = (cfg.rope_base, VT.FLOAT32)
    return md


def write_pack(path: Path, cfg: ModelConfig = TINY, n_layer: int | None = None,
               edits: dict | None = None, types: dict | None = None) -> Path:
    """A pack of cfg's tensors (n_layer blocks, default cfg's), its metadata that of cfg with
    `edits` (key -> (value, type), or None to leave the key out) applied; `types` (file name
    -> GGML type) writes those tensors as random codes of that type (finite scales) instead."""
    rng = np.random.default_rng(24)
    md = {**metadata(cfg), **(edits or {})}
    w = GGUFWriter(path, "qwen3moe")
    for key, spec in md.items():
        if spec is None:
            continue
        value, vtype = spec
        if vtype == VT.ARRAY:
            w.add_array(key, value)
        else:
            w.add_key_value(key, value, vtype)
    for name, ne in tensor_shapes(cfg, cfg.n_layer if n_layer is None else n_layer).items():
        if name in (types or {}):
            vals, nbytes = GGML_QUANT_SIZES[types[name]]
            raw = rng.integers(0, 256, (*reversed(ne[1:]), ne[0] // vals * nbytes), dtype=np.uint8)
            fmt = qformats.lookup(types[name])
            if fmt is not None:  # finite scales: a pack holding NaN is refused at open
                blocks = raw.reshape(-1, nbytes)
                fmt.set_scales(blocks, np.full(blocks.shape[0], 0.01, np.float32))
            w.add_tensor(name, raw, raw_dtype=types[name])
        elif len(ne) == 1 or ".ffn_gate_inp." in name:  # norms and the router: F32
            values = rng.standard_normal(tuple(reversed(ne))).astype(np.float32)
            w.add_tensor(name, values * np.float32(0.1) + np.float32(1.0 if len(ne) == 1 else 0.0))
        else:
            w.add_tensor(name, q8_0(ne, rng), raw_dtype=QT.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# id -> (write_pack keyword arguments, texts the one line must hold: the key, the value, ...)
EPS, BASE = A + "attention.layer_norm_rms_epsilon", A + "rope.freq_base"
BAD = {
    "head_count_kv 3 of 4": (dict(cfg=TINY.replace(n_head_kv=3)),
                             [A + "attention.head_count_kv 3", "does not divide",
                              A + "attention.head_count 4"]),
    "head size 48": (dict(cfg=TINY.replace(head_dim=48)),
                     [A + "attention.key_length", " 48", "multiple of 32"]),
    "head size 0": (dict(edits={A + "attention.key_length": (0, VT.UINT32),
                                A + "attention.value_length": None}),
                    [A + "attention.key_length", " 0", "multiple of 32"]),
    "value_length 32 of 64": (dict(edits={A + "attention.value_length": (32, VT.UINT32)}),
                              [A + "attention.value_length 32", A + "attention.key_length 64"]),
    "block_count 1 on 2 layers": (dict(edits={A + "block_count": (1, VT.UINT32)}),
                                  [A + "block_count 1", "holds 2 layers (blk.0 to blk.1)"]),
    "block_count 3 on 2 layers": (dict(edits={A + "block_count": (3, VT.UINT32)}),
                                  [A + "block_count 3", "holds 2 layers"]),
    "block_count 0": (dict(edits={A + "block_count": (0, VT.UINT32)}),
                      [A + "block_count 0", "at least 1"]),
    "block_count a float": (dict(edits={A + "block_count": (2.0, VT.FLOAT32)}),
                            [A + "block_count", "must be an integer", "2.0"]),
    "rms_epsilon -1": (dict(edits={EPS: (-1.0, VT.FLOAT32)}), [EPS + " -1.0", "finite number > 0"]),
    "rms_epsilon NaN": (dict(edits={EPS: (float("nan"), VT.FLOAT32)}), [EPS + " nan", "finite"]),
    "rms_epsilon 0": (dict(edits={EPS: (0.0, VT.FLOAT32)}), [EPS + " 0.0", "> 0"]),
    "freq_base 0": (dict(edits={BASE: (0.0, VT.FLOAT32)}), [BASE + " 0.0", "finite number > 0"]),
    "freq_base inf": (dict(edits={BASE: (float("inf"), VT.FLOAT32)}), [BASE + " inf", "finite"]),
    "expert_used_count 0": (dict(edits={A + "expert_used_count": (0, VT.UINT32)}),
                            [A + "expert_used_count 0", f"[1, {A}expert_count 16]"]),
    "expert_used_count 17 of 16": (dict(cfg=TINY.replace(n_expert_used=17)),
                                   [A + "expert_used_count 17", f"[1, {A}expert_count 16]"]),
    "vocab_size 600, 512 rows": (dict(edits={A + "vocab_size": (600, VT.UINT32)}),
                                 [A + "vocab_size 600", "token_embd.weight has 512 rows"]),
    "token list 500, 512 rows": (dict(edits={A + "vocab_size": None,
                                             "tokenizer.ggml.tokens": ([f"t{i}" for i in range(500)],
                                                                       VT.ARRAY)}),
                                 ["tokenizer.ggml.tokens 500", "token_embd.weight has 512 rows"]),
    "context_length 0": (dict(edits={A + "context_length": (0, VT.UINT32)}),
                         [A + "context_length 0", "at least 1"]),
    "epsilon and base at once": (dict(edits={EPS: (-1.0, VT.FLOAT32), BASE: (0.0, VT.FLOAT32)}),
                                 [EPS + " -1.0: must be a finite number > 0; " + BASE + " 0.0"]),
}


@pytest.fixture(scope="module")
def packs(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("load-checks")
    out = {"good": write_pack(d / "good.gguf")}
    for i, (name, (kw, _)) in enumerate(BAD.items()):
        out[name] = write_pack(d / f"bad{i}.gguf", **kw)
    return out


def commands(path: Path) -> dict[str, list[str]]:
    # a run with real work in it: 64 tokens and 4 greedy ones, so the refusal cannot be late
    return {"info": ["info", str(path)],
            "run": ["run", "--pack", str(path), "--prompt-tokens", "64", "--greedy", "4",
                    "--no-progress"]}


def test_the_writer_makes_packs_that_run(packs, capsys):
    """The control: the unedited pack of the same writer opens and runs, so every refusal
    below is its edit's."""
    for args in commands(packs["good"]).values():
        assert main(args) == 0
    out = capsys.readouterr().out
    assert "layers:         2" in out and "next " in out


ROWS = [(name, cmd) for name in BAD for cmd in ("info", "run")]


@pytest.mark.parametrize("name, cmd", ROWS, ids=[f"{c}: {n}" for n, c in ROWS])
def test_bad_metadata_is_refused_in_one_line(packs, tmp_path, name, cmd):
    path = packs[name]
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-m", "strata_prefill", *commands(path)[cmd]],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    err = proc.stderr.splitlines()
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "Warning" not in proc.stderr
    assert len(err) == 1, proc.stderr
    assert err[0].startswith(f"strata-prefill: error: {path}: "), err[0]
    for needle in BAD[name][1]:
        assert needle in err[0], (needle, err[0])
    assert proc.stdout == ""  # nothing was described or run
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before


@pytest.mark.parametrize("name", list(BAD))
def test_bad_metadata_is_refused_before_any_work(packs, monkeypatch, capsys, name):
    """In the process: `run` refuses before an engine or a session is made, under a second."""
    import strata_prefill.session

    def no_work(*a, **k):
        raise AssertionError("the run started work on a pack it should have refused")

    monkeypatch.setattr(strata_prefill.session.Session, "__init__", no_work)
    t0 = time.perf_counter()
    assert main(commands(packs[name])["run"]) == 2
    assert time.perf_counter() - t0 < 1.0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and BAD[name][1][0] in err


def test_every_problem_is_one_phrase_of_the_config():
    """ModelConfig.problems() is the one list: the presets have none, each bad value one."""
    for cfg in PRESETS.values():
        assert cfg.problems() == []
    bad = TINY.replace(n_head_kv=3, head_dim=40, n_expert_used=0, rms_eps=float("nan"),
                       rope_base=float("-inf"), context_length=0)
    problems = bad.problems()
    assert len(problems) == 6 and all(A in p for p in problems)
    with pytest.raises(PackError) as ei:
        ModelConfig.from_metadata({"general.architecture": "qwen3moe",
                                   **{k: v for k, (v, _) in metadata(bad).items()}})
    assert str(ei.value) == "; ".join(problems)


def test_the_cuda_limits_are_the_kernels():
    """contract/limits.py's CUDA numbers are those of fast/cuda's wrappers (which contract/ cannot
    import), and cuda_problems() names what only the kernels refuse."""
    from strata_prefill.fast.cuda import attention, elementwise

    assert limits.CUDA_HEAD_DIMS == attention.ATTEND_HEAD_DIMS
    src = (ROOT / "fast/cuda/elementwise.py").read_text()
    assert f"min({limits.CUDA_TOP_K_MAX}, E" in src and "smem = 4 * 4 * E" in src
    assert "smem > 48 * 1024" in src and elementwise.top_k.__doc__.count("k <= 32")
    assert TINY.cuda_problems() == [] and PRESETS["strata"].cuda_problems() == []
    cfg = TINY.replace(head_dim=96, n_expert=4096, n_expert_used=33)
    assert cfg.problems() == []  # the reference runs it
    lines = cfg.cuda_problems()
    assert len(lines) == 3 and "96" in lines[0] and "64 and 128" in lines[0]
    assert "33" in lines[1] and "4096" in lines[2] and "3072" in lines[2]


def test_a_pack_the_kernels_cannot_run_is_refused_before_the_backend(tmp_path):
    """A head size of 96 runs on the reference and the sim, not on the CUDA kernels: the fast
    path's cuda backend refuses it in one line naming the key, before it looks for a GPU (so
    the refusal is the same on a machine without one)."""
    from strata_prefill.fast import make_fast_engine
    from strata_prefill.contract.errors import PackError
    from strata_prefill.formats.pack import Pack

    cfg = TINY.replace(head_dim=96)
    pack = Pack.open(write_pack(tmp_path / "hd96.gguf", cfg))
    with pytest.raises(PackError) as err:
        make_fast_engine(pack, "cuda")
    msg = str(err.value)
    assert "cuda backend cannot run this pack" in msg and "96" in msg and "\n" not in msg
    make_fast_engine(pack, "sim")  # the sim runs it


# Tensors of types the loader does not read (gguf knows them all) and two bad keys, in one file.
UNREAD = {"blk.0.attn_q.weight": QT.TQ1_0, "blk.1.attn_q.weight": QT.TQ1_0,
          **{f"blk.{l}.ffn_{m}_exps.weight": QT.TQ2_0 for l in (0, 1) for m in ("gate", "up")},
          "blk.1.attn_norm.weight": QT.Q8_0}


def test_every_unsupported_tensor_and_key_in_one_refusal(tmp_path):
    """One refusal, every reason: each tensor of an unsupported type, grouped by type (a block
    tensor's layers folded), with the types each kind takes, beside every bad key."""
    path = write_pack(tmp_path / "many.gguf", types=UNREAD,
                      edits={EPS: (-1.0, VT.FLOAT32), BASE: (0.0, VT.FLOAT32)})
    with pytest.raises(PackError) as err:
        from strata_prefill.formats.pack import Pack

        Pack.open(path)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"{path}: ")
    for needle in (EPS + " -1.0: must be a finite number > 0", BASE + " 0.0",
                   "7 tensors of unsupported types (TQ1_0: blk.{0,1}.attn_q.weight; "
                   "TQ2_0: blk.{0,1}.ffn_gate_exps.weight, blk.{0,1}.ffn_up_exps.weight; "
                   "Q8_0: blk.1.attn_norm.weight)",
                   "supported: matrices Q8_0, Q4_1, Q2_K", "norms and vectors F32, F16, BF16"):
        assert needle in msg, (needle, msg)
    # the same in one line on the command line, nothing run
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-m", "strata_prefill", "info", str(path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [f"strata-prefill: error: {msg}"]


def test_sound_metadata_every_tensor_problem_in_one_refusal(tmp_path):
    """With the metadata sound: missing tensors, the tensors no qwen3moe pack holds and the
    unsupported types, all in one message."""
    from strata_prefill.formats.pack import Pack

    path = write_pack(tmp_path / "t.gguf", types={"blk.0.ffn_down_exps.weight": QT.TQ2_0})
    data = path.read_bytes()
    # rename two tensors so the pack lacks them (the same length keeps every offset)
    for old, new in ((b"blk.1.attn_k.weight", b"blk.1.attn_x.weight"), (b"blk.0.attn_k.weight", b"blk.0.attn_x.weight")):
        assert data.count(old) == 1
        data = data.replace(old, new)
    path.write_bytes(data)
    with pytest.raises(PackError) as err:
        Pack.open(path)
    msg = str(err.value)
    assert msg.startswith(f"{path}: missing tensors blk.{{0,1}}.attn_k.weight; ")
    assert "; 2 tensors a qwen3moe pack does not hold (blk.0.attn_x.weight, blk.1.attn_x.weight; " in msg
    assert msg.endswith("1 tensor of unsupported types (TQ2_0: blk.0.ffn_down_exps.weight); supported: matrices "
                        + ", ".join(t.name for t in (*quants.SUPPORTED_TYPES, QT.F32, QT.F16, QT.BF16)))


def test_folded_names():
    from strata_prefill.formats.pack import by_type, folded

    assert folded(["token_embd", "blk.3.attn_v"]) == "token_embd.weight, blk.3.attn_v.weight"
    layers = [0, 2, 5, 6, 7, 8, 9, 11, 12]
    assert folded([f"blk.{l}.attn_v" for l in layers]) == "blk.{0,2,5..9,11,12}.attn_v.weight"
    assert folded([f"blk.{l}.x" for l in range(48)][::-1]) == "blk.{0..47}.x.weight"
    assert by_type([("output", "Q6_K"), ("blk.0.attn_v", "Q3_K"), ("blk.1.attn_v", "Q3_K"),
                    ("blk.1.ffn_down_exps", "Q6_K")]) == (
        "Q6_K: output.weight, blk.1.ffn_down_exps.weight; Q3_K: blk.{0,1}.attn_v.weight")


def test_cuda_refuses_a_type_without_a_kernel_before_the_backend(tmp_path, monkeypatch):
    """A matrix of a type with no CUDA MMQ kernel runs on the reference and the sim; the cuda
    backend refuses the pack in one line naming the tensors and their types, before it looks
    for a GPU. An untied token_embd of such a type is only looked up: not named. (Every
    registered type has a kernel now: three are made kernel-less here.)"""
    from strata_prefill.fast import make_fast_engine
    from strata_prefill.contract import qformats
    from strata_prefill.formats.pack import Pack

    for qt in (QT.Q6_K, QT.Q3_K, QT.Q5_K):
        monkeypatch.setattr(qformats.lookup(qt), "mmq_kernel", None)

    types = {"token_embd.weight": QT.Q6_K, "blk.0.attn_v.weight": QT.Q3_K, "blk.1.attn_v.weight": QT.Q3_K,
             "blk.1.ffn_down_exps.weight": QT.Q5_K}
    pack = Pack.open(write_pack(tmp_path / "k.gguf", types=types))
    with pytest.raises(PackError) as err:
        make_fast_engine(pack, "cuda")
    msg = str(err.value)
    assert "\n" not in msg and "the cuda backend cannot run this pack" in msg
    assert "no CUDA MMQ kernel decodes Q3_K: blk.{0,1}.attn_v.weight; Q5_K: blk.1.ffn_down_exps.weight" in msg
    assert "token_embd" not in msg
    make_fast_engine(pack, "sim")  # the sim runs it


def test_every_tensor_of_broken_blocks_in_one_refusal(tmp_path):
    """Rows that are not whole blocks of their type (a broken writer: the file's sizes cannot
    even be read as blocks) are named all at once, before the metadata is looked at."""
    import struct

    from strata_prefill.formats.pack import Pack

    path = tmp_path / "rows.gguf"
    w = GGUFWriter(path, "qwen3moe")
    names = {"blk.0.attn_q.weight": QT.Q4_K, "blk.1.attn_v.weight": QT.Q6_K, "output.weight": QT.Q8_0}
    for name, qt in names.items():  # 2 rows of 256 values (gguf-py writes whole blocks only)
        vals, nbytes = GGML_QUANT_SIZES[qt]
        w.add_tensor(name, np.zeros((2, 256 * nbytes // vals), np.uint8), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    # the K-quants' tensor infos made 4 rows of 128 values: the same bytes, half blocks
    data = bytearray(path.read_bytes())
    for name in ("blk.0.attn_q.weight", "blk.1.attn_v.weight"):
        tag = struct.pack("<Q", len(name)) + name.encode()
        at = data.index(tag) + len(tag)
        assert struct.unpack_from("<IQQ", data, at) == (2, 256, 2)
        struct.pack_into("<IQQ", data, at, 2, 128, 4)
    path.write_bytes(bytes(data))
    with pytest.raises(PackError) as err:
        Pack.open(path)
    assert str(err.value) == (
        "tensor blk.0.attn_q.weight (Q4_K): rows of 128 values are not a multiple of the Q4_K "
        "block size (256); tensor blk.1.attn_v.weight (Q6_K): rows of 128 values are not a "
        "multiple of the Q6_K block size (256)")


def test_every_missing_or_malformed_key_in_one_refusal(tmp_path):
    """Keys the loader cannot read at all (missing, of the wrong kind, a rope scaling it does
    not support, a key it would ignore) are named together, before any value is judged."""
    from strata_prefill.formats.pack import Pack

    path = write_pack(tmp_path / "keys.gguf", edits={
        A + "expert_count": None, A + "block_count": (2.5, VT.FLOAT32), A + "rope.scaling.type": ("longrope", VT.STRING),
        A + "rope.scaling.yarn_ext_factor": (0.5, VT.FLOAT32), EPS: (-1.0, VT.FLOAT32)})
    with pytest.raises(PackError) as err:
        Pack.open(path)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"{path}: ")
    for needle in ("missing metadata key qwen3moe.expert_count", "metadata key qwen3moe.block_count must be an integer",
                   "qwen3moe.rope.scaling.type 'longrope' is not supported", "yarn_ext_factor 0.5"):
        assert needle in msg, (needle, msg)
    assert msg.count("; ") >= 2
    assert "layer_norm_rms_epsilon" not in msg  # a value's range is judged once every key was read
