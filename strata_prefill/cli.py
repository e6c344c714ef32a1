"""The `strata-prefill` command. Each subcommand lives in its own module under
strata_prefill/commands/ with `add_parser(subparsers, name)` and `main(args) -> int`.

Every error a user can cause, from a bad argument to a pack that is not a GGUF file, ends the
command with one line on stderr, `strata-prefill: error: ...`, and exit status 2."""
from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
import warnings

import numpy as np

from strata_prefill.contract.errors import StrataError

PROG = "strata-prefill"

# subcommand name -> module under strata_prefill.commands
COMMANDS = {
    "run": "run",
    "make-pack": "make_pack",
    "info": "info",
    "diff": "diff",
    "bench": "bench",
    "plot": "plot",
    "build-kernels": "build_kernels",
    "cache": "cache",
}


def fail(message: str) -> int:
    """Print the one-line error and return the exit status."""
    print(f"{PROG}: error: {' '.join(str(message).split())}", file=sys.stderr)
    return 2


class OneLineParser(argparse.ArgumentParser):
    """argparse, with its usage-and-error block replaced by the command's one-line error
    (naming the subcommand); `--help` still prints the full usage."""

    def error(self, message: str):
        sub = self.prog[len(PROG):].strip()
        sys.exit(fail(f"{sub}: {message}" if sub else message))

    def _get_value(self, action, arg_string):
        """A value's check that meets the file system's own refusal (a name too long, a loop
        of links) says it as the argument's one-line error, as any other bad value."""
        try:
            return super()._get_value(action, arg_string)
        except OSError as exc:
            from strata_prefill.checks import shown

            raise argparse.ArgumentError(action, f"{shown(arg_string)}: {exc.strerror or exc}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog=PROG,
        description="Prefill of a qwen3moe GGUF pack: NumPy reference, PyCUDA fast path, parity gate.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in COMMANDS.items():
        mod = importlib.import_module(f"strata_prefill.commands.{module}")
        mod.add_parser(sub, name)
    return parser


@contextlib.contextmanager
def quiet_floats():
    """NumPy's floating-point warnings (overflow, invalid value, divide by zero) never reach
    the user: a run that computes NaN or Inf is told so in one line naming where
    (strata_prefill/nonfinite.py). errstate covers this thread, the warnings filter the
    threads the reference runs its experts and heads on (errstate does not carry into them)."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=RuntimeWarning,
                                message=r"(overflow|invalid value|divide by zero|underflow) encountered")
        yield


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        argv = ["run"]  # the main job on its built-in default
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # a bad argument (after its one line) or --help: a status to return
        return int(exc.code or 0)
    if args.command is None:
        return fail(f"no command given (commands: {', '.join(COMMANDS)})")
    try:
        with quiet_floats():
            return int(args.func(args) or 0)
    except StrataError as exc:
        return fail(str(exc))
    except OSError as exc:  # the disk or a file failing under a checked path (full, removed)
        where = f"{exc.filename}: " if exc.filename else ""
        return fail(f"{where}{exc.strerror or exc}")
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
