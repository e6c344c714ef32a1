#!/usr/bin/env python3
"""Each prefill phase against its floor inside the numerics contract: how far the fast path is
from the fastest any kernel keeping these bytes could be, on this device.

    python3 -m bench.phase_floors --pack strata8.gguf [--tokens 2048,8192,32768] [--out DIR]
    python3 -m bench.phase_floors --plot phase_floors.json phase_floors.png   # needs matplotlib

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

from strata_prefill.formats.config import ModelConfig

#: issue slots of the MMQ epilogue per output element and 32-value block, as mmq.cu writes the
#: contract's float steps (docs/numerics.md section 3; exact fused forms counted as one):
#: Q8_0 conversion, dw * da, product, sum; Q4_1 adds the min term (product and sum); IQ2_XS two
#: sub-scaled half sums (one exact FMA each), their sum, dw * da, product, sum; IQ3 one
#: sub-scaled sum; Q2_K two sub-scaled halves and their sum, the min term's two-half integer sum
#: (two products and a sum), dmin * da and its product, the difference, dw * da, product, sum
MMQ_EPILOGUE = {QT.Q8_0: 4, QT.Q4_1: 6, QT.IQ2_XS: 6, QT.IQ3_XXS: 4, QT.IQ3_S: 4, QT.Q2_K: 12}
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


def _mmq_ops(qt: QT, rows: float, n_out: int, k: int) -> float | None:
    """Lane operations of one quantized product (rows x n_out outputs over k values), None for
    a type without an epilogue count here."""
    if qt in FLOAT_TYPES:
        return FLOAT_PER_MAC * rows * n_out * k
    per = MMQ_EPILOGUE.get(qt)
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


def layer_types(pack) -> dict[str, QT]:
    """The qtypes phase_floors needs, from layer 0 of a pack."""
    names = ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate_inp", "ffn_gate_exps", "ffn_down_exps",
             "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"]
    have = set(pack.tensor_names())
    return {n: QT(pack.tensor_type(f"blk.0.{n}")) for n in names if f"blk.0.{n}" in have}


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
    types = layer_types(pack)
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
        floors = phase_floors(cfg, types, n, cfg.n_layer, dev)
        print("\n" + format_table(n, measured, floors), flush=True)
        runs.append({"tokens": n, "measured": {k: v for k, v in measured.items() if k in floors}, "floors": floors})
    return {"device": runtime.device_name(), "pack": os.path.basename(pack_path),
            "types": {k: v.name for k, v in types.items()},
            "schedulers": dev.schedulers, "clock_hz": clock_hz, "peak_bytes_per_s": peak, "runs": runs}


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
    ap.add_argument("--out", default=os.environ.get("OUT", ""), help="write phase_floors.json here")
    ap.add_argument("--plot", nargs=2, metavar=("JSON", "PNG"), help="draw a phase_floors.json (no GPU)")
    args = ap.parse_args(argv)
    if args.plot:
        try:
            with open(args.plot[0]) as f:
                results = json.load(f)
        except (OSError, ValueError) as e:
            ap.error(f"--plot: cannot read {args.plot[0]}: {e}")
        if not isinstance(results, dict) or not isinstance(results.get("runs"), list):
            ap.error(f"--plot: {args.plot[0]} is not a phase_floors.json (no runs)")
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
