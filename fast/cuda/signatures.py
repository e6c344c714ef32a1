"""The C signatures of the kernels in fast/cuda/kernels/*.cu, read without a compiler, and the
PyCUDA argument format each one takes: a format that does not match its kernel's parameters
packs the launch's arguments at the wrong offsets, which no error reports.

Only as much of the preprocessor runs as the signatures need: comments and line splices go, the
conditionals (``#if``/``#ifdef``/``#ifndef``/``#elif``/``#else``) are evaluated over the file's own
``#define``s and the ``defines`` a module is built with (``-DKEY=VALUE``, as
fast/cuda/runtime.py passes them), the project's own headers (``#include "x.cuh"``) are read in
place (one that fast/cuda/generated.py writes, as that text), and the function-like macros that
declare kernels (``#define ENTRY(NAME, T) extern "C" __global__ ...``) are expanded (``##``
pasting, ``#`` stringizing), also where a list macro applies one to each entry
(``#define LIST(X) X(a, int) X(b, float)``, then ``LIST(ENTRY)``). Object-like macros expand
inside parameter types and ``#if`` expressions. System headers are not read.

A kernel is a ``__global__`` function with C linkage (``extern "C"`` before it, or an
``extern "C" { }`` block around it). Each parameter's type maps to one struct letter (pointers
and arrays: P; ``int``: i; ``unsigned``/``uint32_t``: I; ``long long``/``int64_t``: q;
``unsigned long long``/``uint64_t``/``size_t``: Q; ``float``: f; ``double``: d; ...: see
``SCALAR``); a struct passed by value gives its fields' letters in order (its arrays repeated).
``long`` is taken as 8 bytes (q, Q): the Linux targets are LP64.

Nothing here imports PyCUDA: the checks run on any machine.
"""
from __future__ import annotations

import bisect
import os
import re
from dataclasses import dataclass

from . import generated
from .kernel_paths import KERNEL_DIR

__all__ = [
    "SCALAR",
    "Param",
    "Kernel",
    "kernels",
    "parse_source",
    "expected_format",
    "normalize_format",
    "check",
    "check_kernel",
]

#: a scalar parameter's type (qualifiers dropped, "int" folded into its modifiers: "unsigned int"
#: is "unsigned") -> its PyCUDA (struct module) letter
SCALAR = {
    "int": "i", "unsigned": "I", "int32_t": "i", "uint32_t": "I",
    "long long": "q", "unsigned long long": "Q", "int64_t": "q", "uint64_t": "Q",
    "long": "q", "unsigned long": "Q", "size_t": "Q", "ssize_t": "q", "ptrdiff_t": "q",
    "intptr_t": "q", "uintptr_t": "Q",
    "short": "h", "unsigned short": "H", "int16_t": "h", "uint16_t": "H",
    "char": "b", "signed char": "b", "unsigned char": "B", "int8_t": "b", "uint8_t": "B",
    "bool": "?", "float": "f", "double": "d", "__half": "e", "half": "e",
}

_QUALIFIERS = {"const", "volatile", "__restrict__", "__restrict", "restrict", "struct",
               "__grid_constant__", "register"}
_TYPE_WORDS = {"int", "unsigned", "signed", "long", "short", "char", "float", "double", "bool", "void"}
#: declaration attributes that take a parenthesized argument list (skipped before the name)
_ATTRIBUTES = {"__launch_bounds__", "__attribute__", "__declspec", "__maxnreg__", "__cluster_dims__", "alignas"}
_PREDEFINED = {"__CUDACC__": "1", "__NVCC__": "1", "__cplusplus": "201703L"}

_TOKEN = re.compile(r"""
    (?P<s>"(?:\\.|[^"\\\n])*")
  | (?P<c>'(?:\\.|[^'\\\n])*')
  | (?P<id>[A-Za-z_]\w*)
  | (?P<num>\.?\d(?:[eEpP][+-]|[\w.])*)
  | (?P<op>\#\#|<<=|>>=|->|::|&&|\|\||<<|>>|<=|>=|==|!=|[-+*/%&|^]=|\+\+|--|\S)
""", re.X)


def _tokens(text: str) -> list[str]:
    return [m.group() for m in _TOKEN.finditer(text)]


def _is_ident(tok: str) -> bool:
    return bool(tok) and (tok[0].isalpha() or tok[0] == "_")


@dataclass(frozen=True)
class Param:
    ctype: str    # as declared, qualifiers kept: "const float* __restrict__"
    name: str     # "" where the declaration names none
    letters: str  # its PyCUDA letters: one, or a by-value struct's fields'

    def __str__(self) -> str:
        return f"{self.ctype} {self.name}".strip()


@dataclass(frozen=True)
class Kernel:
    name: str
    params: tuple[Param, ...]
    file: str    # the file and line of the declaration (of the macro use, for a macro's kernel)
    line: int
    macro: str | None = None          # the function-like macro that declared it, if one did
    conditions: tuple[str, ...] = ()  # the #if lines around any part of it (not include guards)

    @property
    def format(self) -> str:
        return "".join(p.letters for p in self.params)

    @property
    def signature(self) -> str:
        return f"{self.name}({', '.join(str(p) for p in self.params)})"

    @property
    def where(self) -> str:
        via = f" (via {self.macro})" if self.macro else ""
        return f"{self.file}:{self.line}{via}"


# ---------------------------------------------------------------------------------- #if expressions

class _Expr:
    """A C preprocessor constant expression over integer tokens (macros already expanded):
    precedence climbing over the C operators, ternary included."""

    _BINARY = [("||",), ("&&",), ("|",), ("^",), ("&",), ("==", "!="), ("<", "<=", ">", ">="),
               ("<<", ">>"), ("+", "-"), ("*", "/", "%")]

    def __init__(self, toks: list[str], text: str):
        self.toks, self.i, self.text = toks, 0, text

    def fail(self, why: str):
        raise ValueError(f"#if {self.text}: {why}")

    def peek(self):
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self):
        t = self.peek()
        if t is None:
            self.fail("ends early")
        self.i += 1
        return t

    def value(self) -> int:
        v = self.ternary()
        if self.peek() is not None:
            self.fail(f"unexpected {self.peek()!r}")
        return v

    def ternary(self) -> int:
        c = self.binary(0)
        if self.peek() == "?":
            self.take()
            a = self.ternary()
            if self.take() != ":":
                self.fail("'?' without ':'")
            b = self.ternary()
            return a if c else b
        return c

    def binary(self, level: int) -> int:
        if level == len(self._BINARY):
            return self.unary()
        v = self.binary(level + 1)
        while self.peek() in self._BINARY[level]:
            op = self.take()
            w = self.binary(level + 1)
            v = self.apply(op, v, w)
        return v

    def apply(self, op: str, a: int, b: int) -> int:
        if op in ("/", "%"):
            if b == 0:
                self.fail("division by zero")
            q = abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1)  # C truncates toward zero
            return q if op == "/" else a - b * q
        if op == "||":
            return int(bool(a) or bool(b))
        if op == "&&":
            return int(bool(a) and bool(b))
        return {
            "|": a | b, "^": a ^ b, "&": a & b, "==": int(a == b), "!=": int(a != b),
            "<": int(a < b), "<=": int(a <= b), ">": int(a > b), ">=": int(a >= b),
            "+": a + b, "-": a - b, "*": a * b,
            "<<": a << b if b >= 0 else 0, ">>": a >> b if b >= 0 else 0,
        }[op]

    def unary(self) -> int:
        t = self.take()
        if t == "(":
            v = self.ternary()
            if self.take() != ")":
                self.fail("unbalanced parentheses")
            return v
        if t == "!":
            return int(not self.unary())
        if t == "~":
            return ~self.unary()
        if t == "-":
            return -self.unary()
        if t == "+":
            return self.unary()
        if t[0].isdigit():
            return _int_literal(t, self)
        if t[0] == "'" and len(t) == 3:
            return ord(t[1])
        self.fail(f"cannot evaluate {t!r}")


def _int_literal(t: str, expr: _Expr) -> int:
    s = t.rstrip("uUlL")
    try:
        if len(s) > 1 and s[0] == "0" and s[1] not in "xXbB":
            return int(s, 8)
        return int(s, 0)
    except ValueError:
        expr.fail(f"not an integer: {t!r}")


# ---------------------------------------------------------------------------------- preprocessor

@dataclass
class _Macro:
    params: list[str] | None  # None: object-like
    body: list[str]
    file: str
    line: int
    conditions: tuple[str, ...]


@dataclass
class _Line:
    file: str
    line: int
    text: str
    conditions: tuple[str, ...]


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first physical line, text) of each line after splicing backslash-newlines and removing
    comments (a block comment's newlines kept, so a line's number stays its own)."""
    spliced: list[tuple[int, str]] = []
    cur, start = [], 1
    for n, raw in enumerate(text.split("\n"), 1):
        if not cur:
            start = n
        if raw.endswith("\\"):
            cur.append(raw[:-1])
            continue
        cur.append(raw)
        spliced.append((start, "".join(cur)))
        cur = []
    if cur:
        spliced.append((start, "".join(cur)))
    joined = "\n".join(t for _, t in spliced)
    out, i, n = [], 0, len(joined)
    while i < n:
        ch = joined[i]
        if ch in "\"'":
            j = i + 1
            while j < n and joined[j] != ch and joined[j] != "\n":
                j += 2 if joined[j] == "\\" else 1
            out.append(joined[i:j + 1])
            i = j + 1
        elif joined.startswith("//", i):
            j = joined.find("\n", i)
            j = n if j < 0 else j
            out.append(" ")
            i = j
        elif joined.startswith("/*", i):
            j = joined.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(" " + "\n" * joined.count("\n", i, j))
            i = j
        else:
            out.append(ch)
            i += 1
    lines = "".join(out).split("\n")
    assert len(lines) == len(spliced)
    return [(spliced[k][0], lines[k]) for k in range(len(lines))]


class _Pre:
    """The preprocessor state of one translation unit: its macros and the active lines."""

    def __init__(self, include_dir: str | None, defines: dict | None):
        self.include_dir = include_dir
        self.macros: dict[str, _Macro] = {}
        for k, v in {**_PREDEFINED, **{str(k): str(v) for k, v in (defines or {}).items()}}.items():
            self.macros[k] = _Macro(None, _tokens(v), "<defines>", 0, ())
        self.lines: list[_Line] = []
        self.files: list[str] = []  # every file read, for the cache's staleness check
        self.generated: list[tuple[str, str]] = []  # (name, text) of each generated header read
        self.depth = 0

    # -- expansion of object-like macros (types, #if expressions)
    def expand(self, toks: list[str], hide: frozenset = frozenset(), keep_defined: bool = False) -> list[str]:
        out: list[str] = []
        i = 0
        while i < len(toks):
            t = toks[i]
            if keep_defined and t == "defined":
                # defined X / defined(X): the operand is a name, not something to expand
                j = i + 1
                if j < len(toks) and toks[j] == "(":
                    out.extend(toks[i:j + 3])
                    i = j + 3
                else:
                    out.extend(toks[i:j + 1])
                    i = j + 1
                continue
            m = self.macros.get(t) if _is_ident(t) and t not in hide else None
            if m is not None and m.params is None:
                out.extend(self.expand(m.body, hide | {t}, keep_defined))
            elif m is not None and i + 1 < len(toks) and toks[i + 1] == "(":
                args, end = _macro_args(toks, i + 1, t)
                out.extend(self.expand(_substitute(m, args), hide | {t}, keep_defined))
                i = end
                continue
            else:
                out.append(t)
            i += 1
        return out

    def evaluate(self, text: str) -> int:
        toks = self.expand(_tokens(text), keep_defined=True)
        plain: list[str] = []
        i = 0
        while i < len(toks):
            t = toks[i]
            if t == "defined":
                if i + 1 < len(toks) and toks[i + 1] == "(":
                    name, i = toks[i + 2], i + 4
                else:
                    name, i = toks[i + 1], i + 2
                plain.append("1" if name in self.macros else "0")
                continue
            if _is_ident(t):  # what is left of the names is 0 (true, false: C++'s)
                plain.append("1" if t == "true" else "0")
            else:
                plain.append(t)
            i += 1
        return _Expr(plain, text).value()

    # -- one file
    def run(self, path: str, shown: str) -> None:
        self.depth += 1
        if self.depth > 32:
            raise ValueError(f"{shown}: #include nested too deep")
        with open(path, encoding="utf-8") as f:
            text = f.read()
        self.files.append(path)
        self.run_text(text, shown, os.path.dirname(path))
        self.depth -= 1

    def run_text(self, text: str, shown: str, here: str | None) -> None:
        lines = _logical_lines(text)
        guard = _include_guard(lines)
        # each open conditional: [taking now, taken already, its text, outer taking]
        stack: list[list] = []

        def active() -> bool:
            return all(s[0] for s in stack)

        def conditions() -> tuple[str, ...]:
            return tuple(s[2] for s in stack if s[2] is not None)

        for lineno, line in lines:
            s = line.strip()
            if not s.startswith("#"):
                if active() and s:
                    self.lines.append(_Line(shown, lineno, line, conditions()))
                continue
            m = re.match(r"#\s*(\w*)\s*(.*)$", s)
            word, rest = m.group(1), m.group(2).strip()
            where = f"{shown}:{lineno}"
            if word in ("if", "ifdef", "ifndef"):
                outer = active()
                if not outer:
                    take = False
                elif word == "if":
                    take = bool(self.evaluate(rest))
                else:
                    name = rest.split()[0] if rest else ""
                    if not name:
                        raise ValueError(f"{where}: #{word} without a name")
                    take = (name in self.macros) == (word == "ifdef")
                label = None if (guard and lineno == guard) else f"{where}: #{word} {rest}"
                stack.append([take, take, label, outer])
            elif word == "elif":
                if not stack:
                    raise ValueError(f"{where}: #elif without #if")
                top = stack[-1]
                take = top[3] and not top[1] and bool(self.evaluate(rest))
                top[0], top[1] = take, top[1] or take
            elif word == "else":
                if not stack:
                    raise ValueError(f"{where}: #else without #if")
                top = stack[-1]
                top[0] = top[3] and not top[1]
                top[1] = True
            elif word == "endif":
                if not stack:
                    raise ValueError(f"{where}: #endif without #if")
                stack.pop()
            elif not active():
                continue
            elif word == "define":
                self.define(rest, shown, lineno, conditions(), where)
            elif word == "undef":
                self.macros.pop(rest.split()[0] if rest else "", None)
            elif word == "include":
                inc = re.match(r'"([^"]+)"', rest)
                if inc is None:
                    continue  # <system header>: not read
                text = generated.header(inc.group(1))
                if text is not None:  # written from Python (fast/cuda/generated.py), no file
                    self.generated.append((inc.group(1), text))
                    self.run_text(text, inc.group(1), here)
                    continue
                base = self.include_dir or here
                path = os.path.join(base or ".", inc.group(1))
                if not os.path.isfile(path) and here and base != here:
                    path = os.path.join(here, inc.group(1))
                if not os.path.isfile(path):
                    raise ValueError(f"{where}: #include \"{inc.group(1)}\": no such file")
                self.run(path, os.path.basename(path))
            elif word == "error":
                raise ValueError(f"{where}: #error {rest}")
            # pragma, line, warning, and the null directive: nothing a signature needs
        if stack:
            raise ValueError(f"{shown}: {len(stack)} #if without #endif")

    def define(self, rest: str, shown: str, lineno: int, conds: tuple[str, ...], where: str) -> None:
        m = re.match(r"([A-Za-z_]\w*)(\(([^)]*)\))?\s*(.*)$", rest, re.S)
        if m is None:
            raise ValueError(f"{where}: #define {rest!r}")
        name, params = m.group(1), None
        if m.group(2) is not None:
            params = [p.strip() for p in m.group(3).split(",") if p.strip()]
        self.macros[name] = _Macro(params, _tokens(m.group(4)), shown, lineno, conds)


def _include_guard(lines: list[tuple[int, str]]) -> int | None:
    """The line of a header's include guard (#ifndef X, #define X as its first two directives
    and an #endif as its last), or None."""
    directives = [(n, s.strip()) for n, s in lines if s.strip()]
    if len(directives) < 3:
        return None
    (n0, a), (_, b), (_, z) = directives[0], directives[1], directives[-1]
    ma, mb = re.match(r"#\s*ifndef\s+(\w+)$", a), re.match(r"#\s*define\s+(\w+)\s*$", b)
    if ma and mb and ma.group(1) == mb.group(1) and re.match(r"#\s*endif\b", z):
        return n0
    return None


def _macro_args(toks: list[str], open_at: int, name: str) -> tuple[list[list[str]], int]:
    """The arguments of a function-like macro use whose "(" is toks[open_at], and the index after
    its ")"."""
    args: list[list[str]] = [[]]
    depth = 0
    i = open_at
    while True:
        i += 1
        if i >= len(toks):
            raise ValueError(f"use of macro {name}: no closing parenthesis")
        t = toks[i]
        if t in "([{":
            depth += 1
        elif t in ")]}":
            if depth == 0:
                break
            depth -= 1
        elif t == "," and depth == 0:
            args.append([])
            continue
        args[-1].append(t)
    if args == [[]]:
        args = []
    return args, i + 1


def _substitute(m: _Macro, args: list[list[str]]) -> list[str]:
    """m's body with its parameters replaced by ``args`` (``#p`` stringized, ``a ## b`` pasted)."""
    params = m.params or []
    if len(args) != len(params) and not (not params and not args):
        raise ValueError(f"{m.file}:{m.line}: macro takes {len(params)} arguments, used with {len(args)}")
    arg = dict(zip(params, args))
    body = m.body
    out: list[str] = []
    i = 0
    while i < len(body):
        t = body[i]
        if t == "#" and i + 1 < len(body) and body[i + 1] in arg:
            out.append('"' + " ".join(arg[body[i + 1]]).replace("\\", "\\\\").replace('"', '\\"') + '"')
            i += 2
            continue
        if t == "##" and i + 1 < len(body):
            right = arg.get(body[i + 1], [body[i + 1]])
            left = out.pop() if out else ""
            if right:
                out.extend(_tokens(left + right[0]) + right[1:])
            elif left:
                out.append(left)
            i += 2
            continue
        out.extend(arg.get(t, [t]))
        i += 1
    return out


# ---------------------------------------------------------------------------------- declarations

class _Unit:
    """The kernels of one preprocessed translation unit."""

    def __init__(self, pre: _Pre):
        self.pre = pre
        text_parts, self.starts, self.line_of = [], [], []
        off = 0
        for ln in pre.lines:
            self.starts.append(off)
            self.line_of.append(ln)
            text_parts.append(ln.text)
            off += len(ln.text) + 1
        self.text = "\n".join(text_parts)
        toks, offs = [], []
        for m in _TOKEN.finditer(self.text):
            toks.append(m.group())
            offs.append(m.start())
        self.toks, self.offs = toks, offs
        self.typedefs: dict[str, list[str]] = {}
        self.structs: dict[str, list[list[str]]] = {}
        self._types(toks)
        self.kernels: dict[str, Kernel] = {}

    def at(self, tok_index: int) -> _Line:
        return self.line_of[bisect.bisect_right(self.starts, self.offs[tok_index]) - 1]

    # typedef T NAME;   struct NAME { fields };   typedef struct { fields } NAME;
    def _types(self, toks: list[str]) -> None:
        i = 0
        while i < len(toks):
            t = toks[i]
            if t == "struct" and i + 2 < len(toks) and _is_ident(toks[i + 1]) and toks[i + 2] == "{":
                fields, end = _braced_fields(toks, i + 2)
                self.structs[toks[i + 1]] = fields
                i = end
                continue
            if t == "typedef":
                j = next((k for k in range(i, len(toks)) if toks[k] == ";"), len(toks))
                decl = toks[i + 1:j]
                if len(decl) >= 3 and decl[0] == "struct" and "{" in decl[:3]:
                    k = decl.index("{")
                    fields, end = _braced_fields(decl, k)
                    if end < len(decl) and _is_ident(decl[end]):
                        self.structs[decl[end]] = fields
                elif len(decl) >= 2 and _is_ident(decl[-1]) and "(" not in decl:
                    self.typedefs[decl[-1]] = decl[:-1]
                i = j + 1
                continue
            i += 1

    def scan(self, toks: list[str], origin, hide: frozenset = frozenset()) -> None:
        """Find the kernels in toks; ``origin(i)`` -> (file, line, macro, conditions) of token i."""
        kernel_macros = {n for n, m in self.pre.macros.items()
                         if m.params is not None and "__global__" in m.body and n not in hide}
        i = 0
        while i < len(toks):
            t = toks[i]
            m = self.pre.macros.get(t) if _is_ident(t) and t not in hide else None
            if (m is not None and m.params is not None and t not in kernel_macros and i + 1 < len(toks)
                    and toks[i + 1] == "("):
                args, end = _macro_args(toks, i + 1, t)
                if any(len(a) == 1 and a[0] in kernel_macros for a in args):  # a list macro given one
                    body = _substitute(m, args)
                    file, line, _macro, conds = origin(i)
                    conds = tuple(dict.fromkeys(conds + m.conditions))
                    self.scan(body, lambda _k, f=file, ln=line, c=conds: (f, ln, None, c), hide | {t})
                    i = end
                    continue
            if t in kernel_macros and i + 1 < len(toks) and toks[i + 1] == "(":
                m = self.pre.macros[t]
                args, end = _macro_args(toks, i + 1, t)
                body = _substitute(m, args)
                file, line, _macro, conds = origin(i)
                conds = tuple(dict.fromkeys(conds + m.conditions))
                self.scan(body, lambda _k, f=file, ln=line, n=t, c=conds: (f, ln, n, c), hide | {t})
                i = end
                continue
            if t == "__global__" and _extern_c(toks, i):
                i = self._declaration(toks, i, origin)
                continue
            i += 1

    def _declaration(self, toks: list[str], i: int, origin) -> int:
        file, line, macro, conds = origin(i)
        j, name = i + 1, None
        while j < len(toks) and toks[j] != "(":
            if toks[j] in _ATTRIBUTES and j + 1 < len(toks) and toks[j + 1] == "(":
                _, j = _macro_args(toks, j + 1, toks[j])
                continue
            if toks[j] in (";", "{", "}", "="):
                return j  # not a function
            if _is_ident(toks[j]):
                name = toks[j]
            j += 1
        if name is None or j >= len(toks):
            return j
        args, end = _macro_args(toks, j, name)
        where = f"{file}:{line}"
        for n in range(i, end):  # a parameter under an #if depends on it as much as the name
            conds = tuple(dict.fromkeys(conds + origin(n)[3]))
        params = tuple(self._param(a, where, name) for a in args if a != ["void"])
        k = Kernel(name, params, file, line, macro, conds)
        have = self.kernels.get(name)
        if have is not None and have.format != k.format:
            raise ValueError(f"{where}: kernel {name} declared twice with different parameters "
                             f"({have.signature} at {have.where})")
        if have is None or (end < len(toks) and toks[end] == "{"):  # the definition wins
            self.kernels[name] = k
        return end

    def _param(self, toks: list[str], where: str, kernel: str) -> Param:
        shown = " ".join(toks).replace(" *", "*").replace(" ,", ",")
        if "&" in toks:
            raise ValueError(f"{where}: kernel {kernel}: a reference parameter ({shown}) has no PyCUDA letter")
        decl = toks[:toks.index("[")] if "[" in toks else toks
        # the name: the last word, where something comes before it that is not a qualifier
        # (after the last "*" for a pointer); the type's words are expanded, never the name
        star = len(decl) - decl[::-1].index("*") if "*" in decl else 0
        words = [t for t in decl[star:] if _is_ident(t) and t not in _QUALIFIERS]
        name = ""
        if words and (star or (len([t for t in decl if _is_ident(t) and t not in _QUALIFIERS]) >= 2
                               and words[-1] not in _TYPE_WORDS)):
            name = words[-1]
        ctype = shown[:len(shown) - len(name)].rstrip() if name else shown
        if "*" in decl or "[" in toks:
            return Param(ctype, name, "P")
        if name:
            decl = decl[:len(decl) - decl[::-1].index(name) - 1]
        expanded = self.pre.expand(decl)
        if "*" in expanded:  # a macro that names a pointer type
            return Param(ctype, name, "P")
        type_words = [t for t in expanded if _is_ident(t) and t not in _QUALIFIERS]
        return Param(ctype, name, self._letters(type_words, where, kernel, shown, set()))

    def _letters(self, words: list[str], where: str, kernel: str, shown: str, seen: set) -> str:
        if len(words) == 1 and words[0] in self.typedefs and words[0] not in seen:
            t = self.pre.expand(self.typedefs[words[0]])
            if "*" in t:
                return "P"
            inner = [w for w in t if _is_ident(w) and w not in _QUALIFIERS]
            return self._letters(inner, where, kernel, shown, seen | {words[0]})
        if len(words) == 1 and words[0] in self.structs and words[0] not in seen:
            return "".join(self._field_letters(f, where, kernel, seen | {words[0]})
                           for f in self.structs[words[0]])
        key = _scalar_key(words)
        if key in SCALAR:
            return SCALAR[key]
        raise ValueError(f"{where}: kernel {kernel}: parameter '{shown}' has a type with no known "
                         f"PyCUDA letter ({key or '?'})")

    def _field_letters(self, toks: list[str], where: str, kernel: str, seen: set) -> str:
        toks = self.pre.expand(toks)
        count = 1
        while "[" in toks:
            a = toks.index("[")
            b = toks.index("]", a)
            count *= self.pre.evaluate(" ".join(toks[a + 1:b]))
            toks = toks[:a] + toks[b + 1:]
        if "*" in toks:
            return "P" * count
        words = [t for t in toks if _is_ident(t) and t not in _QUALIFIERS]
        if len(words) >= 2 and words[-1] not in _TYPE_WORDS:
            words = words[:-1]
        return self._letters(words, where, kernel, " ".join(toks), seen) * count


def _braced_fields(toks: list[str], open_at: int) -> tuple[list[list[str]], int]:
    """The field declarations (one token list each; ``int a, b;`` split into two) of the braces
    at toks[open_at], and the index after the closing brace."""
    fields: list[list[str]] = []
    cur: list[str] = []
    depth, i = 0, open_at + 1
    while i < len(toks):
        t = toks[i]
        if t == "{":
            depth += 1
        elif t == "}":
            if depth == 0:
                break
            depth -= 1
        elif t == ";" and depth == 0:
            if cur and "(" not in cur:  # member functions carry no data
                fields.extend(_split_declarators(cur))
            cur = []
            i += 1
            continue
        cur.append(t)
        i += 1
    return fields, i + 1


def _split_declarators(decl: list[str]) -> list[list[str]]:
    """``const T* a, b[4]`` -> [``const T* a``, ``const T b[4]``] (the pointer belongs to a)."""
    if "," not in decl:
        return [decl]
    parts, cur = [], []
    for t in decl:
        if t == ",":
            parts.append(cur)
            cur = []
        else:
            cur.append(t)
    parts.append(cur)
    first = parts[0]
    base = [t for t in first[:-1] if t != "*"] if first else []
    while base and "[" in base:
        base = base[:base.index("[")]
    return [first] + [base + p for p in parts[1:]]


def _scalar_key(words: list[str]) -> str:
    w = list(words)
    if "int" in w and len(w) > 1:
        w.remove("int")
    if w == ["signed"]:
        w = ["int"]
    elif len(w) > 1 and w[0] == "signed" and w[1] != "char":
        w = w[1:]
    return " ".join(w)


def _extern_c(toks: list[str], i: int) -> bool:
    """Whether the declaration of the __global__ at toks[i] has C linkage: ``extern "C"`` earlier
    in the same declaration, or an ``extern "C" {`` block around it."""
    j = i - 1
    while j >= 0 and toks[j] not in (";", "{", "}"):
        if toks[j] == '"C"' and j > 0 and toks[j - 1] == "extern":
            return True
        j -= 1
    depth = 0  # the block the declaration stands in
    while j >= 0:
        t = toks[j]
        if t == "}":
            depth += 1
        elif t == "{":
            if depth == 0:
                return j >= 2 and toks[j - 1] == '"C"' and toks[j - 2] == "extern"
            depth -= 1
        j -= 1
    return False


# ---------------------------------------------------------------------------------- the checks

_cache: dict = {}


def _stat(path: str):
    try:
        st = os.stat(path)
        return (st.st_mtime_ns, st.st_size)
    except OSError:
        return None


def _defines_key(defines: dict | None) -> tuple:
    return tuple(sorted((str(k), str(v)) for k, v in (defines or {}).items()))


def _unit_kernels(pre: _Pre) -> dict[str, Kernel]:
    unit = _Unit(pre)

    def origin(i):
        ln = unit.at(i)
        return ln.file, ln.line, None, ln.conditions

    unit.scan(unit.toks, origin)
    return unit.kernels


def kernels(module: str, defines: dict | None = None, *, kernel_dir: str | None = None) -> dict[str, Kernel]:
    """The kernels of ``<kernel_dir>/<module>.cu`` (default fast/cuda/kernels) built with
    ``defines``, by name. Read again when one of the files it read has changed."""
    folder = os.path.abspath(kernel_dir or KERNEL_DIR)
    key = (folder, module, _defines_key(defines))
    got = _cache.get(key)
    if got is not None and all(_stat(p) == s for p, s in got[0]) \
            and all(generated.header(n) == t for n, t in got[2]):
        return got[1]
    path = os.path.join(folder, f"{module}.cu")
    if not os.path.isfile(path):
        raise ValueError(f"no kernel module {module}: {path} does not exist")
    pre = _Pre(folder, defines)
    pre.run(path, f"{module}.cu")
    found = _unit_kernels(pre)
    _cache[key] = ([(p, _stat(p)) for p in pre.files], found, pre.generated)
    return found


def parse_source(text: str, name: str = "<source>", defines: dict | None = None,
                 include_dir: str | None = None) -> dict[str, Kernel]:
    """The kernels of CUDA source text (a module compiled from a string), by name."""
    pre = _Pre(include_dir, defines)
    pre.run_text(text, name, include_dir)
    return _unit_kernels(pre)


def _kernel(module: str, kernel: str, defines: dict | None, kernel_dir: str | None) -> Kernel:
    found = kernels(module, defines, kernel_dir=kernel_dir)
    k = found.get(kernel)
    if k is None:
        raise ValueError(f"{module}.cu has no extern \"C\" __global__ kernel {kernel} "
                         f"(it has: {', '.join(sorted(found)) or 'none'})")
    return k


def expected_format(module: str, kernel: str, defines: dict | None = None, *,
                    kernel_dir: str | None = None) -> str:
    """The PyCUDA argument format of kernel ``kernel`` of fast/cuda/kernels/<module>.cu."""
    return _kernel(module, kernel, defines, kernel_dir).format


def normalize_format(fmt: str) -> str:
    """A struct format without its spaces and with its counts written out: "2Pi" -> "PPi"."""
    out = []
    for count, letter in re.findall(r"(\d*)(\S)", re.sub(r"\s+", "", fmt)):
        if not (letter.isalpha() or letter == "?"):
            raise ValueError(f"argument format {fmt!r}: {letter!r} is not a struct letter")
        out.append(letter * (int(count) if count else 1))
    return "".join(out)


def check_kernel(k: Kernel, fmt: str, label: str) -> None:
    """ValueError unless ``fmt`` is the argument format of ``k`` (``label`` names its module in
    the message), naming the first position where they differ and the parameter there."""
    got, want = normalize_format(fmt), k.format
    if got == want:
        return
    pos = next((n for n, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    owner, at = None, 0
    for p in k.params:
        if at <= pos < at + len(p.letters):
            owner = p
            break
        at += len(p.letters)
    have = repr(got[pos]) if pos < len(got) else "nothing (the format ends)"
    if owner is not None:
        field = f" (field {pos - at} of its {len(owner.letters)})" if len(owner.letters) > 1 else ""
        wants = f"{want[pos]!r} for parameter '{owner}'{field}"
    else:
        wants = "nothing (the signature ends)"
    raise ValueError(
        f"{label}: kernel {k.name} is prepared with {fmt!r}, but its C signature "
        f"{k.signature} ({k.where}) takes {want!r}: at position {pos} (counting from 0) the "
        f"format has {have}, the signature {wants}")


def check(module: str, kernel: str, fmt: str, defines: dict | None = None, *,
          kernel_dir: str | None = None) -> None:
    """ValueError unless ``fmt`` is the argument format of kernel ``kernel`` of
    fast/cuda/kernels/<module>.cu built with ``defines``; the message names the module, the
    kernel, its C signature and the first position where they differ."""
    check_kernel(_kernel(module, kernel, defines, kernel_dir), fmt, f"{module}.cu")
