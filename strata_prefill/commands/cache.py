"""`strata-prefill cache info|clear [--dir DIR]`: the reference cache (strata_prefill/refcache.py,
docs/reference-cache.md). Without --dir: the folder STRATA_PREFILL_REFERENCE_CACHE names, else
the default one under the user cache dir."""
from __future__ import annotations

import argparse
import os

from strata.errors import InputError
from strata_prefill import checks, refcache, variables


def add_parser(subparsers, name: str) -> argparse.ArgumentParser:
    p = subparsers.add_parser(name, help="the reference cache: info, clear",
                              description="The reference results kept on disk "
                                          f"(env {refcache.ENV}=DIR moves them, =off turns them off).")
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    for action, text in (("info", "the folder, entries and bytes by kind, the source digest"),
                         ("clear", "remove every entry")):
        a = actions.add_parser(action, help=text, description=text)
        a.add_argument("--dir", metavar="DIR", type=checks.folder_path, help=f"the cache folder (default: ${refcache.ENV}, "
                                                    f"else {refcache.default_dir()})")
    p.set_defaults(func=main)
    return p


def main(args: argparse.Namespace) -> int:
    if args.action is None:
        raise InputError("cache: say which: info or clear")
    if args.dir is None:
        variables.refuse_empty(refcache.ENV)  # never the default folder for an unset shell variable
    cache = refcache.Cache(args.dir) if args.dir is not None else refcache.from_env(default=True)
    if cache is None:
        print(f"the reference cache is off ({refcache.ENV}={os.environ.get(refcache.ENV)}); "
              "--dir DIR names a folder")
        return 0
    checks.distinct_files("cache", [], [("--dir" if args.dir is not None else refcache.ENV, cache.root)])
    if cache.root.exists() and not cache.root.is_dir():
        raise InputError(f"cache folder {cache.root} is a file")
    if args.action == "info":
        print(refcache.info(cache))
    else:
        entries, freed = refcache.clear(cache)
        print(f"removed {entries:,} entr{'y' if entries == 1 else 'ies'} ({freed:,} bytes) from {cache.root}")
    return 0
