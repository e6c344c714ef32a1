"""The `strata-prefill` command. Each subcommand lives in its own module under
strata/commands/ with `add_parser(subparsers)` and `main(args) -> int`."""
from __future__ import annotations

import argparse
import importlib
import sys

from strata.errors import StrataError

# subcommand name -> module under strata.commands
COMMANDS = {
    "run": "run",
    "make-pack": "make_pack",
    "info": "info",
    "diff": "diff",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="strata-prefill",
        description="Prefill of a qwen3moe GGUF pack: NumPy reference, PyCUDA fast path, parity gate.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in COMMANDS.items():
        mod = importlib.import_module(f"strata.commands.{module}")
        mod.add_parser(sub, name)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        argv = ["run"]  # the main job on its built-in default
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except StrataError as exc:
        print(f"strata-prefill: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("strata-prefill: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
