"""Every environment variable the `strata-prefill` command reads, in one table (`variables()`),
built from where each is declared (the switch table of fast/options.py with its older and retired
names, each reader's own constant). `check(command)` refuses, before any work and in one line,
a value the code would not take: a switch's value as its `run` flag's, a path as the flag that
names the same file, an empty or blank path (an unset shell variable, `"$UNSET"`) never taken as
the current folder or the default. An empty value of any other variable is the default, as its
reader takes it.

tests/test_cli_fuzz.py feeds every variable of the table random values, and checks the table
against the source: a `STRATA_*` variable read under contract/, formats/, strata_prefill/, fast/ or
reference/ that is not here fails it.
"""
from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from typing import Callable

from strata_prefill.contract.errors import InputError


@dataclass(frozen=True)
class Variable:
    name: str
    commands: tuple[str, ...]  # the subcommands that read it
    check: Callable[[str], object]  # an argparse-style check of a non-empty value
    path: str | None = None  # "file" or "folder" where it names one: empty is refused, as an empty path flag is


def _json_object(integers: bool):
    def check(text: str) -> dict:
        try:
            value = json.loads(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"is not JSON: {text[:64]!r}") from None
        if not isinstance(value, dict) or integers and not all(
                isinstance(v, int) and not isinstance(v, bool) for v in value.values()):
            raise argparse.ArgumentTypeError(f"must be a JSON object{' of integers' if integers else ''}, "
                                             f"got {text[:64]!r}")
        return value
    return check


def _kernel_folder(text: str):
    """STRATA_PREFILL_KERNEL_CACHE: `off`, or a folder that can be made and written (`~` is
    the home folder, as fast/cuda/kernel_cache.py reads it)."""
    from strata_prefill.fast.cuda import kernel_cache
    from strata_prefill import checks

    if text.strip().lower() == kernel_cache.OFF:
        return kernel_cache.OFF
    return checks.output_dir(os.path.expanduser(text.strip()))


def _retired(name: str):
    from strata_prefill.fast import options

    def check(_text: str):
        raise argparse.ArgumentTypeError(f"is retired: {options.retired_why(name)}")
    return check


def _table() -> dict[str, Variable]:
    from strata_prefill.fast import options
    from strata_prefill.fast.cuda import kernel_cache, products, stress
    from strata_prefill.contract import parallel
    from strata_prefill.formats import records
    from strata_prefill import arms, checks, refcache
    from strata_prefill.commands.run import DUMP_ENV, reference_cache_dir

    prefills = ("run", "bench")
    rows = []
    for sw in options.SWITCHES:
        check = arms.SWITCHES[sw.keyword][1]
        rows += [Variable(name, prefills, check) for name in (*sw.variables, *sw.opposites)]
    rows += [Variable(name, prefills, _retired(name)) for name in options.RETIRED]
    rows += [
        Variable("STRATA_PREFILL_TIMING", prefills, arms.zero_one),  # fast/phases.py
        Variable("STRATA_PREFILL_DUMP_LEVEL", ("run",), checks.one_of(records.LEVELS)),  # strata_prefill/session.py
        Variable(parallel.ENV, prefills, checks.workers),  # the prefill's threads
        *[Variable(var, ("run", "bench"), checks.output_file, path="file") for var in DUMP_ENV.values()],
        Variable(refcache.ENV, ("run", "cache"), reference_cache_dir, path="folder"),  # DIR or off
        Variable(kernel_cache.ENV, ("run", "bench", "build-kernels"), _kernel_folder, path="folder"),
        Variable(products.CONFIG_ENV, prefills, _json_object(False)),
        Variable(products.DEFINES_ENV, prefills, _json_object(True)),
        Variable(products.LIST_CTAS_ENV, prefills, checks.bounded(0, products.LIST_CTAS_MAX)),
        Variable(stress.ENV, prefills, checks.seed),  # the cuda backend's stress mode
    ]
    return {v.name: v for v in rows}


_TABLE: dict[str, Variable] = {}


def variables() -> dict[str, Variable]:
    """The table, {name: Variable}, made on first use (it imports the readers' modules)."""
    if not _TABLE:
        _TABLE.update(_table())
    return _TABLE


def value_of(name: str):
    """The checked value of a set variable (its check's result), None where it is unset; a
    one-line InputError for a bad or, for a path, empty value. Empty otherwise: None (the
    default)."""
    var = variables()[name]
    raw = os.environ.get(name)
    if raw is None:
        return None
    if var.path is not None:
        refuse_empty(name)
    elif raw == "":
        return None
    try:
        return var.check(raw)
    except argparse.ArgumentTypeError as exc:
        raise InputError(f"{name}{':' if var.path else ''} {exc}") from None


def check(command: str) -> None:
    """Every variable `command` reads, checked (value_of) before any work."""
    for var in variables().values():
        if command in var.commands:
            value_of(var.name)


def refuse_empty(name: str) -> None:
    """A one-line InputError where the path variable `name` is set but empty or blank (its
    value otherwise checked by the reader)."""
    raw = os.environ.get(name)
    if raw is not None and not raw.strip():
        raise InputError(f"{name} is set but empty ({raw!r}): name a {variables()[name].path} or unset it")
