"""`strata-prefill diff A B`: where two runs' dumps part (strata/diff.py)."""
from __future__ import annotations

from strata.diff import KINDS, diff_paths


def add_parser(sub, name: str) -> None:
    p = sub.add_parser(name, help="compare two dumps: record files, dump folders, logits or residuals",
                       description="Compare two runs' dumps. Record files (layers.spd): the first "
                                   "differing op with its layer, chunk, position, expert and group, "
                                   "the shape of the difference and the kernel that writes it. "
                                   "Strata's logits and residual dumps: bytes, then errors, cosine "
                                   "and top-1 agreement. Exit status 1 when they differ.")
    p.add_argument("a", metavar="A", help="a file or a dump folder (--dump-dir)")
    p.add_argument("b", metavar="B", help="the same kind of file or folder")
    p.add_argument("--kind", choices=KINDS, default=None,
                   help="what the files hold (default: read from the first file)")
    p.set_defaults(func=main)


def main(args) -> int:
    same, lines = diff_paths(args.a, args.b, args.kind)
    print("\n".join(lines))
    return 0 if same else 1
