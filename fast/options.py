"""The fast path's switches, each declared once: SWITCHES below. Every one changes speed only,
never a byte of the results.

A switch is a FastEngine keyword (`group_gather`), a `strata-prefill run` flag (`--group-gather`,
made from the keyword), mostly an environment variable (`STRATA_PREFILL_GROUP_GATHER`) and a name
in `bench`'s arm specs (any of the three). `resolve` reads them once for an engine: a keyword
argument, else its variable (then the variable's older names), else the default; the engine and
the backends read the one FastOptions it returns. The command line's own, stricter checks
(strata_prefill/checks.py) are picked from each switch's value type (strata_prefill/arms.py).

The kinds: a `schedule` switch changes what the engine enqueues (launches, gathers, copies,
waits); a `kernel form` picks which form of a kernel the cuda backend launches (the sim runs the
NumPy definitions whatever it says). A kernel form stays a switch only while its A/B is open:
none is today (the settled ones, with their figures, are in docs/performance.md, "Retired
kernel forms"); a kernel's tile configurations are defines that the benchmarks sweep.

`python3 -m fast.options docs/user-guide.md` rewrites the user guide's switch table
(markdown_table) between its markers (TABLE_DOC); tests/test_switch_table.py holds it current.
"""
from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass

from strata.constants import (PINNED_SHARE, RING_RUN, RING_SLOTS, RING_SLOTS_PINNED, STREAM_HIDE_KB, STREAM_MIN,
                              VRAM_RESERVE_MIB)
from strata.errors import InputError

SCHEDULE = "schedule"
KERNEL_FORM = "kernel form"
KINDS = (SCHEDULE, KERNEL_FORM)
AUTO = "auto"
OFF_WORD = "off"  # a Count's word for "none of it" (--window off: one chunk a window)


@dataclass(frozen=True)
class OnOff:
    """0 or 1. A variable holds exactly one of those two words; a keyword argument is any
    integer, nonzero meaning on."""
    values = "0, 1"  # as the user guide's table says it

    def from_keyword(self, value, label: str) -> bool:
        try:
            return bool(int(value))
        except (TypeError, ValueError):
            raise InputError(f"{label} must be 0 or 1, got {value!r}") from None

    def from_variable(self, raw: str, label: str) -> bool:
        if raw not in ("0", "1"):
            raise InputError(f"{label} must be 0 or 1, got {raw!r}")
        return raw == "1"

    @staticmethod
    def shown(value) -> str:
        return str(int(value))


@dataclass(frozen=True)
class Count:
    """An integer of at least `minimum`, or with `auto` also the word auto (the engine sizes it),
    with `off` also the word off."""
    minimum: int
    auto: bool = False
    metavar: str = "N"
    off: bool = False
    maximum: int | None = None

    @property
    def values(self) -> str:
        words = [w for w, on in ((AUTO, self.auto), (OFF_WORD, self.off)) if on]
        span = f"integer >= {self.minimum}" if self.maximum is None else f"integer {self.minimum}..{self.maximum}"
        return ", ".join(words + [span])

    def from_keyword(self, value, label: str):
        if self.auto and value == AUTO:
            return AUTO
        if self.off and value == OFF_WORD:
            return OFF_WORD
        try:
            n = int(value)
        except (TypeError, ValueError):
            raise InputError(f"{label} must be an integer, got {value!r}") from None
        if n < self.minimum:
            raise InputError(f"{label} must be >= {self.minimum}, got {n}")
        if self.maximum is not None and n > self.maximum:
            raise InputError(f"{label} must be <= {self.maximum}, got {n}")
        return n

    from_variable = from_keyword

    @staticmethod
    def shown(value) -> str:
        return str(value)


@dataclass(frozen=True)
class Switch:
    keyword: str  # FastEngine's keyword argument; the run flag is made from it
    variable: str | None  # the environment variable, None where only the argument sets it
    default: object  # None: a rule the engine applies (default_text says which)
    kind: str  # SCHEDULE or KERNEL_FORM
    value: OnOff | Count
    help: str  # one line: what it does
    aliases: tuple[str, ...] = ()  # older names of the variable, read when it is unset
    default_text: str | None = None
    # on/off variables of the seeds that say the opposite (1 sets the switch to 0), read after
    # the aliases: STRATA_PREFILL_GATHER_ONE=1 is group_gather 0
    opposites: tuple[str, ...] = ()

    @property
    def flag(self) -> str:
        return "--" + self.keyword.replace("_", "-")

    @property
    def variables(self) -> tuple[str, ...]:
        """The names the engine reads, the one that wins first."""
        return ((self.variable,) if self.variable else ()) + self.aliases

    def shown_default(self) -> str:
        return self.default_text if self.default_text is not None else self.value.shown(self.default)

    def resolve(self, value, environ):
        """The keyword argument `value` (None: not given), else the first variable set to a
        non-empty word, else the default."""
        if value is not None:
            return self.value.from_keyword(value, self.flag)
        for name in self.variables:
            raw = environ.get(name)
            if raw:  # unset or empty: the default
                return self.value.from_variable(raw, name)
        for name in self.opposites:
            raw = environ.get(name)
            if raw:
                return not self.value.from_variable(raw, name)
        return self.default


ON, OFF = True, False
SWITCHES = (
    Switch("group_gather", "STRATA_PREFILL_GROUP_GATHER", ON, SCHEDULE, OnOff(),
           "1: one wait, gather and event per MMQ group; 0: one each per expert",
           opposites=("STRATA_PREFILL_GATHER_ONE",)),
    Switch("quant_gather", "STRATA_PREFILL_QUANT_GATHER", OFF, SCHEDULE, OnOff(),
           "1: the MoE input quantized by a per-row gather; 0: by a per-token scatter",
           aliases=("STRATA_QUANT_GATHER",)),
    Switch("expert_cache", None, AUTO, SCHEDULE, Count(0, auto=True, metavar="N|auto"),
           "VRAM slots for resident experts, the rest stream from page-locked host memory (auto: "
           "what free memory less --vram-reserve-mib holds; sim: all); at most the pack's experts "
           "(layers x experts)"),
    Switch("vram_reserve_mib", None, VRAM_RESERVE_MIB, SCHEDULE, Count(0, metavar="MIB"),
           "device memory (MiB) --expert-cache auto leaves free on cuda"),
    Switch("ring", "STRATA_PREFILL_RING", None, SCHEDULE, Count(1),
           "ring slots of the streamed walk",
           default_text=f"{RING_SLOTS}, {RING_SLOTS_PINNED} when at least {PINNED_SHARE:.0%} of the "
                        "streamed bytes are page-locked"),
    Switch("stream_min", "STRATA_PREFILL_STREAM_MIN", AUTO, SCHEDULE, Count(1, auto=True, metavar="N|auto"),
           "auto: each layer of a chunk (or window) streams every streamed expert where its routing is "
           "expected to reach enough of them (--stream-hide; the coverage of the same layer of the prompt's last chunk scaled "
           "to this one's tokens, else this chunk's previous layer; layer 0 of the first chunk from "
           f"{STREAM_MIN} tokens), and stages its routed ones after its routing otherwise "
           "(fast.walk.choose_layer); N: every layer of a chunk of at least N tokens streams, smaller "
           "ones stage (the old rule); run --timing prints each chunk's walks and why"),
    Switch("stream_hide", "STRATA_PREFILL_STREAM_HIDE", STREAM_HIDE_KB, SCHEDULE, Count(0, metavar="KB"),
           "stream_min auto: the KB of copies one token's compute of a layer hides; a layer of a chunk "
           "of T tokens streams where the bytes it would copy for experts its routing skips fit in T "
           "times this (fast.walk.stream_need), else it stages"),
    Switch("stage_head", "STRATA_PREFILL_STAGE_HEAD", AUTO, SCHEDULE, Count(0, auto=True, metavar="N|auto"),
           "stage_in_ring: a staged layer's first N streamed experts (by id) are copied before its "
           "routing is known, right behind the layer before it, so the link works while the layer "
           "before finishes and this one's attention and router run; its routed ones beyond them after "
           "its routing, as before; auto: what the link copies in the time a staged layer leaves it "
           "idle (fast.walk.stage_head); 0: only routed experts, after the routing"),
    Switch("head_predict", "STRATA_PREFILL_HEAD_PREDICT", OFF, SCHEDULE, OnOff(),
           "stage_head: 1: a staged layer's head is the streamed experts its own router, run on the "
           "layer before's residual while that layer routes, names most often (ties: lower ids), "
           "rather than its lowest ids; the walk visits the head first, then the routed rest (runs "
           "cut where ids fall); costs a norm, router and top-k over the unit's first PREDICT_ROWS "
           "rows and a count read per such layer (fast.walk.predicted_head). Needs in_place 1, "
           "ring_in_place 1 and stage_in_ring 1; 0: the lowest ids"),
    Switch("window", "STRATA_PREFILL_WINDOW", AUTO, SCHEDULE, Count(1, auto=True, metavar="N|auto|off", off=True),
           "layer-major windows of N tokens (whole chunks, N at least the chunk): a window's chunks run "
           "layer by layer, attention per chunk, the MoE half once over all of its tokens, so a streamed "
           "expert is copied once per window and layer; auto: where experts stream, the most whole chunks "
           "whose window buffers fit in half the free device memory (sim: a fixed 1 GiB), at most the "
           "prompt, and one chunk where every expert is resident; off: one chunk a window; run prints "
           "the window taken"),
    Switch("copy_coalesce", "STRATA_PREFILL_COPY_COALESCE", ON, SCHEDULE, OnOff(),
           "1: adjacent ring slots of adjacent host blobs in one copy; 0: one copy per expert"),
    Switch("stage_in_ring", "STRATA_PREFILL_STAGE_IN_RING", ON, SCHEDULE, OnOff(),
           "1: a staged layer's routed streamed experts join the unit's pass of the streamed walk's "
           "ring, behind the layers before it (all of a layer's copies queued at once where they fit, "
           "coalesced); 0: they go through the 8-slot staging ring, a pass of their own"),
    Switch("flush_on_skip", "STRATA_PREFILL_FLUSH_ON_SKIP", OFF, SCHEDULE, OnOff(),
           "1: the streamed walk gathers what an open group holds whenever it meets a ring entry "
           "the routing skipped; 0: the group is held across skipped entries (released unused at "
           "once) and gathered once, earlier only where its entries span the ring"),
    Switch("overlap_plan", "STRATA_PREFILL_OVERLAP_PLAN", ON, SCHEDULE, OnOff(),
           "1: the MoE-input quantize and the shared expert are queued before the host reads the "
           "routing counts, so the device runs them while the host plans the walk; 0: the host "
           "waits for the counts right after the router, the shared expert runs after the walk"),
    Switch("fuse_group", "STRATA_PREFILL_FUSE_GROUP", ON, SCHEDULE, OnOff(),
           "1: a group's gate and up products in one launch, SwiGLU and the quantize of H in one "
           "(4 launches a group); 0: one launch each (6)"),
    Switch("in_place", "STRATA_PREFILL_IN_PLACE", ON, SCHEDULE, OnOff(),
           "1: a layer's routed resident experts are multiplied where they lie in the expert cache "
           "(one launch for all their gate/up products, one SwiGLU+quantize of H, one down), only "
           "streamed experts are gathered, in groups; 0: every routed expert goes through the "
           "group buffers"),
    Switch("ring_in_place", "STRATA_PREFILL_RING_IN_PLACE", ON, SCHEDULE, OnOff(),
           "1: streamed experts are multiplied where their copies land in the ring (one launch per "
           "product for a run of ring entries, no gather), each slot released after the last product "
           "that reads it; 0: gathered into the group buffers first, an MMQ group at a time. Needs "
           "in_place 1 (with 0 every expert is gathered)"),
    Switch("ring_run", "STRATA_PREFILL_RING_RUN", RING_RUN, SCHEDULE, Count(1),
           "ring_in_place: the most routed experts one run multiplies (one wait, one launch per "
           "product, one event); runs are also cut where their entries would span the ring"),
)
BY_KEYWORD = {sw.keyword: sw for sw in SWITCHES}
#: switches that were kernel forms until their A/B settled: variable -> the form every run now
#: takes. Set, one is refused by name rather than ignored (a script that sets it A/Bs nothing).
RETIRED = {
    "STRATA_PREFILL_LEAN_ATTENTION": "the lean per-(query, key) float work",
    "STRATA_PREFILL_PAIR_ATTENTION": "the pair kernel, attention_pair.cu (the one-warp form is "
                                     "dev/kernels/attention_v1_mma.cu)",
    "STRATA_PREFILL_TILED_DENSE": "the tiled float_dense.cu form from 8 tokens",
    "STRATA_PREFILL_WIDEN_FLOAT": "F16/BF16 dense matrices widened to F32 at load",
}
#: the switches the backends read (fast/backend_base.py); the engine reads the others
KERNEL_FORMS = tuple(sw.keyword for sw in SWITCHES if sw.kind == KERNEL_FORM)

#: one engine's switches, resolved: a field per switch, in the table's order
FastOptions = dataclasses.make_dataclass(
    "FastOptions", [(sw.keyword, object) for sw in SWITCHES], frozen=True,
    namespace={"__doc__": "The fast path's switches, resolved (fast/options.py: resolve).",
               "__module__": __name__})
#: the table's defaults, what a backend reads before an engine gives it its own
DEFAULTS = FastOptions(**{sw.keyword: sw.default for sw in SWITCHES})


def retired_why(variable: str) -> str:
    """What a RETIRED switch's refusal says after its name."""
    return f"every run takes {RETIRED[variable]} (docs/performance.md, \"Retired kernel forms\")"


def retired_variable(name: str) -> str | None:
    """The RETIRED variable that `name` stands for (the variable, its keyword, its flag with or
    without the dashes), or None."""
    kw = name.removeprefix("--").replace("-", "_")
    return next((v for v in RETIRED if name == v or v.removeprefix("STRATA_PREFILL_").lower() == kw), None)


def refuse_retired(environ=None) -> None:
    """An InputError naming the first RETIRED variable set in `environ` (default os.environ)."""
    environ = os.environ if environ is None else environ
    for name in RETIRED:
        if environ.get(name):
            raise InputError(f"{name} is retired: {retired_why(name)}; unset it")


def resolve(keywords: dict | None = None, environ=None) -> FastOptions:
    """Each switch from `keywords` (FastEngine's keyword arguments; None: not given), else its
    environment variable (`environ`, default os.environ), else its default. A bad value is an
    InputError naming the keyword's flag or the variable; an unknown keyword a TypeError."""
    keywords = dict(keywords or {})
    unknown = [k for k in keywords if k not in BY_KEYWORD]
    if unknown:
        raise TypeError(f"unknown fast-path switch {', '.join(map(repr, unknown))} "
                        f"(switches: {', '.join(BY_KEYWORD)})")
    environ = os.environ if environ is None else environ
    refuse_retired(environ)
    return FastOptions(**{sw.keyword: sw.resolve(keywords.get(sw.keyword), environ) for sw in SWITCHES})


# ---- the user guide's table -----------------------------------------------------------------
TABLE_DOC = "docs/user-guide.md"  # the document that holds the table, from the repository's root
BEGIN = f"<!-- switches: made by fast/options.py (python3 -m fast.options {TABLE_DOC}); do not edit -->"
END = "<!-- end of switches -->"


def _variable_cell(sw: Switch) -> str:
    if not sw.variable:
        return "-"
    cell = f"`{sw.variable}`"
    if sw.aliases:
        cell += " (also " + ", ".join(f"`{a}`" for a in sw.aliases) + ", an older name; this one wins)"
    if sw.opposites:
        cell += " (also " + ", ".join(f"`{a}`" for a in sw.opposites) + ": 1 sets it to 0, the seeds' name; this one wins)"
    return cell


def markdown_table() -> str:
    """The switches as a Markdown table: one row each, in the table's order."""
    rows = ["| keyword | `run` flag | variable | default | kind | values | what it does |",
            "|---|---|---|---|---|---|---|"]
    for sw in SWITCHES:
        rows.append(f"| `{sw.keyword}` | `{sw.flag}` | {_variable_cell(sw)} | {sw.shown_default()} | "
                    f"{sw.kind} | {sw.value.values} | {sw.help} |")
    return "\n".join(rows)


def with_table(text: str) -> str:
    """`text` (TABLE_DOC's) with the lines between BEGIN and END replaced by markdown_table()."""
    head, sep, rest = text.partition(BEGIN + "\n")
    if not sep:
        raise ValueError(f"no line {BEGIN!r}")
    _, sep, tail = rest.partition(END)
    if not sep:
        raise ValueError(f"no {END!r} after {BEGIN!r}")
    return f"{head}{BEGIN}\n{markdown_table()}\n{END}{tail}"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(f"usage: python3 -m fast.options {TABLE_DOC}   (rewrites its switch table)", file=sys.stderr)
        return 2
    from strata import atomic

    path = argv[0]
    with open(path, encoding="utf-8") as f:
        text = f.read()
    atomic.write_text(path, with_table(text))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
