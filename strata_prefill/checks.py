"""Argument checks for the subcommands, as argparse `type=` functions: a bad number or a path
that cannot be written is refused while the command line is read, before any work starts.

Writability is tried, not inferred from permission bits (which say nothing for root, or on
/proc and read-only mounts): a probe file is created and removed in the folder that would
receive the output. No check leaves anything behind.
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
