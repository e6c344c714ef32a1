"""`strata-prefill info PACK`: what a pack holds (architecture, shape, types, expert blobs)."""
from __future__ import annotations

import argparse
from collections import Counter

from gguf import GGMLQuantizationType as QT

from strata_prefill.contract import quants
from strata_prefill.contract.errors import PackError
from strata_prefill.formats.pack import KEY_MIX, Pack
from strata_prefill import checks


def add_parser(subparsers, name: str) -> argparse.ArgumentParser:
    p = subparsers.add_parser(name, help="describe a pack",
                              description="Describe a pack: architecture, shape, types, expert blobs.")
    p.add_argument("pack", metavar="PACK", type=checks.input_path, help="GGUF pack")
    p.add_argument("--check", action="store_true",
                   help="decode every tensor and name those that decode to NaN or Inf (exit 1), "
                        "then recompute every tensor's sha256 and compare it with the digests the "
                        "pack's header records (make-pack writes them): exit 2 naming the first "
                        "tensor that differs; a pack with none says so")
    p.set_defaults(func=main)
    return p


def _size(n: int) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n:,} bytes ({n / div:.2f} {unit})"
    return f"{n:,} bytes"


def _rope_line(r) -> str:
    """The RoPE scaling as the table uses it (strata_prefill.formats.config.RopeScaling)."""
    if r.type == "none":
        return "none" + (f", attn factor {r.attn_factor:g}" if r.attn_factor != 1.0 else "")
    line = f"{r.type}, factor {r.factor:g}"
    if r.type == "yarn":
        line += (f", original context {r.original_context}, attn factor {r.attn_factor:g}, "
                 f"beta fast {r.beta_fast:g}, beta slow {r.beta_slow:g}, ext factor {r.ext_factor:g}")
    elif r.attn_factor != 1.0:
        line += f", attn factor {r.attn_factor:g}"
    return line


def _attention_line(c) -> str:
    """The architecture's attention (formats/archs: ATTENTION) with the pack's window."""
    a = c.spec.ATTENTION
    bits = [f"{a.rope.upper()} rope", "q/k norm" if a.qk_norm else "no q/k norm"]
    bits += ["q/k/v/o biases"] if a.qkvo_bias else []
    bits += ["a sink per head"] if a.sinks else []
    if a.swa_every:
        windowed = [l for l in range(2 * a.swa_every) if a.is_sliding(l)]
        bits.append(f"a window of {c.sliding_window} keys on blocks {', '.join(map(str, windowed))}, ...")
    return ", ".join(bits)


def _moe_line(m) -> str:
    """The architecture's MoE half (formats/archs: MOE)."""
    bits = [f"{m.scoring} scoring" + (", renormalized" if m.renormalize else "")]
    bits += ["a router bias"] if m.router_bias else []
    bits += ["expert biases"] if m.expert_bias else []
    return ", ".join(bits + [m.activation])


def describe(pack: Pack) -> list[str]:
    """The lines `info` prints."""
    c = pack.config
    gu_bytes, d_bytes = pack.expert_blob_bytes(0)
    types = [pack.expert_types(l) for l in range(c.n_layer)]
    mixed = len(set(types)) > 1
    router = pack.tensor_type("blk.0.ffn_gate_inp").name
    lines = [
        f"pack:           {pack.path}",
        f"file size:      {_size(pack.file_size)}",
        f"architecture:   {pack.field('general.architecture')}"
        + (f" (preset {pack.field('strata.preset')}, seed {pack.field('strata.seed')})"
           if pack.field("strata.preset") is not None else ""),
        f"layers:         {c.n_layer}",
        f"hidden:         {c.n_embd}",
        f"heads:          {c.n_head} (kv {c.n_head_kv}), head_dim {c.head_dim}",
        f"vocab:          {c.n_vocab}",
        f"context:        {c.context_length}, rope base {c.rope_base:g}, rms eps {c.rms_eps:.3g}",
        "rope scaling:   " + _rope_line(c.rope_scaling),
        f"experts:        {c.n_expert}, top-{c.n_expert_used}, expert ff {c.n_ff_exp}",
        "shared expert:  " + (f"yes (ff {c.n_ff_shexp})" if c.has_shexp else "no"),
        "attention:      " + _attention_line(c),
        "moe:            " + _moe_line(c.spec.MOE),
        f"types:          expert gate/up {c.expert_gu_type.name}, down {c.expert_down_type.name}, "
        f"dense {c.dense_type.name}"
        + f", router {router}"
        + (" (expert types vary by layer)" if mixed else ""),
        f"expert blob:    gate {gu_bytes:,} + up {gu_bytes:,} + down {d_bytes:,} = "
        f"{2 * gu_bytes + d_bytes:,} bytes (layer 0)",
        f"experts/layer:  {_size(c.n_expert * (2 * gu_bytes + d_bytes))}",
        "output:         " + ("tied to token_embd" if pack.tied_embeddings
                              else f"output ({pack.tensor_type('output').name})"),
        f"written by:     {pack.writer or 'not recorded'}"
        + ("" if pack.field("strata.tensor_digest") is None
           else " (tensor digests recorded: `info --check` checks them)"),
    ]
    by_type = Counter(QT(t.tensor_type).name for t in pack.reader.tensors)
    lines.append("tensor types:   " + ", ".join(f"{k} {n}" for k, n in sorted(by_type.items(), key=lambda kv: (-kv[1], kv[0]))))
    mix = pack.field(KEY_MIX)
    if mix:
        lines.append(f"mix:            {mix} (llama-quantize's choice of type per matrix, formats/mixes.py)")
    fb = pack.fallbacks
    if fb:
        kinds = Counter(n.split(".", 2)[-1] for n in fb)
        asked = pack.field("strata.expert_type") or "?"
        try:
            block = f"{quants.block_size(QT[asked])[0]}-value"
        except Exception:
            block = asked
        parts = []
        for kind, n in kinds.items():
            cols = c.n_ff_exp if kind == "ffn_down_exps" else c.n_embd
            parts.append(f"{kind} in {n} layer{'s' if n != 1 else ''} "
                         f"(rows of {cols} values do not fit {block} blocks)")
        lines.append(f"fallbacks:      {asked} -> {pack.fallback_type}: {'; '.join(parts)}")
    else:
        lines.append("fallbacks:      none")
    return lines


def main(args: argparse.Namespace) -> int:
    checks.distinct_files("info", [("PACK", args.pack)], [])  # it writes no file
    with Pack.open(args.pack, check_values=False) as pack:  # --check reports the values itself
        print("\n".join(describe(pack)))
        if args.check:
            n_bad, lines = value_check(pack)
            print("\n".join(lines), flush=True)
            print(check_line(pack), flush=True)
            if n_bad:
                return 1  # a check that failed on a well-formed pack (2 is bad input)
    return 0


NONFINITE_SHOWN = 5  # bad tensors named one a line; the rest are counted


def value_check(pack: Pack) -> tuple[int, list[str]]:
    """`info --check`'s scan for tensors that decode to NaN or Inf (formats/nonfinite.py):
    (how many, the lines: one per bad tensor, at most NONFINITE_SHOWN, then a count). It
    names the tensor it reads on stderr (formats/progress.py: a bar on a terminal, else a
    line every 10 s of a long scan)."""
    from strata_prefill.formats import nonfinite
    from strata_prefill.formats.progress import Progress

    total = sum(int(t.n_bytes) for t in pack.reader.tensors)
    with Progress(total, "info --check: tensor values", "B", unit_scale=True) as bar:
        def progress(done: int, _total: int, name: str) -> None:
            bar.at(name)
            bar.step(done - bar.done)

        bad = list(nonfinite.in_pack(pack, progress))
    n = len(pack.reader.tensors)
    lines = []
    for b in bad[:NONFINITE_SHOWN]:
        where = (f"expert {b.expert}, " if b.expert is not None else "") + f"row {b.row}, value {b.value}"
        lines.append(f"non-finite:     {b.name} decodes to NaN or Inf (first at {where})")
    if bad:
        more = f", {len(bad) - NONFINITE_SHOWN} not named above" if len(bad) > NONFINITE_SHOWN else ""
        lines.append(f"tensor values:  {len(bad)} of {n} tensors decode to NaN or Inf{more}")
    else:
        lines.append(f"tensor values:  all finite ({n} tensors decoded)")
    return len(bad), lines


def check_line(pack: Pack) -> str:
    """`info --check`'s line for a pack whose digest matches or which has none; a PackError
    (one line, exit 2) for one whose data or digests do not match."""
    r = pack.check_digest()
    if not r.present:
        return ("tensor data digest: none (the header records no digest, as in packs not "
                "written by make-pack of pack format 3 or later): nothing to check")
    if r.header_bad is not None:
        raise PackError(f"{pack.path}: the tensor digests in its header are damaged: {r.header_bad}")
    if r.bad is not None:
        raise PackError(f"{pack.path}: tensor data does not match the digest in its header "
                        f"(first bad tensor: {r.bad})")
    return f"tensor data digest: ok ({r.n_tensors} tensors, sha256)"
