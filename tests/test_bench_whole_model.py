"""bench/bench_whole_model.py and its llama.cpp driver (bench/llama_cpp/prefill_driver.c) on the
CPU: the prompt files, the build's configure line, our arms' rows and the floor, the table, the
refusals before any work; and, against a CPU build of llama.cpp, the driver compiled and run on
a `small` pack (its logits against the NumPy reference's on the same ids, its refusals of bad
prompt files) and the whole script end to end.

Building llama.cpp takes over 5 minutes on a 2-core machine, more than this suite's budget, so
the build tests use a build that is there: STRATA_LLAMA_BUILD=DIR (a cmake build folder of the
`llama` target, e.g. `/tmp/strata-llama/build-cpu` as `bench_whole_model.py --llama-backend cpu`
leaves it), else that default folder where it holds a build; otherwise they skip saying so."""
import gzip
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BUILD = Path("/tmp/strata-llama/build-cpu")


@pytest.fixture(scope="module")
def bwm():
    from bench import bench_whole_model  # nothing imports PyCUDA until our arms run

    return bench_whole_model


def run_script(*args, cwd=ROOT, env=None):
    return subprocess.run([sys.executable, "-m", "bench.bench_whole_model", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, env=env)


# ---------------------------------------------------------------------------------------
# Pure parts


def test_prompt_file_layout_byte_for_byte(bwm, tmp_path):
    rng = np.random.default_rng(7)
    ids = rng.integers(0, 151936, size=(4, 333), dtype=np.int32)
    path = tmp_path / "p.bin"
    bwm.write_prompts(path, ids)
    raw = path.read_bytes()
    assert raw[:8] == b"STPROMPT"
    assert int.from_bytes(raw[8:12], "little") == 4 and int.from_bytes(raw[12:16], "little") == 333
    assert len(raw) == 16 + 4 * ids.size
    for k in rng.integers(0, ids.size, 20):  # each id little-endian int32 in row-major order
        k = int(k)
        assert int.from_bytes(raw[16 + 4 * k:20 + 4 * k], "little", signed=True) == ids.ravel()[k]
    assert np.array_equal(bwm.read_prompts(path), ids)


def test_draw_prompts_warm_up_then_reps_seeded(bwm):
    a = bwm.draw_prompts([5, 1030], 3, 2048, seed=1)
    assert list(a) == [5, 1030] and a[5].shape == (4, 5) and a[1030].shape == (4, 1030)
    assert a[1030].min() >= 0 and a[1030].max() < 2048 and a[1030].dtype == np.int32
    assert len({row.tobytes() for row in a[1030]}) == 4  # fresh prompts
    b = bwm.draw_prompts([5, 1030], 3, 2048, seed=1)
    assert all(np.array_equal(a[n], b[n]) for n in a)
    assert not np.array_equal(a[1030], bwm.draw_prompts([5, 1030], 3, 2048, seed=2)[1030])
    assert np.array_equal(bwm.draw_prompts([1030], 3, 2048, seed=1)[1030], a[1030])  # whatever else runs


def test_cmake_args_are_the_peers_line(bwm):
    """The peers README's configure line: the library alone, shared, no downloads; sm_90 with
    flash attention for F16 only where CUDA is on."""
    cuda = bwm.llama_cmake_args(Path("/s"), Path("/b"), True, "Ninja")
    assert cuda[:5] == ["cmake", "-S", "/s", "-B", "/b"] and cuda[-2:] == ["-G", "Ninja"]
    for flag in ("-DCMAKE_BUILD_TYPE=Release", "-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=90",
                 "-DGGML_CUDA_FA_ALL_QUANTS=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                 "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_TOOLS=OFF", "-DLLAMA_BUILD_SERVER=OFF",
                 "-DLLAMA_BUILD_APP=OFF", "-DBUILD_SHARED_LIBS=ON", "-DLLAMA_OPENSSL=OFF"):
        assert flag in cuda, flag
    cpu = bwm.llama_cmake_args(Path("/s"), Path("/b"), False, None)
    assert "-DGGML_CUDA=OFF" in cpu and not any("CUDA_ARCH" in a for a in cpu) and "-G" not in cpu


def test_ours_row_and_the_floor_by_hand(bwm):
    reps = [{"host_s": h, "event_s": e, "copy_bytes": 5_530_000_000, "copy_busy_s": b}
            for h, e, b in ((0.30, 0.25, 0.08), (0.20, 0.15, 0.10), (0.40, 0.35, 0.09))]
    row = bwm.ours_row(1030, reps, resident_event_s=0.05)
    assert row["median_s"] == pytest.approx(0.30) and row["tokens_per_s"] == pytest.approx(1030 / 0.30)
    assert row["event_median_s"] == pytest.approx(0.25) and row["copy_busy_s"] == pytest.approx(0.09)
    assert row["floor_s"] == pytest.approx(0.1)  # 5.53 GB at 55.3 GB/s beats the 0.05 s resident time
    assert row["vs_floor"] == pytest.approx(2.5)
    assert bwm.ours_row(1030, reps, resident_event_s=0.2)["vs_floor"] == pytest.approx(0.25 / 0.2)
    assert "vs_floor" not in bwm.ours_row(1030, reps, None)


def test_logits_agreement_by_hand(bwm):
    rng = np.random.default_rng(3)
    ours = rng.normal(size=1000).astype(np.float32)
    assert bwm.logits_agreement(ours, ours) == {"rel_l2": 0.0, "top1_same": True}
    theirs = ours.copy()
    theirs[int(np.argmin(ours))] = ours.max() + 1  # a new top token, far off
    got = bwm.logits_agreement(theirs, ours)
    want = abs(ours.max() + 1 - ours.min()) / np.linalg.norm(ours.astype(np.float64))
    assert not got["top1_same"] and got["rel_l2"] == pytest.approx(want, rel=1e-6)


def _results(rows):
    setup = {"pack_name": "qwen3-30b-a3b --mix Q4_K_M", "layers": 48, "experts": 128, "top_k": 8,
             "device": "NVIDIA H100 80GB HBM3", "reps": 3, "cache": 2048, "n_experts_all": 6144, "link_gbs": 55.3}
    return {"setup": setup, "rows": rows}


def test_format_table_rows_ratios_and_gaps(bwm):
    def arm(tps, **kw):
        return {"tokens_per_s": tps, **kw}

    rows = [{"tokens": 1030, "arms": {"ours-resident": arm(8000.0), "llama-resident": arm(12000.0),
                                      "ours-streamed": arm(4000.0, vs_floor=1.274),
                                      "llama-host-experts": arm(500.0)},
             "logits_vs_llama": {"rel_l2": 0.0212, "top1_same": True}},
            {"tokens": 32768, "arms": {"llama-resident": arm(5000.0)},
             "logits_vs_llama": {"rel_l2": 0.5, "top1_same": False}}]
    table = bwm.format_table(_results(rows)).splitlines()
    assert table[0].startswith("qwen3-30b-a3b --mix Q4_K_M: 48 layers x 128 experts (top-8), NVIDIA H100")
    assert "cache 2,048 of 6,144" in table[0] and "--n-cpu-moe 48" in table[0]
    assert table[2].startswith("| prompt tokens | ours resident | llama.cpp resident | ours / llama.cpp |")
    assert table[4] == "| 1,030 | 8,000 | 12,000 | 0.67x | 4,000 | 1.27x | 500 | 8.00x | 0.021 |"
    assert table[5] == "| 32,768 | - | 5,000 | - | - | - | - | - | 0.500 (top-1 differs) |"
    assert len(table) == 6
    rows[1]["arms"]["llama-host-experts-pinned"] = arm(1000.0)  # its columns where some row holds it
    table = bwm.format_table(_results(rows)).splitlines()
    assert table[0].endswith("--n-cpu-moe 48 (pinned: --load-mode none)")
    assert table[2].endswith("| llama.cpp host experts pinned | streamed / pinned | logits vs llama.cpp |")
    assert table[3] == "|---" * 11 + "|"
    assert table[4] == "| 1,030 | 8,000 | 12,000 | 0.67x | 4,000 | 1.27x | 500 | 8.00x | - | - | 0.021 |"
    assert table[5] == "| 32,768 | - | 5,000 | - | - | - | - | - | 1,000 | - | 0.500 (top-1 differs) |"


def _tgz(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


@pytest.mark.parametrize("case", ["tokens", "arms", "reps", "no-tgz", "missing-tgz", "not-gzip", "not-llama",
                                  "shared-expert", "context", "not-a-build", "cache-share", "layers-vs-pack"])
def test_bad_arguments_refused_before_any_work(bwm, case, tmp_path, small_pack, capsys):
    root = tmp_path / "root"
    tgz = _tgz(tmp_path / "l.tgz", {"llama.cpp/CMakeLists.txt": b"project(x)\n"})
    other = _tgz(tmp_path / "o.tgz", {"other/CMakeLists.txt": b"project(x)\n"})
    (tmp_path / "plain.tgz").write_bytes(gzip.compress(b"x")[:5] + b"not gzip")
    base = ["--build-root", root, "--out", tmp_path / "out"]
    args, want = {
        "tokens": (["--llama-tgz", tgz, "--tokens", "1030,0"], "--tokens '1030,0': distinct prompt lengths"),
        "arms": (["--llama-tgz", tgz, "--arms", "ours-resident,llama-cpu"], "unknown arm(s) llama-cpu"),
        "reps": (["--llama-tgz", tgz, "--reps", "0"], "--reps 0: at least 1"),
        "no-tgz": ([], "the llama.cpp arms need --llama-tgz TGZ"),
        "missing-tgz": (["--llama-tgz", tmp_path / "none.tgz"], "none.tgz: no such file"),
        "not-gzip": (["--llama-tgz", tmp_path / "plain.tgz"], "not a readable tar.gz"),
        "not-llama": (["--llama-tgz", other], "holds no llama.cpp/CMakeLists.txt"),
        "shared-expert": (["--llama-tgz", tgz, "--preset", "tiny"], "--preset tiny: has a shared expert"),
        "context": (["--llama-tgz", tgz, "--tokens", "32769"], "32,769 is past the pack's context of 32,768"),
        "not-a-build": (["--llama-build", tmp_path], "is not a cmake build folder"),
        "cache-share": (["--arms", "ours-streamed", "--cache-share", "1"], "--cache-share 1.0: between 0 and 1"),
        "layers-vs-pack": (["--llama-tgz", tgz, "--pack", small_pack, "--layers", "3"],
                           f"--layers 3: the pack {small_pack} there has 2"),
    }[case]
    with pytest.raises(SystemExit) as exc:
        bwm.main([str(a) for a in base + args])
    out, err = capsys.readouterr()
    assert exc.value.code == 2, out + err
    last = err.strip().splitlines()[-1]
    assert last.startswith("bench_whole_model.py: error: ") and want in last, last
    assert not root.exists() and not (tmp_path / "out").exists() and out == ""


def test_a_preset_with_its_own_expert_type_takes_no_mix(bwm, tmp_path):
    """gpt-oss's presets: the made pack keeps make-pack's MXFP4 experts (no mix, `own` in its
    name); qwen3's keeps the Q4_K_M default; --mix none asks for make-pack's own types anywhere."""
    assert bwm.default_mix("gpt-oss-20b") is None and bwm.default_mix("gpt-oss-tiny") is None
    assert bwm.default_mix("qwen3-30b-a3b") == bwm.DEFAULT_MIX == "Q4_K_M"
    from strata_prefill.formats.pack import Pack

    root = tmp_path / "root"
    got = run_script("--preset", "gpt-oss-tiny", "--arms", "ours-resident", "--tokens", "64", "--reps", "1",
                     "--layers", "1", "--build-root", root, "--out", tmp_path / "out")
    assert got.returncode == 0, got.stderr
    pack = Pack.open(root / "gpt-oss-tiny-own-1.gguf")
    assert pack.config.arch == "gpt-oss" and pack.config.n_layer == 1
    assert pack.expert_types(0) == (bwm_qt("MXFP4"), bwm_qt("MXFP4")) and pack.field("strata.mix") is None
    got = run_script("--preset", "tiny", "--mix", "none", "--arms", "ours-resident", "--tokens", "64", "--reps", "1",
                     "--layers", "1", "--build-root", root, "--out", tmp_path / "out2")
    assert got.returncode == 0, got.stderr
    assert Pack.open(root / "tiny-own-1.gguf").expert_types(0) == (bwm_qt("Q8_0"), bwm_qt("Q8_0"))


def bwm_qt(name: str):
    from gguf import GGMLQuantizationType

    return GGMLQuantizationType[name]


# ---------------------------------------------------------------------------------------
# Against a CPU build of llama.cpp


@pytest.fixture(scope="module")
def llama_build(bwm):
    """(build folder, source folder, library folder) of a llama.cpp build, or skip saying why."""
    given = os.environ.get("STRATA_LLAMA_BUILD")
    build = Path(given) if given else DEFAULT_BUILD
    try:
        src, lib = bwm.build_paths(build)
    except ValueError as e:
        if given:  # asked for and broken: say so, do not skip
            pytest.fail(f"STRATA_LLAMA_BUILD={given}: {e}")
        pytest.skip("no llama.cpp build: building one takes over 5 minutes on 2 cores, past this suite's budget "
                    f"(set STRATA_LLAMA_BUILD to a cmake build folder of the `llama` target, or leave one in "
                    f"{DEFAULT_BUILD}: python3 -m bench.bench_whole_model --llama-tgz TGZ --llama-backend cpu)")
    if not bwm.c_compiler():
        pytest.skip("no C compiler (cc, gcc or $CC) to build the driver")
    return build, src, lib


@pytest.fixture(scope="module")
def driver(bwm, llama_build, tmp_path_factory):
    _, src, lib = llama_build
    return bwm.compile_driver(src, lib, tmp_path_factory.mktemp("driver") / "prefill_driver")


@pytest.fixture(scope="module")
def small_pack(tmp_path_factory):
    """A 2-layer `small` pack with llama-quantize's Q4_K_M mix: no shared expert, which
    llama.cpp's qwen3moe would not load."""
    from strata_prefill.formats.make_pack import make_pack

    path = tmp_path_factory.mktemp("pack") / "small2.gguf"
    make_pack(path, "small", layers=2, mix="Q4_K_M", progress=False, seed=11)
    return path


def _driver(driver, *args):
    return subprocess.run([str(driver), *map(str, args), "--threads", "2"], capture_output=True, text=True)


def test_driver_logits_match_the_reference(bwm, driver, small_pack, tmp_path):
    """llama.cpp's logits for the last prompt of each file against the NumPy reference's on the
    same ids: within 10% relative L2 and the same top token (2% when written; a prompt fed at
    wrong positions or with other ids is about 120% off), resident and with the experts in host
    memory (memory-mapped, and read in); the timed rows say what ran."""
    from strata_prefill.reference import ReferenceEngine
    from strata_prefill.formats.pack import Pack
    from strata_prefill.session import Session

    pack = Pack.open(small_pack)
    prompts = bwm.draw_prompts([37, 100], 2, pack.config.n_vocab, seed=5)
    files = []
    for n, ids in prompts.items():
        files.append(tmp_path / f"prompts-{n}.bin")
        bwm.write_prompts(files[-1], ids)
    ref = {n: Session(ReferenceEngine(pack), progress=False).prefill(ids[-1]) for n, ids in prompts.items()}
    for host, load_mode in ((None, "auto"), ("2", "auto"), ("all", "none")):
        out = tmp_path / f"logits-{host}"
        out.mkdir()
        res = _driver(driver, small_pack, *files, "--logits-dir", out, "--load-mode", load_mode,
                      *(["--host-experts", host] if host else []))
        assert res.returncode == 0, res.stderr
        lines = [json.loads(x) for x in res.stdout.splitlines()]
        assert lines[0]["n_layer"] == 2 and lines[0]["n_vocab"] == pack.config.n_vocab
        assert lines[0]["host_experts"] == {None: 0, "2": 2, "all": "all"}[host]
        assert lines[0]["load_mode"] == load_mode
        assert [r["tokens"] for r in lines[1:]] == [37, 100]
        for r in lines[1:]:
            assert len(r["times_s"]) == 2 and r["median_s"] > 0 and r["n_batch"] == r["tokens"]
            assert r["n_ubatch"] == r["tokens"] and r["flash_attn"] == "enabled" and r["n_ctx"] >= r["tokens"]
            assert r["tokens_per_s"] == pytest.approx(r["tokens"] / r["median_s"], rel=1e-3)
        for n in prompts:
            got = bwm.logits_agreement(np.fromfile(out / f"logits-{n}.f32", dtype="<f4"), ref[n])
            assert got["top1_same"] and got["rel_l2"] < 0.1, (host, n, got)


@pytest.mark.parametrize("case", ["magic", "short", "one-prompt", "vocab"])
def test_driver_refuses_bad_prompt_files(bwm, driver, small_pack, tmp_path, case):
    path = tmp_path / "p.bin"
    ids = np.random.default_rng(1).integers(0, 2048, size=(3, 20), dtype=np.int32)
    if case == "vocab":
        ids[1, 7] = 2048  # one past the small preset's vocabulary
    bwm.write_prompts(path, ids[:1] if case == "one-prompt" else ids)
    raw = path.read_bytes()
    if case == "magic":
        path.write_bytes(b"STPROMPX" + raw[8:])
    elif case == "short":
        path.write_bytes(raw[:-4])
    res = _driver(driver, small_pack, path)
    want = {"magic": "is not a prompt file", "short": "size does not match 3 prompts of 20 tokens",
            "one-prompt": "needs a warm-up and at least one timed prompt",
            "vocab": "token id 2048 outside the model's vocabulary of 2048"}[case]
    assert res.returncode == 2
    errors = [x for x in res.stderr.splitlines() if x.startswith("prefill_driver: error:")]
    assert len(errors) == 1 and want in errors[0], res.stderr
    assert all("tokens" not in json.loads(x) for x in res.stdout.splitlines())  # nothing timed


def test_the_script_end_to_end_on_the_cpu(bwm, llama_build, small_pack, tmp_path):
    """bench_whole_model.py on a built llama.cpp: both llama.cpp arms at two lengths, our arms
    (skipped in one line without a GPU), the JSON and the table; a second call with --resume
    measures nothing again."""
    from strata_prefill.fast.cuda import runtime

    build, _, _ = llama_build
    args = ["--llama-build", build, "--pack", small_pack, "--tokens", "40,90", "--reps", "2", "--threads", "2",
            "--build-root", tmp_path / "root", "--out", tmp_path / "out", "--resume"]
    res = run_script(*args)
    assert res.returncode == 0, res.stdout + res.stderr
    results = json.loads((tmp_path / "out" / "whole_model.json").read_text())
    assert results["setup"]["layers"] == 2 and results["setup"]["llama_backend"] in ("cpu", "cuda")
    assert [r["tokens"] for r in results["rows"]] == [40, 90]
    for row in results["rows"]:
        for arm in ("llama-resident", "llama-host-experts"):
            r = row["arms"][arm]
            assert r["tokens"] == row["tokens"] and len(r["times_s"]) == 2 and r["tokens_per_s"] > 0
    cuda, why = runtime.cuda_available()
    if not cuda:
        assert f"bench_whole_model.py: CUDA backend unavailable: {why}" in res.stdout
        assert all(set(r["arms"]) == {"llama-resident", "llama-host-experts"} for r in results["rows"])
    table = (tmp_path / "out" / "whole_model.md").read_text().strip()
    assert res.stdout.rstrip().endswith(table)
    lines = table.splitlines()
    assert lines[-2].startswith("| 40 | ") and lines[-1].startswith("| 90 | ")
    again = run_script(*args)
    assert again.returncode == 0, again.stderr
    assert "--resume: 4 arm-lengths kept" in again.stdout or cuda
    assert "llama-resident: " not in again.stdout  # nothing measured twice
    assert again.stdout.rstrip().endswith(table)
