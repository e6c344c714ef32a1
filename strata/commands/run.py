"""`strata-prefill run`: the prompt path on a pack, with either implementation.

With no arguments it runs the built-in default: a `tiny` pack made on first use and cached,
and a seeded prompt.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np

from strata.errors import InputError

DEFAULT_PROMPT_TOKENS = 200
DEFAULT_GREEDY = 8
DEFAULT_PRESET = "tiny"


def add_parser(sub, name: str) -> None:
    p = sub.add_parser(name, help="prefill a prompt (default: built-in tiny pack and prompt)",
                       description="Run the prompt path: prefill, first-token logits, greedy tokens.")
    p.add_argument("--pack", help="GGUF pack (default: a tiny pack, made on first use and cached)")
    p.add_argument("--prompt-tokens", default=str(DEFAULT_PROMPT_TOKENS), metavar="FILE|N",
                   help="a file of token ids (whitespace/comma separated, or .npy), or N for a "
                        f"seeded random prompt of N tokens (default {DEFAULT_PROMPT_TOKENS})")
    p.add_argument("--seed", type=int, default=0, help="seed of the random prompt (default 0)")
    p.add_argument("--prefill", default="auto", metavar="auto|N", help="chunk size (auto = 8192)")
    p.add_argument("--greedy", type=int, default=DEFAULT_GREEDY, metavar="N",
                   help=f"greedy tokens after the prompt (default {DEFAULT_GREEDY})")
    p.add_argument("--impl", choices=["reference", "fast"], default="reference",
                   help="which implementation runs (default reference)")
    p.add_argument("--dump-dir", help="write the project's record file (layers.spd) here")
    p.add_argument("--dump-level", choices=["layer", "ops"], default=None,
                   help="layer: router, q8_1 buffers, sampled residual (default); ops: every op's "
                        "output too (env STRATA_PREFILL_DUMP_LEVEL)")
    p.add_argument("--dump-first-logits", metavar="FILE",
                   help="raw float32 first-token logits (env STRATA_DUMP_FIRST_LOGITS)")
    p.add_argument("--dump-r", metavar="FILE",
                   help="Strata residual dump, pos %% 64 == 0 (env STRATA_PREFILL_DUMP_R)")
    p.add_argument("--top", type=int, default=5, help="how many top next tokens to print")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_fast_switches(p)
    p.set_defaults(func=main)


def add_fast_switches(p) -> None:
    """The fast path's switches; each also has an environment variable."""
    g = p.add_argument_group("fast path switches (--impl fast)")
    g.add_argument("--backend", choices=["cuda", "sim"], default="cuda",
                   help="cuda (PyCUDA, default) or sim (the same walk with NumPy kernels, no GPU)")
    g.add_argument("--group-gather", type=int, choices=[0, 1], default=None,
                   help="1: one gather launch per MMQ group (default); 0: one per expert "
                        "(env STRATA_PREFILL_GROUP_GATHER)")
    g.add_argument("--quant-gather", type=int, choices=[0, 1], default=None,
                   help="1: per-row gather quantize; 0: per-token scatter (default) "
                        "(env STRATA_QUANT_GATHER)")


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "strata-prefill"


def default_pack() -> Path:
    """The built-in tiny pack, written once and reused (written to a temporary name first,
    so an interrupted write never leaves a broken cached pack)."""
    from strata.make_pack import make_pack

    path = cache_dir() / f"{DEFAULT_PRESET}-seed0.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        make_pack(tmp, DEFAULT_PRESET, seed=0)
        os.replace(tmp, path)
    return path


def load_prompt(spec: str, n_vocab: int, seed: int) -> np.ndarray:
    """N random tokens (seeded), or the ids in a file."""
    if re.fullmatch(r"\d+", spec.strip()):
        n = int(spec)
        if n <= 0:
            raise InputError("the prompt is empty (--prompt-tokens 0)")
        return np.random.default_rng(seed).integers(0, n_vocab, size=n, dtype=np.int32)
    path = Path(spec)
    if not path.exists():
        raise InputError(f"prompt file not found: {spec}")
    if path.suffix == ".npy":
        ids = np.load(path)
        if not np.issubdtype(ids.dtype, np.integer):
            raise InputError(f"{spec}: token ids must be integers")
        return ids.reshape(-1)
    words = [w for w in re.split(r"[\s,]+", path.read_text()) if w]
    try:
        return np.array([int(w) for w in words], dtype=np.int64)
    except ValueError:
        bad = next(w for w in words if not re.fullmatch(r"-?\d+", w))
        raise InputError(f"{spec}: not a token id: {bad!r}") from None


def make_engine(impl: str, pack, args=None):
    if impl == "reference":
        from reference import ReferenceEngine

        return ReferenceEngine(pack)
    from fast import make_fast_engine  # says in one line why it cannot run here

    return make_fast_engine(pack, getattr(args, "backend", "cuda"),
                            group_gather=getattr(args, "group_gather", None),
                            quant_gather=getattr(args, "quant_gather", None))


def main(args) -> int:
    from strata.pack import Pack
    from strata.session import Session

    if args.greedy < 0:
        raise InputError("--greedy must be >= 0")
    pack_path = Path(args.pack) if args.pack else default_pack()
    pack = Pack.open(pack_path)
    cfg = pack.config
    prompt = load_prompt(args.prompt_tokens, cfg.n_vocab, args.seed)
    engine = make_engine(args.impl, pack, args)
    session = Session(engine, chunk=args.prefill, dump_dir=args.dump_dir,
                      dump_first_logits=args.dump_first_logits, dump_r=args.dump_r,
                      progress=None if not args.no_progress else False, dump_level=args.dump_level)
    res = session.run(prompt, greedy=args.greedy)

    print(f"pack      {pack_path} ({cfg.n_layer} layers, {cfg.n_expert} experts, top-{cfg.n_expert_used})")
    print(f"impl      {engine.name}")
    print(f"prompt    {res.prompt_tokens} tokens in {res.n_chunks} chunk(s) of up to {res.chunk}")
    top = np.argsort(-res.logits, kind="stable")[: max(1, args.top)]
    print("next      " + "  ".join(f"{int(t)} ({res.logits[t]:+.4f})" for t in top))
    if res.greedy:
        print(f"greedy    {' '.join(str(t) for t in res.greedy)}")
    rate = res.prompt_tokens / res.prefill_seconds if res.prefill_seconds > 0 else float("inf")
    line = f"speed     prefill {rate:,.1f} tokens/s ({res.prefill_seconds:.3f} s)"
    if len(res.greedy) > 1:
        line += f", decode {(len(res.greedy) - 1) / res.decode_seconds:,.1f} tokens/s"
    print(line)
    return 0
