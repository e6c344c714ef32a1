"""The gate's references, computed ahead: `python3 -m strata_prefill.verify.precompute [--quick]` runs the
reference for every (pack, prompt) the cuda parity rows compare with, the costliest first,
into the reference cache. The gate starts it beside its workers on a GPU machine (verify/gate.py),
with every core, so the long references are kept by the time the workers reach their rows;
a reference a worker needs first is computed by that worker (the cache's per-key lock keeps
the two from computing one twice)."""
from __future__ import annotations

import argparse
import sys
import time


def rows(quick: bool):
    from strata_prefill.verify.cases import parity_rows

    seen, out = set(), []
    for c in sorted(parity_rows("cuda"), key=lambda c: -c.cost):
        if c.base != "reference" or (quick and not c.quick):
            continue
        key = (c.case_key, c.greedy, c.level)
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m strata_prefill.verify.precompute")
    ap.add_argument("--quick", action="store_true", help="only the quick tier's rows")
    args = ap.parse_args(argv)
    from strata_prefill.formats.pack import Pack
    from strata_prefill import refcache
    from strata_prefill.verify import gate

    t0, todo = time.perf_counter(), rows(args.quick)
    for c in todo:
        pack = Pack.open(gate.kept_pack(c.preset, c.expert_type, dict(c.pack_options), None))
        refcache.reference_run(pack, c.prompt_ids(pack.config.n_vocab), greedy=c.greedy, dump_level=c.level)
    s = refcache.stats()
    print(f"gate: references ahead: {len(todo)} runs, {s['misses']} computed, {s['hits']} kept, "
          f"{time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
