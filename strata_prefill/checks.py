"""Argument checks for the subcommands, as argparse `type=` functions: a bad number or a path
that cannot be written is refused while the command line is read, before any work starts.

Writability is tried, not inferred from permission bits (which say nothing for root, or on
/proc and read-only mounts): a probe file is created and removed in the folder that would
receive the output. No check leaves anything behind.

Numbers: every integer a user types (a flag, a bench list or arm spec, a switch variable) is
read by `integer`, against the limits below (TOKENS_MAX, SEED_MAX, WORKERS_MAX, LAYERS_MAX,
COUNT_MAX: each with where it comes from); what only the pack bounds (its context with the
greedy tokens, its vocabulary) by `counts_fit` once its header is read, before the prompt is
made.

After the command line, before any work: `distinct_files` (no output is an input or another
output) and `environment_values` (every variable the command reads: strata_prefill/variables.py).
A fast-path switch that would do nothing, or a value past what the pack can use, is refused by
the switch table's one rule (fast/options.py: refuse_idle), for flags, variables and bench arms
alike.
"""
from __future__ import annotations

import argparse
import os
import re
import tempfile
from pathlib import Path


# ---- numbers a user types: one parser, and the limits the code has -----------------------------
# Every integer of a command line, an arm spec or a switch variable goes through `integer`; a
# limit that needs the pack (its context, vocabulary) is checked by `counts_fit` once the
# pack's header is read, before the prompt is made or any layer runs.

#: a count of tokens or positions (a prompt, a chunk, greedy tokens, bench's lengths, the stream
#: threshold): the CUDA kernels hold positions and token counts in int32 (kv_cache.cu,
#: the attention kernels); the pack's context length, checked once it is open, is the tighter bound
TOKENS_MAX = 2**31 - 1
#: a seed: make-pack records its seed in the pack's header as a uint64 (strata.seed); the
#: prompt seeds of run and bench are held to the same 64 bits
SEED_MAX = 2**64 - 1
#: threads of the prefill (STRATA_PREFILL_THREADS) or nvcc processes (build-kernels --jobs) at a
#: time: each is a thread of this process (the pool starts one per piece of work, up to this), and
#: beyond the CPUs they only contend
WORKERS_MAX = 1024
#: a count a GGUF header holds as a uint32 (make-pack --layers, block_count; --rope-scaling's
#: original context); for --layers the free disk, checked from the arguments before anything is
#: written, is the tighter bound
UINT32_MAX = LAYERS_MAX = 2**32 - 1
#: any other count (expert-cache slots, ring slots, reps, --top, --vram-reserve-mib): what NumPy's
#: int64 sizes and indices hold (the pack, once open, bounds most of them far lower)
COUNT_MAX = 2**63 - 1
#: the longest value echoed in a message (a 5,000-digit number is shown cut, not in full)
SHOWN_MAX = 32


def integer(text: str, minimum: int = 0, maximum: int = COUNT_MAX, why: str = "") -> int:
    """The integer `text` spells, at least `minimum` and at most `maximum` (`why`: the
    limit's reason, said when it is passed), or ArgumentTypeError with one phrase. Decimal
    digits with an optional sign and blanks around them, nothing else: not 1e3, 1.0 or 1_000
    (a hint gives the digits where the value is whole), nor other scripts' digits, which int()
    would take. The length is checked before the conversion (int() refuses 4,300 digits)."""
    word = str(text).strip()
    if not re.fullmatch(r"[+-]?[0-9]+", word):
        raise argparse.ArgumentTypeError(f"must be {_at_least(minimum)}, got {shown(text)}{_digits_hint(word)}")
    digits = word.lstrip("+-").lstrip("0")
    n = int(word) if len(digits) <= len(str(abs(maximum))) + 1 else None  # None: far past the limit
    if n is not None and n < minimum or n is None and word.startswith("-"):
        raise argparse.ArgumentTypeError(f"must be {_at_least(minimum)}, got {shown(text)}")
    if n is None or n > maximum:
        because = f" ({why})" if why else ""
        raise argparse.ArgumentTypeError(f"must be at most {maximum:,}{because}, got {shown(text)}")
    return n


def bounded(minimum: int, maximum: int = COUNT_MAX, why: str = ""):
    """An argparse `type=` that takes `integer(text, minimum, maximum, why)`."""
    def check(text: str) -> int:
        return integer(text, minimum, maximum, why)
    check.__name__ = f"integer_{minimum}_{maximum}"
    check.minimum = minimum  # what auto_or's refusal says a number must be
    return check


def _at_least(minimum: int) -> str:
    return {1: "a positive integer", 0: "an integer >= 0"}.get(minimum, f"an integer >= {minimum}")


def shown(text) -> str:
    text = str(text)
    if len(text) <= SHOWN_MAX:
        return repr(text)
    return f"{text[:SHOWN_MAX // 2]!r}...({len(text):,} characters)"


def _number_like(text: str) -> bool:
    """Whether float() reads `text` (1e3, 2.5, nan): a number, not a file name, to the user."""
    try:
        float(text.strip().replace("_", ""))
    except (ValueError, OverflowError):
        return False
    return True


def _digits_hint(word: str) -> str:
    """' (in digits: 1000)' for a word such as 1e3, 1.0 or 1_000 that is a whole number."""
    if re.fullmatch(r"[+-]?[0-9]+", word):
        return ""
    try:
        value = float(word.replace("_", ""))
    except (ValueError, OverflowError):
        return ""
    if not value.is_integer() or abs(value) > COUNT_MAX:
        return ""
    return f" (in digits: {int(value)})"


positive_int = bounded(1)
non_negative_int = bounded(0)
#: a count of tokens: a prompt's, a chunk's, greedy tokens, bench's lengths, the stream threshold
token_count = bounded(1, TOKENS_MAX, "token positions are int32 in the CUDA kernels")
greedy_count = bounded(0, TOKENS_MAX, "token positions are int32 in the CUDA kernels")
seed = bounded(0, SEED_MAX, "a seed is 64 bits: make-pack's is a uint64 in the pack's header")
workers = bounded(1, WORKERS_MAX, "each is a thread of this process")
layer_count = bounded(1, LAYERS_MAX, "a GGUF header holds block_count as a uint32")


def _count_or(count, text: str, refusal: str) -> int:
    """count(text), its refusal of a number past the limit as it is (that says the limit and
    why); any other refusal replaced by `refusal`, which names what else `text` may be."""
    try:
        return count(text)
    except argparse.ArgumentTypeError as exc:
        if "at most" in str(exc):
            raise
        raise argparse.ArgumentTypeError(refusal) from None


def auto_or(count, off: bool = False):
    """An argparse `type=` that takes `auto` (and with `off` the word off) or what `count` (a
    `bounded` check) takes."""
    words = ("auto", "off") if off else ("auto",)
    said = " or ".join(f"'{w}'" for w in words)

    def check(text: str) -> str | int:
        if text in words:
            return text
        return _count_or(count, text, f"must be {said} or {_at_least(count.minimum)}, "
                                      f"got {shown(text)}{_digits_hint(text.strip())}")
    check.__name__ = f"auto_or_{count.__name__}"
    return check


#: `auto` or a positive integer (the prefill's chunk); a switch's `auto` or count: strata_prefill/arms.py
chunk_size = auto_or(token_count)


def prompt_source(text: str) -> int | Path:
    """A token count (a positive integer) or an existing prompt file. A word that looks like a
    number (1e3, -5, 2.5) and is not a file is refused as a count."""
    _not_blank(text, "prompt file or a token count")
    if re.fullmatch(r"[+-]?\d+", text.strip()):
        return _count_or(token_count, text, f"{text!r} is not a token count (a count is a positive integer)")
    path = Path(text)
    if _number_like(text) and not path.exists():
        hint = _digits_hint(text.strip())
        raise argparse.ArgumentTypeError(f"{shown(text)} is not a token count (a count is a positive "
                                         f"integer{', ' + hint[2:-1] if hint else ''}) nor a prompt file")
    if not path.exists():
        raise argparse.ArgumentTypeError(f"prompt file not found: {text}")
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"prompt is not a file: {text}")
    return path


def _not_blank(text: str, noun: str) -> None:
    """An empty or blank path (an unset shell variable: `--dump-dir "$UNSET"`) is refused: it
    would name the current folder, or stand for the default."""
    if not str(text).strip():
        raise argparse.ArgumentTypeError(f"{text!r} is an empty path: name a {noun}")


def input_path(text: str) -> str:
    """A file or folder the command reads (what it holds is checked where it is opened, before
    any work); never empty."""
    _not_blank(text, "file")
    return text


def folder_path(text: str) -> str:
    """A folder the command reads or empties; never empty."""
    _not_blank(text, "folder")
    return text


def output_file(text: str) -> Path:
    """A file the command may create or replace: not a folder nor a device, pipe or socket (a
    write renames a temp file onto it), in an existing, writable folder."""
    _not_blank(text, "file")
    path = Path(text)
    if text.endswith(os.sep) or path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder, not a file name")
    if path.exists() and not path.is_file():
        raise argparse.ArgumentTypeError(f"cannot write {text}: it is not a regular file (a device, pipe "
                                         "or socket), which a write would replace")
    folder = path.parent
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise argparse.ArgumentTypeError(f"cannot write {text}: folder {folder} {what}")
    _probe(folder, text)
    if path.exists() and not os.access(path, os.W_OK):
        raise argparse.ArgumentTypeError(f"cannot write {text}: permission denied")
    return path


def output_dir(text: str, files: tuple[str, ...] = ()) -> Path:
    """A folder the command may create (with its parents) and write into; `files`: the names
    it will write there, each checked as output_file is where the folder exists."""
    _not_blank(text, "folder")
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
    if existing == path:
        for name in files:
            output_file(str(path / name))
    return path


def folder_for(*files: str):
    """An argparse `type=`: output_dir(text, files)."""
    def check(text: str) -> Path:
        return output_dir(text, files)
    check.__name__ = "output_dir"
    return check


def _probe(folder: Path, target: str) -> None:
    """Create and remove a file in `folder`, or say in one line why it cannot be written."""
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".strata-probe-"):
            pass
    except OSError as exc:
        raise argparse.ArgumentTypeError(
            f"cannot write {target}: folder {folder}: {exc.strerror or exc}") from None


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
    from strata_prefill.contract.errors import InputError

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


# ---- values the environment gives ------------------------------------------------------------

def environment_values(command: str = "run") -> None:
    """Refuse, before any work, a value the code would not take of a variable `command` reads
    (strata_prefill/variables.py: the switches of the fast path, read by the engine only once it
    is made; the timing switch, which fast/phases.py reads as off unless "1", so `yes` would pass
    unseen; the dump level and files, the thread count, the caches' folders). Each count through
    `integer`, as the flags are; an empty path as an empty path flag is."""
    from strata_prefill import variables

    variables.check(command)


def one_of(choices):
    def check(text: str) -> str:
        if text not in choices:
            raise argparse.ArgumentTypeError(f"must be one of {', '.join(choices)}, got {text!r}")
        return text
    return check


# ---- counts bounded by the pack: its context, its vocabulary ---------------------------------

def counts_fit(config, prompt_tokens: int | None = None, prompt_label: str | None = None,
               greedy: int = 0, top: int | None = None, where: str = "") -> None:
    """Refuse (InputError) counts this pack cannot take, from its header alone, before the
    prompt is made or any layer runs: a prompt whose tokens, with the greedy tokens fed back
    after it, need more positions than the pack's context length (each greedy token but the
    last is fed back: strata_prefill/session.py), or a --top past the vocabulary. `prompt_label` names
    the prompt (default: `--prompt-tokens N`), `where` the pack (default "the pack"; "the
    default pack" before it is made)."""
    from strata_prefill.contract.errors import InputError

    ctx = config.context_length
    if prompt_tokens is not None:
        fed = max(greedy - 1, 0)
        if prompt_tokens + fed > ctx:
            with_greedy = f" with --greedy {greedy}" if fed else ""
            need = (f"{prompt_tokens + fed:,} positions ({prompt_tokens:,} + {fed:,} greedy tokens fed back)"
                    if fed else f"{prompt_tokens:,} positions")
            room = []
            if ctx > fed:
                room.append(f"at most {ctx - fed:,} prompt tokens{with_greedy}")
            if fed and prompt_tokens <= ctx:
                room.append(f"at most --greedy {ctx - prompt_tokens + 1} after {prompt_tokens:,} prompt tokens")
            if not room:
                room.append(f"the prompt's tokens and --greedy less one at most {ctx:,}")
            subject = prompt_label or f"--prompt-tokens {prompt_tokens}"
            raise InputError(f"{subject}{with_greedy} needs {need}, beyond "
                             f"{where or 'the pack'}'s context length ({ctx:,}): {' or '.join(room)}")
    if top is not None and top > config.n_vocab:
        raise InputError(f"--top {top}: {where or 'the pack'}'s vocabulary has {config.n_vocab:,} tokens: "
                         f"at most {config.n_vocab:,}")

