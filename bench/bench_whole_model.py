#!/usr/bin/env python3
"""The whole model beside llama.cpp: one pack, one set of prompts, our fast path and llama.cpp's
prefill timed the same way in one call.

    python3 -m bench.bench_whole_model --llama-tgz ../shared/peers/llama.cpp-0.3.36-vendored.tgz
        [--layers 48] [--tokens 1030,2048,8192,32768] [--reps 3] [--out DIR] [--resume]
        [--arms ours-resident,ours-streamed,llama-resident,llama-host-experts]

What it does, in order:

1. Checks every argument (exit 2 with one line), then starts building llama.cpp's `llama` library
   from the vendored source tgz in the background: unpacked under `--build-root` (default
   /tmp/strata-llama; a build there from the same tgz and options is reused), configured as
   `llama_cmake_args` says (the peers README's line: CUDA for sm_90 where this machine has a CUDA
   device, else `GGML_CUDA=OFF`), log in OUT/llama_build.log. `--llama-build DIR` takes a finished
   build instead.
2. Makes the pack while that builds: `make-pack --preset qwen3-30b-a3b --mix Q4_K_M [--layers N]`
   at `--pack` (default under the build root, named by preset, mix and layers); a pack already
   there is used as it is. llama.cpp's qwen3moe has no shared expert, so a pack with one is
   refused. A preset whose make-pack default has its own expert type (`--preset gpt-oss-20b`:
   MXFP4 experts, as the released model's) takes no mix unless `--mix` names one.
3. Compiles the driver (bench/llama_cpp/prefill_driver.c) against the built library.
4. Draws the prompts: for each length a warm-up and `--reps` timed prompts of random ids (seeded),
   the same ids for every arm.
5. llama.cpp, one driver process per arm, every layer on the GPU, flash attention, F16 KV cache,
   n_ubatch 2048, n_batch the prompt: `llama-resident` (every tensor in VRAM) and
   `llama-host-experts` (the expert tensors of every layer in host memory, as `--n-cpu-moe`
   puts them, in the memory-mapped file's pageable pages; llama.cpp copies them to the GPU for
   each ubatch); `llama-host-experts-pinned` where --arms names it (the same read into
   page-locked buffers: `--load-mode none`). They run first: our process keeps its device memory
   until it exits.
6. Our fast path (needs PyCUDA and a GPU; without one these arms skip with one line, as the other
   GPU bench scripts do): `ours-resident` (every expert in the expert cache) and `ours-streamed`
   (a cache of `--cache-share` of the experts, the rest streamed from page-locked host memory,
   the defaults otherwise), interleaved on each prompt as bench/bench_streaming_cuda.py runs its
   arms, the streamed first-token logits checked byte for byte against the resident ones.

Timing, the same on both sides: one untimed warm-up prompt per arm and length, then each timed
prompt on an empty KV cache (llama.cpp: `llama_memory_clear`, ours: a fresh cache), the host's
clock from handing over the ids to holding the last token's logits on the host; the median of
the reps; tokens/s = prompt tokens / median. The streamed arm's floor is bench_streaming_cuda's:
max(the resident time, its bytes copied / 55.3 GB/s) on CUDA-event times (`vs floor`).
llama.cpp's last-prompt logits are compared with ours on the same ids (relative L2 distance and
whether the top token agrees): a check that both ran the same model, not a numerics contract.

Writes OUT/whole_model.json after each arm and length (partial results survive a time limit)
and OUT/whole_model.md, and prints the Markdown table last. OUT: --out, else $OUT, else
./gpu-logs. With --resume, a second call on the same machine (the same build root, pack, tree and
settings) keeps what the first measured and measures the rest: for a machine that limits a
command's time.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np

from strata_prefill.formats import atomic
from strata_prefill.formats.config import PRESETS
from strata_prefill.formats.mixes import MIXES

ROOT = Path(__file__).resolve().parents[1]

ARMS = ("ours-resident", "ours-streamed", "llama-resident", "llama-host-experts", "llama-host-experts-pinned")
DEFAULT_ARMS = ARMS[:4]
#: llama.cpp's arms: (experts in host memory, the driver's --load-mode). Memory-mapped (llama.cpp's
#: default) the host experts stay in the file's pageable pages; `none` reads them into CUDA's
#: page-locked host buffers, as llama.cpp's loader recommends beside CPU overrides
LLAMA_ARMS = {"llama-resident": (False, "auto"), "llama-host-experts": (True, "auto"),
              "llama-host-experts-pinned": (True, "none")}
DEFAULT_TOKENS = "1030,2048,8192,32768"  # 1K is 1,030: the streaming benchmarks' length
DRIVER_SRC = ROOT / "bench" / "llama_cpp" / "prefill_driver.c"
PROMPT_MAGIC = b"STPROMPT"
UBATCH = 2048
TGZ_TOP = "llama.cpp"  # the vendored tgz unpacks to this folder
STAMP = ".strata-build.json"  # in the build folder: what it was built from
PROG = "bench_whole_model.py"
DEFAULT_MIX = "Q4_K_M"
NO_MIX = "none"  # --mix none: make-pack's own types (the preset's expert type, Q8_0 dense)


def default_mix(preset: str) -> str | None:
    """The mix a made pack of `preset` takes without --mix: DEFAULT_MIX, or none where make-pack
    writes the preset's experts in a type of their own (gpt-oss's MXFP4, as released)."""
    from strata_prefill.formats.make_pack import PRESET_EXPERT_TYPE

    return None if preset in PRESET_EXPERT_TYPE else DEFAULT_MIX


def log(*a) -> None:
    print(*a, flush=True)


# ---------------------------------------------------------------------------------------
# Prompts: one file per length, read by the driver and by our side


def draw_prompts(tokens: list[int], reps: int, n_vocab: int, seed: int = 0) -> dict[int, np.ndarray]:
    """Per prompt length, (1 + reps, length) int32 ids: the warm-up, then the timed prompts;
    uniform over the vocabulary, from a generator of (seed, length) alone, so a length's prompts
    are the same whichever other lengths a call runs (--resume compares llama.cpp's logits of
    one call with ours of another)."""
    return {n: np.random.default_rng([seed, n]).integers(0, n_vocab, size=(1 + reps, n), dtype=np.int32)
            for n in tokens}


def write_prompts(path: Path, prompts: np.ndarray) -> None:
    """The driver's prompt file (bench/llama_cpp/prefill_driver.c): STPROMPT, the prompt count
    and tokens per prompt as little-endian uint32, then the ids as little-endian int32."""
    p, n = prompts.shape
    head = PROMPT_MAGIC + np.array([p, n], dtype="<u4").tobytes()
    atomic.write_bytes(path, head + np.ascontiguousarray(prompts, dtype="<i4").tobytes())


def read_prompts(path: Path) -> np.ndarray:
    raw = Path(path).read_bytes()
    if raw[:8] != PROMPT_MAGIC:
        raise ValueError(f"{path}: not a prompt file")
    p, n = np.frombuffer(raw[8:16], dtype="<u4")
    return np.frombuffer(raw[16:], dtype="<i4").reshape(int(p), int(n))


# ---------------------------------------------------------------------------------------
# llama.cpp: build and driver


def llama_cmake_args(src: Path, build: Path, cuda: bool, generator: str | None) -> list[str]:
    """The configure command of the peers README: the `llama` library only, shared, no
    downloads; CUDA for sm_90 (flash attention for F16 only) or none."""
    args = ["cmake", "-S", str(src), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
            f"-DGGML_CUDA={'ON' if cuda else 'OFF'}", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_TOOLS=OFF", "-DLLAMA_BUILD_SERVER=OFF",
            "-DLLAMA_BUILD_APP=OFF", "-DBUILD_SHARED_LIBS=ON", "-DLLAMA_OPENSSL=OFF"]
    if cuda:
        args += ["-DCMAKE_CUDA_ARCHITECTURES=90", "-DGGML_CUDA_FA_ALL_QUANTS=OFF"]
    if generator:
        args += ["-G", generator]
    return args


def tgz_problem(path: Path) -> str | None:
    """Why `path` is not the vendored llama.cpp source tgz, or None (read before any work)."""
    if not path.is_file():
        return f"--llama-tgz {path}: no such file"
    try:
        with tarfile.open(path, "r:gz") as tf:
            tf.getmember(f"{TGZ_TOP}/CMakeLists.txt")
    except (tarfile.TarError, OSError, EOFError) as e:
        return f"--llama-tgz {path}: not a readable tar.gz ({e})"
    except KeyError:
        return f"--llama-tgz {path}: holds no {TGZ_TOP}/CMakeLists.txt (not llama.cpp's source)"
    return None


def build_paths(build: Path) -> tuple[Path, Path]:
    """(source folder, folder of libllama) of a finished cmake build of llama.cpp, read from its
    CMakeCache.txt; ValueError saying what is missing."""
    cache = build / "CMakeCache.txt"
    if not cache.is_file():
        raise ValueError(f"{build} is not a cmake build folder (no CMakeCache.txt)")
    src = None
    for line in cache.read_text(errors="replace").splitlines():
        if line.startswith("CMAKE_HOME_DIRECTORY:"):
            src = Path(line.split("=", 1)[1])
    if src is None or not (src / "include" / "llama.h").is_file():
        raise ValueError(f"{build}: its source folder ({src}) has no include/llama.h")
    for lib in (build / "bin", build / "src", build):
        if any(lib.glob("libllama.so*")) or any(lib.glob("libllama.dylib")):
            return src, lib
    raise ValueError(f"{build}: no libllama.so (build the `llama` target)")


def start_build(tgz: Path, root: Path, cuda: bool, jobs: int, log_path: Path) -> tuple[subprocess.Popen | None, Path]:
    """Unpacks the tgz under root (unless the same tgz is there already) and starts configuring
    and building the `llama` target in the background, its output in log_path: (the process,
    or None where the build folder is up to date already, and the build folder)."""
    digest = hashlib.sha256(tgz.read_bytes()).hexdigest()
    src = root / TGZ_TOP
    build = root / ("build-cuda" if cuda else "build-cpu")
    generator = "Ninja" if shutil.which("ninja") else None
    configure = llama_cmake_args(src, build, cuda, generator)
    want = {"tgz_sha256": digest, "configure": configure[5:]}  # the paths aside
    stamp = build / STAMP
    try:
        have = json.loads(stamp.read_text())
    except (OSError, ValueError):
        have = None
    if have == want:
        try:
            build_paths(build)
            log(f"llama.cpp: reusing the build in {build} (same tgz and options)")
            return None, build
        except ValueError:
            pass
    shutil.rmtree(src, ignore_errors=True)
    shutil.rmtree(build, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "xzf", str(tgz), "-C", str(root)], check=True)
    steps = [configure, ["cmake", "--build", str(build), "--target", "llama", "-j", str(jobs)]]
    script = " && ".join(shlex.join(s) for s in steps)
    script += f" && printf '%s' {shlex.quote(json.dumps(want))} > {shlex.quote(str(stamp))}"
    log(f"llama.cpp: building the `llama` library ({'CUDA sm_90' if cuda else 'CPU only'}, -j {jobs}) "
        f"in {build}, log {log_path}")
    out = open(log_path, "w")
    return subprocess.Popen(["bash", "-c", script], stdout=out, stderr=subprocess.STDOUT, start_new_session=True), build


def finish_build(proc: subprocess.Popen | None, build: Path, log_path: Path, t0: float) -> tuple[Path, Path]:
    if proc is not None:
        rc = proc.wait()
        if rc != 0:
            tail = "".join(Path(log_path).read_text(errors="replace").splitlines(True)[-15:])
            raise SystemExit(f"{PROG}: llama.cpp's build failed (exit {rc}); the end of {log_path}:\n{tail}")
        log(f"llama.cpp: built in {time.monotonic() - t0:.0f} s")
    return build_paths(build)


def gpu_present() -> str | None:
    """The first CUDA device's name, from the CUDA backend where PyCUDA runs, else from
    nvidia-smi (a GPU machine before PyCUDA is installed still builds llama.cpp for CUDA);
    None where there is none."""
    from strata_prefill.fast.cuda import runtime

    ok, name = runtime.cuda_available()
    if ok:
        return name
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            res = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                 text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        names = res.stdout.strip().splitlines() if res.returncode == 0 else []
        return names[0].strip() if names else None
    return None


def c_compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def compile_driver(src: Path, lib: Path, exe: Path) -> Path:
    """Compiles prefill_driver.c against the built library (rpath to it): the executable."""
    cmd = [c_compiler(), "-O2", "-std=c11", "-Wall", "-Wextra", "-o", str(exe), str(DRIVER_SRC),
           f"-I{src / 'include'}", f"-I{src / 'ggml' / 'include'}", f"-L{lib}",
           "-lllama", "-lggml", "-lggml-base", f"-Wl,-rpath,{lib}"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"{PROG}: the driver does not compile:\n{shlex.join(cmd)}\n{res.stderr}")
    return exe


def run_driver(exe: Path, pack: Path, files: list[Path], host_experts: int | None, load_mode: str, threads: int,
               logits_dir: Path | None, log_path: Path, on_row) -> dict:
    """Runs the driver on every prompt file in one process, calling on_row(row) as each length's
    row arrives; returns its model line. host_experts: the layers whose experts stay in host
    memory (None: every tensor on the GPU); load_mode: the driver's --load-mode. Its stderr
    (llama.cpp's warnings) goes to log_path; SystemExit with its tail on failure."""
    cmd = [str(exe), str(pack), *map(str, files), "--ubatch", str(UBATCH), "--flash-attn", "on",
           "--threads", str(threads), "--load-mode", load_mode]
    if host_experts:
        cmd += ["--host-experts", str(host_experts)]
    if logits_dir is not None:
        cmd += ["--logits-dir", str(logits_dir)]
    model = None
    with open(log_path, "w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
        for line in proc.stdout:
            r = json.loads(line)
            if "tokens" not in r:
                model = r
                continue
            log(f"  {r['tokens']:,} tokens: {r['median_s'] * 1e3:.1f} ms, {r['tokens_per_s']:,.0f} tokens/s")
            on_row(r)
        rc = proc.wait()
    if rc != 0 or model is None:
        tail = "".join(Path(log_path).read_text(errors="replace").splitlines(True)[-15:])
        raise SystemExit(f"{PROG}: the llama.cpp driver failed (exit {rc}): {shlex.join(cmd)}\n{tail}")
    return model


# ---------------------------------------------------------------------------------------
# Our side


def timed_ours(eng, ids: np.ndarray) -> dict:
    """One prefill of ids on a fresh KV cache: host seconds (ids in, logits on the host), CUDA
    event seconds on the compute stream, the logits, the bytes copied and the copy stream's busy
    seconds."""
    import pycuda.driver as cuda

    from strata_prefill.session import Session

    be = eng.be
    be.reset_cache()
    be.copy_busy()  # drop earlier spans
    before = eng.counters.get("copy_bytes", 0)
    cuda.Context.synchronize()
    start, end = cuda.Event(), cuda.Event()
    t0 = time.perf_counter()
    start.record(be.dev.stream)
    logits = Session(eng, progress=False).prefill(ids)
    end.record(be.dev.stream)
    end.synchronize()
    host = time.perf_counter() - t0
    busy, _ = be.copy_busy()
    return {"host_s": host, "event_s": start.time_till(end) / 1e3, "logits": logits,
            "copy_bytes": eng.counters.get("copy_bytes", 0) - before, "copy_busy_s": busy}


def ours_row(n: int, reps: list[dict], resident_event_s: float | None) -> dict:
    """An arm of ours at one length from its timed reps: medians (host and event), tokens/s on
    the host median, the bytes copied, and for a streamed arm (resident_event_s given) the time
    against bench_streaming_cuda's floor, max(resident, bytes / LINK_GBS), on event times."""
    from bench.bench_streaming_cuda import LINK_GBS

    host = statistics.median(r["host_s"] for r in reps)
    event = statistics.median(r["event_s"] for r in reps)
    nbytes = reps[-1]["copy_bytes"]
    row = {"tokens": n, "times_s": [r["host_s"] for r in reps], "median_s": host, "tokens_per_s": n / host,
           "event_median_s": event, "copy_bytes": nbytes,
           "copy_busy_s": statistics.median(r["copy_busy_s"] for r in reps)}
    if resident_event_s is not None:
        row["floor_s"] = max(resident_event_s, nbytes / (LINK_GBS * 1e9))
        row["vs_floor"] = event / row["floor_s"]
    return row


def run_ours(pack, prompts: dict[int, np.ndarray], arms: list[str], cache_share: float, logits_dir: Path,
             on_row) -> bool:
    """Our arms at each length of prompts (resident and streamed interleaved on each prompt, the
    order alternating), on_row(length, {arm: row}) after each length, the resident arm's
    last-prompt logits to logits_dir/logits-N.f32; False after one line where the CUDA backend
    cannot run here. The streamed logits must equal the resident ones byte for byte (SystemExit).
    The resident engine runs wherever the streamed one does: its time is the floor's."""
    from bench.gpu_timing import unavailable

    if unavailable(PROG):
        return False
    from strata_prefill.fast import make_fast_engine

    cfg = pack.config
    n_all = cfg.n_layer * cfg.n_expert
    cache = int(round(cache_share * n_all))
    t0 = time.monotonic()
    engines = {"ours-resident": make_fast_engine(pack, "cuda", expert_cache=n_all)}
    if "ours-streamed" in arms:
        engines["ours-streamed"] = make_fast_engine(pack, "cuda", expert_cache=cache)
    for eng in engines.values():
        eng.be.copy_timing = True
    log(f"ours: {', '.join(engines)} loaded in {time.monotonic() - t0:.1f} s"
        + (f" (streamed: cache {cache:,} of {n_all:,} experts)" if "ours-streamed" in engines else ""))
    names = list(engines)
    logits_dir.mkdir(parents=True, exist_ok=True)
    for n, ids in prompts.items():
        for eng in engines.values():
            timed_ours(eng, ids[0])  # warm-up
        reps = {a: [] for a in names}
        for r, prompt in enumerate(ids[1:]):
            order = names[r % len(names):] + names[:r % len(names)]
            got = {a: timed_ours(engines[a], prompt) for a in order}
            for a in names:
                reps[a].append(got[a])
            streamed = got.get("ours-streamed")
            if streamed and streamed["logits"].tobytes() != got["ours-resident"]["logits"].tobytes():
                raise SystemExit(f"{PROG}: the streamed prefill differs from the resident one at {n} tokens (rep {r})")
        atomic.write_bytes(logits_dir / f"logits-{n}.f32",
                           np.asarray(reps["ours-resident"][-1]["logits"], dtype="<f4").tobytes())
        res_event = statistics.median(x["event_s"] for x in reps["ours-resident"])
        rows = {a: ours_row(n, reps[a], res_event if a == "ours-streamed" else None) for a in names}
        log(f"  {n:,} tokens: " + ", ".join(
            f"{a} {v['median_s'] * 1e3:.1f} ms ({v['tokens_per_s']:,.0f} tokens/s"
            + (f", {v['vs_floor']:.2f}x of its floor" if "vs_floor" in v else "") + ")" for a, v in rows.items()))
        on_row(n, {a: v for a, v in rows.items() if a in arms})
    return True


# ---------------------------------------------------------------------------------------
# Results


def logits_agreement(theirs: np.ndarray, ours: np.ndarray) -> dict:
    """llama.cpp's logits against ours on the same prompt: ||a - b|| / ||b|| and whether the
    top token is the same."""
    theirs = np.asarray(theirs, dtype=np.float64).ravel()
    ours = np.asarray(ours, dtype=np.float64).ravel()
    rel = float(np.linalg.norm(theirs - ours) / np.linalg.norm(ours))
    return {"rel_l2": rel, "top1_same": bool(np.argmax(theirs) == np.argmax(ours))}


def _tps(row: dict | None) -> str:
    return f"{row['tokens_per_s']:,.0f}" if row else "-"


def _ratio(a: dict | None, b: dict | None) -> str:
    return f"{a['tokens_per_s'] / b['tokens_per_s']:.2f}x" if a and b else "-"


def format_table(results: dict) -> str:
    """The Markdown table of a results dict (main's JSON): per prompt length each arm's tokens/s,
    ours over llama.cpp resident and expert-offloaded, the streamed arm against its floor, and
    llama.cpp's logits against ours; a head line naming the pack, card and method. The pinned
    host-experts arm has its two columns only where some row holds it."""
    s = results["setup"]
    pinned = any("llama-host-experts-pinned" in row["arms"] for row in results["rows"])
    head = (f"{s['pack_name']}: {s['layers']} layers x {s['experts']} experts (top-{s['top_k']}), "
            f"{s['device']}; tokens/s = prompt tokens / median of {s['reps']} fresh prompts after a warm-up, "
            f"host clock, ids in to last logits out; ours streamed: cache {s['cache']:,} of "
            f"{s['n_experts_all']:,} experts, floor = max(resident, bytes / {s['link_gbs']} GB/s) on CUDA-event times; "
            f"llama.cpp: flash attention, F16 KV, n_ubatch {UBATCH}, host experts as --n-cpu-moe {s['layers']}"
            + (" (pinned: --load-mode none)" if pinned else ""))
    cols = ["prompt tokens", "ours resident", "llama.cpp resident", "ours / llama.cpp", "ours streamed", "vs floor",
            "llama.cpp host experts", "streamed / host experts"]
    cols += ["llama.cpp host experts pinned", "streamed / pinned"] if pinned else []
    lines = [head, "", "| " + " | ".join(cols + ["logits vs llama.cpp"]) + " |", "|---" * (len(cols) + 1) + "|"]
    for row in results["rows"]:
        a = row["arms"]
        ores, ostr = a.get("ours-resident"), a.get("ours-streamed")
        lres, lhost, lpin = a.get("llama-resident"), a.get("llama-host-experts"), a.get("llama-host-experts-pinned")
        vf = f"{ostr['vs_floor']:.2f}x" if ostr and "vs_floor" in ostr else "-"
        agree = row.get("logits_vs_llama")
        ag = f"{agree['rel_l2']:.3f}{'' if agree['top1_same'] else ' (top-1 differs)'}" if agree else "-"
        cells = [f"{row['tokens']:,}", _tps(ores), _tps(lres), _ratio(ores, lres), _tps(ostr), vf, _tps(lhost),
                 _ratio(ostr, lhost)]
        cells += [_tps(lpin), _ratio(ostr, lpin)] if pinned else []
        lines.append("| " + " | ".join(cells + [ag]) + " |")
    return "\n".join(lines)


def tree_digest() -> str:
    """sha256 (16 hex digits) of what runs either side: every file under fast/, contract/, formats/ and
    bench/llama_cpp/ and this script, by path and bytes: part of the --resume key, so a call on
    an edited tree measures again."""
    h = hashlib.sha256()
    files = [p for d in ("fast", "contract", "formats", "bench/llama_cpp") for p in (ROOT / d).rglob("*")
             if p.is_file() and "__pycache__" not in p.parts] + [Path(__file__).resolve()]
    for path in sorted(files):
        rel = path.relative_to(ROOT).as_posix().encode()
        data = path.read_bytes()
        h.update(len(rel).to_bytes(8, "little") + rel + len(data).to_bytes(8, "little") + data)
    return h.hexdigest()[:16]


def _out_dir(arg: str | None) -> Path:
    return Path(arg or os.environ.get("OUT") or "gpu-logs")


def _parse_tokens(p, spec: str) -> list[int]:
    try:
        tokens = [int(t) for t in spec.split(",") if t.strip()]
    except ValueError:
        p.error(f"--tokens {spec!r}: a comma-separated list of prompt lengths")
    if not tokens or any(t < 1 for t in tokens) or len(set(tokens)) != len(tokens):
        p.error(f"--tokens {spec!r}: distinct prompt lengths of at least 1 token")
    return tokens


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--llama-tgz", type=Path, help="llama.cpp's vendored source (llama.cpp-0.3.36-vendored.tgz)")
    p.add_argument("--llama-build", type=Path, help="a finished cmake build of llama.cpp's `llama` library "
                   "to use instead of building from --llama-tgz")
    p.add_argument("--build-root", type=Path, default=Path("/tmp/strata-llama"),
                   help="where llama.cpp is unpacked and built, the driver compiled, the prompts and a made "
                        "pack written (default /tmp/strata-llama)")
    p.add_argument("--llama-backend", choices=("auto", "cuda", "cpu"), default="auto",
                   help="build llama.cpp for CUDA (sm_90) or the CPU; auto: CUDA where this machine has a "
                        "CUDA device (default)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="build jobs (default: the CPUs)")
    p.add_argument("--pack", type=Path, help="the GGUF pack: used as it is where it exists, else made there "
                   "(default: BUILD_ROOT/PRESET-MIX-LAYERS.gguf)")
    p.add_argument("--preset", choices=sorted(PRESETS), default="qwen3-30b-a3b", help="make-pack's preset")
    p.add_argument("--mix", choices=sorted(MIXES) + [NO_MIX], default=None,
                   help=f"make-pack's mix (default {DEFAULT_MIX}; for a preset whose experts make-pack writes in a "
                        f"type of their own, gpt-oss's MXFP4, {NO_MIX}: make-pack's own types)"),
    p.add_argument("--layers", type=int, help="layers of a made pack (default: the preset's)")
    p.add_argument("--tokens", default=DEFAULT_TOKENS, help=f"prompt lengths (default {DEFAULT_TOKENS})")
    p.add_argument("--reps", type=int, default=3, help="timed prompts per length and arm (default 3)")
    p.add_argument("--cache-share", type=float, default=1 / 3,
                   help="ours-streamed: share of experts cached (default 1/3)")
    p.add_argument("--arms", default=",".join(DEFAULT_ARMS),
                   help=f"comma-separated arms of {', '.join(ARMS)} (default: {', '.join(DEFAULT_ARMS)})")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="llama.cpp's threads (default: the CPUs)")
    p.add_argument("--seed", type=int, default=0, help="the prompts' seed (default 0)")
    p.add_argument("--out", help="results folder (default $OUT, else ./gpu-logs)")
    p.add_argument("--resume", action="store_true",
                   help="keep the arms and lengths an earlier call on this machine measured with the same "
                        "setup (BUILD_ROOT/whole_model-state.json) and measure only the rest")
    args = p.parse_args(argv)

    # ---- every check before any work
    arms = [a for a in args.arms.split(",") if a]
    bad = [a for a in arms if a not in ARMS]
    if bad or not arms:
        p.error(f"--arms: unknown arm(s) {', '.join(bad) or '(none given)'}; arms: {', '.join(ARMS)}")
    tokens = _parse_tokens(p, args.tokens)
    if args.reps < 1:
        p.error(f"--reps {args.reps}: at least 1")
    if not 0 < args.cache_share < 1:
        p.error(f"--cache-share {args.cache_share}: between 0 and 1 (1 is the resident arm)")
    if args.jobs < 1 or args.threads < 1:
        p.error("--jobs and --threads: at least 1")
    preset = PRESETS[args.preset]
    if args.layers is not None and args.layers < 1:
        p.error(f"--layers {args.layers}: at least 1")
    layers = args.layers or preset.n_layer
    mix = default_mix(args.preset) if args.mix is None else None if args.mix == NO_MIX else args.mix
    want_llama = any(a.startswith("llama-") for a in arms)
    if want_llama and not (args.llama_tgz or args.llama_build):
        p.error("the llama.cpp arms need --llama-tgz TGZ (or --llama-build DIR); "
                "--arms ours-resident,ours-streamed runs ours alone")
    if want_llama and args.llama_build:
        try:
            build_paths(args.llama_build)
        except ValueError as e:
            p.error(f"--llama-build: {e}")
    elif want_llama and (why := tgz_problem(args.llama_tgz)):
        p.error(why)
    if want_llama and not args.llama_build and not shutil.which("cmake"):
        p.error("building llama.cpp needs cmake, which is not on PATH")
    if want_llama and not c_compiler():
        p.error("the llama.cpp driver needs a C compiler ($CC, cc or gcc), and none is on PATH")
    gpu_name = gpu_present()
    cuda = args.llama_backend == "cuda" or (args.llama_backend == "auto" and gpu_name is not None)
    if want_llama and cuda and not args.llama_build and not shutil.which("nvcc"):
        nvcc = Path("/usr/local/cuda/bin/nvcc")
        if not nvcc.is_file():
            p.error("a CUDA build of llama.cpp needs nvcc (not on PATH, nor /usr/local/cuda/bin)")
        os.environ["PATH"] = f"{nvcc.parent}:{os.environ['PATH']}"
    pack_path = args.pack or args.build_root / f"{args.preset}-{mix or 'own'}-{layers}.gguf"
    if pack_path.exists():
        from strata_prefill.contract.errors import PackError
        from strata_prefill.formats.pack import Pack

        try:
            cfg = Pack.open(pack_path).config
        except (PackError, OSError, ValueError) as e:
            p.error(f"--pack {pack_path}: {e}")
        if args.layers is not None and cfg.n_layer != args.layers:
            p.error(f"--layers {args.layers}: the pack {pack_path} there has {cfg.n_layer} (another --pack, "
                    "or remove it to make a new one)")
    else:
        cfg = preset.replace(n_layer=layers)
    if cfg.has_shexp and want_llama:
        p.error(f"{'--pack ' + str(pack_path) if pack_path.exists() else '--preset ' + args.preset}: has a shared "
                "expert, which llama.cpp's qwen3moe does not load (use qwen3-30b-a3b or small)")
    if max(tokens) > cfg.context_length:
        p.error(f"--tokens: {max(tokens):,} is past the pack's context of {cfg.context_length:,}")
    out = _out_dir(args.out)
    out.mkdir(parents=True, exist_ok=True)
    args.build_root.mkdir(parents=True, exist_ok=True)

    # ---- the build in the background, the pack meanwhile
    t_build = time.monotonic()
    build_log = out / "llama_build.log"
    proc = build = None
    if want_llama:
        if args.llama_build:
            build = args.llama_build
        else:
            proc, build = start_build(args.llama_tgz, args.build_root, cuda, args.jobs, build_log)
    try:
        if not pack_path.exists():
            cmd = [sys.executable, "-m", "strata_prefill", "make-pack", "--preset", args.preset,
                   *(["--mix", mix] if mix else []), "--layers", str(layers), str(pack_path)]
            log(f"making the pack: {shlex.join(cmd)}")
            if subprocess.run(cmd, cwd=ROOT).returncode != 0:
                raise SystemExit(f"{PROG}: make-pack failed")
        else:
            log(f"using the pack {pack_path}")
        if want_llama:
            src, lib = finish_build(proc, build, build_log, t_build)
            exe = compile_driver(src, lib, args.build_root / "prefill_driver")
            log(f"llama.cpp: driver {exe} (library {lib})")
    finally:
        if proc is not None and proc.poll() is None:  # the build's own process group, cmake and compilers
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait()

    from bench.bench_streaming_cuda import LINK_GBS
    from strata_prefill.formats.pack import Pack

    pack = Pack.open(pack_path)
    cfg = pack.config
    prompts = draw_prompts(tokens, args.reps, cfg.n_vocab, args.seed)
    files = {}
    for n, ids in prompts.items():
        files[n] = args.build_root / f"prompts-{n}.bin"
        write_prompts(files[n], ids)
    n_all = cfg.n_layer * cfg.n_expert
    setup = {
        "pack": str(pack_path.resolve()), "pack_bytes": pack_path.stat().st_size,
        "pack_name": f"{pack.field('strata.preset') or pack_path.name}"
                     + (f" --mix {pack.field('strata.mix')}" if pack.field("strata.mix") else ""),
        "layers": cfg.n_layer, "experts": cfg.n_expert, "top_k": cfg.n_expert_used, "n_experts_all": n_all,
        "cache": int(round(args.cache_share * n_all)), "reps": args.reps, "seed": args.seed,
        "device": gpu_name or "no CUDA device",
        "llama_backend": ("cuda" if cuda else "cpu") if want_llama else None, "threads": args.threads,
        "link_gbs": LINK_GBS, "ubatch": UBATCH, "tree": tree_digest(),
        "llama_build": str(build.resolve()) if build else None,
        "llama_tgz_sha256": json.loads((build / STAMP).read_text())["tgz_sha256"] if build and (build / STAMP).is_file()
        else None}
    results = {"setup": setup, "rows": [{"tokens": n, "arms": {}} for n in tokens]}
    # --resume: the rows of an earlier call on this machine with the same setup (the state file
    # lives under the build root, beside the build and the pack)
    state = args.build_root / "whole_model-state.json"
    logits_dir = args.build_root / "logits"
    resumed = False
    if args.resume:
        try:
            old = json.loads(state.read_text())
        except (OSError, ValueError):
            old = None
        if old and old.get("setup") == setup:
            kept = {r["tokens"]: r for r in old["rows"]}
            for row in results["rows"]:
                row["arms"].update({a: v for a, v in kept.get(row["tokens"], {}).get("arms", {}).items() if a in arms})
            resumed = True
            results["llama_models"] = old.get("llama_models", {})
            done = sum(len(r["arms"]) for r in results["rows"])
            log(f"--resume: {done} arm-lengths kept from {state} (measured {old.get('date')})")
        elif old:
            log(f"--resume: {state} holds another setup; measuring everything")
    by_n = {row["tokens"]: row for row in results["rows"]}
    json_path = out / "whole_model.json"

    def save(n: int | None = None, arm_rows: dict | None = None) -> None:
        if n is not None:
            for v in arm_rows.values():
                v["measured"] = time.strftime("%Y-%m-%d %H:%M:%S")
            by_n[n]["arms"].update(arm_rows)
        results["date"] = time.strftime("%Y-%m-%d")
        text = json.dumps(results, indent=1)
        atomic.write_text(json_path, text)
        atomic.write_text(state, text)

    def missing(arm: str) -> list[int]:
        return [n for n in tokens if arm not in by_n[n]["arms"]]

    if not resumed:  # no last-prompt logits of another setup compared with this one's
        shutil.rmtree(logits_dir, ignore_errors=True)
    save()
    for arm, (host, load_mode) in LLAMA_ARMS.items():
        if arm not in arms or not (todo := missing(arm)):
            continue
        (logits_dir / arm).mkdir(parents=True, exist_ok=True)
        log(f"{arm}: {cfg.n_layer} layers, " + (f"the experts of all {cfg.n_layer} in host memory" if host
                                                 else "all on the device") + f", load mode {load_mode}")
        model = run_driver(exe, pack_path, [files[n] for n in todo], cfg.n_layer if host else None, load_mode,
                           args.threads, logits_dir / arm, out / f"{arm}.log",
                           lambda r, arm=arm: save(r["tokens"], {arm: r}))
        results.setdefault("llama_models", {})[arm] = model
    ours_arms = [a for a in arms if a.startswith("ours-")]
    todo = sorted({n for a in ours_arms for n in missing(a)})
    if todo:
        log(f"ours: {', '.join(ours_arms)} at {', '.join(map(str, todo))} tokens")
        run_ours(pack, {n: prompts[n] for n in todo}, ours_arms, args.cache_share, logits_dir / "ours-resident", save)
    for n in tokens:  # llama.cpp's last prompt against ours, where both are on disk
        theirs, ours = (logits_dir / a / f"logits-{n}.f32" for a in ("llama-resident", "ours-resident"))
        if theirs.is_file() and ours.is_file():
            by_n[n]["logits_vs_llama"] = logits_agreement(np.fromfile(theirs, dtype="<f4"),
                                                          np.fromfile(ours, dtype="<f4"))
    save()
    table = format_table(results)
    atomic.write_text(out / "whole_model.md", table + "\n")
    log(f"\nwrote {json_path} and {out / 'whole_model.md'}\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
