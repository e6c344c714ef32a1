"""How much one prompt's routing tells of another's, per layer, from the op records of runs on
one pack (`strata-prefill run --dump-dir DIR`): whether a cache or a head filled by the experts
an earlier prompt used would hold the experts a later prompt routes.

    python3 -m dev.routing_overlap --expert-cache 1365 --head 15 A/layers.spd B/layers.spd

Per layer, for prompt B: how many experts it routes at all; how many of the streamed ones (the
fast path's placement of --expert-cache, strata_prefill.fast.experts.place_experts) it routes, against the
same count where the cache holds instead the experts prompt A routed most often; and how many
of a head of --head streamed experts it routes, the lowest ids (stage_head) against the ones A
routed most often. NumPy only; runs anywhere.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

from strata_prefill.fast.experts import place_experts
from strata_prefill.formats.dumps import read_records


def layer_counts(path: str) -> list[np.ndarray]:
    """Per layer, how many of the prompt's top-k entries name each expert."""
    rec = read_records(path)
    layers = sorted(int(k[1:3]) for k in rec if k.endswith(".topk_ids"))
    return [rec[f"L{l:02d}.topk_ids"].ravel() for l in layers]


def by_use(counts: np.ndarray, n: int) -> np.ndarray:
    """The n experts most often named in counts, ties to the lower id."""
    ids = np.arange(len(counts))
    return np.lexsort((ids, -counts))[:n]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a", help="prompt A's layers.spd (the earlier prompt)")
    p.add_argument("b", help="prompt B's layers.spd")
    p.add_argument("--expert-cache", type=int, required=True)
    p.add_argument("--head", type=int, default=15)
    args = p.parse_args(argv)
    ids_a, ids_b = layer_counts(args.a), layer_counts(args.b)
    if len(ids_a) != len(ids_b):
        p.error(f"the records hold {len(ids_a)} and {len(ids_b)} layers: runs of one pack are needed")
    n_expert = int(max(max(x.max() for x in ids_a), max(x.max() for x in ids_b))) + 1
    pl = place_experts(len(ids_a), n_expert, args.expert_cache)
    print(f"| layer | B routes | B's streamed routed (of {int((~pl.resident[0]).sum())}) | the same, cache by A's use "
          f"| head of {args.head}: lowest ids routed | head by A's use routed |")
    print("|---|---|---|---|---|---|")
    for l, (a, b) in enumerate(zip(ids_a, ids_b)):
        ca, cb = np.bincount(a, minlength=n_expert), np.bincount(b, minlength=n_expert)
        streamed = ~pl.resident[l]
        cache_a = np.zeros(n_expert, bool)
        cache_a[by_use(ca, int(pl.resident[l].sum()))] = True
        sids = np.nonzero(streamed)[0]
        head_id = sids[:args.head]
        head_a = sids[np.lexsort((sids, -ca[sids]))][:args.head]
        print(f"| {l} | {int((cb > 0).sum())} | {int(((cb > 0) & streamed).sum())} | {int(((cb > 0) & ~cache_a).sum())} "
              f"| {int((cb[head_id] > 0).sum())} | {int((cb[head_a] > 0).sum())} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
