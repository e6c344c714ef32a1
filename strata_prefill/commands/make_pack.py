"""`strata-prefill make-pack`: write a synthetic qwen3moe pack (see strata.make_pack)."""
from __future__ import annotations

import argparse
import os
import sys
import time

from strata.config import PRESETS
from strata_prefill import checks


def add_parser(subparsers, name: str) -> argparse.ArgumentParser:
    from strata.make_pack import DENSE_TYPES, EXPERT_TYPES, FALLBACK_TYPE, ROUTER_TYPES

    p = subparsers.add_parser(
        name,
        help="write a synthetic qwen3moe pack (GGUF)",
        description=(
            "Write a synthetic qwen3moe GGUF pack: random but valid blocks, deterministic for "
            "a seed, written streaming. Matrices whose rows are not a multiple of the expert "
            f"type's block (256 for Q2_K and the IQ types) fall back to {FALLBACK_TYPE.name}; "
            "`info` lists them."),
    )
    p.add_argument("out", metavar="OUT.gguf", type=checks.output_file,
                   help="pack to write (replaced if it exists: written to a temp beside it and "
                        "renamed onto it at the end, so a failed or interrupted run leaves it "
                        "as it was)")
    p.add_argument("--preset", choices=list(PRESETS), default="tiny",
                   help="model shape (default: tiny)")
    p.add_argument("--layers", type=checks.layer_count, default=None, metavar="N",
                   help="number of layers (default: the preset's); the pack's size is checked "
                        "against the free disk before anything is written")
    p.add_argument("--expert-type", default="Q8_0", metavar="T",
                   choices=[t.name for t in EXPERT_TYPES],
                   help="routed experts' type: " + ", ".join(t.name for t in EXPERT_TYPES)
                   + " (default: Q8_0; F16, BF16 and F32 experts are multiplied in float32)")
    p.add_argument("--dense-type", default="Q8_0", choices=[t.name for t in DENSE_TYPES],
                   help="attention, shared expert, token_embd and output (default: Q8_0)")
    p.add_argument("--router-type", default=None, choices=[t.name for t in ROUTER_TYPES],
                   help="ffn_gate_inp (and the shared-expert gate): F32 as llama.cpp's converters "
                        "keep it, BF16 for the strata preset as Strata does (default by preset)")
    p.add_argument("--seed", type=checks.seed, default=0,
                   help="random seed, 0 to 2**64-1 (default: 0)")
    p.add_argument("--rope-scaling", type=rope_scaling, default=None, metavar="SPEC",
                   help="RoPE scaling written as the pack's rope.scaling keys, as llama.cpp "
                        "reads them: yarn:FACTOR:ORIG_CTX or linear:FACTOR (default: none)")
    p.add_argument("--tie-embeddings", action="store_true",
                   help="write no `output` tensor: the lm_head is token_embd")
    p.add_argument("--progress", dest="progress", action="store_true", default=None,
                   help="always show a progress bar (default: for packs over 50 MB, a bar on a "
                        "terminal, else a line every 10 s naming the tensor being written)")
    p.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no progress at all")
    p.set_defaults(func=main)
    return p


def rope_scaling(text: str):
    """--rope-scaling's SPEC: yarn:FACTOR:ORIG_CTX or linear:FACTOR, a strata.config.RopeScaling
    (its values' ranges are make_pack's, ModelConfig.problems)."""
    from strata.config import RopeScaling

    parts = text.split(":")
    try:
        if parts[0] == "yarn" and len(parts) == 3:
            return RopeScaling("yarn", float(parts[1]), int(parts[2]))
        if parts[0] == "linear" and len(parts) == 2:
            return RopeScaling("linear", float(parts[1]))
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(
        f"{text!r} is not yarn:FACTOR:ORIG_CTX or linear:FACTOR (e.g. yarn:4:4096)")


def data_bytes(args: argparse.Namespace) -> int:
    """The bytes of the pack's tensor data, from the arguments alone: one layer is planned
    (strata.make_pack.plan_tensors, the types as make_pack resolves them) and its bytes counted
    once per layer, so a pack of 100,000 layers is sized at once. The header and the tensors'
    alignment come on top: a lower bound of the file's size."""
    from strata import make_pack as mp

    config = PRESETS[args.preset].replace(n_layer=1)
    router = args.router_type or mp.PRESET_ROUTER_TYPE.get(args.preset, mp.ROUTER_TYPE_DEFAULT)
    rt = mp.parse_qtype(router, mp.ROUTER_TYPES, "router type")
    dt = mp.parse_qtype(args.dense_type, mp.DENSE_TYPES, "dense type")
    gu, down, _fell = mp.expert_types(config, args.expert_type)
    plans = mp.plan_tensors(config, gu, down, dt, args.tie_embeddings, rt)
    per_layer = sum(p.nbytes for p in plans if p.name.startswith("blk.0."))
    fixed = sum(p.nbytes for p in plans) - per_layer
    layers = PRESETS[args.preset].n_layer if args.layers is None else args.layers
    return fixed + layers * per_layer


def refuse_what_the_disk_cannot_hold(args: argparse.Namespace) -> None:
    """A pack the disk under OUT cannot hold, by its data alone, is refused in one line before
    its tensors are planned or its header made (for many layers those take minutes)."""
    from strata.make_pack import check_free_disk

    check_free_disk(args.out, data_bytes(args))


def main(args: argparse.Namespace) -> int:
    from strata.make_pack import make_pack

    def announce(size: int) -> None:
        print(f"writing {args.out}: {size:,} bytes ({size / 2**30:.2f} GiB)", flush=True)

    checks.distinct_files("make-pack", [], [("OUT.gguf", args.out)])  # it reads no file
    refuse_what_the_disk_cannot_hold(args)
    t0 = time.perf_counter()
    path = make_pack(args.out, preset=args.preset, layers=args.layers,
                     expert_type=args.expert_type, seed=args.seed, dense_type=args.dense_type,
                     tie_embeddings=args.tie_embeddings, progress=args.progress,
                     on_size=announce, router_type=args.router_type,
                     rope_scaling=args.rope_scaling)
    dt = time.perf_counter() - t0
    size = os.path.getsize(path)
    print(f"wrote {path}: preset {args.preset}, expert type {args.expert_type}, "
          f"dense {args.dense_type}, seed {args.seed}, {size:,} bytes in {dt:.2f} s "
          f"({size / 1e6 / max(dt, 1e-9):.0f} MB/s)", file=sys.stdout)
    return 0
