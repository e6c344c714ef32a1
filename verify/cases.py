"""The one table of cases, in the manner of llama.cpp's test-backend-ops: every kernel case and
every parity case is one row here, and nothing else lists them.

- `KERNEL_CASES`: one CUDA op at one shape, weight type and configuration (or kernel form), with
  the FLOPs and bytes one launch does and moves. `verify/` checks every row byte for byte
  against its NumPy definition; `bench/` times the rows marked `timed` (the shapes timed are the
  shapes checked) and reports TOP/s or GB/s from the row's own figures.
- `PARITY_CASES`: one run of the fast path (pack, prompt, chunking, switch arm, streaming
  setting, backend) compared byte for byte with the reference's run of the same prompt (kept in
  the reference cache: chunking, switches, ring and cache sizes change no bit, docs/numerics.md
  section 9).

Rows marked `quick` make up `pytest verify/ -m quick`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

# ============================================================================ kernel cases


@dataclass(frozen=True)
class KernelCase:
    """One kernel launch checked (and, if `timed`, benchmarked) at one shape."""

    op: str  # the test family: "quantize", "mmq", "attention", ...
    name: str  # unique within op: the pytest id
    shape: dict = field(default_factory=dict)  # the op's own shape arguments
    weight_type: str | None = None
    config: object = None  # a tile configuration or kernel form, None: the default
    flops: int = 0  # one launch (integer or float operations)
    bytes: int = 0  # one launch's fewest bytes moved (each input read once, each output written once)
    quick: bool = False
    timed: bool = False

    @property
    def id(self) -> str:
        return f"{self.op}-{self.name}"


KERNEL_CASES: tuple[KernelCase, ...] = ()


def kernel_rows(op: str, **where) -> list[KernelCase]:
    """The rows of one op (optionally only those whose attributes equal `where`)."""
    return [c for c in KERNEL_CASES if c.op == op and all(getattr(c, k) == v for k, v in where.items())]


# ============================================================================ parity cases

# The switch designs: names, then arms (the defaults first; every pair of switches meets all
# four value pairs: the 3-of-6 vectors, no two complementary; tests/test_switch_designs.py).
SIM_SWITCH_NAMES = ("group_gather", "quant_gather", "overlap_plan", "fuse_group", "in_place")
SIM_SWITCHES = [(1, 0, 1, 1, 1), (0, 0, 0, 0, 0), (0, 1, 0, 1, 0), (0, 1, 1, 0, 0), (1, 1, 0, 0, 0), (0, 1, 0, 0, 1)]
CUDA_SWITCH_NAMES = ("group_gather", "quant_gather", "overlap_plan", "fuse_group", "lean_attention", "tiled_dense",
                     "in_place", "widen_float", "pair_attention")
CUDA_SWITCHES = [(1, 0, 1, 1, 1, 1, 1, 1, 1), (0, 0, 0, 0, 0, 0, 0, 1, 1), (0, 0, 0, 0, 1, 1, 1, 0, 0),
                 (0, 1, 1, 1, 0, 0, 1, 0, 0), (1, 1, 0, 1, 0, 1, 0, 0, 1), (1, 1, 1, 0, 1, 0, 0, 1, 0)]
# Streamed arms: (group_gather, quant_gather, copy_coalesce), every combination; rings and caches
# cycle with the arm so that each value meets several of the others.
STREAM_SWITCHES = [(1, 0, 0), (1, 0, 1), (1, 1, 0), (1, 1, 1), (0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1)]
RINGS = [8, 16, 96, 128, 384]
# Whole-model packs that only the GPU runs at length: a 2-layer `strata` pack (512 experts,
# top-10, a shared expert).
STRATA2 = ("strata", "IQ2_XS", (("layers", 2),))
EXPERT_TYPES = ("Q8_0", "Q4_1", "Q2_K", "IQ2_XS", "IQ3_XXS", "IQ3_S")
# Prompts up to this many tokens record every op (dump level "ops"), so that a failure names the
# first op that went wrong; longer ones the layer level (per-pair products run to hundreds of MB).
OPS_DUMP_MAX_TOKENS = 256


@dataclass(frozen=True)
class ParityCase:
    """One fast-path run compared byte for byte with a base run of the same prompt: the
    reference's (kept in the reference cache), or, where NumPy is too slow (32K), the fast
    path's own all-resident default run."""

    name: str  # the pytest id
    backend: str  # "cuda" or "sim"
    preset: str
    expert_type: str
    tokens: int
    chunk: object = "auto"
    arm: tuple = ()  # (FastEngine keyword, value) pairs: switches, caches, ring, stream threshold
    pack_options: tuple = ()  # (make_pack keyword, value) pairs
    prompt: str = "uniform"  # "uniform": random ids; "few": three ids, so streamed chunks skip experts
    seed: int | None = None  # the prompt's seed (None: the token count)
    greedy: int = 2
    records: bool = True  # compare the record file (off at length: its buffers run to gigabytes)
    dump_level: str | None = None  # None: "ops" up to OPS_DUMP_MAX_TOKENS tokens, else "layer"
    base: str = "reference"  # or "resident"
    sim_seed: int | None = None  # the sim's schedule seed (its streams' interleaving)
    stress: bool = False  # run under STRATA_PREFILL_STRESS (the cuda backend's forced interleavings)
    open_skip: bool = False  # the routing must skip ring entries inside open groups
    quick: bool = False

    @property
    def options(self) -> dict:
        return dict(self.arm)

    @property
    def level(self) -> str | None:
        if not self.records:
            return None
        return self.dump_level or ("ops" if self.tokens <= OPS_DUMP_MAX_TOKENS else "layer")

    @property
    def case_key(self) -> str:
        """The (pack, prompt) this row runs: rows sharing it share one reference run."""
        pack = "-".join([self.preset, self.expert_type, *(f"{k}{v}" for k, v in self.pack_options)])
        return f"{pack}/{self.prompt}{self.tokens}s{self.seed if self.seed is not None else self.tokens}"

    @property
    def cost(self) -> float:
        """A rough relative cost, so that the longest rows start first."""
        size = {"tiny": 1, "small": 4, "strata": 60}[self.preset]
        return size * (self.tokens + 200) * (2 if self.base == "resident" else 1)


def _arm_name(arm: dict) -> str:
    short = {"group_gather": "gg", "quant_gather": "qg", "overlap_plan": "op", "fuse_group": "fg",
             "lean_attention": "la", "tiled_dense": "td", "in_place": "ip", "widen_float": "wf",
             "pair_attention": "pa", "copy_coalesce": "co", "expert_cache": "cache", "ring": "ring",
             "stream_min": "smin", "group_size": "gs"}
    return ",".join(f"{short.get(k, k)}{v}" for k, v in arm.items()) or "default"


def _row(backend, preset, etype, tokens, chunk="auto", arm=None, **kw) -> ParityCase:
    arm = {k: v for k, v in (arm or {}).items() if v is not None}
    opts = kw.get("pack_options", ())
    bits = [backend, preset, etype, *(f"{k}{v}" for k, v in opts), f"T{tokens}", f"c{chunk}", _arm_name(arm)]
    for flag in ("prompt", "stress", "base"):
        if flag in kw and kw[flag] not in ("uniform", False, "reference"):
            bits.append(str(kw[flag]) if flag != "stress" else "stress")
    if kw.get("sim_seed") is not None:
        bits.append(f"seed{kw['sim_seed']}")
    return ParityCase("-".join(bits), backend, preset, etype, tokens, chunk, tuple(arm.items()), **kw)


def _all_experts(preset: str, layers: int | None = None) -> int:
    from strata.config import PRESETS

    cfg = PRESETS[preset]
    return (layers or cfg.n_layer) * cfg.n_expert


def _cuda_rows() -> list[ParityCase]:
    rows = []
    defaults = dict(zip(CUDA_SWITCH_NAMES, CUDA_SWITCHES[0]))

    def arm_of(i):  # arm i of the design, as the switches that differ from the defaults
        return {k: v for k, v in zip(CUDA_SWITCH_NAMES, CUDA_SWITCHES[i]) if defaults[k] != v}

    # Resident experts: every weight type at every length with the defaults; each other arm of
    # the design at two lengths per type (rotating, so every arm meets every length).
    lengths = {"tiny": [(1, "auto"), (63, "auto"), (128, "auto"), (600, "auto"), (1030, "auto"), (2099, "auto"),
                        (2099, 700)],
               "small": [(1, "auto"), (63, "auto"), (600, "auto"), (2099, "auto"), (2099, 700)]}
    for preset, spread in lengths.items():
        for ti, etype in enumerate(EXPERT_TYPES):
            for n, chunk in spread:
                rows.append(_row("cuda", preset, etype, n, chunk, quick=preset == "tiny" and n == 63))
            for i in range(1, len(CUDA_SWITCHES)):
                for j in (i + ti, i + ti + 3):
                    n, chunk = spread[j % len(spread)]
                    rows.append(_row("cuda", preset, etype, n, chunk, arm_of(i)))
    # Every switch's earlier form once in the quick tier (tiny Q8_0, 130 tokens).
    for k in CUDA_SWITCH_NAMES:
        if k != "widen_float":
            rows.append(_row("cuda", "tiny", "Q8_0", 130, 64, {k: 1 - defaults[k]}, quick=True))
    # Float routers and float attention/shared-expert matrices, widened to F32 or read as stored.
    for router, dense in (("BF16", "F16"), ("F32", "F16"), ("BF16", "Q8_0")):
        for wf in (1, 0):
            rows.append(_row("cuda", "tiny", "Q4_1", 70, 64, {"widen_float": wf}, seed=3,
                             pack_options=(("router_type", router), ("dense_type", dense)),
                             quick=(router, dense, wf) == ("BF16", "F16", 0)))
    # Experts streamed from the host tier: caches of none, a third and all; rings of 8 to 384;
    # streamed and staged chunks; every streamed arm.
    for preset, etype in (("tiny", "Q8_0"), ("tiny", "IQ2_XS"), ("tiny", "Q2_K"), ("tiny", "Q4_1"),
                          ("small", "IQ2_XS"), ("small", "Q2_K")):
        n_all = _all_experts(preset)
        for n, chunk, stream_min in ((130, 64, 64), (1100, "auto", None)):
            if preset == "small" and n == 130:
                continue
            for i, (gg, qg, co) in enumerate(STREAM_SWITCHES):
                arm = dict(group_gather=gg, quant_gather=qg, copy_coalesce=co, expert_cache=(0, n_all // 3, n_all)[i % 3],
                           ring=RINGS[i % len(RINGS)], stream_min=stream_min, in_place=1 - (i // 3) % 2)
                rows.append(_row("cuda", preset, etype, n, chunk, arm,
                                 quick=(preset, etype, n, i) in (("tiny", "Q8_0", 130, 0), ("tiny", "Q8_0", 130, 1))))
    # Streamed chunks whose routing skips ring entries inside open groups: a prompt of three ids.
    for preset, etype in (("tiny", "Q8_0"), ("tiny", "IQ2_XS"), ("small", "Q2_K")):
        n_all = _all_experts(preset)
        for gg in (1, 0):
            for ring in (8, 16):
                arm = dict(group_gather=gg, expert_cache=n_all // 3, ring=ring, stream_min=16)
                rows.append(_row("cuda", preset, etype, 200, 64, arm, prompt="few", open_skip=True,
                                 quick=(preset, etype, gg, ring) == ("tiny", "Q8_0", 1, 8)))
    # Long prompts on the strata pack: 8K against the reference (resident arms of the design and
    # streamed arms, a third of the experts cached); 32K against the all-resident default run.
    preset, etype, opts = STRATA2
    n_all = _all_experts(preset, 2)
    for i in range(len(CUDA_SWITCHES)):
        rows.append(_row("cuda", preset, etype, 8192, "auto", {**arm_of(i), "expert_cache": n_all}, greedy=1,
                         records=False, pack_options=opts))
    for i, (gg, qg, co) in enumerate(STREAM_SWITCHES):
        arm = dict(group_gather=gg, quant_gather=qg, copy_coalesce=co, expert_cache=n_all // 3,
                   ring=(None, 96, 8)[i % 3], in_place=1 - (i // 3) % 2)
        rows.append(_row("cuda", preset, etype, 8192, "auto", arm, greedy=1, records=False, pack_options=opts))
    for arm in ({"expert_cache": n_all // 3}, {"expert_cache": n_all // 3, "ring": 8, "copy_coalesce": 1, "group_gather": 0},
                {**arm_of(1), "expert_cache": n_all}):
        rows.append(_row("cuda", preset, etype, 32768, "auto", arm, greedy=1, records=False, base="resident",
                         pack_options=opts))
    # Under the stress mode: the streaming and overlap cases once.
    for preset, etype, n, chunk, arm in (
            ("tiny", "Q8_0", 130, 64, dict(expert_cache=0, ring=8, stream_min=64)),
            ("tiny", "Q8_0", 130, 64, dict(expert_cache=0, ring=8, stream_min=64, group_gather=0, copy_coalesce=1)),
            ("tiny", "Q2_K", 130, 64, dict(expert_cache=11, ring=16, stream_min=64, overlap_plan=0)),
            ("tiny", "IQ2_XS", 600, "auto", dict(overlap_plan=1)),
            ("tiny", "IQ2_XS", 600, "auto", dict(overlap_plan=0)),
            ("small", "IQ2_XS", 1100, "auto", dict(expert_cache=_all_experts("small") // 3, ring=16))):
        rows.append(_row("cuda", preset, etype, n, chunk, arm, stress=True))
    rows.append(_row("cuda", "tiny", "Q8_0", 200, 64, dict(expert_cache=10, ring=8, stream_min=16), prompt="few",
                     open_skip=True, stress=True))
    return rows


def _sim_rows() -> list[ParityCase]:
    rows = []
    for etype in EXPERT_TYPES:
        for n in (1, 63, 130):
            for sw in SIM_SWITCHES:
                arm = {k: v for k, v in zip(SIM_SWITCH_NAMES, sw)}
                rows.append(_row("sim", "tiny", etype, n, 64, arm, quick=n == 63 and sw == SIM_SWITCHES[0]))
    for router in ("F32", "BF16", "Q8_0"):  # float routers, float dense matrices; a Q8_0 router the MMQ path
        for dense in ("Q8_0", "F16"):
            rows.append(_row("sim", "tiny", "Q4_1", 70, 64, seed=3,
                             pack_options=(("router_type", router), ("dense_type", dense))))
    for etype in ("Q2_K", "IQ3_XXS"):  # 64 experts, top-8, a fallback down type, three chunks
        for gg, qg in ((1, 0), (0, 1)):
            rows.append(_row("sim", "small", etype, 600, 256, dict(group_gather=gg, quant_gather=qg), seed=11))
    for gs in (1, 3, 16):
        rows.append(_row("sim", "tiny", "IQ2_XS", 97, 64, dict(group_size=gs), seed=5))
    for chunk in (1, 37, "auto"):
        rows.append(_row("sim", "tiny", "Q4_1", 150, chunk, seed=6))
    for etype in ("Q8_0", "Q4_1", "Q2_K"):  # the fused SwiGLU + quantize of H, every down layout
        rows.append(_row("sim", "tiny", etype, 90, 64, seed=12, dump_level="layer"))
    for etype in ("Q8_0", "IQ2_XS", "Q2_K"):
        for ring in RINGS:
            for i, (gg, qg, co) in enumerate(STREAM_SWITCHES):
                arm = dict(group_gather=gg, quant_gather=qg, copy_coalesce=co, expert_cache=(0, 11, 32)[(i + ring) % 3],
                           ring=ring, stream_min=64)
                rows.append(_row("sim", "tiny", etype, 130, 64, arm, seed=ring, sim_seed=i,
                                 quick=(etype, ring, i) == ("Q8_0", 8, 0)))
    n_cache = _all_experts("small") // 3
    for gg in (1, 0):
        rows.append(_row("sim", "small", "IQ3_S", 600, 512, dict(group_gather=gg, expert_cache=n_cache, ring=16,
                                                                  stream_min=256), seed=12))
        for ring in (8, 16):
            rows.append(_row("sim", "tiny", "Q8_0", 200, 64, dict(group_gather=gg, expert_cache=10, ring=ring,
                                                                   stream_min=16), prompt="few", open_skip=True,
                             sim_seed=ring))
    return rows


PARITY_CASES: tuple[ParityCase, ...] = tuple(_cuda_rows() + _sim_rows())


def parity_rows(backend: str | None = None, **where) -> list[ParityCase]:
    return [c for c in PARITY_CASES if (backend is None or c.backend == backend)
            and all(getattr(c, k) == v for k, v in where.items())]
