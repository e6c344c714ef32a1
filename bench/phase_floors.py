#!/usr/bin/env python3
"""Each prefill phase against its floor inside the numerics contract: how far the fast path is
from the fastest any kernel keeping these bytes could be, on this device.

    python3 -m bench.phase_floors --pack strata8.gguf [--tokens 2048,8192,32768] [--out DIR]
    python3 -m bench.phase_floors --preset qwen3-30b-a3b --mix Q4_K_M --layers 48 --card h100   # no GPU
    python3 -m bench.phase_floors --plot phase_floors.json phase_floors.png   # needs matplotlib

--pack prefills a pack on the GPU and sets each phase's measured time beside its floor. --preset
(with make-pack's --mix, --expert-type, --dense-type, --router-type and --layers) prints the floors
alone for the pack make-pack would write, on a card named by --card (NVIDIA's figures for it) or
given as SMS:GHZ:GB/S: no pack, no GPU. Either way the floors are summed over the layers by their
types (a mix gives some layers other types than layer 0), and the table's last line gives the
tokens a second the floors together allow, the ceiling any kernel keeping the contract's bytes
stays under on these phases.

A phase's floor is the larger of two lower bounds:
- issue: the instructions the contract itself writes down for the phase's elements
  (docs/numerics.md: the MMQ epilogue per output and 32-value block, the float products' one
  product and one sum per multiply-add, attention's float work per (query, key) pair), one warp
  instruction per cycle on every scheduler (4 a SM) at the SM's top clock. The integer products
  (tensor cores), decode, staging, address and loop instructions are left out, so no kernel
  can issue the phase in less.
- memory: the bytes the phase must read and write once (weights, activations, results) at the
  device's peak memory bandwidth (2 x memory clock x bus width, from the driver; a copy
  reaches less, so this bound is low too).
Both are lower bounds, so measured / floor >= 1 always holds; a phase below its floor means a
count here is wrong (the table says so). The measured phase times come from one prefill of a
fresh prompt with phase timing (CUDA events; fast/phases.py), after a warm-up prefill.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass

from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as QT

from strata_prefill.contract import qformats
from strata_prefill.contract.errors import InputError
from strata_prefill.contract.qformats import Epilogue
from strata_prefill.formats.config import PRESETS, ModelConfig

FLOAT_TYPES = (QT.F32, QT.F16, QT.BF16)
#: float products (docs/numerics.md section 3a): a product and a sum per multiply-add, no FMA
FLOAT_PER_MAC = 2
#: attention's base-2 exponential as the kernels issue it (strata_numerics.cuh strata_exp2c): the
#: clamp, the magic add, n, f, four fused multiply-adds, 2^n into the exponent bits (one shift-add)
EXP2C_SLOTS = 9
#: bytes a q8_1 row takes per value (block_q8_1_mmq: 128 codes and 16 bytes of scales)
Q8_1_BYTES_PER_VALUE = 144 / 128


def attention_slots_per_pair(head_dim: int) -> int:
    """Issue slots of the contract's float work per (query head, valid key) pair
    (docs/numerics.md section 5): the score's two products (sumf * dk, * dqs; sumf itself is
    the tensor cores' exact integer), the row maximum, s - m_new, exp2c, lsum, p * dv, w's
    maximum, the P code (w * 127/amax and its rounding add), and O's update per 64-key block and
    dimension (the P.V sum's conversion and one fused multiply-add; alpha skipped where it is
    exactly 1) over the 64 keys."""
    score = 2
    per_key = 1 + 1 + EXP2C_SLOTS + 1 + 1 + 1 + 2
    o_update = 2 * head_dim // 64
    return score + per_key + o_update


@dataclass(frozen=True)
class Device:
    schedulers: int        # SMs x 4
    clock_hz: float        # the SM's top clock
    peak_bytes_per_s: float  # memory: 2 x memory clock x bus width

    def issue_s(self, lane_ops: float) -> float:
        """Seconds to issue lane_ops thread-level instructions, 32 a warp instruction."""
        return lane_ops / 32.0 / self.schedulers / self.clock_hz

    def bytes_s(self, nbytes: float) -> float:
        return nbytes / self.peak_bytes_per_s


def epilogue_slots(qt: QT) -> int | None:
    """Issue slots of the MMQ epilogue per output element and 32-value block, as mmq.cu writes the
    contract's float steps (docs/numerics.md section 3; the exact fused forms counted as one),
    from the registry's form of the type (contract/qformats.py: epilogue, sub_per_16); None for a
    type the registry does not hold.
    - the integer sum as a float: one conversion from the magic bits (one exact fused
      multiply-add where a sub-scale multiplies it); with sub_per_16 one for each half and their
      sum;
    - dw * da, its product with the sum, the accumulation: 3;
    - MIN: mw * sa and its sum, 2 more;
    - DMIN: the min term's integer mi (one product, or two and their sum with sub_per_16), mw * da,
      its product with mi and the difference;
    - HALVES: each half's conversion, dw_h * da and product (6), their sum and the accumulation."""
    fmt = qformats.lookup(qt)
    if fmt is None:
        return None
    if fmt.epilogue is Epilogue.HALVES:
        return 2 * 3 + 2
    halves = 2 if fmt.sub_per_16 else 1
    integer = 2 * halves - 1  # one step a half, and the halves' sum
    slots = integer + 3
    if fmt.epilogue is Epilogue.MIN:
        slots += 2
    elif fmt.epilogue is Epilogue.DMIN:
        slots += integer + 3
    return slots


def _mmq_ops(qt: QT, rows: float, n_out: int, k: int) -> float | None:
    """Lane operations of one quantized product (rows x n_out outputs over k values), None for
    a type without an epilogue count."""
    if qt in FLOAT_TYPES:
        return FLOAT_PER_MAC * rows * n_out * k
    per = epilogue_slots(qt)
    return None if per is None else per * rows * n_out * (k // 32)


def _weight_bytes(qt: QT, n_out: int, k: int) -> float:
    """Bytes of an n_out x k matrix of type qt (gguf's block sizes: any GGUF type)."""
    block, size = GGML_QUANT_SIZES[qt]
    return n_out * (k // block) * size


def phase_floors(cfg: ModelConfig, types: dict[str, QT], n_tok: int, n_layer: int, dev: Device,
                 pos0: int = 0) -> dict[str, dict]:
    """Per phase: {"issue_s", "memory_s", "floor_s", "bound"} summed over n_layer layers for a
    chunk of n_tok tokens at positions pos0 .. pos0 + n_tok - 1 (one chunk from an empty cache:
    pos0 = 0). types: the qtype of each layer matrix by its short name (attn_q, attn_k, attn_v,
    attn_output, ffn_gate_inp, ffn_gate_exps, ffn_down_exps and, with a shared expert,
    ffn_gate_shexp, ffn_up_shexp, ffn_down_shexp). A phase whose issue count is unknown (a type without a count)
    keeps its memory bound only."""
    T, E, K, D = n_tok, cfg.n_expert, cfg.n_expert_used, cfg.n_embd
    hd, nq, nkv, ff = cfg.head_dim, cfg.n_head * cfg.head_dim, cfg.n_head_kv * cfg.head_dim, cfg.n_ff_exp
    rows = T * K
    f4 = 4.0

    def prod(name, r, n_out, k):
        return _mmq_ops(types[name], r, n_out, k)

    def act_in(name, r, k):  # the product's input: float rows, or q8_1 rows
        return r * k * (f4 if types[name] in FLOAT_TYPES else Q8_1_BYTES_PER_VALUE)

    out: dict[str, tuple[float | None, float]] = {}
    # attention: projections, attention itself; memory: the four matrices, x in, the K/V cache
    # written, Q/K/V/O rows, x out
    pairs = cfg.n_head * (T * pos0 + T * (T + 1) / 2)
    ops = [prod("attn_q", T, nq, D), prod("attn_k", T, nkv, D), prod("attn_v", T, nkv, D),
           prod("attn_output", T, D, nq), attention_slots_per_pair(hd) * pairs]
    mem = (sum(_weight_bytes(types[n], m, k) for n, m, k in (("attn_q", nq, D), ("attn_k", nkv, D),
                                                             ("attn_v", nkv, D), ("attn_output", D, nq)))
           + T * D * f4 * 2 + T * (nq + 2 * nkv) * f4 + 2 * T * nkv + T * nq * f4)
    out["attention"] = (None if None in ops else sum(ops), mem)
    # router: logits over all experts, the norm's input and output
    out["router"] = (prod("ffn_gate_inp", T, E, D),
                     _weight_bytes(types["ffn_gate_inp"], E, D) + T * D * f4 * 2 + T * E * f4)
    # the MoE input: h read, T * K q8_1 rows written
    out["quantize"] = (None, T * D * f4 + rows * D * Q8_1_BYTES_PER_VALUE)
    # gate/up: every routed row times both matrices of its expert; memory: the routed experts'
    # two matrices (at most E), the input rows, gate and up written
    gu = prod("ffn_gate_exps", rows, ff, D)
    n_routed = min(E, rows)
    out["gate/up"] = (None if gu is None else 2 * gu,
                      2 * n_routed * _weight_bytes(types["ffn_gate_exps"], ff, D) + act_in("ffn_gate_exps", rows, D)
                      + 2 * rows * ff * f4)
    out["swiglu+quantize H"] = (None, 2 * rows * ff * f4 + rows * ff * Q8_1_BYTES_PER_VALUE)
    out["down"] = (prod("ffn_down_exps", rows, D, ff),
                   n_routed * _weight_bytes(types["ffn_down_exps"], D, ff) + act_in("ffn_down_exps", rows, ff)
                   + rows * D * f4)
    if cfg.n_ff_shexp:
        sf = cfg.n_ff_shexp
        sh = [prod("ffn_gate_shexp", T, sf, D), prod("ffn_up_shexp", T, sf, D), prod("ffn_down_shexp", T, D, sf),
              FLOAT_PER_MAC * T * D]  # the last: the shared expert's gate input, a float row
        out["shared expert"] = (None if None in sh else sum(sh),
                                _weight_bytes(types["ffn_gate_shexp"], sf, D) + _weight_bytes(types["ffn_up_shexp"], sf, D)
                                + _weight_bytes(types["ffn_down_shexp"], D, sf) + T * D * f4 + 3 * T * sf * f4 + T * D * f4)
    # combine: the routed rows' outputs, x and the shared expert's read, x written; K products
    # and sums an output
    out["combine"] = (2 * K * T * D, rows * D * f4 + T * D * f4 * (3 if cfg.n_ff_shexp else 2))

    table = {}
    for name, (ops, nbytes) in out.items():
        issue = None if ops is None else dev.issue_s(ops) * n_layer
        memory = dev.bytes_s(nbytes) * n_layer
        floor = memory if issue is None else max(issue, memory)
        table[name] = {"issue_s": issue, "memory_s": memory, "floor_s": floor,
                       "bound": "memory" if issue is None or memory >= issue else "issue"}
    return table


#: the matrices phase_floors reads the types of, by their names in a layer (blk.L.<name>)
LAYER_MATRICES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate_inp", "ffn_gate_exps", "ffn_down_exps",
                  "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp")

#: cards by name, with NVIDIA's figures for them (the SXM forms): 132 SMs at 1.98 GHz, and the
#: memory bandwidth
CARDS = {"h100": Device(4 * 132, 1.98e9, 3.35e12), "h200": Device(4 * 132, 1.98e9, 4.8e12)}


def layer_types(pack, layer: int = 0) -> dict[str, QT]:
    """The qtypes phase_floors needs, from one layer of a pack."""
    have = set(pack.tensor_names())
    return {n: QT(pack.tensor_type(f"blk.{layer}.{n}")) for n in LAYER_MATRICES if f"blk.{layer}.{n}" in have}


def layer_groups(types_by_layer) -> list[tuple[dict[str, QT], int]]:
    """[(types, layers)]: the layers grouped by their matrices' types, in order of first sight."""
    out: dict[tuple, list] = {}
    for types in types_by_layer:
        key = tuple(sorted((k, int(v)) for k, v in types.items()))
        out.setdefault(key, [types, 0])[1] += 1
    return [(types, n) for types, n in out.values()]


def pack_groups(pack) -> list[tuple[dict[str, QT], int]]:
    """A pack's layers grouped by their types (a mix gives some layers other types than layer 0)."""
    return layer_groups(layer_types(pack, l) for l in range(pack.config.n_layer))


def preset_groups(cfg: ModelConfig, preset: str, **types) -> list[tuple[dict[str, QT], int]]:
    """The layer groups of the pack make-pack would write for preset (its shape as cfg, e.g. with
    fewer layers): formats/make_pack.py's own choice of every tensor's type from `types`
    (pack_types' mix, expert_type, dense_type, router_type)."""
    from strata_prefill.formats import make_pack  # noqa: PLC0415 - the pack writer, for its type plan only

    pt = make_pack.pack_types(cfg, preset, **types)
    plan = {p.name: QT(p.qtype) for p in make_pack.plan_tensors(cfg, pt.gu, pt.down, pt.dense, False, pt.router,
                                                                 pt.per_tensor)}
    return layer_groups({n: plan[f"blk.{l}.{n}"] for n in LAYER_MATRICES if f"blk.{l}.{n}" in plan}
                        for l in range(cfg.n_layer))


def model_floors(cfg: ModelConfig, groups, n_tok: int, dev: Device, pos0: int = 0) -> dict[str, dict]:
    """phase_floors over a whole model: each group of layers (layer_groups) with its own types,
    the groups' floors summed per phase. A phase's bound is "mixed" where the groups differ."""
    table: dict[str, dict] = {}
    for types, n in groups:
        for name, fl in phase_floors(cfg, types, n_tok, n, dev, pos0).items():
            t = table.setdefault(name, {"issue_s": 0.0, "memory_s": 0.0, "floor_s": 0.0, "bound": fl["bound"]})
            t["issue_s"] = None if t["issue_s"] is None or fl["issue_s"] is None else t["issue_s"] + fl["issue_s"]
            t["memory_s"] += fl["memory_s"]
            t["floor_s"] += fl["floor_s"]
            if t["bound"] != fl["bound"]:
                t["bound"] = "mixed"
    return table


def format_floors(n_tok: int, floors: dict) -> str:
    """The floors alone (no measured side): each phase's two bounds, the floor, and the tokens a
    second the phases' floors together allow."""
    ms = lambda s: "-" if s is None else f"{s * 1e3:.2f}"  # noqa: E731
    lines = [f"{n_tok} tokens: {'phase':<18} {'floor ms':>9} {'issue ms':>9} {'memory ms':>10} {'bound':>7}"]
    pad = " " * (len(str(n_tok)) + 8)
    for name, fl in sorted(floors.items(), key=lambda kv: -kv[1]["floor_s"]):
        lines.append(f"{pad} {name:<18} {ms(fl['floor_s']):>9} {ms(fl['issue_s']):>9} {ms(fl['memory_s']):>10} "
                     f"{fl['bound']:>7}")
    total = sum(fl["floor_s"] for fl in floors.values())
    lines.append(f"{pad} {'these phases':<18} {ms(total):>9}   at most {n_tok / total:,.0f} tokens/s")
    return "\n".join(lines)


def card(text: str) -> Device:
    """--card: a name of CARDS, or SMS:GHZ:GB/S (SMs, the top SM clock, memory bandwidth)."""
    if text.lower() in CARDS:
        return CARDS[text.lower()]
    try:
        sms, ghz, gbs = (float(v) for v in text.split(":"))
    except ValueError:
        sms = ghz = gbs = 0.0
    if not (sms >= 1 and sms == int(sms) and ghz > 0 and gbs > 0):
        raise argparse.ArgumentTypeError(f"expected {' or '.join(CARDS)} or SMS:GHZ:GB/S (e.g. 132:1.98:3350), "
                                         f"got {text!r}")
    return Device(4 * int(sms), ghz * 1e9, gbs * 1e9)


def format_table(n_tok: int, measured: dict, floors: dict) -> str:
    lines = [f"{n_tok} tokens: {'phase':<18} {'measured ms':>12} {'floor ms':>9} {'bound':>7} {'x floor':>8}"]
    tm = tf = 0.0
    for name, fl in sorted(floors.items(), key=lambda kv: -measured.get(kv[0], 0.0)):
        if name not in measured:
            continue
        m = measured[name]
        tm += m
        tf += fl["floor_s"]
        ratio = m / fl["floor_s"] if fl["floor_s"] > 0 else float("inf")
        flag = "  BELOW THE FLOOR: a count here is wrong" if ratio < 1.0 else ""
        lines.append(f"{'':>{len(str(n_tok)) + 8}} {name:<18} {m * 1e3:>12.2f} {fl['floor_s'] * 1e3:>9.2f} "
                     f"{fl['bound']:>7} {ratio:>8.1f}{flag}")
    lines.append(f"{'':>{len(str(n_tok)) + 8}} {'these phases':<18} {tm * 1e3:>12.2f} {tf * 1e3:>9.2f} {'':>7} "
                 f"{tm / tf if tf else float('inf'):>8.1f}")
    return "\n".join(lines)


def plot(results: dict, path: str) -> None:
    """Bars of measured and floor time per phase, one panel per prompt length."""
    import matplotlib  # noqa: PLC0415 - optional ([plot] extra)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    runs = results["runs"]
    fig, axes = plt.subplots(1, len(runs), figsize=(5.2 * len(runs), 4.4), squeeze=False)
    for ax, run in zip(axes[0], runs):
        names = [n for n in sorted(run["floors"], key=lambda n: -run["measured"].get(n, 0)) if n in run["measured"]]
        y = range(len(names))
        meas = [run["measured"][n] * 1e3 for n in names]
        flo = [run["floors"][n]["floor_s"] * 1e3 for n in names]
        ax.barh([i + 0.2 for i in y], meas, height=0.4, label="measured", color="#c0504d")
        ax.barh([i - 0.2 for i in y], flo, height=0.4, label="contract floor", color="#4f81bd")
        for i, (m, f) in enumerate(zip(meas, flo)):
            ax.text(m, i + 0.2, f" {m / f:.1f}x", va="center", fontsize=8)
        ax.set_yticks(list(y))
        ax.set_yticklabels(names)
        ax.invert_yaxis()
        ax.set_xlabel("ms, all layers")
        ax.set_title(f"{run['tokens']} tokens: {sum(meas):.0f} ms measured, {sum(flo):.0f} floor")
        ax.legend(loc="lower right", fontsize=8)
    fig.suptitle(f"{results['device']}: prefill phases against the contract's floor ({results['pack']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _measure(pack_path: str, tokens: list[int]) -> dict:
    import numpy as np  # noqa: PLC0415

    from strata_prefill.fast import make_fast_engine  # noqa: PLC0415
    from strata_prefill.fast.cuda import runtime  # noqa: PLC0415
    from strata_prefill.formats.pack import Pack  # noqa: PLC0415
    from strata_prefill.session import Session  # noqa: PLC0415

    pack = Pack.open(pack_path)
    cfg = pack.config
    eng = make_fast_engine(pack, "cuda")
    cuda = runtime._driver()
    attr = runtime._device().get_attribute
    clock_hz = attr(cuda.device_attribute.CLOCK_RATE) * 1e3
    peak = 2 * attr(cuda.device_attribute.MEMORY_CLOCK_RATE) * 1e3 * attr(cuda.device_attribute.GLOBAL_MEMORY_BUS_WIDTH) / 8
    dev = Device(4 * runtime.multiprocessor_count(), clock_hz, peak)
    print(f"{runtime.device_name()}: {dev.schedulers} schedulers at {clock_hz / 1e9:.2f} GHz, memory "
          f"{peak / 1e9:.0f} GB/s peak", flush=True)
    groups = pack_groups(pack)
    rng = np.random.default_rng(0)
    runs = []
    for n in tokens:
        Session(eng, progress=False).prefill(rng.integers(0, cfg.n_vocab, n))  # warm-up
        eng.be.reset_cache()
        eng.be.timing = True
        eng.be.phase_table()
        Session(eng, progress=False).prefill(rng.integers(0, cfg.n_vocab, n))
        measured = eng.be.phase_table()
        eng.be.timing = False
        eng.be.reset_cache()
        floors = model_floors(cfg, groups, n, dev)
        print("\n" + format_table(n, measured, floors), flush=True)
        runs.append({"tokens": n, "measured": {k: v for k, v in measured.items() if k in floors}, "floors": floors})
    return {"device": runtime.device_name(), "pack": os.path.basename(pack_path),
            "types": {k: v.name for k, v in groups[0][0].items()},
            "layer_groups": [{"layers": n, "types": {k: v.name for k, v in t.items()}} for t, n in groups],
            "schedulers": dev.schedulers, "clock_hz": clock_hz, "peak_bytes_per_s": peak, "runs": runs}


def _floors_only(ap, args) -> int:
    if args.preset not in PRESETS:
        ap.error(f"--preset: unknown preset {args.preset!r} (presets: {', '.join(sorted(PRESETS))})")
    cfg = PRESETS[args.preset]
    if args.layers is not None:
        if args.layers < 1:
            ap.error(f"--layers: expected a positive number of layers, got {args.layers}")
        cfg = cfg.replace(n_layer=args.layers)
    try:
        groups = preset_groups(cfg, args.preset, mix=args.mix, expert_type=args.expert_type,
                               dense_type=args.dense_type, router_type=args.router_type)
    except InputError as e:
        ap.error(str(e))
    dev = args.card or CARDS["h100"]
    what = f"{args.preset}" + (f" --mix {args.mix}" if args.mix else "") + f", {cfg.n_layer} layers"
    print(f"{what}: {dev.schedulers} schedulers at {dev.clock_hz / 1e9:.2f} GHz, memory "
          f"{dev.peak_bytes_per_s / 1e9:,.0f} GB/s")
    for types, n in groups:
        print(f"  {n} layer{'s' if n > 1 else ''}: " + ", ".join(f"{k} {v.name}" for k, v in types.items()))
    runs = []
    for n_tok in args.tokens:
        floors = model_floors(cfg, groups, n_tok, dev)
        print("\n" + format_floors(n_tok, floors))
        runs.append({"tokens": n_tok, "floors": floors})
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "floors.json"), "w") as f:
            json.dump({"preset": args.preset, "mix": args.mix, "layers": cfg.n_layer,
                       "schedulers": dev.schedulers, "clock_hz": dev.clock_hz,
                       "peak_bytes_per_s": dev.peak_bytes_per_s, "runs": runs}, f, indent=1)
    return 0


def token_list(text: str) -> list[int]:
    """--tokens: prompt lengths, comma-separated positive integers."""
    try:
        out = [int(t) for t in text.split(",")]
    except ValueError:
        out = []
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pack", help="the pack to prefill (the GPU run)")
    ap.add_argument("--tokens", type=token_list, default="2048,8192,32768")
    ap.add_argument("--out", default=os.environ.get("OUT", ""),
                    help="write phase_floors.json here (floors.json with --preset)")
    ap.add_argument("--plot", nargs=2, metavar=("JSON", "PNG"), help="draw a phase_floors.json (no GPU)")
    floors_only = ap.add_argument_group("the floors alone, of the pack make-pack would write (no pack, no GPU)")
    floors_only.add_argument("--preset", help="a make-pack preset")
    floors_only.add_argument("--layers", type=int, help="its layers (default the preset's)")
    for opt in ("--mix", "--expert-type", "--dense-type", "--router-type"):
        floors_only.add_argument(opt, help=f"as make-pack's {opt}")
    floors_only.add_argument("--card", type=card,
                             help=f"{', '.join(CARDS)} (NVIDIA's figures) or SMS:GHZ:GB/S (default h100)")
    args = ap.parse_args(argv)
    if args.preset:
        if args.pack or args.plot:
            ap.error("--preset prints the floors alone: give no --pack or --plot with it")
        return _floors_only(ap, args)
    alone = [o for o in ("layers", "mix", "expert_type", "dense_type", "router_type", "card")
             if getattr(args, o) is not None]
    if alone:
        ap.error(f"--{alone[0].replace('_', '-')} goes with --preset (a pack's types and card are its own)")
    if args.plot:
        try:
            with open(args.plot[0]) as f:
                results = json.load(f)
        except (OSError, ValueError) as e:
            ap.error(f"--plot: cannot read {args.plot[0]}: {e}")
        if (not isinstance(results, dict) or not isinstance(results.get("runs"), list)
                or not all(isinstance(r, dict) and "measured" in r for r in results["runs"])):
            ap.error(f"--plot: {args.plot[0]} is not a phase_floors.json (no measured runs)")
        try:
            plot(results, args.plot[1])
        except ImportError:
            ap.error("--plot needs matplotlib (pip install -e '.[plot]')")
        print(f"wrote {args.plot[1]}")
        return 0
    if not args.pack:
        ap.error("--pack is required for a GPU run (or --plot JSON PNG)")
    if not os.path.isfile(args.pack):
        ap.error(f"--pack: no such file: {args.pack}")
    if args.out:
        os.makedirs(args.out, exist_ok=True)  # before the GPU work: an unwritable --out fails first
    results = _measure(args.pack, args.tokens)
    if args.out:
        with open(os.path.join(args.out, "phase_floors.json"), "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
