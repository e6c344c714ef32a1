"""Arms of `strata-prefill bench`: a set of the fast path's switches, read from a spec such as
`group-gather=0,expert-cache=5` or `default`, as FastEngine keyword arguments; and the command
line's side of the switch table (fast/options.py): each switch's check, `run` flag and help.

A switch is named by its environment variable (or an older name of it), its FastEngine keyword
(`group_gather`) or its `run` flag (`group-gather`, `--group-gather`). The values are checked as
`run` checks its flags, so a bad spec ends the command before any pack is opened. The
environment is never changed: each arm's engine gets its switches as arguments.
"""
from __future__ import annotations

import argparse
import os
import re

from strata_prefill.fast import options
from strata_prefill.fast.options import Count, OnOff, Switch
from strata_prefill.contract.errors import InputError
from strata_prefill import checks


def zero_one(text: str) -> int:
    if text not in ("0", "1"):
        raise argparse.ArgumentTypeError(f"must be 0 or 1, got {text!r}")
    return int(text)


def value_check(sw: Switch):
    """The check of a switch's value as text (an arm spec, a variable), by its value type: the
    integers through checks.integer, as every number a user types."""
    if isinstance(sw.value, OnOff):
        return zero_one
    assert isinstance(sw.value, Count)
    count = checks.bounded(sw.value.minimum)
    if sw.value.off:
        return checks.auto_or(count, off=True)
    return checks.auto_or(count) if sw.value.auto else count


def add_flags(group) -> None:
    """A `run` flag for each switch of the table, its dest the switch's keyword; not given: None
    (the engine then reads the variable, else the default)."""
    for sw in options.SWITCHES:
        if isinstance(sw.value, OnOff):  # 0 or 1 as argparse's int choices, `{0,1}` in --help
            kind = dict(type=int, choices=[0, 1])
        else:
            kind = dict(type=value_check(sw), metavar=sw.value.metavar)
        env = ", ".join(sw.variables)
        text = f"{sw.help} (default {sw.shown_default()}{'; env ' + env if env else ''})"
        group.add_argument(sw.flag, dest=sw.keyword, default=None, **kind,
                           help=text.replace("%", "%%"))  # argparse expands %(...)s in help
    for variable in options.RETIRED:  # refused by name, not as an unknown flag
        group.add_argument(retired_flag(variable), type=_refuse(variable), default=argparse.SUPPRESS,
                           help=argparse.SUPPRESS)


def retired_flag(variable: str) -> str:
    """The `run` flag a retired switch had: STRATA_PREFILL_WIDEN_FLOAT -> --widen-float."""
    return "--" + variable.removeprefix("STRATA_PREFILL_").lower().replace("_", "-")


def _refuse(variable: str):
    def check(_text: str):
        raise argparse.ArgumentTypeError(f"retired: {options.retired_why(variable)}")
    return check


# FastEngine keyword -> (environment variable or None, value check), from the table: what
# checks.environment_values reads; each is also a `run` flag
SWITCHES = {sw.keyword: (sw.variable, value_check(sw)) for sw in options.SWITCHES}


def environment_aliases() -> None:
    """Refuse a bad value in an older name of a switch variable that the engine would read (its
    new name unset), before any work, as checks.environment_values does for the new names; and
    a retired switch's variable (options.RETIRED), which would change nothing."""
    options.refuse_retired()
    for sw in options.SWITCHES:
        for alias in sw.aliases + sw.opposites:
            raw = os.environ.get(alias)
            if not raw or (sw.variable and os.environ.get(sw.variable)):
                continue
            try:
                SWITCHES[sw.keyword][1](raw)
            except argparse.ArgumentTypeError as exc:
                raise InputError(f"{alias} {exc}") from None


DEFAULT = "default"


def switch_names() -> str:
    """The names a spec may use, for error messages."""
    return ", ".join(sw.variable or sw.keyword.replace("_", "-") for sw in options.SWITCHES)


def keyword_of(name: str) -> str | None:
    """The FastEngine keyword a spec's switch name stands for, or None."""
    for sw in options.SWITCHES:
        if name in sw.variables:
            return sw.keyword
    kw = name.removeprefix("--").replace("-", "_")
    return kw if kw in SWITCHES else None


def parse_arm(spec: str, label: str) -> dict:
    """`default` -> {}; 'NAME=VALUE,NAME=VALUE' (commas or spaces) -> {keyword: value}.
    label names the arm (`--a`) in the one-line error."""
    words = [w for w in re.split(r"[\s,]+", spec.strip()) if w]
    if words == [DEFAULT]:
        return {}
    if not words:
        raise InputError(f"{label}: an empty arm (give '{DEFAULT}' or NAME=VALUE,...)")
    out = {}
    for word in words:
        name, eq, value = word.partition("=")
        if word == DEFAULT:
            raise InputError(f"{label}: '{DEFAULT}' stands alone, it cannot join switches ({spec!r})")
        if not eq or not name or not value:
            raise InputError(f"{label}: {word!r} is not NAME=VALUE (or '{DEFAULT}')")
        opposite = next((sw.keyword for sw in options.SWITCHES if name in sw.opposites), None)
        kw = opposite or keyword_of(name)
        if kw is None:
            retired = options.retired_variable(name)
            if retired:
                raise InputError(f"{label}: {name!r} is retired: {options.retired_why(retired)}")
            raise InputError(f"{label}: unknown switch {name!r} (switches: {switch_names()})")
        if kw in out:
            raise InputError(f"{label}: switch {name!r} is given twice")
        try:
            out[kw] = SWITCHES[kw][1](value)
        except argparse.ArgumentTypeError as exc:
            raise InputError(f"{label}: {name} {exc}") from None
        if opposite is not None:  # the seeds' name of the other setting: GATHER_ONE=1 is group_gather 0
            out[kw] = 1 - int(out[kw])
    return out


def describe(keywords: dict) -> str:
    """An arm's switches as the spec names them (environment variables where they have one)."""
    if not keywords:
        return DEFAULT
    return ",".join(f"{SWITCHES[kw][0] or kw.replace('_', '-')}={v}" for kw, v in keywords.items())


def engine_settings(engine) -> dict:
    """What an arm's engine runs with: its switches resolved (argument, environment, default;
    0/1 as integers, the ring's slots), and where its experts live."""
    o, p = engine.options, engine.placement
    out = {sw.keyword: int(v) if isinstance(v, bool) else v
           for sw in options.SWITCHES for v in [getattr(o, sw.keyword)]}
    return {**out, "resident_experts": int(p.n_resident), "experts": int(p.resident.size)}
