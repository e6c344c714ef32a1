"""Argument checks for the subcommands, as argparse `type=` functions: a bad number or a path
that cannot be written is refused while the command line is read, before any work starts.

Writability is tried, not inferred from permission bits (which say nothing for root, or on
/proc and read-only mounts): a probe file is created and removed in the folder that would
receive the output. No check leaves anything behind.

After the command line, before any work: `distinct_files` (no output is an input or another
output), `environment_values` (the switch variables' values) and `fast_switches_used` (no
fast-path switch that would do nothing on the pack at hand).
"""
from __future__ import annotations

import argparse
import os
import re
import tempfile
from pathlib import Path


def positive_int(text: str) -> int:
    """An integer >= 1."""
    n = _int(text, "a positive integer")
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return n


def non_negative_int(text: str) -> int:
    """An integer >= 0."""
    n = _int(text, "an integer >= 0")
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}")
    return n


def chunk_size(text: str) -> str | int:
    """`auto` or a positive integer (the prefill's chunk)."""
    if text == "auto":
        return text
    try:
        return positive_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"must be 'auto' or a positive integer, got {text!r}") from None


def cache_size(text: str) -> str | int:
    """`auto` or an integer >= 0 (expert-cache slots)."""
    if text == "auto":
        return text
    try:
        return non_negative_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"must be 'auto' or an integer >= 0, got {text!r}") from None


def prompt_source(text: str) -> int | Path:
    """A token count (a positive integer) or an existing prompt file."""
    if re.fullmatch(r"[+-]?\d+", text.strip()):
        n = int(text)
        if n < 1:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a token count (a count is a positive integer)")
        return n
    path = Path(text)
    if not path.exists():
        raise argparse.ArgumentTypeError(f"prompt file not found: {text}")
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"prompt is not a file: {text}")
    return path


def output_file(text: str) -> Path:
    """A file the command may create or replace: not a folder, in an existing, writable folder."""
    path = Path(text)
    if text.endswith(os.sep) or path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder, not a file name")
    folder = path.parent
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise argparse.ArgumentTypeError(f"cannot write {text}: folder {folder} {what}")
    _probe(folder, text)
    if path.exists() and not os.access(path, os.W_OK):
        raise argparse.ArgumentTypeError(f"cannot write {text}: permission denied")
    return path


def output_dir(text: str) -> Path:
    """A folder the command may create (with its parents) and write into."""
    path = Path(text)
    existing = path
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if not existing.is_dir():
        where = "it" if existing == path else existing
        raise argparse.ArgumentTypeError(f"cannot make folder {text}: {where} is a file")
    _probe(existing, text)
    return path


def _probe(folder: Path, target: str) -> None:
    """Create and remove a file in `folder`, or say in one line why it cannot be written."""
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".strata-probe-"):
            pass
    except OSError as exc:
        raise argparse.ArgumentTypeError(
            f"cannot write {target}: folder {folder}: {exc.strerror or exc}") from None


def _int(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None


# ---- outputs never overwrite inputs or each other --------------------------------------------
# An entry is (label, path) or (label, path, noun): label names where the path came from (a
# flag, a positional such as OUT.png, an environment variable), noun what the file is to the
# command ("the pack"); a None path (an output not asked for) is skipped.

def distinct_files(command: str, reads, writes) -> None:
    """Refuse in one line (InputError) a path `command` writes that is a path it reads or a path
    it also writes under another label. Two paths are the same file when they resolve to the
    same path (symlinks followed, `..` and `.` removed) or, where both exist, when they have
    the same (st_dev, st_ino): a hard link or a symlink to an input is that input. Call it
    before any work: nothing is opened or written."""
    from strata.errors import InputError

    reads = [(_entry(e), _identity(e[1])) for e in reads if e[1] is not None]
    seen = []
    for w in writes:
        if w[1] is None:
            continue
        (label, path, _noun), ident = _entry(w), _identity(w[1])
        for (r_label, r_path, noun), r_ident in reads:
            if _same(ident, r_ident):
                raise InputError(f"{command}: {label} {path} is {noun or 'the file'} this {command} "
                                 f"reads ({r_label}{_another_name(path, r_path)})")
        for (o_label, o_path, _), o_ident in seen:
            if _same(ident, o_ident):
                raise InputError(f"{command}: {label} {path} is also the file of {o_label}"
                                 f"{_another_name(path, o_path)}: two outputs cannot share one file")
        seen.append(((label, path, _noun), ident))


def _entry(e) -> tuple:
    label, path, *noun = e
    return label, str(path), (noun[0] if noun else None)


def _identity(path) -> tuple:
    """(the resolved path, (st_dev, st_ino) or None where nothing is there yet)."""
    try:
        resolved = os.path.realpath(os.path.abspath(os.fspath(path)))
    except (OSError, ValueError):
        resolved = os.path.abspath(os.fspath(path))
    try:
        st = os.stat(path)  # follows symlinks: a link to an input is that input
        inode = (st.st_dev, st.st_ino)
    except (OSError, ValueError):
        inode = None
    return resolved, inode


def _same(a: tuple, b: tuple) -> bool:
    return a[0] == b[0] or (a[1] is not None and a[1] == b[1])


def _another_name(path: str, other: str) -> str:
    """' OTHER, the same file under another name' where the two are spelt differently."""
    if os.path.abspath(path) == os.path.abspath(other):
        return ""
    return f" {other}, the same file under another name"


# ---- values the environment gives, and switches that would do nothing ------------------------

def environment_values() -> None:
    """Refuse a value of a switch variable the code would not take, before any work: the 0/1
    switches and counts of the fast path (read by the engine only once it is made), the timing
    switch (fast/phases.py reads anything but "1" as off, so `yes` would pass unseen), the dump
    level, the thread count."""
    from strata import parallel, records
    from strata.errors import InputError
    from strata_prefill.arms import SWITCHES, zero_one

    variables = {env: check for env, check in SWITCHES.values() if env}
    variables["STRATA_PREFILL_TIMING"] = zero_one
    variables["STRATA_PREFILL_DUMP_LEVEL"] = _one_of(records.LEVELS)
    for var, check in variables.items():
        raw = os.environ.get(var)
        if raw is None or raw == "":  # unset or empty: the default, as the readers take it
            continue
        try:
            check(raw)
        except argparse.ArgumentTypeError as exc:
            raise InputError(f"{var} {exc}") from None
    parallel.thread_count()  # a one-line InputError for a bad STRATA_PREFILL_THREADS


def _one_of(choices):
    def check(text: str) -> str:
        if text not in choices:
            raise argparse.ArgumentTypeError(f"must be one of {', '.join(choices)}, got {text!r}")
        return text
    return check


# FastEngine keywords read only when some expert streams through the ring (fast/engine.py)
STREAMING = ("ring", "stream_min", "copy_coalesce")
# kernel forms only the cuda backend reads (fast/backend_base.py: the sim runs the NumPy
# definitions whatever they say)
CUDA_FORMS = ("lean_attention", "tiled_dense", "widen_float", "pair_attention")


def fast_switches_used(switches: dict, backend: str, config, label, where: str = "") -> None:
    """Refuse (InputError) a fast-path switch that would do nothing on this pack, or an expert
    cache larger than the pack: `switches` are the FastEngine keywords given (None values: not
    given), `label(keyword)` names one in the message, after `where` (bench: the arm). The engine caps --expert-cache at every
    expert; a user who asked for more is told instead. Needs the pack's config, not the engine."""
    from strata.errors import InputError

    total = config.n_layer * config.n_expert
    slots = switches.get("expert_cache")
    fixed = isinstance(slots, int)  # not None or "auto"
    if fixed and slots > total:
        raise InputError(f"{where}{label('expert_cache')} {slots}: the pack has {total} experts "
                         f"({config.n_layer} layers x {config.n_expert}): at most {total} slots")
    if switches.get("vram_reserve_mib") is not None:
        if fixed:
            raise InputError(f"{where}{label('vram_reserve_mib')} sizes {label('expert_cache')} auto: "
                             f"with {label('expert_cache')} {slots} it does nothing")
        if backend == "sim":
            raise InputError(f"{where}{label('vram_reserve_mib')} sizes the cuda backend's expert cache: "
                             "the sim holds every expert, it does nothing with --backend sim")
    if backend == "sim":
        for kw in CUDA_FORMS:
            if switches.get(kw) is not None:
                raise InputError(f"{where}{label(kw)} picks a cuda kernel's form: the sim runs the "
                                 "NumPy definitions whatever it says: it needs --backend cuda")
    if fixed and slots == 0 and switches.get("in_place") is not None:
        raise InputError(f"{where}{label('in_place')} picks how resident experts are multiplied: with "
                         f"{label('expert_cache')} 0 none is resident: it does nothing")
    every = (fixed and slots >= total) or (backend == "sim" and not fixed)
    if every:
        for kw in STREAMING:
            if switches.get(kw) is not None:
                why = (f"{label('expert_cache')} {slots} holds all {total}" if fixed
                       else f"the sim holds all {total} unless {label('expert_cache')} N is below that")
                raise InputError(f"{where}{label(kw)} shapes how streamed experts are copied: none stream "
                                 f"when every expert is resident ({why}): it does nothing")
