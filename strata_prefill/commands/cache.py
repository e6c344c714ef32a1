"""`strata-prefill cache info|clear [--dir DIR]`: the reference cache (strata_prefill/refcache.py,
docs/reference-cache.md). Without --dir: the folder STRATA_PREFILL_REFERENCE_CACHE names, else
the default one under the user cache dir.

`clear` deletes, so the folder it is given is checked first: not an empty word (an unset
variable in `--dir "$X"`), not a folder that means nothing without a prefix that went missing
(`$X/cache` is `/cache`, `${X}cache` is `cache`: a relative folder is written `./cache`), and a
reference cache (refcache.not_a_cache). Entries a running process holds are passed over."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from strata_prefill.contract.errors import InputError
from strata_prefill import checks, refcache, variables


def add_parser(subparsers, name: str) -> argparse.ArgumentParser:
    p = subparsers.add_parser(name, help="the reference cache: info, clear",
                              description="The reference results kept on disk "
                                          f"(env {refcache.ENV}=DIR moves them, =off turns them off).")
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    for action, text in (("info", "the folder, entries and bytes by kind, the source digest"),
                         ("clear", "remove every entry no running process holds")):
        a = actions.add_parser(action, help=text, description=text)
        a.add_argument("--dir", metavar="DIR", type=checks.folder_path,
                       help=f"the cache folder (default: ${refcache.ENV}, else {refcache.default_dir()}); "
                            "for clear an absolute folder, or one starting ./ or ../")
    p.set_defaults(func=main)
    return p


def folder_problem(text: str, clearing: bool) -> str | None:
    """Why the folder `text` (as given) is refused, or None. Empty: refused for both actions
    (it names no folder, and the default cache is not what an empty word asked for). For
    `clear`, also a folder that only a missing prefix would make sense of: `~` where there is
    no home, the filesystem root, or a relative folder written without ./ or ../."""
    if not text.strip():
        return f"{text!r} names no folder (an unset variable?): name the cache folder"
    if not clearing:
        return None
    expanded = os.path.expanduser(text)
    home = os.path.expanduser("~")
    if expanded.startswith("~") or ((text == "~" or text.startswith("~/")) and home in ("", "/")):
        return f"{text} starts with ~ and there is no home folder to put there (HOME is empty)"
    if not os.path.isabs(expanded) and not text.startswith(("./", "../")) and text not in (".", ".."):
        return (f"{text} is relative to nothing named (is it a variable's tail, `${{X}}{text}`?): "
                f"write ./{text} for the current folder's, or the absolute folder")
    if Path(os.path.abspath(expanded)) == Path("/"):
        return f"{text} is the filesystem root"
    return None


def main(args: argparse.Namespace) -> int:
    if args.action is None:
        raise InputError("cache: say which: info or clear")
    if args.dir is None:
        variables.refuse_empty(refcache.ENV)  # never the default folder for an unset shell variable
    clearing = args.action == "clear"
    if args.dir is not None:
        label, text = "--dir", args.dir
    else:
        label, text = refcache.ENV, os.environ.get(refcache.ENV)
    if args.dir is not None or (text and text.strip().lower() not in refcache.OFF):
        problem = folder_problem(text, clearing)
        if problem:
            raise InputError(f"cache {args.action}: {label} {problem}")
    cache = refcache.Cache(args.dir) if args.dir is not None else refcache.from_env(default=True)
    if cache is None:
        print(f"the reference cache is off ({refcache.ENV}={os.environ.get(refcache.ENV)}); "
              "--dir DIR names a folder")
        return 0
    checks.distinct_files("cache", [], [(label if text else "the default cache", cache.root)])
    if cache.root.exists() and not cache.root.is_dir():
        raise InputError(f"cache folder {cache.root} is a file")
    if not clearing:
        print(refcache.info(cache))
        return 0
    root = Path(os.path.abspath(cache.root))
    if not root.exists():
        print(f"nothing to clear: {root} does not exist")
        return 0
    why = refcache.not_a_cache(root)
    if why:
        raise InputError(f"cache clear: {root} is not a reference cache: {why}; nothing removed")
    done = refcache.clear(refcache.Cache(root))
    line = f"removed {done.removed:,} entr{'y' if done.removed == 1 else 'ies'} ({done.freed:,} bytes) from {root}"
    if done.in_use:
        line += (f"; kept {done.in_use:,} in use by a running process (computed or read now: "
                 "clear again once it ends)")
    print(line)
    return 0
