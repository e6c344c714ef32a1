"""What the parity tests share: running an engine with dumps, and comparing two runs."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from strata_prefill.formats.records import q8_layouts, read_timeline
from strata_prefill.report import compare_timelines, diff_array
from strata_prefill.session import Session
from strata_prefill.verify.cases import OPS_DUMP_MAX_TOKENS


SIM_SKIP_REASON = "a GPU is here: the cuda rows check the walk on the card (STRATA_VERIFY_SIM=1 runs the sim rows too)"


def cuda_here() -> tuple[bool, str]:
    """(whether the cuda backend runs here, why not)."""
    try:
        from strata_prefill.fast.cuda.runtime import cuda_available
    except ImportError as exc:  # pragma: no cover - the runtime module itself is missing
        return False, f"the cuda runtime does not import: {exc}"
    return cuda_available()


def sim_here() -> bool:
    """Whether the sim's tests run: where there is no GPU (the CPU tier), or when asked
    (STRATA_VERIFY_SIM=1); on a GPU machine the cuda rows check the same walk on the card."""
    return not cuda_here()[0] or os.environ.get("STRATA_VERIFY_SIM") == "1"


@dataclass
class Run:
    logits: np.ndarray
    greedy: list
    timeline: list  # strata_prefill.formats.records.Chunk, in the order they ran
    residuals: bytes


def run_engine(engine, ids, chunk, out_dir: Path, greedy: int = 2, layer_dumps: bool = True,
               dump_level: str | None = None) -> Run:
    """Run with the Strata dumps, and the record file unless `layer_dumps` is off (long
    prompts: their q8_1 buffers run to gigabytes). dump_level None: "ops" up to
    OPS_DUMP_MAX_TOKENS tokens, else "layer"."""
    out_dir.mkdir(parents=True, exist_ok=True)
    level = dump_level or ("ops" if len(ids) <= OPS_DUMP_MAX_TOKENS else "layer")
    s = Session(engine, chunk=chunk, dump_dir=out_dir if layer_dumps else None, dump_r=out_dir / "r.bin",
                progress=False, dump_level=level)
    res = s.run(ids, greedy=greedy)
    timeline = read_timeline(out_dir / "layers.spd") if layer_dumps else []
    return Run(res.logits, res.greedy, timeline, (out_dir / "r.bin").read_bytes())


def assert_same_run(a: Run, b: Run, pack, what: str) -> None:
    """Byte for byte: every dump record, the residual dump, the first-token logits, the
    greedy tokens. A failure names the first op that differs (strata_prefill/report.py)."""
    k = pack.config.n_expert_used
    miss = compare_timelines(a.timeline, b.timeline, q8_layouts(pack), k)
    assert miss is None, f"{what}:\n{miss}"
    logits = diff_array("first-token logits", a.logits[None], b.logits[None])
    assert logits is None, f"{what}: {logits}"
    assert a.residuals == b.residuals, f"{what}: STRATA_PREFILL_DUMP_R files differ"
    assert a.greedy == b.greedy, f"{what}: greedy tokens {a.greedy} vs {b.greedy}"


def copied_by_choices(pack, engine) -> int:
    """The bytes a fast engine's walks copy, from its units' records (strata_prefill.fast.schedule.WalkChoice): a
    streamed layer every streamed expert of it, a staged one its head (stage_head) and its
    routed ones the head did not hold (a copy counter that differs from this copied something
    no walk chose, or missed something)."""
    blob = [pack.expert_blob_size(l) for l in range(pack.config.n_layer)]
    n = [len(engine.placement.streamed(l)) for l in range(pack.config.n_layer)]
    total = 0
    for u in engine.walk_choices:
        for l, c in enumerate(u.layers):
            if c.walk == "resident":
                continue
            assert 0 <= u.in_head[l] <= min(c.head, u.routed[l]), (l, c, u.routed[l], u.in_head[l])
            total += blob[l] * (n[l] if c.streams else c.head + u.routed[l] - u.in_head[l])
    return total
