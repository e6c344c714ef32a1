"""The independent check of formats/gpt_oss_table.py: a random transformers GptOssForCausalLM of the
gpt-oss-tiny preset's shape, saved and converted by llama.cpp's own converter
(convert_hf_to_gguf.py from llama.cpp's tarball in shared/peers, with the gguf-py beside it),
must give a GGUF whose tensor names, shapes and types and whose architecture keys are the
table's. Skips where torch or transformers is missing (or the tarball is absent).

One thing of the converter's is replaced: the vocabulary. A random model has no tokenizer, and
the converter's set_vocab refuses a tokenizer it does not recognize, so the driver gives it
n_vocab placeholder tokens; the tensors and the architecture's keys are the converter's own.

What the later end-to-end comparison (reference logits against transformers in float64) will
need, beyond this file:
- the seam's gpt-oss reference (formats/archs/gpt_oss.py; reference/archs/gpt_oss.py's attention
  with sinks, the sliding window on even blocks, q/k/v/o biases; the MoE half through
  strata_prefill.contract.routing.top_k(gating="softmax_selected", bias=...), strata_prefill.contract.moe.add_expert_bias,
  strata_prefill.contract.moe.swiglu_oai, strata_prefill.contract.moe.combine(down_bias=...)) and a pack reader for this GGUF;
- the same weights on both sides: convert with --outtype f32 (every matrix F32; the reference's
  float products), or, for MXFP4 experts, load the transformers model with the experts replaced
  by their MXFP4-dequantized values (gguf.quants.dequantize) so that only the arithmetic differs;
- transformers in float64 (model.double(), attn_implementation="eager": the sinks' softmax),
  the same token ids, rope yarn as the config says; and a tolerance derived from the contract
  (the reference quantizes activations to q8_1 and attention's K, V, P to int8, so its logits
  differ from float64 by far more than float32 rounding: a bound relative to the logits' spread,
  measured on the GPU machine and written to docs, not guessed here).
"""
from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import textwrap
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from gguf import GGMLQuantizationType as QT  # noqa: E402
from gguf import GGUFReader  # noqa: E402

from strata_prefill.formats import gpt_oss_table as gt  # noqa: E402

_TGZ = "llama.cpp-0.3.36-vendored.tgz"
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: where llama.cpp's tarball is looked for: $STRATA_LLAMA_TGZ, the checkout's shared/peers/, /work/shared/peers/
TARBALLS = [p for p in (os.environ.get("STRATA_LLAMA_TGZ", ""), os.path.join(_REPO, "shared", "peers", _TGZ),
                        os.path.join("/work/shared/peers", _TGZ)) if p]
PRESET = "gpt-oss-tiny"

# Run in a child process: the converter imports the gguf-py of its own tree (first on sys.path),
# not the installed one. argv: llama.cpp folder, HF folder, output file.
_DRIVER = textwrap.dedent("""
    import sys
    root, src, out = sys.argv[1:4]
    sys.path[:0] = [root, root + "/gguf-py"]
    import convert_hf_to_gguf as conv
    from conversion import gpt_oss

    def set_vocab(self):  # a random model has no tokenizer: placeholder tokens, n_vocab of them
        n = self.hparams["vocab_size"]
        self.gguf_writer.add_tokenizer_model("gpt2")
        self.gguf_writer.add_token_list([f"<t{i}>" for i in range(n)])
        self.gguf_writer.add_token_types([1] * n)

    gpt_oss.GptOssModel.set_vocab = set_vocab
    sys.argv = ["convert_hf_to_gguf.py", src, "--outfile", out, "--outtype", "f16"]
    conv.main()
""")


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    tarball = next((p for p in TARBALLS if os.path.exists(p)), None)
    if tarball is None:
        pytest.skip(f"no {_TGZ} (looked in {', '.join(TARBALLS)}): no converter to run")
    tmp = tmp_path_factory.mktemp("gpt_oss")
    with tarfile.open(tarball) as tf:
        tf.extractall(tmp / "src", **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    root = next(p for p in (tmp / "src").rglob("convert_hf_to_gguf.py")).parent
    c = gt.PRESETS[PRESET]
    torch.manual_seed(0)
    cfg = transformers.GptOssConfig(**gt.hf_config(c))
    model = transformers.GptOssForCausalLM(cfg).to(torch.float32)
    with torch.no_grad():  # biases and sinks random too (some initializers leave them zero)
        for name, p in model.named_parameters():
            if name.endswith(("bias", "sinks")):
                p.normal_(0.0, 0.5)
    model.save_pretrained(tmp / "hf", safe_serialization=True)
    out = tmp / "tiny.gguf"
    r = subprocess.run([sys.executable, "-c", _DRIVER, str(root), str(tmp / "hf"), str(out)],
                       capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    return c, GGUFReader(str(out))


def test_tensor_names_shapes_and_types(converted):
    c, reader = converted
    got = {t.name: (tuple(int(d) for d in reversed(t.shape.tolist())), QT(int(t.tensor_type))) for t in reader.tensors}
    # a float checkpoint: the expert matrices come out in the outtype, as the dense ones do
    cf = replace(c, expert_gu_type=QT.F16, expert_down_type=QT.F16, dense_type=QT.F16)
    want = {n: (s, gt.tensor_type(spec, cf)) for n, s, spec in gt.tensors(c)}
    assert set(got) == set(want), (sorted(set(got) - set(want)), sorted(set(want) - set(got)))
    for n in want:
        assert got[n] == want[n], n


def test_architecture_keys(converted):
    c, reader = converted
    assert bytes(reader.fields["general.architecture"].parts[-1]).decode() == gt.ARCH
    for key, value in gt.metadata(c).items():
        assert key in reader.fields, key
        f = reader.fields[key]
        got = bytes(f.parts[-1]).decode() if isinstance(value, str) else f.parts[-1][0].item()
        assert got == pytest.approx(value) if isinstance(value, float) else got == value, key
    keys = {k for k in reader.fields if k.startswith(gt.ARCH + ".")}
    assert keys <= set(gt.metadata(c)), f"keys the table lacks: {sorted(keys - set(gt.metadata(c)))}"
