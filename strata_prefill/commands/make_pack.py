"""`strata-prefill make-pack`: write a synthetic pack of a preset's architecture (see
strata_prefill.formats.make_pack)."""
from __future__ import annotations

import argparse
import os
import re
import sys
import time

from strata_prefill.formats.config import PRESETS
from strata_prefill import checks


def add_parser(subparsers, name: str) -> argparse.ArgumentParser:
    from strata_prefill.formats.make_pack import DENSE_TYPES, EXPERT_TYPES, FALLBACK_TYPE, ROUTER_TYPES
    from strata_prefill.formats.mixes import MIXES

    p = subparsers.add_parser(
        name,
        help="write a synthetic pack (GGUF) of a preset's architecture",
        description=(
            "Write a synthetic GGUF pack of a preset's architecture (qwen3moe, or gpt-oss for "
            "the gpt-oss presets): random but valid blocks, deterministic for "
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
    p.add_argument("--expert-type", default=None, metavar="T",
                   choices=[t.name for t in EXPERT_TYPES],
                   help="routed experts' type: " + ", ".join(t.name for t in EXPERT_TYPES)
                   + " (default: Q8_0, MXFP4 for the gpt-oss presets; F16, BF16 and F32 experts are "
                   "multiplied in float32)")
    p.add_argument("--dense-type", default=None, metavar="T", choices=[t.name for t in DENSE_TYPES],
                   help="attention, shared expert, token_embd and output: "
                   + ", ".join(t.name for t in DENSE_TYPES) + " (default: Q8_0; a type whose block "
                   "does not divide a matrix's rows is refused)")
    p.add_argument("--mix", default=None, type=str.upper, choices=list(MIXES),
                   help="every matrix's type as llama-quantize's " + " or ".join(MIXES) + " file "
                   "type picks it (token_embd, output, attn_v, attn_output, ffn_down each its own; "
                   "rows its block does not divide fall back as llama-quantize's do); takes no "
                   "--dense-type"),
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


# a FACTOR as a user types it: decimal digits, a fraction, an exponent (not 1_0, 0x10, nan or inf)
_DECIMAL = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")


def rope_scaling(text: str):
    """--rope-scaling's SPEC: yarn:FACTOR:ORIG_CTX or linear:FACTOR, a strata_prefill.formats.config.RopeScaling,
    every value in the range the pack's header holds and the RoPE table takes
    (strata_prefill.formats.config.rope_problems), so nothing is refused once writing has begun."""
    from strata_prefill.formats.config import RopeScaling, rope_problems

    parts = text.split(":")
    shape = (len(parts) == 3 if parts[0] == "yarn" else len(parts) == 2 if parts[0] == "linear" else False)
    if not shape or not _DECIMAL.fullmatch(parts[1]):
        raise argparse.ArgumentTypeError(
            f"{checks.shown(text)} is not yarn:FACTOR:ORIG_CTX or linear:FACTOR (e.g. yarn:4:4096)")
    if parts[0] == "yarn":
        try:
            ctx = checks.integer(parts[2], 1, checks.UINT32_MAX, "the pack's header holds it as a uint32")
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentTypeError(f"ORIG_CTX {exc}") from None
        scaling = RopeScaling("yarn", float(parts[1]), ctx)
    else:
        scaling = RopeScaling("linear", float(parts[1]))
    bad = rope_problems(scaling)
    if bad:
        raise argparse.ArgumentTypeError("; ".join(bad))
    return scaling


def data_bytes(args: argparse.Namespace) -> int:
    """The bytes of the pack's tensor data, from the arguments alone: one layer is planned
    (strata_prefill.formats.make_pack.plan_tensors, the types as make_pack resolves them) and its bytes counted
    once per layer, so a pack of 100,000 layers is sized at once (a mix: one layer of each of
    its classes, strata_prefill.formats.mixes.layer_classes, counted as often as the layers of that class). The
    header and the tensors' alignment come on top: a lower bound of the file's size."""
    from strata_prefill.formats import make_pack as mp
    from strata_prefill.formats import mixes
    from strata_prefill.formats import tensor_names as tn

    router = args.router_type or mp.PRESET_ROUTER_TYPE.get(args.preset, mp.ROUTER_TYPE_DEFAULT)
    layers = PRESETS[args.preset].n_layer if args.layers is None else args.layers
    mix = getattr(args, "mix", None)
    full, one = PRESETS[args.preset].replace(n_layer=layers), PRESETS[args.preset].replace(n_layer=1)
    if mix is None:
        ty = mp.pack_types(full, args.preset, args.expert_type, args.dense_type, router, None,
                           args.tie_embeddings)
        kinds = [(None, layers)]
    else:
        ty = mp.pack_types(one, args.preset, args.expert_type, args.dense_type, router, mix,
                           args.tie_embeddings)
        kinds = list(mixes.layer_classes(full, mix).items())
    total = 0
    for key, count in kinds:
        per = None if key is None else {
            **mixes.head_types(full, mix, args.tie_embeddings),
            **{tn.name(k, 0): t for k, t in mixes.layer_types(full, mix, key).items()}}
        plans = mp.plan_tensors(one, ty.gu, ty.down, ty.dense, args.tie_embeddings, ty.router, per)
        per_layer = sum(p.nbytes for p in plans if p.name.startswith("blk.0."))
        total += count * per_layer
    return total + sum(p.nbytes for p in plans if not p.name.startswith("blk."))


def refuse_what_the_disk_cannot_hold(args: argparse.Namespace) -> None:
    """A pack the disk under OUT cannot hold, by its data alone, is refused in one line before
    its tensors are planned or its header made (for many layers those take minutes)."""
    from strata_prefill.formats.make_pack import check_free_disk

    check_free_disk(args.out, data_bytes(args))


def main(args: argparse.Namespace) -> int:
    from strata_prefill.formats.make_pack import PRESET_EXPERT_TYPE, make_pack

    def announce(size: int) -> None:
        print(f"writing {args.out}: {size:,} bytes ({size / 2**30:.2f} GiB)", flush=True)

    checks.distinct_files("make-pack", [], [("OUT.gguf", args.out)])  # it reads no file
    refuse_what_the_disk_cannot_hold(args)
    t0 = time.perf_counter()
    path = make_pack(args.out, preset=args.preset, layers=args.layers,
                     expert_type=args.expert_type, seed=args.seed, dense_type=args.dense_type,
                     tie_embeddings=args.tie_embeddings, progress=args.progress,
                     on_size=announce, router_type=args.router_type,
                     rope_scaling=args.rope_scaling, mix=args.mix)
    dt = time.perf_counter() - t0
    size = os.path.getsize(path)
    types = (f"mix {args.mix}" if args.mix else
             f"expert type {args.expert_type or getattr(PRESET_EXPERT_TYPE.get(args.preset), 'name', 'Q8_0')}, "
             f"dense {args.dense_type or 'Q8_0'}")
    print(f"wrote {path}: preset {args.preset}, {types}, seed {args.seed}, {size:,} bytes in {dt:.2f} s "
          f"({size / 1e6 / max(dt, 1e-9):.0f} MB/s)", file=sys.stdout)
    return 0
