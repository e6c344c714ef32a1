"""The independent check of gpt-oss: a random transformers GptOssForCausalLM of the gpt-oss-tiny
preset's shape (formats/archs/gpt_oss.py: hf_config), saved and converted by llama.cpp's own
converter (convert_hf_to_gguf.py from llama.cpp's tarball in shared/peers, with the gguf-py
beside it, --outtype f32), must give a GGUF whose tensor names, shapes and types and whose
architecture keys are the table's; our Pack opens it; and the reference prefill of a prompt on
it gives, at every position, the logits of transformers' float64 forward of the same model
(model.double(), eager attention: the sinks' softmax) within a relative L2 distance of
LOGITS_REL_L2.

The weights are the same on both sides: F32 in the GGUF (the float32 checkpoint's own values;
the converter writes every matrix, the experts included, in the --outtype where the checkpoint
holds no MXFP4) and those values widened exactly in float64. So only the arithmetic differs: the
reference's float32 products (float matrices are multiplied in float32 on the unquantized rows)
and its int8 attention (K, V and P quantized, docs/numerics.md section 5) against float64.
YaRN's correction range is truncated on both sides (hf_config's `truncate`: llama.cpp floors and
ceils it). Skips where torch, transformers or safetensors is missing, where llama.cpp's tarball
is absent, or where the converter lacks an optional dependency (named in the skip).

One thing of the converter's is replaced: the vocabulary. A random model has no tokenizer, and
the converter's set_vocab refuses a tokenizer it does not recognize, so the driver gives it
n_vocab placeholder tokens and one merge (llama.cpp loads no BPE vocabulary without merges); the
tensors and the architecture's keys are the converter's own. Where STRATA_LLAMA_BUILD names a
llama.cpp build, llama.cpp's own distance from float64 at the last position is stated beside the
reference's.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")  # save_pretrained's format, which the converter reads

from gguf import GGMLQuantizationType as QT  # noqa: E402
from gguf import GGUFReader  # noqa: E402

from strata_prefill.formats import tensor_names as tn  # noqa: E402
from strata_prefill.formats.archs import gpt_oss as go  # noqa: E402
from strata_prefill.formats.config import PRESETS  # noqa: E402
from strata_prefill.formats.pack import Pack  # noqa: E402
from strata_prefill.reference import ReferenceEngine  # noqa: E402

_TGZ = "llama.cpp-0.3.36-vendored.tgz"
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: where llama.cpp's tarball is looked for: $STRATA_LLAMA_TGZ, the checkout's shared/peers/, /work/shared/peers/
TARBALLS = [p for p in (os.environ.get("STRATA_LLAMA_TGZ", ""), os.path.join(_REPO, "shared", "peers", _TGZ),
                        os.path.join("/work/shared/peers", _TGZ)) if p]
PRESET = "gpt-oss-tiny"
#: the bound on ||reference - float64|| / ||float64|| over every position's logits: the
#: reference's float32 products and int8 attention against float64 (the module docstring)
LOGITS_REL_L2 = 2e-2
PROMPT_TOKENS = 40  # longer than the preset's window of 16: the even block's window is exercised
_MISSING_DEP = 3  # the driver's exit status for a converter dependency that is not installed

# Run in a child process: the converter imports the gguf-py of its own tree (first on sys.path),
# not the installed one. argv: llama.cpp folder, HF folder, output file.
_DRIVER = textwrap.dedent("""
    import sys
    root, src, out = sys.argv[1:4]
    sys.path[:0] = [root, root + "/gguf-py"]
    try:
        import convert_hf_to_gguf as conv
        from conversion import gpt_oss
    except ImportError as exc:  # an optional dependency of the converter (sentencepiece, ...)
        print(f"the converter cannot be imported: {exc}", file=sys.stderr)
        sys.exit(%d)

    def set_vocab(self):  # a random model has no tokenizer: placeholder tokens, n_vocab of them
        n = self.hparams["vocab_size"]
        self.gguf_writer.add_tokenizer_model("gpt2")
        self.gguf_writer.add_token_list([f"<t{i}>" for i in range(n)])
        self.gguf_writer.add_token_types([1] * n)
        self.gguf_writer.add_token_merges(["<t0> <t1>"])  # llama.cpp's BPE vocabulary wants merges

    gpt_oss.GptOssModel.set_vocab = set_vocab
    sys.argv = ["convert_hf_to_gguf.py", src, "--outfile", out, "--outtype", "f32"]
    conv.main()
""" % _MISSING_DEP)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """(config, the float32 transformers model, the GGUF's path)."""
    tarball = next((p for p in TARBALLS if os.path.exists(p)), None)
    if tarball is None:
        pytest.skip(f"no {_TGZ} (looked in {', '.join(TARBALLS)}): no converter to run")
    tmp = tmp_path_factory.mktemp("gpt_oss")
    with tarfile.open(tarball) as tf:
        tf.extractall(tmp / "src", **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    root = next(p for p in (tmp / "src").rglob("convert_hf_to_gguf.py")).parent
    c = PRESETS[PRESET]
    torch.manual_seed(0)
    cfg = transformers.GptOssConfig(**go.hf_config(c), attn_implementation="eager")
    rope = getattr(cfg, "rope_scaling", None) or getattr(cfg, "rope_parameters", None) or {}
    assert rope.get("rope_type") == "yarn" and rope.get("factor") == c.rope_scaling.factor, rope
    model = transformers.GptOssForCausalLM(cfg).to(torch.float32).eval()
    if hasattr(model, "set_experts_implementation"):  # newer transformers: grouped kernels take no float64
        model.set_experts_implementation("eager")
    with torch.no_grad():  # biases and sinks random too (some initializers leave them zero)
        for name, p in model.named_parameters():
            if name.endswith(("bias", "sinks")):
                p.normal_(0.0, 0.5)
    model.save_pretrained(tmp / "hf", safe_serialization=True)
    out = tmp / "tiny.gguf"
    r = subprocess.run([sys.executable, "-c", _DRIVER, str(root), str(tmp / "hf"), str(out)],
                       capture_output=True, text=True, check=False)
    if r.returncode == _MISSING_DEP:
        pytest.skip(r.stderr.strip().splitlines()[-1])
    assert r.returncode == 0, r.stderr[-3000:]
    return c, model, out


def test_tensor_names_shapes_and_types(converted):
    c, _model, path = converted
    reader = GGUFReader(str(path))
    got = {t.name: (tuple(int(d) for d in reversed(t.shape.tolist())), QT(int(t.tensor_type))) for t in reader.tensors}
    specs = [(t.name(), t) for t in go.MODEL_TENSORS] + [
        (t.name(b), t) for b in range(c.n_layer) for t in go.BLOCK_TENSORS]
    # a float32 checkpoint converted to f32: every tensor F32, the experts included
    want = {tn.file_name(n): (tuple(reversed(t.shape(c))), QT.F32) for n, t in specs}
    assert set(got) == set(want), (sorted(set(got) - set(want)), sorted(set(want) - set(got)))
    for n in want:
        assert got[n] == want[n], n


def test_architecture_keys(converted):
    c, _model, path = converted
    reader = GGUFReader(str(path))
    assert bytes(reader.fields["general.architecture"].parts[-1]).decode() == go.NAME
    k, r = go.KEYS, go.ROPE_KEYS
    want = {k["n_layer"]: c.n_layer, k["context_length"]: c.context_length, k["n_embd"]: c.n_embd,
            k["n_head"]: c.n_head, k["n_head_kv"]: c.n_head_kv, k["rope_base"]: c.rope_base,
            k["rms_eps"]: c.rms_eps, k["n_expert"]: c.n_expert, k["n_expert_used"]: c.n_expert_used,
            k["head_dim"]: c.head_dim, go.VALUE_LENGTH_KEY: c.head_dim, k["sliding_window"]: c.sliding_window,
            k["n_ff_exp"]: c.n_ff_exp, go.FEED_FORWARD_KEY: c.n_ff_exp, r["type"]: "yarn",
            r["factor"]: c.rope_scaling.factor, r["original_context"]: c.rope_scaling.original_context}
    for key, value in want.items():
        assert key in reader.fields, key
        f = reader.fields[key]
        got = bytes(f.parts[-1]).decode() if isinstance(value, str) else f.parts[-1][0].item()
        assert got == pytest.approx(value) if isinstance(value, float) else got == value, key
    known = set(want) | set(go.ROPE_UNREAD_KEYS)
    keys = {key for key in reader.fields if key.startswith(go.NAME + ".")}
    assert keys <= known, f"keys the table lacks: {sorted(keys - known)}"


def test_our_pack_opens_it(converted):
    c, _model, path = converted
    with Pack.open(path) as pack:
        assert pack.config.replace(expert_gu_type=c.expert_gu_type, expert_down_type=c.expert_down_type,
                                   dense_type=c.dense_type) == c
        assert pack.config.expert_gu_type == pack.config.dense_type == QT.F32


def reference_logits(pack, ids) -> np.ndarray:
    """float32 [T, n_vocab]: the reference prefill of ids in one chunk, every position's logits."""
    engine = ReferenceEngine(pack)
    positions = np.arange(len(ids))
    x = engine.embed(np.asarray(ids))
    for layer in range(pack.config.n_layer):
        x = engine.layer(layer, x, positions)
    return engine.head(x)


def test_reference_logits_match_transformers_float64(converted):
    c, model, path = converted
    ids = np.random.default_rng(11).integers(0, c.n_vocab, PROMPT_TOKENS)
    with torch.no_grad():
        want = model.double()(input_ids=torch.tensor(ids[None], dtype=torch.long)).logits[0].numpy()
    with Pack.open(path) as pack:
        got = reference_logits(pack, ids).astype(np.float64)
    assert got.shape == want.shape == (PROMPT_TOKENS, c.n_vocab)
    per_pos = np.linalg.norm(got - want, axis=1) / np.linalg.norm(want, axis=1)
    rel = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    print(f"gpt-oss-tiny reference vs transformers float64: relative L2 {rel:.3e} over {PROMPT_TOKENS} "
          f"positions (worst position {per_pos.max():.3e} at {int(per_pos.argmax())}); bound {LOGITS_REL_L2}")
    assert rel < LOGITS_REL_L2 and per_pos.max() < 2 * LOGITS_REL_L2
    assert np.std(want) > 0 and np.mean(np.argmax(got, 1) == np.argmax(want, 1)) > 0.5


#: the bound on llama.cpp's own last-position distance from float64 (its CPU or CUDA kernels on
#: the same F32 file: F16 KV cache, its own exp and softmax); stated beside the reference's
LLAMA_REL_L2 = 5e-2


def test_llama_cpp_distance_beside_ours(converted, tmp_path):
    """llama.cpp's own logits for the prompt's last position on the same converted file (its
    build in STRATA_LLAMA_BUILD, a cmake build folder of the `llama` target, run by the
    project's driver bench/llama_cpp/prefill_driver.c) against transformers' float64, beside
    the reference's distance at that position. Skips where no build is named."""
    given = os.environ.get("STRATA_LLAMA_BUILD")
    if not given:
        pytest.skip("STRATA_LLAMA_BUILD names no llama.cpp build (python3 -m bench.bench_whole_model "
                    "--llama-tgz TGZ --llama-backend cpu makes one)")
    from pathlib import Path

    from bench import bench_whole_model as bwm

    src, lib = bwm.build_paths(Path(given))
    exe = bwm.compile_driver(src, lib, tmp_path / "prefill_driver")
    c, model, path = converted
    ids = np.random.default_rng(11).integers(0, c.n_vocab, PROMPT_TOKENS)
    prompts = tmp_path / f"prompts-{PROMPT_TOKENS}.bin"
    bwm.write_prompts(prompts, np.stack([ids, ids]).astype(np.int32))
    res = subprocess.run([str(exe), str(path), str(prompts), "--logits-dir", str(tmp_path), "--threads", "4"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    theirs = np.fromfile(tmp_path / f"logits-{PROMPT_TOKENS}.f32", dtype="<f4").astype(np.float64)
    with torch.no_grad():
        want = model.double()(input_ids=torch.tensor(ids[None], dtype=torch.long)).logits[0, -1].numpy()
    with Pack.open(path) as pack:
        ours = reference_logits(pack, ids)[-1].astype(np.float64)
    d_llama = float(np.linalg.norm(theirs - want) / np.linalg.norm(want))
    d_ours = float(np.linalg.norm(ours - want) / np.linalg.norm(want))
    print(f"gpt-oss-tiny at position {PROMPT_TOKENS - 1} vs transformers float64: llama.cpp {d_llama:.3e}, "
          f"reference {d_ours:.3e}")
    assert theirs.shape == want.shape
    assert d_llama < LLAMA_REL_L2 and d_ours < LOGITS_REL_L2
