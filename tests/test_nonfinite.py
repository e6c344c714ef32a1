"""Non-finite values named: a pack any tensor of which decodes to NaN or Inf is refused when a
command that computes opens it (exit 2, one line naming the tensors, before any work); a run
that computes a NaN or an Inf anyway (a finite weight so large that a product overflows) exits 1
in one line naming the first layer and op, with or without dump flags, on every engine, even
where the logits come out finite (an int8 quantize turns a NaN into zeros); `info --check` names
the tensors that decode to NaN or Inf; NumPy's warnings never reach the user."""
import hashlib
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from strata_prefill.formats import nonfinite
from strata_prefill.contract import quants
from strata_prefill.contract.errors import PackError
from strata_prefill.formats.pack import KEY_TENSOR_DIGEST, KEY_TENSOR_DIGESTS, Pack, tensor_digest_root
from strata_prefill.formats.records import read_timeline
from strata_prefill.cli import main

ROOT = Path(__file__).resolve().parents[1]
PROMPT = ["--prompt-tokens", "70", "--greedy", "2", "--no-progress"]
SIM = ["--impl", "fast", "--backend", "sim"]
CUDA = ["--impl", "fast", "--backend", "cuda"]
try:
    from strata_prefill.fast.cuda.runtime import cuda_available

    _CUDA, _WHY = cuda_available()
except ImportError as exc:  # pragma: no cover - the runtime module itself is missing
    _CUDA, _WHY = False, f"the cuda runtime does not import: {exc}"
ON_CUDA = pytest.param(CUDA, id="cuda", marks=pytest.mark.skipif(
    not _CUDA, reason=f"cuda backend unavailable: {_WHY}"))
WARNING_WORDS = ("RuntimeWarning", "encountered in", "Traceback")
DOWN = "blk.1.ffn_down_exps"
BAD_ROW, BAD_BLOCK = 3, 2  # the down matrix's row (an output element) and 32-value block edited


def cli(*args: str) -> subprocess.CompletedProcess:
    """The command as a user runs it, in a process of its own: its stderr is what they see
    (in this process pytest would catch the warnings before they were printed), less the
    lines of a first kernel compile (fast/cuda/runtime.py says what it compiles), which come
    before the run's own lines where the kernel cache is empty."""
    r = subprocess.run([sys.executable, "-m", "strata_prefill", *args], cwd=ROOT,
                       capture_output=True, text=True, timeout=900)  # cuda: a first compile
    r.stderr = "".join(ln for ln in r.stderr.splitlines(keepends=True) if not ln.startswith("compiling kernel "))
    return r


def one_line(stderr: str) -> str:
    """The run's one line (the test names every line where there are more)."""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, f"{len(lines)} lines on stderr, not one: {lines}"
    return lines[0]


def reseal(path: Path) -> None:
    """Rewrite a pack's tensor digests to match its data, as if make-pack had written the
    edited bytes (the digests' hex strings keep their length, so they are patched in place)."""
    pack = Pack.open(path, check_values=False)
    old = [str(d) for d in pack.field(KEY_TENSOR_DIGESTS)]
    old_root = str(pack.field(KEY_TENSOR_DIGEST))
    data = bytearray(path.read_bytes())
    new = [hashlib.sha256(data[int(t.data_offset):int(t.data_offset) + int(t.n_bytes)]).digest()
           for t in pack.reader.tensors]
    header_end = int(pack.reader.data_offset)
    pack.close()
    for a, b in [*zip(old, (d.hex() for d in new)), (old_root, tensor_digest_root(new))]:
        at = bytes(data[:header_end]).find(a.encode())
        assert at > 0
        data[at:at + len(a)] = b.encode()
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    """A tiny pack of its own and its run's record file (the experts it routes)."""
    from strata_prefill.formats.make_pack import make_pack

    d = tmp_path_factory.mktemp("nonfinite")
    path = make_pack(d / "tiny.gguf", "tiny", seed=7)
    assert main(["run", "--pack", str(path), *PROMPT, "--dump-dir", str(d / "h")]) == 0
    return path, read_timeline(d / "h" / "layers.spd")


@pytest.fixture(scope="module")
def ff_pack(healthy, tmp_path_factory):
    """The tiny pack with every byte of its tensor data 0xFF (every half and float is NaN)."""
    path = tmp_path_factory.mktemp("ff") / "ff.gguf"
    shutil.copy(healthy[0], path)
    with Pack.open(path) as p:
        start = int(p.reader.data_offset)
    with open(path, "r+b") as f:
        f.seek(0, 2)
        n = f.tell() - start
        f.seek(start)
        f.write(b"\xff" * n)
    return path


def scaled_pack(healthy, folder: Path, value: float) -> tuple[Path, int]:
    """The tiny pack with the f16 scale of one Q8_0 block of DOWN set to `value`, in the
    expert position 0 routes first at layer 1 (so the prefill multiplies by it), digests
    resealed; (path, that expert)."""
    path, timeline = healthy
    expert = int(timeline[0].records["L01.topk_ids"][0, 0])
    out = folder / f"scale-{value}.gguf"
    shutil.copy(path, out)
    with Pack.open(out) as p:
        m = p.matrix(DOWN)
        assert m.qtype == QT.Q8_0
        vals, nbytes = quants.block_size(QT.Q8_0)
        at = p.tensor_offset(DOWN) + (expert * m.n_rows + BAD_ROW) * m.row_bytes + BAD_BLOCK * nbytes
    with open(out, "r+b") as f:
        f.seek(at)  # a Q8_0 block's scale is its first two bytes (contract/quants.py)
        f.write(np.float16(value).tobytes())
    reseal(out)
    return out, expert


def overflow_pack(healthy, folder: Path) -> Path:
    """The tiny pack with every value of blk.1.attn_norm 3e38: finite, so the pack opens, but
    its RMSNorm's products overflow to Inf, and the projections' int8 quantize of those turns
    the NaN they lead to into zeros: the logits stay finite (test_the_watch_names...). Digests
    resealed."""
    out = folder / "overflow.gguf"
    shutil.copy(healthy[0], out)
    with Pack.open(out) as p:
        t = p.tensor("blk.1.attn_norm")
        at, n = int(t.data_offset), int(t.n_elements)
    with open(out, "r+b") as f:
        f.seek(at)
        f.write(np.full(n, 3e38, "<f4").tobytes())
    reseal(out)
    return out


@pytest.fixture(scope="module")
def overflowing(healthy, tmp_path_factory):
    return overflow_pack(healthy, tmp_path_factory.mktemp("overflow"))


@pytest.fixture
def unchecked(monkeypatch):
    """Pack.open without its value check: a NaN planted in a weight reaches the run, so the
    run's own watch is what is tested."""
    monkeypatch.setattr(Pack, "refuse_nonfinite", lambda self, progress=None: None)


@pytest.mark.parametrize("impl", [pytest.param([], id="reference"), pytest.param(SIM, id="sim"), ON_CUDA])
def test_an_all_ff_pack_is_refused_at_open_naming_the_tensors(ff_pack, impl):
    before = ff_pack.read_bytes()
    t0 = time.monotonic()
    r = cli("run", "--pack", str(ff_pack), *PROMPT, *impl)
    assert r.returncode == 2, r.stderr
    line = one_line(r.stderr)
    assert line.startswith(f"strata-prefill: error: {ff_pack}: 35 tensors decode to NaN or Inf")
    assert "Q8_0: token_embd.weight, output.weight, blk.{0,1}.attn_q.weight" in line
    assert "F32: output_norm.weight, blk.{0,1}.attn_norm.weight" in line
    assert "`strata-prefill info --check` names the first row of each" in line
    assert not any(w in r.stderr for w in WARNING_WORDS)
    assert r.stdout == ""  # nothing computed, nothing printed as a result
    assert time.monotonic() - t0 < 30  # the open's scan, not a prefill (no kernel is compiled)
    assert ff_pack.read_bytes() == before


@pytest.mark.parametrize("value, impl", [(np.nan, []), (np.inf, SIM), (-np.inf, [])],
                         ids=["nan", "inf-sim", "-inf"])
def test_a_bad_scale_is_refused_before_any_work(healthy, tmp_path, monkeypatch, capsys, value, impl):
    """One scale of one block among 35 tensors: named, in the process before a session is made."""
    import strata_prefill.session

    pack, _ = scaled_pack(healthy, tmp_path, value)
    before = pack.read_bytes()

    def no_work(*a, **k):
        raise AssertionError("the run started work on a pack it should have refused")

    monkeypatch.setattr(strata_prefill.session.Session, "__init__", no_work)
    assert main(["run", "--pack", str(pack), *PROMPT, *impl]) == 2
    out, err = capsys.readouterr()
    assert one_line(err) == (f"strata-prefill: error: {pack}: 1 tensor decodes to NaN or Inf (a scale "
                             f"or float value is NaN or Inf): Q8_0: {DOWN}.weight; `strata-prefill info "
                             "--check` names the first row of each")
    assert out == "" and pack.read_bytes() == before


def test_the_scale_check_reads_float_tensors_whole(healthy, tmp_path):
    """A NaN in the middle of a norm is found; info and diff open the pack without the check."""
    path = tmp_path / "norm.gguf"
    shutil.copy(healthy[0], path)
    with Pack.open(path) as p:
        t = p.tensor("blk.0.ffn_norm")
        at = int(t.data_offset) + 4 * (int(t.n_elements) // 2)
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(np.float32(np.nan).tobytes())
    with pytest.raises(PackError, match=r"1 tensor decodes to NaN or Inf .*: F32: blk\.0\.ffn_norm\.weight;"):
        Pack.open(path)
    assert Pack.open(path, check_values=False).config.n_layer == 2


@pytest.mark.parametrize("impl", [pytest.param([], id="reference"), pytest.param(SIM, id="sim"), ON_CUDA])
def test_the_watch_names_what_the_logits_hide(overflowing, impl):
    """No dump flag: the run names the layer and op (a replay of that layer alone gives the
    position), though its logits are finite."""
    before = overflowing.read_bytes()
    r = cli("run", "--pack", str(overflowing), *PROMPT, *impl)
    assert r.returncode == 1, r.stdout + r.stderr
    line = one_line(r.stderr)
    assert line.startswith("strata-prefill: error: the run computed non-finite values: ")
    assert "Inf first in layer 1, op attn_norm (L01.attn_norm) of chunk 0, position 0, element " in line
    assert line.endswith("; the first-token logits are finite")
    assert not any(w in r.stderr for w in WARNING_WORDS)
    assert "next" not in r.stdout and overflowing.read_bytes() == before


@pytest.mark.parametrize("impl", [pytest.param([], id="reference"), pytest.param(SIM, id="sim")])
def test_without_the_watch_that_run_prints_an_answer(overflowing, monkeypatch, capsys, impl):
    """The control of the test above: what the logits alone let through."""
    monkeypatch.setattr(nonfinite.Watch, "first", lambda self: None)
    assert main(["run", "--pack", str(overflowing), *PROMPT, *impl]) == 0
    out, err = capsys.readouterr()
    assert "next      " in out and err == ""


# the tensor whose Q8_0 block 3 (of row 0) gets a NaN scale -> what the line names: in the
# attention's output projection it reaches the residual, then the next quantize zeroes it (the
# logits come out finite); in attn_q the Q quantize zeroes it at once
PLANTED = {
    "blk.0.attn_output": "NaN first in layer 0, op attn_proj (L00.attn_proj) of chunk 0, position 0, element 0 (",
    "blk.0.attn_q": "NaN first in layer 0, op q (L00.q) of chunk 0, position 0, element 0 (",
}


@pytest.mark.parametrize("impl", [pytest.param([], id="reference"), pytest.param(SIM, id="sim"), ON_CUDA])
@pytest.mark.parametrize("tensor", list(PLANTED))
@pytest.mark.parametrize("dumps", [[], ["--dump-level", "ops"]], ids=["no-dumps", "ops-records"])
def test_a_nan_a_quantize_would_hide_is_named(healthy, tmp_path, unchecked, capsys, impl, tensor, dumps):
    path = tmp_path / "planted.gguf"
    shutil.copy(healthy[0], path)
    with Pack.open(path) as p:
        at = p.tensor_offset(tensor) + 3 * quants.block_size(QT.Q8_0)[1]
    with open(path, "r+b") as f:
        f.seek(at)  # a Q8_0 block's scale is its first two bytes
        f.write(np.float16(np.nan).tobytes())
    if dumps:
        dumps = ["--dump-dir", str(tmp_path / "d"), *dumps]
    assert main(["run", "--pack", str(path), *PROMPT, *impl, *dumps]) == 1
    out, err = capsys.readouterr()
    line = one_line(err)
    assert PLANTED[tensor] in line, line
    assert out == ""
    if impl != CUDA:  # NumPy's quantize zeroes the NaN's block; a kernel's fmaxf drops it, or
        # keeps an all-NaN block's (docs/numerics.md section 10): past the named op, the bits differ
        assert "the first-token logits are finite" in line


@pytest.mark.parametrize("value, kind, impl", [
    pytest.param(np.inf, "Inf first", [], id="inf-reference"),
    pytest.param(-np.inf, "Inf first", SIM, id="-inf-sim"),
    pytest.param(np.nan, "NaN first", [], id="nan-reference"),
    pytest.param(np.nan, "NaN first", SIM, id="nan-sim"),
    *(pytest.param(v, k, CUDA, id=f"{i}-cuda", marks=ON_CUDA.marks)
      for v, k, i in ((np.inf, "Inf first", "inf"), (np.nan, "NaN first", "nan")))])
def test_a_bad_scale_in_layer_1_is_named_at_layer_1(healthy, tmp_path, unchecked, capsys, value, kind, impl):
    pack, expert = scaled_pack(healthy, tmp_path, value)
    assert main(["run", "--pack", str(pack), *PROMPT, *impl]) == 1
    out, err = capsys.readouterr()
    line = one_line(err)
    # the down product of position 0's first expert, at the row whose scale is bad
    assert (f"first in layer 1, op y (L01.y) of chunk 0, position 0 (top-K rank 0), "
            f"element {BAD_ROW}") in line, line
    assert kind in line  # an Inf scale times a code is +-Inf (the code's sign), NaN stays NaN
    assert out == ""


def test_a_cached_reference_run_is_refused_too(overflowing, tmp_path):
    """Through --reference-cache: the miss that computes it and the hit that reads it back."""
    for hit in ("miss", "hit"):
        r = cli("run", "--pack", str(overflowing), *PROMPT, "--reference-cache", str(tmp_path / "c"),
                "--dump-dir", str(tmp_path / "d"))
        assert r.returncode == 1, r.stderr
        cache_line, line = r.stderr.strip().splitlines()
        assert cache_line.startswith(f"reference cache: {hit}")
        assert "Inf first in layer 1, op attn_norm (L01.attn_norm) of chunk 0, position 0" in line
        assert "--dump-level ops names" not in line  # the replay named the op
        assert not any(w in r.stderr for w in WARNING_WORDS) and r.stdout == ""


@pytest.mark.parametrize("impl", [pytest.param([], id="reference"), pytest.param(SIM, id="sim"), ON_CUDA])
def test_the_records_name_the_first_op(overflowing, tmp_path, impl):
    r = cli("run", "--pack", str(overflowing), *PROMPT, *impl, "--dump-dir", str(tmp_path / "d"),
            "--dump-level", "ops", "--dump-first-logits", str(tmp_path / "l.f32"))
    assert r.returncode == 1
    line = one_line(r.stderr)
    assert "Inf first in layer 1, op attn_norm (L01.attn_norm) of chunk 0, position 0, element " in line
    assert "the first-token logits are finite" in line
    assert "(the dumps written stay)" in line and "--dump-level ops names" not in line
    assert (tmp_path / "d" / "layers.spd").exists() and (tmp_path / "l.f32").stat().st_size == 2048
    assert not any(w in r.stderr for w in WARNING_WORDS)


def test_in_records_walks_the_computed_order(healthy, tmp_path):
    """A planted value is found where it is, and an earlier layer's wins over a later op."""
    from strata_prefill.formats.dumps import RecordWriter

    rng = np.random.default_rng(3)
    path = tmp_path / "r.spd"
    with RecordWriter(path) as w:
        w.write("chunk", np.array([0], np.int64))
        w.write("positions", np.arange(5, 9, dtype=np.int64))
        y = rng.standard_normal((8, 6)).astype(np.float32)  # K = 2: pair rows t*2+k
        y[5, 4] = np.inf
        w.write("L01.topk_ids", rng.integers(0, 4, (4, 2)).astype(np.int32))
        w.write("L01.y", y)  # written before the earlier layer's record: order is not file order
        a = rng.standard_normal((4, 6)).astype(np.float32)
        w.write("L00.attn_norm", a)
    f = nonfinite.in_records(path)
    assert (f.layer, f.op, f.position, f.rank, f.index) == (1, "y", 7, 1, (5, 4))
    assert f.kind == "Inf" and f.count == 1


def test_a_healthy_pack_is_unaffected(healthy, capsys, tmp_path):
    path, _ = healthy
    for extra in ([], SIM, ["--dump-dir", str(tmp_path / "d"), "--dump-level", "ops",
                            "--dump-r", str(tmp_path / "r.bin")]):
        assert main(["run", "--pack", str(path), *PROMPT, *extra]) == 0
        out, err = capsys.readouterr()
        assert "next      " in out and err == ""
    assert nonfinite.in_records(tmp_path / "d" / "layers.spd", nonfinite.q8_layouts(Pack.open(path))) is None


def test_info_check_names_the_tensor(healthy, tmp_path, capsys):
    pack, expert = scaled_pack(healthy, tmp_path, np.nan)
    assert main(["info", "--check", str(pack)]) == 1
    out, err = capsys.readouterr()
    assert (f"non-finite:     {DOWN}.weight decodes to NaN or Inf (first at expert {expert}, "
            f"row {BAD_ROW}, value {BAD_BLOCK * 32})") in out
    assert "tensor values:  1 of 35 tensors decode to NaN or Inf" in out
    assert "tensor data digest: ok" in out and err == ""
    assert main(["info", "--check", str(healthy[0])]) == 0
    out, err = capsys.readouterr()
    assert "tensor values:  all finite (35 tensors decoded)" in out and "non-finite" not in out


def test_info_check_on_the_ff_pack_names_a_few_then_counts(ff_pack, capsys):
    assert main(["info", "--check", str(ff_pack)]) == 2  # its digests fail too: one line
    out, err = capsys.readouterr()
    named = [l for l in out.splitlines() if l.startswith("non-finite:")]
    assert len(named) == 5 and "token_embd.weight" in named[0]
    assert "35 of 35 tensors decode to NaN or Inf, 30 not named above" in out
    assert len(err.strip().splitlines()) == 1 and "does not match the digest" in err


def test_mxfp4_overflow_is_found_where_a_full_dequantize_finds_it():
    """MXFP4's e8m0 scales are finite, but from 2^125 a large code overflows float32: the scan
    names the tensor exactly where gguf's own dequantize gives Inf, and only there."""
    import gguf.quants as gq

    qt = quants.QT.MXFP4
    rng = np.random.default_rng(5)
    raw = quants.random_blocks(qt, 64, rng).reshape(4, 16 * 17)
    assert nonfinite.in_tensor(qt, raw) is None
    blocks = raw.reshape(-1, 17)
    blocks[:, 0] = 253  # 2^125: a code of 12 overflows, a code of 4 does not
    blocks[:, 1:] &= 0x22  # every code 0, 1, 2 (small: finite)
    assert nonfinite.in_tensor(qt, raw) is None and np.isfinite(gq.dequantize(raw, qt)).all()
    blocks[37, 5] = 0x07  # one code of 12 in block 37 (row 2)
    with np.errstate(over="ignore"):
        assert not np.isfinite(gq.dequantize(raw, qt)).all()
    assert nonfinite.in_tensor(qt, raw) is not None


# MXFP4's and NVFP4's scales are bytes that always decode finite (tests/test_codebooks.py)
@pytest.mark.parametrize("qtype", [t for t in quants.SUPPORTED_TYPES if t not in (quants.QT.MXFP4, quants.QT.NVFP4)],
                         ids=lambda q: q.name)
def test_in_tensor_equals_a_full_dequantize(qtype):
    """The half-scale scan says what a full decode says, for every type and half scale (a
    half field, or IQ1_M's d in four nibbles: QuantFormat.scale_values)."""
    from strata_prefill.contract import qformats

    fmt = qformats.lookup(qtype)
    rng = np.random.default_rng(int(qtype))
    vals, nbytes = quants.block_size(qtype)
    n_blocks = 6
    raw = quants.random_blocks(qtype, n_blocks * 3, rng).reshape(3, n_blocks * nbytes)
    assert nonfinite.in_tensor(qtype, raw) is None
    assert np.isfinite(quants.dequantize(qtype, raw)).all()
    n_scales = fmt.scale_values(raw[:1, :nbytes]).shape[1]
    assert n_scales == max(1, len(fmt.half_fields))
    for field in range(n_scales):
        for bad in (np.inf, -np.inf, np.nan):
            r = raw.copy()
            row, blk = int(rng.integers(1, 3)), int(rng.integers(0, n_blocks))
            block = r[row, blk * nbytes:(blk + 1) * nbytes][None]  # a view of the block in r
            v = fmt.scale_values(block)
            v[0, field] = bad
            fmt.put_scale_values(block, v)
            assert not np.isfinite(fmt.scale_values(r[row, blk * nbytes:(blk + 1) * nbytes][None])).all()
            with np.errstate(invalid="ignore"):  # inf times a zero code: NaN, as intended
                full = ~np.isfinite(quants.dequantize(qtype, r))
            first = np.unravel_index(int(np.argmax(full)), full.shape)
            assert nonfinite.in_tensor(qtype, r) == (row, blk * vals) == tuple(map(int, first)), field
            assert full[row, blk * vals:(blk + 1) * vals].all() and full.sum() == vals


@pytest.mark.parametrize("qtype", [QT.F32, QT.F16, QT.BF16], ids=lambda q: q.name)
def test_in_tensor_of_float_types(qtype):
    from strata_prefill.contract.dense import encode_float

    x = np.random.default_rng(5).standard_normal((4, 64)).astype(np.float32)
    assert nonfinite.in_tensor(qtype, encode_float(x, qtype)) is None
    x[2, 17] = np.nan
    x[3, 1] = np.inf
    assert nonfinite.in_tensor(qtype, encode_float(x, qtype)) == (2, 17)


def test_cli_keeps_numpy_warnings_away(capsys):
    """Float warnings raised under the command, in its thread and in a pool thread, print
    nothing (the non-finite check is what tells the user)."""
    import warnings
    from concurrent.futures import ThreadPoolExecutor

    from strata_prefill.cli import quiet_floats

    def overflow():
        return np.float32(3e38) * np.float32(10) + np.log(np.zeros(2)) * 0

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with quiet_floats():
            overflow()
            with ThreadPoolExecutor(1) as pool:
                pool.submit(overflow).result()
        assert seen == []
        overflow()  # outside the command they still warn: the filter was the command's
        assert seen


def test_in_pack_reads_in_slabs_and_counts_every_byte(healthy, tmp_path, monkeypatch):
    """Rows found across slabs are the tensor's rows; progress ends at the data's size."""
    pack, expert = scaled_pack(healthy, tmp_path, np.inf)
    monkeypatch.setattr(nonfinite, "SLAB_BYTES", 1000)  # 3 rows of 272 bytes a slab
    for path, want in ((pack, [(f"{DOWN}.weight", expert, BAD_ROW, BAD_BLOCK * 32)]), (healthy[0], [])):
        seen = []
        with Pack.open(path, check_values=False) as p:
            got = [(b.name, b.expert, b.row, b.value)
                   for b in nonfinite.in_pack(p, lambda done, total, _: seen.append((done, total)))]
            size = sum(int(t.n_bytes) for t in p.reader.tensors)
        assert got == want
        assert seen[-1] == (size, size) and [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_the_residual_dump_stays_and_the_replay_leaves_the_runs_files(overflowing, tmp_path, monkeypatch,
                                                                      capsys):
    """--dump-r and --dump-first-logits (here from their variables): the run writes them
    whole; the replay that names the op writes neither, nor anything beside them. The
    residual they hold is finite: the dump alone would not have told."""
    r_bin, logits = tmp_path / "r.bin", tmp_path / "l.f32"
    monkeypatch.setenv("STRATA_PREFILL_DUMP_R", str(r_bin))
    monkeypatch.setenv("STRATA_DUMP_FIRST_LOGITS", str(logits))
    assert main(["run", "--pack", str(overflowing), "--prompt-tokens", "130", "--greedy", "0",
                 "--no-progress"]) == 1
    out, err = capsys.readouterr()
    line = one_line(err)
    assert "Inf first in layer 1, op attn_norm (L01.attn_norm) of chunk 0, position 0" in line
    assert line.endswith("(the dumps written stay)") and out == ""
    assert r_bin.stat().st_size == 3 * (8 + 4 * 256)  # positions 0, 64, 128 of 256 values each
    assert nonfinite.in_residual_dump(r_bin, 256) is None  # what the dump alone would not have said
    assert logits.stat().st_size == 2048 and sorted(p.name for p in tmp_path.iterdir()) == ["l.f32", "r.bin"]


def test_a_greedy_step_with_non_finite_logits_is_refused(healthy, monkeypatch, capsys):
    """First-token logits finite, a later one-token step's not (here planted in the
    reference's lm_head): the run still says so, naming the greedy token."""
    from strata_prefill.reference import ReferenceEngine

    orig = ReferenceEngine.last_logits
    calls = []

    def last_logits(self, x):
        out = np.array(orig(self, x))
        calls.append(1)
        if len(calls) == 3:  # the prefill's, the first step's, then this one
            out[11] = np.inf
        return out

    monkeypatch.setattr(ReferenceEngine, "last_logits", last_logits)
    assert main(["run", "--pack", str(healthy[0]), "--prompt-tokens", "20", "--greedy", "4",
                 "--no-progress"]) == 1
    out, err = capsys.readouterr()
    line = one_line(err)
    assert ("NaN or Inf first in the logits greedy token 2 was picked from (the first-token "
            "logits are finite)") in line and out == ""


def test_info_check_names_the_tensor_it_reads_while_it_lasts(healthy, monkeypatch, capsys):
    """Off a terminal, a long value scan says every HEARTBEAT_S which tensor it is on. (Each
    tensor's scan outlasts a heartbeat, so a line comes however many threads share the scan: with
    a heartbeat longer than a tensor's scan, a 16-core machine finished before the first.)"""
    from strata_prefill.formats import progress

    monkeypatch.setattr(progress, "HEARTBEAT_S", 0.004)
    orig = nonfinite.in_tensor

    def slow(*args):
        time.sleep(0.01)
        return orig(*args)

    monkeypatch.setattr(nonfinite, "in_tensor", slow)
    assert main(["info", "--check", str(healthy[0])]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err and all(l.startswith("info --check: tensor values ") and "GiB" in l for l in err), err
    assert any(".weight (" in l for l in err), err  # (a beat before the first tensor says "starting")


@pytest.mark.parametrize("layout", list(__import__("strata_prefill.contract.q8_1", fromlist=["Layout"]).Layout),
                         ids=lambda l: l.name)
def test_a_q8_1_record_is_read_by_its_layout(tmp_path, layout):
    """An Inf quantized into a q8_1 buffer shows in its header (the scale of its 32 values is
    +inf): named with the pack's layout, skipped without one (its bytes read as nothing
    else). (A NaN block the quantize zeroes, contract/blockquant.py: the float records before
    it hold the NaN.)"""
    from strata_prefill.contract import q8_1
    from strata_prefill.formats.dumps import RecordWriter

    rng = np.random.default_rng(int(layout) + 20)
    x = rng.standard_normal((8, 256)).astype(np.float32)
    x[5, 200] = np.inf  # value 200: the q8_1 row's 32-value group 6 (64-value group 3 for D2S6)
    path = tmp_path / "q.spd"
    with RecordWriter(path) as w:
        w.write("chunk", np.array([0], np.int64))
        w.write("positions", np.arange(10, 14, dtype=np.int64))
        w.write("L00.topk_ids", rng.integers(0, 8, (4, 2)).astype(np.int32))
        w.write("L00.moe_in_q8_1", q8_1.quantize_rows(x, layout))
    assert nonfinite.in_records(path) is None
    f = nonfinite.in_records(path, {("L00", "moe_in_q8_1"): layout})
    assert (f.layer, f.op, f.position, f.rank) == (0, "moe_in_q8_1", 12, 1)
    assert f.kind == "Inf" and f.where().endswith("header value 6")


# ---- the watch's parts -------------------------------------------------------------------------

from hypothesis import given, settings, strategies as st  # noqa: E402

from strata_prefill.formats.records import OPS  # noqa: E402
from strata_prefill.formats.records import computed_order  # noqa: E402

OP_NAMES = [op.name for op in OPS]
BITS = {"nan": 0x7FC00000, "-nan": 0xFFC00000, "signalling nan": 0x7F800001, "inf": 0x7F800000,
        "-inf": 0xFF800000}


@settings(max_examples=200, deadline=None)
@given(n_layer=st.integers(1, 200), seen=st.lists(
    st.tuples(st.integers(0, 10**6), st.integers(0, 199), st.sampled_from(OP_NAMES)), min_size=1, max_size=20))
def test_the_watch_keeps_the_first_in_the_record_files_order(n_layer, seen):
    """Whatever order the engine sees them in, the first in (unit, layer, op) order is kept,
    the order in_records walks a record file in (strata_prefill/report.py's)."""
    seen = [(u, l % n_layer, op) for u, l, op in seen]
    w = nonfinite.Watch(n_layer)
    bad = np.array([1.0, np.nan], np.float32)
    for unit, layer, op in seen:
        w.unit = unit
        w.see(layer, op, bad)
        w.see(layer, op, np.ones(3, np.float32))  # finite: changes nothing
    first = min(seen, key=lambda s: (s[0], computed_order(f"L{s[1]:02d}.{s[2]}")))
    assert w.first() == nonfinite.Seen(*first)
    w.reset()
    assert w.first() is None and w.unit == 0


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 300), at=st.integers(0, 299), kind=st.sampled_from([None, *BITS]),
       first=st.integers(0, 2**64 - 1), code=st.integers(0, 2**64 - 2), seed=st.integers(0, 2**32 - 1))
def test_mark_is_the_bits_rule(n, at, kind, first, code, seed):
    """mark: a NaN (any payload, either sign) or an Inf marks; a code not below first does not."""
    x = np.random.default_rng(seed).standard_normal(n).astype(np.float32) * np.float32(1e30)
    if kind is not None:
        x.view(np.uint32)[at % n] = BITS[kind]
    want = code if kind is not None and code < first else first
    assert nonfinite.mark(first, x, code) == want


@pytest.mark.skipif(not _CUDA, reason=f"cuda backend unavailable: {_WHY}")
def test_the_kernel_is_mark():
    """fast/cuda/kernels/nonfinite.cu against strata_prefill.formats.nonfinite.mark: sizes around the vector
    width and the grid, views off the 16-byte alignment, every kind of NaN and Inf at the
    first, last and a random element, a code above, equal to and below the value held."""
    from pycuda import gpuarray

    from strata_prefill.fast.cuda import elementwise as cu_ew, runtime

    dev = runtime.Device()
    rng = np.random.default_rng(11)
    for n in (1, 3, 4, 5, 255, 1024, 1027, 3 * 1024 * 1024 + 1):
        base = rng.standard_normal(n + 3).astype(np.float32)
        for skip in (0, 1, 3):
            for kind in (None, *BITS):
                for where in ("first", "last", "any"):
                    x = base[skip:skip + n].copy()
                    if kind is not None:
                        i = {"first": 0, "last": n - 1, "any": int(rng.integers(n))}[where]
                        x.view(np.uint32)[i] = BITS[kind]
                    buf = gpuarray.to_gpu(np.concatenate([base[:skip], x]))
                    view = buf[skip:]
                    for held, code in ((nonfinite.NOTHING, 7), (7, 7), (9, 7), (3, 2**40)):
                        first = gpuarray.to_gpu(np.array([held], np.uint64))
                        cu_ew.nonfinite_mark(dev, view, first, code)
                        got = int(first.get()[0])
                        assert got == nonfinite.mark(held, x, code), (n, skip, kind, where, held, code)
                    if kind is None:  # where is nothing to plant: once
                        break


def test_a_nan_first_in_a_greedy_step_is_named_there(healthy, monkeypatch, capsys):
    """The watch reads the greedy steps too; the replay runs the prompt and the steps before to
    reach the step's unit (chunk 1: the first one-token step, at position 70)."""
    import strata_prefill.reference.moe_half as moe_half

    combine = moe_half.combine

    def planted(x, weights, slot, y, shared, **kw):
        out = combine(x, weights, slot, y, shared, **kw)
        if x.shape[0] == 1:  # a one-token step: a NaN in the residual it leaves
            out = out.copy()
            out[0, 5] = np.nan
        return out

    monkeypatch.setattr(moe_half, "combine", planted)
    assert main(["run", "--pack", str(healthy[0]), "--prompt-tokens", "70", "--greedy", "3", "--no-progress"]) == 1
    out, err = capsys.readouterr()
    line = one_line(err)
    assert ("NaN first in layer 0, op moe_out (L00.moe_out) of chunk 1, position 70, element 5 (1 of 256 "
            "values non-finite); the first-token logits are finite") in line and out == ""


def test_a_windowed_run_is_named_the_same(overflowing, capsys):
    """Layer-major windows of two chunks (the sim): the unit is the window, the op the same."""
    assert main(["run", "--pack", str(overflowing), "--prompt-tokens", "70", "--prefill", "16", "--window", "32",
                 "--greedy", "1", "--no-progress", *SIM]) == 1
    out, err = capsys.readouterr()
    line = one_line(err)
    assert "Inf first in layer 1, op attn_norm (L01.attn_norm) of chunk 0, position 0, element 0 (" in line
    assert " of 8,192 values non-finite)" in line and out == ""  # the window's 32 rows of 256


# ---- gate, up and the shared expert's: marked by the SwiGLU steps that read them -------------
# The fast engine queues no nonfinite_mark for `gate`, `up` or `shexp`: the SwiGLU steps that read
# those rows mark them (the backends' `mark`, swiglu.cu and swiglu_q8_1.cu on the GPU). These
# tests plant a NaN or an Inf in one element of a product's output, right after the product
# wrote it, and hold the watch's answer (the Seen, no replay) to that op and layer in every form
# of the walk; and that every row of every layer's gate and up passes a marked SwiGLU step.

from strata_prefill.fast import make_fast_engine  # noqa: E402
from strata_prefill.session import Session  # noqa: E402
from switch_needs import settled  # noqa: E402

WALK_PROMPT, WALK_CHUNK = 40, 32  # two units: 32 tokens (128 routed rows), then 8 (32 rows)
#: the walk's forms on the tiny pack (2 layers, top-4 of 16 experts): FastEngine switches, the
#: group size, and the walk every unit must have taken (None: every expert resident, no ring)
WALK_FORMS = {
    "device-plan": (dict(), 16, None),  # the sim holds every expert: one DeviceBatch, rows 0..n
    "host-batch": (dict(device_plan=0), 16, None),  # the resident Batch's row span
    "groups-of-3": (dict(in_place=0), 3, None),  # every expert gathered, SwiGLU a group at a time
    "per-expert-gathers": (dict(in_place=0, group_gather=0), 3, None),
    "two-launches": (dict(in_place=0, fuse_group=0), 16, None),  # swiglu_rows, then the quantize of H
    "staged-groups": (dict(expert_cache=4, ring=8, stream_min=40, stage_head=0, ring_in_place=0), 3, "staged"),
    "streamed-groups": (dict(expert_cache=4, ring=8, stream_min=1, ring_in_place=0), 3, "streamed"),
    "streamed-ring-runs": (dict(expert_cache=4, ring=8, stream_min=1, ring_run=2), 16, "streamed"),
    "staged-ring-runs": (dict(expert_cache=4, ring=8, stream_min=40, stage_head=3, ring_run=3), 16, "staged"),
    "window-of-both-chunks": (dict(expert_cache=4, ring=8, stream_min=1, window=64), 3, None),  # one unit
    # a predicted head first: a run's rows may span a later run's, not yet written when its SwiGLU
    # reads them; that step makes no mark and the layer's gate and up are marked after the walk
    "predicted-head-runs": (dict(expert_cache=4, ring=8, stream_min=40, stage_head=3, head_predict=1), 16,
                            "staged"),
}
#: the ops the engine marks with nonfinite_mark of their own
SEPARATE = {"q", "k", "v", "attn_out", "router_logits", "moe_out"}
KINDS = {"nan": np.float32(np.nan), "inf": np.float32(np.inf), "-inf": np.float32(-np.inf)}


def _planted_engine(pack, switches: dict, group_size: int, layer: int, target: str, value, seed: int,
                    backend: str = "sim"):
    """An engine whose `target` product ("gate" or "up": the routed experts' rows; "shexp gate"
    or "shexp up": the shared expert's) of `layer` gets `value` at one element (drawn once per
    buffer), put there on the compute stream (a sim step, a copy on the cuda backend's stream)
    after every product that writes the buffer, so that whichever product writes that row, the
    value is what the SwiGLU step reads. Also records every SwiGLU step's rows and mark and the
    ops of the separate marks (engine.marked_ops): (engine, planted list, steps list)."""
    eng = make_fast_engine(pack, backend, group_size=group_size,
                           **settled(pack, backend, **{"window": "off", **switches}))
    be, rng, at, planted, steps = eng.be, np.random.default_rng(seed), {}, [], []

    def plant(buf):
        if id(buf) not in at:  # `at` holds buf: no other buffer takes its id
            at[id(buf)] = (buf, int(rng.integers(buf.shape[0])), int(rng.integers(buf.shape[1])))
        _buf, r, c = at[id(buf)]
        if backend == "cuda":
            import pycuda.driver as cuda

            cuda.memcpy_htod_async(int(buf.gpudata) + 4 * (r * int(buf.shape[1]) + c), np.array([value], np.float32),
                                   be.dev.stream)
            planted.append((r, c))
            return

        def run():
            buf[r, c] = value
            planted.append((r, c))

        be._launch("plant", run)

    def routed(method):
        def wrapped(**kw):
            method(**kw)
            if kw["layer"] == layer and target in ("gate", "up"):
                plant(kw[target])
        return wrapped

    def dense_product(method):
        def wrapped(w, x):
            out = method(w, x)
            if target.startswith("shexp ") and w is getattr(eng.layer_weights(layer), f"ffn_{target.split()[1]}_shexp"):
                plant(out)
            return out
        return wrapped

    shared = []  # non-empty while the engine's shared_expert runs

    def recorded(method, fused: bool):
        def wrapped(*args, **kw):
            gate, up, r0, r1 = (kw["gate"], kw["up"], kw["r0"], kw["r1"]) if fused else args[:4]
            steps.append((bool(shared), gate, int(r0), int(r1), kw.get("mark")))
            return method(*args, **kw)
        return wrapped

    def in_shared(method):
        def wrapped(*args):
            shared.append(1)
            try:
                return method(*args)
            finally:
                shared.pop()
        return wrapped

    eng.shared_expert = in_shared(eng.shared_expert)
    mark = be.nonfinite_mark

    def marked(x, code):  # the separate marks' ops, in the unit's code (formats/nonfinite.py Watch.code)
        eng.marked_ops.add(OPS[code % len(OPS)].name)
        mark(x, code)

    eng.marked_ops, be.nonfinite_mark = set(), marked

    be.mmq_group_gate_up, be.mmq_batch_gate_up = routed(be.mmq_group_gate_up), routed(be.mmq_batch_gate_up)
    be.mmq_dense, be.float_dense = dense_product(be.mmq_dense), dense_product(be.float_dense)
    be.swiglu_rows, be.swiglu_quantize = recorded(be.swiglu_rows, False), recorded(be.swiglu_quantize, True)
    return eng, planted, steps


def _watch_of(eng, ids, dump_dir=None):
    """The run's watch answer (a Seen: no replay names a record); NumPy's warnings of the
    planted values kept quiet, as the command keeps them."""
    from strata_prefill.cli import quiet_floats

    s = Session(eng, chunk=WALK_CHUNK, progress=False, dump_dir=dump_dir, dump_level="ops" if dump_dir else None)
    s._name_nonfinite = lambda *a: None
    with quiet_floats():
        return s.run(ids, greedy=0).nonfinite


def _assert_every_row_marked(eng, steps) -> tuple[int, int]:
    """Every row of every layer's gate and up (each unit's buffers: T*K rows) passed a SwiGLU
    step that marked it under that layer's codes, but in the layers (of a unit) where a step
    made no mark; the shared expert's under its one code. Returns (the units the run took:
    chunks, or windows; the layers, of all units, where a step made no mark)."""
    cfg = eng.config
    by_buf: dict = {}
    for _shared, gate, r0, r1, mark in (s for s in steps if not s[0]):
        got = by_buf.setdefault(id(gate), [gate, None, set(), False])
        if mark is None:
            got[3] = True
            continue
        assert got[1] in (None, mark)
        got[1] = mark
        got[2].update(range(r0, r1))
    n_units, odd = divmod(len(by_buf), cfg.n_layer)
    assert n_units and not odd, len(by_buf)
    codes = {m for _g, m, _rows, _unmarked in by_buf.values() if m is not None}
    assert all(cg < cu for cg, cu in codes) and len(codes) <= n_units * cfg.n_layer
    for gate, _mark, rows, unmarked in by_buf.values():
        assert unmarked or rows == set(range(gate.shape[0])), \
            f"rows {sorted(set(range(gate.shape[0])) - rows)} never marked"
    shared = [s[1:] for s in steps if s[0]]
    assert len(shared) == (n_units * cfg.n_layer if cfg.has_shexp else 0)
    assert all(m is not None and m[0] == m[1] and (r0, r1) == (0, g.shape[0]) for g, r0, r1, m in shared)
    return n_units, sum(unmarked for *_x, unmarked in by_buf.values())


def _forms():
    out = []
    for i, (form, (switches, gs, walk)) in enumerate(WALK_FORMS.items()):
        for j, target in enumerate(("gate", "up")):
            kind = list(KINDS)[(2 * i + j) % len(KINDS)]
            out.append(pytest.param(form, target, kind, id=f"{form}-{target}-{kind}"))
    return out


BACKENDS = ["sim", pytest.param("cuda", marks=ON_CUDA.marks)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("form, target, kind", _forms())
def test_a_non_finite_gate_or_up_row_is_seen_in_every_walk_form(healthy, form, target, kind, backend):
    """A NaN or an Inf in one routed row of layer 1's gate or up (one NumPy quantize of H hides a
    NaN, an Inf reaches only moe_out): the watch names layer 1, that op, in the first unit, in
    every form of the walk, with no nonfinite_mark launch of its own for gate, up or shexp
    (the SwiGLU steps mark them); every row of every layer passes a marked SwiGLU step (a
    predicted head's layers: or are marked after the walk); the healthy run sees nothing."""
    switches, gs, walk = WALK_FORMS[form]
    pack = Pack.open(healthy[0])
    ids = np.random.default_rng(3).integers(0, pack.config.n_vocab, WALK_PROMPT).astype(np.int32)
    eng, planted, steps = _planted_engine(pack, switches, gs, 1, target, KINDS[kind], len(form), backend)
    assert _watch_of(eng, ids) == nonfinite.Seen(0, 1, target)
    assert planted, "nothing was planted"
    if walk is not None:
        assert {c.walk for c in eng.walk_choices} == {walk}
    n_units, unmarked = _assert_every_row_marked(eng, steps)
    assert n_units == (1 if form.startswith("window") else -(-WALK_PROMPT // WALK_CHUNK))
    if form.startswith("predicted"):  # the layers whose steps read unwritten rows: marked after the walk
        assert unmarked and eng.marked_ops == SEPARATE | {"gate", "up"}
    else:
        assert not unmarked and eng.marked_ops == SEPARATE  # no gate, up or shexp
    healthy_eng, _, _ = _planted_engine(pack, switches, gs, 1, "none", KINDS[kind], 0, backend)
    assert _watch_of(healthy_eng, ids) is None  # no mark of rows before their product wrote them


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("target", ["gate", "up", "shexp gate", "shexp up"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_the_first_of_gate_up_and_shexp_is_seen_and_a_healthy_run_sees_none(healthy, tmp_path, target, kind,
                                                                              backend):
    """The shared expert's gate or up: op shexp (one name for both); with the op records (H kept:
    SwiGLU and the quantize of H two steps) the same answer; a healthy run: nothing."""
    pack = Pack.open(healthy[0])
    ids = np.random.default_rng(4).integers(0, pack.config.n_vocab, WALK_PROMPT).astype(np.int32)
    want = nonfinite.Seen(0, 0, "shexp" if target.startswith("shexp") else target)
    eng, planted, _ = _planted_engine(pack, {}, 16, 0, target, KINDS[kind], 1, backend)
    assert _watch_of(eng, ids) == want and planted
    eng, planted, steps = _planted_engine(pack, dict(in_place=0, overlap_plan=0), 3, 0, target, KINDS[kind], 2,
                                          backend)
    assert _watch_of(eng, ids, dump_dir=tmp_path) == want and planted
    assert _assert_every_row_marked(eng, steps)[1] == 0
    eng, _, _ = _planted_engine(pack, {}, 16, 0, "none", KINDS[kind], 1, backend)
    assert _watch_of(eng, ids) is None


def test_gate_is_named_before_up_and_float_experts_are_marked_too(make_test_pack):
    """Both of a row's gate and up non-finite: gate (the record file's order). Float experts
    (BF16: float gate/up, H written as it is into down_in): the same marks, in place and gathered."""
    pack = make_test_pack("tiny", "BF16")
    ids = np.random.default_rng(5).integers(0, pack.config.n_vocab, WALK_PROMPT).astype(np.int32)
    for switches, gs in ((dict(), 16), (dict(in_place=0), 3)):
        for target in ("gate", "up"):
            eng, planted, steps = _planted_engine(pack, switches, gs, 1, target, np.float32(np.nan), seed=6)
            assert _watch_of(eng, ids) == nonfinite.Seen(0, 1, target) and planted
            assert _assert_every_row_marked(eng, steps)[1] == 0
    eng, planted, _ = _planted_engine(pack, {}, 16, 1, "up", np.float32(np.inf), seed=7)
    be, gate_up = eng.be, eng.be.mmq_batch_gate_up

    def both(**kw):  # the same element of gate non-finite as well, after every product
        gate_up(**kw)
        if kw["layer"] == 1:
            g, u = kw["gate"], kw["up"]
            be._launch("plant", lambda: np.copyto(g, np.where(np.isfinite(u), g, np.float32(np.nan))))

    be.mmq_batch_gate_up = both
    assert _watch_of(eng, ids) == nonfinite.Seen(0, 1, "gate") and planted


def _planted_rows(rng, R: int, n: int, r0: int, r1: int, where: str):
    """(gate, up) float32 [R, n], never zero (verify/kernel_inputs.around_clamp), every value of
    the rows before r0 and from r1 on NaN or Inf (what a step reading past its rows would see),
    and 1 to 3 elements of rows r0..r1 of gate, up or both ("none": neither) NaN or Inf, any kind."""
    from strata_prefill.verify.kernel_inputs import around_clamp

    g, u = around_clamp(rng, (R, n)), around_clamp(rng, (R, n))
    for x in (g, u):
        bits = x.view(np.uint32)
        for r in (*range(r0), *range(r1, R)):
            bits[r] = BITS[list(BITS)[int(rng.integers(len(BITS)))]]
        if where in ("both", "gate" if x is g else "up"):
            for _ in range(int(rng.integers(1, 4))):
                bits[int(rng.integers(r0, r1)), int(rng.integers(n))] = BITS[list(BITS)[int(rng.integers(len(BITS)))]]
    return g, u


@settings(max_examples=150, deadline=None)
@given(R=st.integers(1, 9), n=st.sampled_from([1, 3, 4, 33, 130]), rows=st.data(),
       where=st.sampled_from(["none", "gate", "up", "both"]), held=st.sampled_from(["nothing", "below", "between"]),
       fused=st.booleans(), oai=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_the_sim_swiglu_steps_mark_as_two_marks(R, n, rows, where, held, fused, oai, seed):
    """The sim's SwiGLU steps with a mark: the watch after them is what two nonfinite_mark steps
    over rows r0..r1 of gate and up leave (the smaller code wins, whatever the order of the
    codes; a code not below the watch's value changes nothing); rows outside r0..r1 are not
    read; H (or its q8_1 rows) the same bytes as without the mark."""
    from strata_prefill.contract import q8_1
    from strata_prefill.contract.moe import SwigluOai, glu
    from strata_prefill.fast import make_backend

    r0 = rows.draw(st.integers(0, R - 1))
    r1 = rows.draw(st.integers(r0 + 1, R))
    rng = np.random.default_rng(seed)
    g, u = _planted_rows(rng, R, n, r0, r1, where)
    codes = [int(c) for c in rng.choice(2**40, 2, replace=False)]
    start = {"nothing": nonfinite.NOTHING, "below": min(codes) - 1, "between": sum(codes) // 2}[held]
    want = nonfinite.mark(nonfinite.mark(start, g[r0:r1], codes[0]), u[r0:r1], codes[1])
    act = SwigluOai() if oai else None
    outs = []
    for mark in (tuple(codes), None):
        be = make_backend("sim")
        be.nonfinite_reset()
        if start != nonfinite.NOTHING:
            be.nonfinite_mark(np.array([np.nan], np.float32), start)
        with np.errstate(all="ignore"):
            if fused:
                out = be.alloc_q8(R + 2, n)
                be.swiglu_quantize(gate=g, up=u, r0=r0, r1=r1, layout=q8_1.Layout(seed % len(q8_1.Layout)), out=out,
                                   row0=1, n_rows_total=R + 2, act=act, mark=mark)
            else:
                out = be.swiglu_rows(g, u, r0, r1, act=act, mark=mark)
            assert be.nonfinite_first() == (want if mark else start)  # waits for the steps
        outs.append(np.array(out.data if fused else out, copy=True).view(np.uint8))
    assert np.array_equal(outs[0], outs[1])
    if not fused:
        with np.errstate(all="ignore"):
            assert np.array_equal(outs[0].view(np.uint32), glu(g[r0:r1], u[r0:r1], act).view(np.uint32))


@pytest.mark.skipif(not _CUDA, reason=f"cuda backend unavailable: {_WHY}")
def test_the_swiglu_kernels_mark_as_nonfinite_mark_does():
    """swiglu.cu (swiglu_rows, swiglu_oai_rows, with and without the expert biases) and
    swiglu_q8_1.cu (swiglu_q8_1_mark, swiglu_oai_q8_1_mark, every layout) with a mark, against
    two nonfinite.cu launches over rows r0..r1 of gate and up: `first` byte for byte (and
    formats/nonfinite.py's mark of the host rows), over random shapes (n past a 128-value block:
    the padding; n not a multiple of 4: unaligned rows), NaN or Inf of every kind at random
    elements of those rows of gate, up, both or neither, every value of the other rows NaN or
    Inf (a kernel reading past its rows or into the padding would mark), values never zero,
    codes in either order, a value held below, between or above them; a NaN in a bias marks
    nothing (the mark tests gate and up as read). The output bytes (a poisoned q8_1 buffer's,
    other rows included) the same as the unmarked kernels'; one launch, counted as before."""
    from pycuda import gpuarray

    from strata_prefill.contract import q8_1
    from strata_prefill.contract.moe import SwigluOai
    from strata_prefill.fast.cuda import elementwise as cu_ew, products, runtime
    from strata_prefill.verify.kernel_inputs import around_clamp

    dev = runtime.Device()
    rng = np.random.default_rng(29)
    forms = ("rows", "rows-oai", "rows-oai-bias", "q8", "q8-oai", "q8-oai-bias")
    for case in range(240):
        form = forms[case % len(forms)]
        n = int(rng.choice([1, 3, 4, 33, 128, 130, 257, 640, 2880]))
        R = int(rng.integers(1, 14))
        r0 = int(rng.integers(0, R))
        r1 = int(rng.integers(r0 + 1, R + 1))
        where = ("none", "gate", "up", "both")[int(rng.integers(4))]
        g, u = _planted_rows(rng, R, n, r0, r1, where)
        gflat, uflat = gpuarray.to_gpu(g.reshape(-1)), gpuarray.to_gpu(u.reshape(-1))
        gd, ud = gflat.reshape(R, n), uflat.reshape(R, n)
        codes = [int(c) for c in rng.choice(2**62, 2, replace=False)]
        start = (nonfinite.NOTHING, min(codes) - 1, sum(codes) // 2, max(codes) + 1)[int(rng.integers(4))]
        act = SwigluOai() if "oai" in form else None
        bias = None
        if form.endswith("bias"):
            E = 5
            bg, bu = around_clamp(rng, (E, n)), around_clamp(rng, (E, n))
            if rng.random() < 0.3:
                bg[int(rng.integers(E)), int(rng.integers(n))] = np.nan
            rexp = rng.integers(0, E, R).astype(np.int32)
            bias = (gpuarray.to_gpu(rexp), gpuarray.to_gpu(bg), gpuarray.to_gpu(bu))
        what = (case, form, n, R, r0, r1, where, start, codes)

        two = gpuarray.to_gpu(np.array([start], np.uint64))
        cu_ew.nonfinite_mark(dev, gflat[r0 * n:r1 * n], two, codes[0])
        cu_ew.nonfinite_mark(dev, uflat[r0 * n:r1 * n], two, codes[1])
        one = gpuarray.to_gpu(np.array([start], np.uint64))
        mark = (one, codes[0], codes[1])
        if form.startswith("rows"):
            before = dev.counters["swiglu"]
            got = cu_ew.swiglu(dev, gd, ud, r0=r0, r1=r1, act=act, expert_bias=bias, mark=mark).get()
            assert dev.counters["swiglu"] == before + 1
            plain = cu_ew.swiglu(dev, gd, ud, r0=r0, r1=r1, act=act, expert_bias=bias).get()
            assert np.array_equal(got.view(np.uint32), plain.view(np.uint32)), what
        else:
            layout = list(q8_1.Layout)[int(rng.integers(len(q8_1.Layout)))]
            R_total = (r1 - r0) + int(rng.integers(0, 3))
            row0 = int(rng.integers(0, R_total - (r1 - r0) + 1))
            nbytes = q8_1.buffer_nbytes(R_total, n)
            bufs = [gpuarray.to_gpu(np.full(nbytes, 0xA5, np.uint8)) for _ in range(2)]
            kw = dict(r0=r0, r1=r1, layout=layout, row0=row0, R_total=R_total, act=act, expert_bias=bias)
            name = "swiglu_oai_q8_1" if act else "swiglu_q8_1"
            before = dev.counters[name]
            products.swiglu_quantize(dev, gd, ud, out=bufs[0], mark=mark, **kw)  # the kernel that marks
            assert dev.counters[name] == before + 1
            products.swiglu_quantize(dev, gd, ud, out=bufs[1], **kw)  # the plain kernel
            got, plain = (b.get() for b in bufs)
            assert np.array_equal(got, plain), what
        want = nonfinite.mark(nonfinite.mark(start, g[r0:r1], codes[0]), u[r0:r1], codes[1])
        assert one.get().tobytes() == two.get().tobytes(), (what, int(one.get()[0]), int(two.get()[0]))
        assert int(one.get()[0]) == want, what
