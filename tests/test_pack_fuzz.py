"""A pack's header fuzzed, field by field: every kind of field of the tiny pack's GGUF header
(magic, version, tensor and key counts), of its metadata (key lengths, keys, value types,
values, string lengths, array element types, counts and elements) and of its tensor table
(name lengths, names, dimension counts, dimensions, type ids, data offsets), found by a reader
of this file's own (struct, not gguf-py nor strata), is given random and edge values by
hypothesis: zero, one, the integer limits, values past them wrapped into the field, NaN, the
infinities, negative and subnormal floats, random bytes, one bit flipped.

`run` on the result either refuses it before any work (exit 2, one line `strata-prefill: error:
...`, no traceback, before a session is made, in a fraction of a prefill's time) or, where
nothing reads the field or the value is one a pack may hold, opens it as a pack (the same one:
its configuration and tensors unchanged; or another that runs, exit 0). The fields that lay the
file out (the counts, the lengths, every field of the tensor table) are always refused. The
file is never changed. A few of each part run in a process of their own, for the exit status a
shell sees."""
from __future__ import annotations

import contextlib
import hashlib
import io
import math
import os
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

ROOT = Path(__file__).resolve().parents[1]
RUN = ["--prompt-tokens", "8", "--greedy", "0", "--no-progress"]

# ---- the file's fields, read here ---------------------------------------------------------

SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9


@dataclass(frozen=True)
class Field:
    part: str    # "header", "metadata" or "tensor table"
    owner: str   # the key or the tensor's name ("" for the header)
    what: str    # the kind of field (KINDS)
    offset: int
    size: int
    fmt: str     # a struct format, or "bytes" (the magic, keys, names, string values)


def fields_of(data: bytes) -> list[Field]:
    """Every field of a GGUF file's header, metadata and tensor table, in file order."""
    out: list[Field] = []
    at = 0

    def take(part, owner, what, fmt):
        nonlocal at
        out.append(Field(part, owner, what, at, struct.calcsize(fmt), fmt))
        value = struct.unpack_from(fmt, data, at)[0]
        at += struct.calcsize(fmt)
        return value

    def text(part, owner, what):
        nonlocal at
        n = take(part, owner, what + "_len", "<Q")
        out.append(Field(part, owner, what, at, n, "bytes"))
        at += n
        return data[at - n:at].decode()

    out.append(Field("header", "", "magic", 0, 4, "bytes"))
    at = 4
    take("header", "", "version", "<I")
    n_tensors = take("header", "", "n_tensors", "<Q")
    n_kv = take("header", "", "n_kv", "<Q")
    for _ in range(n_kv):
        first = len(out)
        key = text("metadata", "", "key")
        out[first:] = [Field(f.part, key, f.what, f.offset, f.size, f.fmt) for f in out[first:]]
        vtype = take("metadata", key, "value_type", "<I")
        if vtype == STRING:
            text("metadata", key, "value")
        elif vtype == ARRAY:
            etype = take("metadata", key, "elem_type", "<I")
            for _ in range(take("metadata", key, "count", "<Q")):
                if etype == STRING:
                    text("metadata", key, "elem")
                else:
                    take("metadata", key, "elem", SCALARS[etype])
        else:
            take("metadata", key, "value", SCALARS[vtype])
    for _ in range(n_tensors):
        first = len(out)
        name = text("tensor table", "", "name")
        out[first:] = [Field(f.part, name, f.what, f.offset, f.size, f.fmt) for f in out[first:]]
        for _ in range(take("tensor table", name, "n_dims", "<I")):
            take("tensor table", name, "dim", "<Q")
        take("tensor table", name, "type", "<I")
        take("tensor table", name, "offset", "<Q")
    return out


# the kinds of field, each fuzzed on its own; STRUCTURAL ones are always refused (they lay the
# file out: a changed count or length misreads what follows; a changed tensor entry breaks the
# tensors' layout, shapes or names)
KINDS = ("magic", "version", "n_tensors", "n_kv", "key_len", "key", "value_type", "value", "value_len",
         "elem_type", "count", "elem_len", "elem", "name_len", "name", "n_dims", "dim", "type", "offset")
STRUCTURAL = {"magic", "n_tensors", "n_kv", "key_len", "value_len", "elem_len", "count", "name_len",
              "name", "n_dims", "dim", "type", "offset"}

EDGE_INTS = (0, 1, 2, 3, 31, 32, 33, 255, 256, 2**15, 2**16 - 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32,
             2**63 - 1, 2**63, 2**64 - 1)
EDGE_FLOATS = (math.nan, math.inf, -math.inf, -1.0, 0.0, -0.0, 3.4e38, 1e-45, 1e300, -3.0)


@st.composite
def new_bytes(draw, field: Field, old: bytes) -> bytes:
    """A field's new bytes, of its own size (so every other field stays where it was)."""
    if field.fmt == "bytes":
        if field.size == 0:
            return b""
        how = draw(st.sampled_from(["random", "bit", "text"]))
        if how == "random":
            return draw(st.binary(min_size=field.size, max_size=field.size))
        if how == "text":
            return draw(st.text("abcdefghijklmnopqrstuvwxyz._0123456789", min_size=field.size,
                                max_size=field.size)).encode()
        i, bit = draw(st.integers(0, field.size - 1)), draw(st.integers(0, 7))
        return old[:i] + bytes([old[i] ^ (1 << bit)]) + old[i + 1:]
    if field.fmt in ("<f", "<d"):
        width = 32 if field.fmt == "<f" else 64
        value = draw(st.one_of(st.sampled_from(EDGE_FLOATS), st.floats(width=width)))
        with contextlib.suppress(OverflowError):
            return struct.pack(field.fmt, value)
        return struct.pack(field.fmt, math.inf)  # 1e300 in a float32: what overflows is Inf
    if field.fmt == "<?":
        return bytes([draw(st.integers(2, 255))])
    bits = 8 * field.size
    value = draw(st.one_of(st.sampled_from(EDGE_INTS), st.integers(0, 2**bits - 1),
                           st.integers(-2**63, -1)))
    return (value % 2**bits).to_bytes(field.size, "little")


# ---- the fixture and the oracle ---------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(make_test_pack):
    """(path, bytes, fields by kind, the seconds of a run of 1024 prompt tokens: what a refusal
    is timed against)."""
    from strata_prefill.cli import main

    path = Path(make_test_pack("tiny").path)
    data = path.read_bytes()
    by_kind: dict[str, list[Field]] = {}
    for f in fields_of(data):
        by_kind.setdefault(f.what, []).append(f)
    assert set(by_kind) == set(KINDS), set(KINDS) ^ set(by_kind)  # every kind is in the pack
    with contextlib.redirect_stdout(io.StringIO()):
        main(["run", "--pack", str(path), *RUN])  # imports, caches: the prefill below is timed alone
        t0 = time.perf_counter()
        assert main(["run", "--pack", str(path), "--prompt-tokens", "1024", "--greedy", "1", "--no-progress"]) == 0
    return path, data, by_kind, time.perf_counter() - t0


class _Work(Exception):
    """A session was made: the run started work."""


def _no_work(*_a, **_k):
    raise _Work


def _table(path: Path):
    """What a run computes from: the configuration and each tensor's name, type, shape and
    place, as strata opens them (its value check off: the bytes were not changed)."""
    from strata_prefill.formats.pack import Pack

    with Pack.open(path, check_values=False) as p:
        return p.config, [(t.name, int(t.tensor_type), [int(d) for d in t.shape], int(t.data_offset))
                          for t in p.reader.tensors]


def check_mutation(tiny, field: Field, new: bytes) -> None:
    """Write the pack with `field` replaced by `new`, run it in the process, and hold the
    outcome to the module docstring's promise."""
    from strata_prefill.cli import main

    path, data, _, prefill_s = tiny
    old = data[field.offset:field.offset + field.size]
    if new == old:
        return
    with tempfile.TemporaryDirectory() as d:
        bad = Path(d) / "fuzzed.gguf"
        bad.write_bytes(data[:field.offset] + new + data[field.offset + field.size:])
        before = hashlib.sha256(bad.read_bytes()).hexdigest()
        err, out = io.StringIO(), io.StringIO()
        t0 = time.perf_counter()
        started = False
        with mock.patch("strata_prefill.session.Session.__init__", _no_work), \
                contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            try:
                code = main(["run", "--pack", str(bad), *RUN])
            except _Work:
                started = True
        seconds = time.perf_counter() - t0
        where = f"{field.part} {field.owner} {field.what} {old!r} -> {new!r}"
        if started:  # accepted: harmless, or a pack that may be so
            assert field.what not in STRUCTURAL, f"accepted: {where}"
            if _table(bad) != _table(path):  # another pack: it runs
                with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
                    code = main(["run", "--pack", str(bad), *RUN])
                assert code == 0 and err.getvalue() == "", (where, err.getvalue())
        else:
            lines = err.getvalue().splitlines()
            assert code == 2, (where, code, err.getvalue())
            assert len(lines) == 1 and lines[0].startswith("strata-prefill: error: "), (where, lines)
            assert out.getvalue() == "", where
            # before any work: the mocked session proves the order; the time, that no check costs
            # as much as the prefill it guards (a whole prefill's time: the two are measured apart,
            # and a shared machine's load moves either)
            assert seconds < prefill_s, (where, seconds, prefill_s)
        assert hashlib.sha256(bad.read_bytes()).hexdigest() == before, where
    assert hashlib.sha256(path.read_bytes()).hexdigest() == hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_a_fuzzed_field_is_refused_before_any_work_or_is_harmless(tiny, kind, data):
    field = data.draw(st.sampled_from(tiny[2][kind]), label="field")
    old = tiny[1][field.offset:field.offset + field.size]
    check_mutation(tiny, field, data.draw(new_bytes(field, old), label="new bytes"))


# one field of each part, in a process of its own: (kind, owner or "", new value as an integer, or
# bytes for a "bytes" field) -> the text its one line holds
IN_A_PROCESS = [
    ("magic", "", b"GGUG", "not a GGUF file"),
    ("n_tensors", "", 2**40, "corrupt or truncated GGUF file"),
    ("key_len", "general.architecture", 2**63, "corrupt or truncated GGUF file"),
    ("value", "qwen3moe.block_count", 2**32 - 1, "qwen3moe.block_count 4294967295"),
    ("value", "qwen3moe.attention.layer_norm_rms_epsilon", math.nan, "layer_norm_rms_epsilon nan"),
    ("type", "blk.0.attn_q.weight", 1, "tensor blk.0.attn_q.weight (data bytes"),
    ("offset", "blk.1.ffn_up_exps.weight", 7, "not a multiple of the alignment (32)"),
    ("name", "blk.0.ffn_norm.weight", b"blk.0.ffn_nrom.weight", "1 tensor a qwen3moe pack does not hold"),
]


@pytest.mark.parametrize("kind, owner, value, needle", IN_A_PROCESS, ids=[f"{k} {o}".strip() for k, o, *_ in IN_A_PROCESS])
def test_in_a_process_of_its_own(tiny, tmp_path, kind, owner, value, needle):
    path, data, by_kind, prefill_s = tiny
    field = next(f for f in by_kind[kind] if f.owner == owner)
    if field.fmt == "bytes":
        new = value
    elif field.fmt in ("<f", "<d"):
        new = struct.pack(field.fmt, value)
    else:
        new = value.to_bytes(field.size, "little")
    bad = tmp_path / "fuzzed.gguf"
    bad.write_bytes(data[:field.offset] + new + data[field.offset + field.size:])
    before = bad.read_bytes()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-m", "strata_prefill", "run", "--pack", str(bad), *RUN],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "Warning" not in proc.stderr
    assert len(lines) == 1 and lines[0].startswith("strata-prefill: error: "), proc.stderr
    assert needle in lines[0], (needle, lines[0])
    assert proc.stdout == "" and bad.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fuzzed.gguf"]  # nothing written, no cache made
