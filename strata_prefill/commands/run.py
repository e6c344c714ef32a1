"""`strata-prefill run`: the prompt path on a pack, with either implementation.

With no arguments it runs the built-in default: a `tiny` pack made on first use and cached,
and a seeded prompt. Every argument is checked before the pack is opened or made: paths the
run will write are tried while the command line is read, the prompt is read and checked
before the prefill.
"""
from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

import numpy as np

from strata_prefill.formats import atomic
from strata_prefill.formats.cache_home import user_cache_dir
from strata_prefill.formats.config import PRESETS
from strata_prefill.contract.constants import PACK_FORMAT
from strata_prefill.formats.dumps import RECORD_FILE
from strata_prefill.contract.errors import InputError
from strata_prefill import arms, checks, refcache, variables
from strata_prefill.arms import SWITCHES

DEFAULT_PROMPT_TOKENS = 200
DEFAULT_GREEDY = 8
DEFAULT_PRESET = "tiny"
DEFAULT_SEED = 0  # the default pack's
DEFAULT_PROMPT_SEED = 0

# the dump switches Strata reads from the environment: argparse dest -> variable
DUMP_ENV = {
    "dump_first_logits": "STRATA_DUMP_FIRST_LOGITS",
    "dump_r": "STRATA_PREFILL_DUMP_R",
}


def add_parser(sub, name: str) -> None:
    p = sub.add_parser(name, help="prefill a prompt (default: built-in tiny pack and prompt)",
                       description="Run the prompt path: prefill, first-token logits, greedy tokens.")
    p.add_argument("--pack", type=checks.input_path,
                   help="GGUF pack (default: a tiny pack, made on first use and cached)")
    p.add_argument("--prompt-tokens", type=checks.prompt_source, default=str(DEFAULT_PROMPT_TOKENS),
                   metavar="FILE|N",
                   help="a file of token ids (whitespace/comma separated, or a 1-D integer .npy), "
                        f"or N for a seeded random prompt of N tokens (default {DEFAULT_PROMPT_TOKENS})")
    p.add_argument("--seed", type=checks.seed, default=None,
                   help=f"seed of the random prompt (default {DEFAULT_PROMPT_SEED}; a prompt file takes no seed)")
    p.add_argument("--prefill", type=checks.chunk_size, default="auto", metavar="auto|N",
                   help="chunk size (auto = 8192)")
    p.add_argument("--greedy", type=checks.greedy_count, default=DEFAULT_GREEDY, metavar="N",
                   help=f"greedy tokens after the prompt (default {DEFAULT_GREEDY}); the prompt and "
                        "the greedy tokens but the last fit the pack's context")
    p.add_argument("--impl", choices=["reference", "fast"], default="reference",
                   help="which implementation runs (default reference)")
    p.add_argument("--dump-dir", type=checks.folder_for(RECORD_FILE),
                   help=f"write the project's record file ({RECORD_FILE}) here")
    p.add_argument("--dump-level", choices=["layer", "ops"], default=None,
                   help="with --dump-dir: layer: router, q8_1 buffers, sampled residual (default); ops: "
                        "every op's output too (env STRATA_PREFILL_DUMP_LEVEL)")
    p.add_argument("--dump-first-logits", type=checks.output_file, metavar="FILE",
                   help="raw float32 first-token logits (env STRATA_DUMP_FIRST_LOGITS)")
    p.add_argument("--dump-r", type=checks.output_file, metavar="FILE",
                   help="Strata residual dump, pos %% 64 == 0 (env STRATA_PREFILL_DUMP_R)")
    p.add_argument("--top", type=checks.positive_int, default=5,
                   help="how many top next tokens to print (default 5)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress (default: a bar naming the chunk, layer and greedy token where "
                        "stderr is a terminal, else a line every 10 s of long work)")
    p.add_argument("--explain", action="store_true",
                   help="after the results, say on stderr what each line means and what to try next "
                        "(the run that makes the default pack always does)")
    p.add_argument("--reference-cache", type=reference_cache_dir, metavar="DIR|off",
                   help="--impl reference: keep the run's results in DIR and read them back "
                        "instead of recomputing (off: never) (env STRATA_PREFILL_REFERENCE_CACHE; "
                        "docs/reference-cache.md)")
    g = p.add_argument_group("timing and traces (--impl fast)")
    g.add_argument("--timing", action="store_true",
                   help="after the run, per chunk (or window): the walk taken and why, ms and share of "
                        "each phase (event pairs around each phase) beside the chunk's uninstrumented total "
                        "(a further prefill with one event pair per chunk), and per layer the copy time not "
                        "covered by compute and the compute time waiting for copies (env STRATA_PREFILL_TIMING=1)")
    g.add_argument("--trace", type=checks.output_file, metavar="FILE",
                   help="after the run, write the compute and copy streams of one more prefill as "
                        "Chrome trace / Perfetto JSON (strata-prefill plot draws it)")
    add_fast_switches(p)
    p.set_defaults(func=main)


def add_fast_switches(p) -> None:
    """The fast path's flags: --backend and the switches (fast/options.py)."""
    g = p.add_argument_group("fast path switches (--impl fast)")
    g.add_argument("--backend", choices=["cuda", "sim"], default=None,
                   help="cuda (PyCUDA, default) or sim (the same walk with NumPy kernels, no GPU)")
    arms.add_flags(g)  # the switches of fast/options.py's table


def fast_engine_kwargs(args) -> dict:
    """The fast path's switches given in `args` as FastEngine keyword arguments (each flag's
    dest is its keyword; one not given is left out: the engine's default or its environment
    variable)."""
    return {kw: v for kw in SWITCHES if (v := getattr(args, kw, None)) is not None}


def backend_of(args) -> str:
    return args.backend or "cuda"


def make_engine(impl: str, pack, args=None):
    if impl == "reference":
        from strata_prefill.reference import ReferenceEngine

        return ReferenceEngine(pack)
    from strata_prefill.fast import make_fast_engine  # says in one line why it cannot run here

    return make_fast_engine(pack, backend_of(args), **fast_engine_kwargs(args))


def default_pack_path() -> Path:
    """Where the built-in pack is kept (made or not). Its name carries the pack format."""
    return user_cache_dir() / f"{DEFAULT_PRESET}-seed{DEFAULT_SEED}-f{PACK_FORMAT}.gguf"


def default_pack() -> Path:
    """The built-in tiny pack, written once and reused. Its name carries the pack format, so
    a cached pack of another format is never opened: it is removed and the pack remade.
    make_pack writes it whole, so an interrupted write never leaves a broken pack."""
    from strata_prefill.formats.make_pack import make_pack

    stem = f"{DEFAULT_PRESET}-seed{DEFAULT_SEED}"
    path = default_pack_path()
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        for stale in [*path.parent.glob(f"{stem}.gguf"), *path.parent.glob(f"{stem}-f*.gguf")]:
            stale.unlink()  # an older format's pack, never to be opened again
        t0 = time.perf_counter()
        make_pack(path, DEFAULT_PRESET, seed=DEFAULT_SEED)  # written whole (formats/atomic.py)
        print(f"made the default pack ({DEFAULT_PRESET} preset, seed {DEFAULT_SEED}) at {path} in "
              f"{time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    return path


def explain_output(pack_path: Path, impl: str, window: bool = False) -> None:
    """What each line of a run's output means, one line each, and the next command to try
    (stderr: stdout stays the same whether or not it is explained)."""
    lines = [
        "what the lines say:",
        "  pack      the GGUF pack run: its layers, the routed experts of a layer, how many a token "
        "is routed to",
        "  impl      which implementation ran: reference (NumPy) or fast (PyCUDA, or fast/sim: its "
        "walk on NumPy kernels)",
        "  prompt    the prompt's length and the prefill chunks it was cut into (--prefill N)",
        "  next      the most likely tokens after the prompt, highest first: token id (its logit) "
        "(--top N)",
        "  greedy    the tokens generated after the prompt, each the highest-logit token after the "
        "one before (--greedy N)",
        "  speed     the prefill's prompt tokens a second (its seconds); decode: the greedy tokens "
        "after the first, a second",
    ]
    if impl == "fast":
        if window:
            lines.append("  window    the tokens of each layer-major window the prompt ran in (whole chunks, "
                         "--window N|auto|off), how many, and why that window")
        lines.append("  counters  what the fast path launched, gathered, copied and waited for, "
                     "and its resident experts")
        nxt = f"strata-prefill info {pack_path}   (the pack's shape and tensors)"
    else:
        nxt = ("strata-prefill run --impl fast --backend sim   (the fast path's walk on NumPy "
               "kernels: the same next and greedy, plus its counters)")
    lines.append(f"try next: {nxt}")
    print("\n".join(lines), file=sys.stderr, flush=True)


def read_prompt_file(path: Path) -> np.ndarray:
    """The token ids of a prompt file: a 1-D integer .npy, or ids separated by whitespace or
    commas. The range check against the vocabulary is the session's."""
    if path.suffix == ".npy":
        try:
            ids = np.load(path, allow_pickle=False)
        except (ValueError, OSError, EOFError) as exc:
            raise InputError(f"{path}: not a readable .npy file ({' '.join(str(exc).split())})") from None
        if not isinstance(ids, np.ndarray):
            raise InputError(f"{path}: holds several arrays; a prompt is one 1-D array of ids")
        if ids.ndim != 1:
            raise InputError(f"{path}: a prompt is a 1-D array of token ids, this one has shape "
                             f"{ids.shape}")
        if not np.issubdtype(ids.dtype, np.integer):
            raise InputError(f"{path}: token ids must be integers, got {ids.dtype}")
    else:
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            raise InputError(f"{path}: not a text file of token ids (or a .npy file)") from None
        words = [w for w in re.split(r"[\s,]+", text) if w]
        bad = next((w for w in words if not re.fullmatch(r"[+-]?\d{1,18}", w)), None)
        if bad is not None:
            raise InputError(f"{path}: not a token id: {bad!r}")
        ids = np.array([int(w) for w in words], dtype=np.int64)
    if ids.size == 0:
        raise InputError(f"{path}: the prompt is empty")
    return ids


def check_env_dumps(args) -> dict:
    """The dump files named by Strata's environment variables, checked as their switches are
    (strata_prefill/variables.py); {dest: the label that named it} for the messages of
    check_paths."""
    labels = {}
    for dest, var in DUMP_ENV.items():
        value = variables.value_of(var)  # checked even where the flag wins: a bad value is said
        labels[dest] = flag_of(dest)
        if getattr(args, dest) is None and value is not None:
            setattr(args, dest, value)
            labels[dest] = var
    return labels


def flag_of(dest: str) -> str:
    return "--" + dest.replace("_", "-")


#: run's own flags of the fast path, beside the switches of fast/options.py: each needs --impl fast
FAST_ONLY = ("backend", "timing", "trace")


def refuse_idle_flags(args) -> None:
    """A flag that would do nothing in this run is an error naming what it needs (the switches
    of fast/options.py's table, flags and variables alike: refuse_idle_switches)."""
    from strata_prefill.fast.phases import timing_enabled

    for flag, on in (("--timing", args.timing), ("--trace", args.trace is not None),
                     ("STRATA_PREFILL_TIMING=1", timing_enabled())):
        if on and args.impl != "fast":
            raise InputError(f"{flag} times the fast path's streams: it needs --impl fast")
    if args.impl != "fast" and args.backend is not None:
        raise InputError("--backend picks the fast path's backend: it needs --impl fast")
    if args.dump_level is not None and args.dump_dir is None:
        raise InputError("--dump-level picks what --dump-dir records: it needs --dump-dir")
    if args.seed is not None and not isinstance(args.prompt_tokens, int):
        raise InputError("--seed seeds the random prompt of --prompt-tokens N: a prompt file "
                         f"({args.prompt_tokens}) takes no seed")


def refuse_idle_switches(args, config=None, prompt_tokens: int | None = None) -> None:
    """The switches set (flags, variables) that would do nothing in this run, refused by the
    switch table's one rule (strata_prefill.fast.options.refuse_idle): before the pack is opened, what the
    command line says (--impl, --backend, --expert-cache); once its header is read (`config`),
    the experts too, and the window against the prompt's chunks."""
    from strata_prefill.fast import options

    kwargs = fast_engine_kwargs(args)
    options.refuse_idle(kwargs, options.facts_of(args.impl, backend_of(args) if args.impl == "fast" else None,
                                                 kwargs.get("expert_cache"), config))
    if args.impl == "fast" and prompt_tokens is not None:
        from strata_prefill.session import parse_chunk

        window = options.resolve(kwargs).window
        if window != options.AUTO:  # a number less than the prompt's chunk: one line, before the engine
            options.window_taken(window, parse_chunk(args.prefill), prompt_tokens)


def window_cut(engine, res) -> bool:
    """Whether the run took another window than the number of tokens asked (the flag or its
    variable): one past the prompt, or not a whole number of chunks. The window line then says
    what was taken, even where that is one chunk."""
    from strata_prefill.fast import options

    asked = engine.options.window
    return asked not in (options.AUTO, options.OFF_WORD) and res.window != int(asked)


def check_counts(args, file_ids, config, where: str = "") -> None:
    """The prompt's tokens with the greedy tokens, and --top, against the pack's context and
    vocabulary (checks.counts_fit), from its header alone: before the prompt is made."""
    if file_ids is None:
        n, label = args.prompt_tokens, None
    else:
        n, label = int(file_ids.size), f"--prompt-tokens {args.prompt_tokens} ({file_ids.size:,} tokens)"
    checks.counts_fit(config, n, label, greedy=args.greedy, top=args.top, where=where)


def check_paths(args, labels: dict, pack_path: Path) -> None:
    """No file the run writes is the pack, the prompt file, or another of its outputs."""
    pack_label = "--pack" if args.pack else "the default pack"
    reads = [(pack_label, pack_path, "the pack"),
             ("--prompt-tokens", None if isinstance(args.prompt_tokens, int) else args.prompt_tokens,
              "the prompt file")]
    writes = [(labels["dump_first_logits"], args.dump_first_logits),
              (labels["dump_r"], args.dump_r),
              ("--dump-dir", args.dump_dir),
              ("--dump-dir's record file", None if args.dump_dir is None else args.dump_dir / RECORD_FILE),
              ("--trace", args.trace)]
    checks.distinct_files("run", reads, writes)


def reference_cache_dir(text: str) -> str:
    """`off` (or 0, none), or a folder the cache may be made in (not an empty word: that is
    no folder, not the current one)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is an empty path: name a folder, or off")
    if text.strip().lower() in refcache.OFF:
        return "off"
    return str(checks.output_dir(text))


def reference_cache_of(args) -> refcache.Cache | None:
    """The cache a reference run goes through: --reference-cache, else the variable, else
    none (`run` keeps results only when asked). Checked before any work."""
    value = args.reference_cache
    if value is not None and args.impl != "reference":
        raise InputError("--reference-cache keeps reference runs: it needs --impl reference")
    if args.impl != "reference":
        return None
    if value is None:
        value = variables.value_of(refcache.ENV)  # an empty one is refused, never the current folder
    return refcache.cache_from(value, default=False)


def _write_atomic(path: Path, data: bytes | None = None, copy_of: Path | None = None) -> None:
    """`data`, or the bytes of the file `copy_of`, written whole (formats/atomic.py: a temp of
    this process's own beside `path`, removed on any failure or SIGTERM/SIGHUP)."""
    atomic.write_bytes(path, data if copy_of is None else Path(copy_of).read_bytes())


def run_cached(args, cache: refcache.Cache, pack, pack_path: Path, prompt) -> int:
    """A reference run through the cache: the same lines and files as a computed run (the
    dumps copied from the entry, held meanwhile so that a `cache clear` passes over it), one
    line on stderr saying hit or miss (and what was wrong with an entry found there, or why
    the result could not be kept), and on a hit a speed line that says nothing was timed."""
    from strata_prefill.session import parse_chunk, parse_dump_level

    level = parse_dump_level(args.dump_level) if args.dump_dir else None
    asked = parse_chunk(args.prefill)
    with refcache.open_reference_run(pack, prompt, greedy=args.greedy, dump_level=level, cache=cache,
                                     chunk=asked, progress=None if not args.no_progress else False) as r:
        if args.dump_first_logits:
            _write_atomic(args.dump_first_logits, r.logits.astype("<f4").tobytes())
        if args.dump_r:
            _write_atomic(args.dump_r, r.residuals)
        if args.dump_dir:
            args.dump_dir.mkdir(parents=True, exist_ok=True)
            _write_atomic(args.dump_dir / RECORD_FILE, copy_of=r.records)
    print(cache_line(r, args.dump_dir is not None, asked), file=sys.stderr)
    return print_cached(args, r, pack, pack_path, prompt)


def cache_line(r: refcache.RefRun, dumped: bool, asked) -> str:
    """The one line a run through the cache prints on stderr."""
    if r.hit:
        line = f"reference cache: hit (nothing computed or timed) {r.entry}"
        if dumped and r.chunk != asked:
            line += (f"; its records are cut in chunks of up to {r.chunk}, not {asked} (no bit "
                     "differs: docs/numerics.md section 9)")
    else:
        line = "reference cache: miss"
        if r.recomputed:
            line += f" (the entry there was {r.recomputed})"
        line += f", computed in {r.seconds:.1f} s, "
        line += f"not kept: {r.not_stored}" if r.not_stored else f"stored {r.entry}"
    return line + (f"; {r.pack_index}" if r.pack_index else "")


def print_cached(args, r: refcache.RefRun, pack, pack_path: Path, prompt) -> int:
    """A cached run's lines on stdout, as a computed run prints them."""
    from strata_prefill.nonfinite import EXIT_NONFINITE, refuse  # NaN/Inf: one line naming where

    if refuse(r, pack, args):
        return EXIT_NONFINITE
    cfg = pack.config
    n = int(np.asarray(prompt).size)
    print(f"pack      {pack_path} ({cfg.n_layer} layers, {cfg.n_expert} experts, top-{cfg.n_expert_used})")
    print("impl      reference")
    print(f"prompt    {n} tokens in {-(-n // r.chunk)} chunk(s) of up to {r.chunk}")
    print_logits(r.logits, r.greedy, args.top)
    if r.hit:
        print("speed     nothing timed: the run was read from the reference cache")
    else:
        print(speed_line(n, r.greedy, r.prefill_seconds, r.decode_seconds))
    if args.explain:
        sys.stdout.flush()
        explain_output(pack_path, args.impl)
    return 0


def print_logits(logits: np.ndarray, greedy: list[int], top_n: int) -> None:
    top = np.argsort(-logits, kind="stable")[:top_n]
    print("next      " + "  ".join(f"{int(t)} ({logits[t]:+.4f})" for t in top))
    if greedy:
        print(f"greedy    {' '.join(str(t) for t in greedy)}")


def speed_line(prompt_tokens: int, greedy: list[int], prefill_seconds: float,
               decode_seconds: float) -> str:
    rate = prompt_tokens / prefill_seconds if prefill_seconds > 0 else float("inf")
    line = f"speed     prefill {rate:,.1f} tokens/s ({prefill_seconds:.3f} s)"
    if len(greedy) > 1:
        line += f", decode {(len(greedy) - 1) / decode_seconds:,.1f} tokens/s"
    return line


def timing_asked(args) -> bool:
    """--timing, or STRATA_PREFILL_TIMING=1 with the fast path (the reference has no phases)."""
    from strata_prefill.fast.phases import timing_enabled

    if args.timing:
        return True
    return args.impl == "fast" and timing_enabled()


def main(args) -> int:
    from strata_prefill.formats.pack import Pack
    from strata_prefill.session import Session

    labels = check_env_dumps(args)
    refuse_idle_flags(args)
    checks.environment_values("run")
    arms.environment_aliases()
    refuse_idle_switches(args)
    check_paths(args, labels, Path(args.pack) if args.pack else default_pack_path())
    timing = timing_asked(args)
    ref_cache = reference_cache_of(args)
    file_ids = None if isinstance(args.prompt_tokens, int) else read_prompt_file(args.prompt_tokens)
    if not args.pack:  # the default pack's shape is its preset's: checked before it is made
        check_counts(args, file_ids, PRESETS[DEFAULT_PRESET], "the default pack")
    args.explain = args.explain or (not args.pack and not default_pack_path().exists())
    pack_path = Path(args.pack) if args.pack else default_pack()
    pack = Pack.open(pack_path, progress=False if args.no_progress else None)
    cfg = pack.config
    check_counts(args, file_ids, cfg)  # before the prompt is made or any layer runs
    refuse_idle_switches(args, cfg, args.prompt_tokens if file_ids is None else int(file_ids.size))
    if file_ids is None:
        seed = DEFAULT_PROMPT_SEED if args.seed is None else args.seed
        prompt = np.random.default_rng(seed).integers(0, cfg.n_vocab, size=args.prompt_tokens,
                                                      dtype=np.int32)
    else:
        prompt = file_ids
    if ref_cache is not None:
        return run_cached(args, ref_cache, pack, pack_path, prompt)
    engine = make_engine(args.impl, pack, args)
    if args.impl == "fast":
        engine.be.timing = False  # the run's own speed is uninstrumented; timing has its own prefills
    session = Session(engine, chunk=args.prefill, dump_dir=args.dump_dir,
                      dump_first_logits=args.dump_first_logits, dump_r=args.dump_r,
                      progress=None if not args.no_progress else False, dump_level=args.dump_level)
    res = session.run(prompt, greedy=args.greedy)
    from strata_prefill.nonfinite import EXIT_NONFINITE, refuse  # NaN/Inf: one line naming where

    if refuse(res, pack, args):
        return EXIT_NONFINITE

    print(f"pack      {pack_path} ({cfg.n_layer} layers, {cfg.n_expert} experts, top-{cfg.n_expert_used})")
    print(f"impl      {engine.name}")
    print(f"prompt    {res.prompt_tokens} tokens in {res.n_chunks} chunk(s) of up to {res.chunk}")
    windowed = args.impl == "fast" and (res.window != res.chunk or window_cut(engine, res))
    if windowed:  # the window the run took (auto: sized by the engine) where it holds several chunks or was cut
        shown = res.window if res.window != res.chunk else min(res.window, res.prompt_tokens)  # one chunk: the prompt's
        print(f"window    {shown} tokens ({res.window // res.chunk} chunk(s) a window, "
              f"{-(-res.prompt_tokens // res.window)} window(s); {engine.window_reason})")
    print_logits(res.logits, res.greedy, args.top)
    print(speed_line(res.prompt_tokens, res.greedy, res.prefill_seconds, res.decode_seconds))
    counters = getattr(engine, "counters", None)
    if counters is not None:  # the fast path: what it launched, copied, waited for
        c = counters
        print(f"counters  launches {c['launches']:,}, gathers {c['gathers']:,}, copies {c['copies']:,} "
              f"({c['copy_bytes'] / 1e6:,.1f} MB), waits {c['waits']:,}, events {c['events']:,} "
              f"(resident experts {engine.placement.n_resident:,} of {engine.placement.resident.size:,}, "
              f"ring {engine.ring.n_slots} slots)")
    if args.explain:
        sys.stdout.flush()
        explain_output(pack_path, args.impl, window=windowed)
    if timing or args.trace is not None:
        from strata_prefill.observe import observe

        observe(engine, prompt, args.prefill, timing, args.trace,
                progress=False if args.no_progress else None)
    return 0
