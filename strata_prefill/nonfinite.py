"""`run`'s refusal of a result holding NaN or Inf: one line on stderr naming where the
values first appear (formats/nonfinite.py), exit status 1. The dumps the run wrote stay in
place: they are the evidence."""
from __future__ import annotations

import sys
from pathlib import Path

from strata_prefill.formats import nonfinite

EXIT_NONFINITE = 1  # not 2: the input was well formed, the numbers it led to are not
HINT = "--dump-dir DIR --dump-level ops names the layer and op where they first appear"


def refusal_line(logits, pack, dump_dir: Path | None = None, dump_r: Path | None = None,
                 dump_level: str = "layer", greedy_nonfinite: int | None = None,
                 found=None) -> str | None:
    """The line for a run that computed a NaN or an Inf, None when it did not. found: the
    run's own answer (RunResult.nonfinite: the engine's watch, on every run, and the replay
    that names the op, strata_prefill/session.py); beside it the first-token logits, the residual dump,
    the record file and the greedy steps' logits (greedy_nonfinite: the first greedy token
    picked from such logits). The most precise wins: the run's own op records, then the
    replay's, then the watch's layer and op, then the layer-level records, the residual dump,
    the logits."""
    cfg = pack.config
    in_logits = nonfinite.in_logits(logits)
    in_resid = nonfinite.in_residual_dump(dump_r, cfg.n_embd) if dump_r and Path(dump_r).exists() else None
    records = Path(dump_dir) / "layers.spd" if dump_dir else None
    in_file = None
    if records is not None and records.exists():
        in_file = nonfinite.in_records(records, nonfinite.q8_layouts(pack), cfg.n_expert_used)
    replayed = found if isinstance(found, nonfinite.Found) else None
    seen = found if isinstance(found, nonfinite.Seen) else None
    if (in_file is None and in_logits is None and in_resid is None and greedy_nonfinite is None
            and found is None):
        return None
    head = "strata-prefill: error: the run computed non-finite values: "  # as every failure
    first = in_file if in_file is not None and dump_level == "ops" else replayed or in_file
    if first is not None and not (first is in_file and dump_level != "ops" and seen is not None):
        line = head + first.summary()
        if first is in_file and dump_level != "ops":  # layer level: router, q8_1 buffers, residual
            line += "; --dump-level ops names the op"
    elif seen is not None:
        line = head + f"NaN or Inf first in {seen.where()}; " + HINT.replace("the layer and op", "the position")
    elif in_resid is not None:
        line = head + in_resid.summary() + "; " + HINT
    elif in_logits is not None:
        line = head + in_logits.summary() + "; " + HINT
    else:  # only a one-token step of the greedy continuation
        line = (head + f"NaN or Inf first in the logits greedy token {greedy_nonfinite} was picked "
                "from (the first-token logits are finite); " + HINT)
    if first is not None or seen is not None or in_resid is not None:
        line += ("; the first-token logits are finite" if in_logits is None else
                 f"; the first-token logits hold {in_logits.count:,} non-finite of {in_logits.size:,}")
    return line + " (the dumps written stay)" if (dump_dir or dump_r) else line


def refuse(result, pack, args) -> bool:
    """Print run's refusal line and say True where the run's results hold NaN or Inf.
    result: the run's RunResult (strata_prefill/session.py), a cached reference run (RefRun, which
    keeps the same answers), or the first-token logits alone."""
    from strata_prefill.session import parse_dump_level

    logits = getattr(result, "logits", result)
    line = refusal_line(logits, pack, args.dump_dir, args.dump_r, parse_dump_level(args.dump_level),
                        getattr(result, "greedy_nonfinite", None), getattr(result, "nonfinite", None))
    if line is None:
        return False
    print(line, file=sys.stderr, flush=True)
    return True
