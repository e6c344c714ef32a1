"""Arms of `strata-prefill bench`: a set of the fast path's switches, read from a spec such as
`STRATA_PREFILL_GROUP_GATHER=0,expert-cache=5` or `default`, as FastEngine keyword arguments.

A switch is named by its environment variable, its FastEngine keyword (`group_gather`) or its
`run` flag (`group-gather`, `--group-gather`). The values are checked as `run` checks its flags,
so a bad spec ends the command before any pack is opened. The environment is never changed:
each arm's engine gets its switches as arguments.
"""
from __future__ import annotations

import argparse
import re

from strata.errors import InputError
from strata_prefill import checks


def zero_one(text: str) -> int:
    if text not in ("0", "1"):
        raise argparse.ArgumentTypeError(f"must be 0 or 1, got {text!r}")
    return int(text)


# FastEngine keyword -> (environment variable or None, value check); each is also a `run` flag
# (run.add_fast_switches, whose dests are these keywords: a test holds the two sets equal)
SWITCHES = {
    "group_gather": ("STRATA_PREFILL_GROUP_GATHER", zero_one),
    "quant_gather": ("STRATA_QUANT_GATHER", zero_one),
    "expert_cache": (None, checks.cache_size),
    "vram_reserve_mib": (None, checks.non_negative_int),
    "ring": ("STRATA_PREFILL_RING", checks.positive_int),
    "stream_min": ("STRATA_PREFILL_STREAM_MIN", checks.positive_int),
    "copy_coalesce": ("STRATA_PREFILL_COPY_COALESCE", zero_one),
    "overlap_plan": ("STRATA_PREFILL_OVERLAP_PLAN", zero_one),
    "fuse_group": ("STRATA_PREFILL_FUSE_GROUP", zero_one),
    "lean_attention": ("STRATA_PREFILL_LEAN_ATTENTION", zero_one),
    "tiled_dense": ("STRATA_PREFILL_TILED_DENSE", zero_one),
    "in_place": ("STRATA_PREFILL_IN_PLACE", zero_one),
    "widen_float": ("STRATA_PREFILL_WIDEN_FLOAT", zero_one),
    "pair_attention": ("STRATA_PREFILL_PAIR_ATTENTION", zero_one),
}

DEFAULT = "default"


def switch_names() -> str:
    """The names a spec may use, for error messages."""
    return ", ".join(env or kw.replace("_", "-") for kw, (env, _) in SWITCHES.items())


def keyword_of(name: str) -> str | None:
    """The FastEngine keyword a spec's switch name stands for, or None."""
    for kw, (env, _) in SWITCHES.items():
        if name == env:
            return kw
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
        kw = keyword_of(name)
        if kw is None:
            raise InputError(f"{label}: unknown switch {name!r} (switches: {switch_names()})")
        if kw in out:
            raise InputError(f"{label}: switch {name!r} is given twice")
        try:
            out[kw] = SWITCHES[kw][1](value)
        except argparse.ArgumentTypeError as exc:
            raise InputError(f"{label}: {name} {exc}") from None
    return out


def describe(keywords: dict) -> str:
    """An arm's switches as the spec names them (environment variables where they have one)."""
    if not keywords:
        return DEFAULT
    return ",".join(f"{SWITCHES[kw][0] or kw.replace('_', '-')}={v}" for kw, v in keywords.items())


def engine_settings(engine) -> dict:
    """What an arm's engine runs with, its switches resolved (argument, environment, default)."""
    p = engine.placement
    return {"group_gather": int(engine.group_gather), "quant_gather": int(engine.quant_gather),
            "copy_coalesce": int(engine.copy_coalesce), "overlap_plan": int(engine.overlap_plan),
            "fuse_group": int(engine.fuse_group), "lean_attention": int(engine.lean_attention),
            "tiled_dense": int(engine.tiled_dense), "in_place": int(engine.in_place),
            "widen_float": int(engine.widen_float), "pair_attention": int(engine.pair_attention),
            "stream_min": engine.stream_min,
            "ring": engine.ring.n_slots, "resident_experts": int(p.n_resident),
            "experts": int(p.resident.size)}
