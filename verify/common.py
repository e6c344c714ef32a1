"""What the parity tests share: running an engine with dumps, and comparing two runs."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from strata import q8_1
from strata.dumps import read_records
from strata.session import Session

from verify.report import compare_records, diff_array

# (buffer name in the dumps, which expert matrix selects its layout)
Q8_RECORDS = {"moe_in_q8_1": 0, "down_in_q8_1": 1}


@dataclass
class Run:
    logits: np.ndarray
    greedy: list
    records: dict
    residuals: bytes


def run_engine(engine, ids, chunk, out_dir: Path, greedy: int = 2, layer_dumps: bool = True) -> Run:
    """Run with the Strata dumps, and the per-layer record file unless `layer_dumps` is off
    (long prompts: their q8_1 buffers run to gigabytes)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    s = Session(engine, chunk=chunk, dump_dir=out_dir if layer_dumps else None, dump_r=out_dir / "r.bin",
                progress=False)
    res = s.run(ids, greedy=greedy)
    records = read_records(out_dir / "layers.spd") if layer_dumps else {}
    return Run(res.logits, res.greedy, records, (out_dir / "r.bin").read_bytes())


def layouts_of(pack) -> dict:
    out = {}
    for layer in range(pack.config.n_layer):
        types = pack.expert_types(layer)
        for name, which in Q8_RECORDS.items():
            out[(f"L{layer:02d}", name)] = q8_1.layout_for(types[which])
    return out


def assert_same_run(a: Run, b: Run, pack, what: str) -> None:
    """Byte for byte: every dump record, the residual dump, the first-token logits, the
    greedy tokens. A failure names the first differing byte."""
    k = pack.config.n_expert_used
    miss = compare_records(a.records, b.records, k, layouts_of(pack))
    assert miss is None, f"{what}: {miss}"
    logits = diff_array("first-token logits", a.logits[None], b.logits[None])
    assert logits is None, f"{what}: {logits}"
    assert a.residuals == b.residuals, f"{what}: STRATA_PREFILL_DUMP_R files differ"
    assert a.greedy == b.greedy, f"{what}: greedy tokens {a.greedy} vs {b.greedy}"
