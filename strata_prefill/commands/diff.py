"""`strata-prefill diff A B`: where two runs' dumps part (strata_prefill/diff.py)."""
from __future__ import annotations

from strata_prefill.diff import KINDS, diff_paths
from strata_prefill import checks


def add_parser(sub, name: str) -> None:
    p = sub.add_parser(name, help="compare two dumps or packs: record files, dump folders, logits, "
                                  "residuals, GGUF packs",
                       description="Compare two runs' dumps, or two packs. What a file holds is read "
                                   "from its content (or said with --kind). Record files (layers.spd): "
                                   "the first differing op with its layer, chunk, position, expert and "
                                   "group, the shape of the difference and the kernel that writes it. "
                                   "Strata's logits and residual dumps: bytes, then errors, cosine "
                                   "and top-1 agreement. Packs: metadata key by key, then tensor by "
                                   "tensor, naming the first difference. Exit status 1 when they "
                                   "differ, 2 for files of two kinds or sizes, or empty.")
    p.add_argument("a", metavar="A", type=checks.input_path, help="a file or a dump folder (--dump-dir)")
    p.add_argument("b", metavar="B", type=checks.input_path, help="the same kind of file or folder")
    p.add_argument("--kind", choices=KINDS, default=None,
                   help="what the files hold (default: read from each file's content); checked "
                        "against the content")
    p.add_argument("--pack", metavar="PACK", default=None, type=checks.input_path,
                   help="the pack the dumps came from: logits must hold its vocabulary, residual "
                        "rows its width (default: the two must have the same size)")
    p.set_defaults(func=main)


def main(args) -> int:
    checks.distinct_files("diff", [("A", args.a), ("B", args.b)], [])  # it writes no file
    same, lines = diff_paths(args.a, args.b, args.kind, args.pack)
    print("\n".join(lines))
    return 0 if same else 1
