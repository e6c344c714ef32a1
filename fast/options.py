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

`python3 -m strata_prefill.fast.options docs/user-guide.md` rewrites the user guide's switch table
(markdown_table) between its markers (TABLE_DOC); tests/test_switch_table.py holds it current.
"""
from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass

from strata_prefill.fast.tuning import (
    PINNED_SHARE,
    RING_RUN,
    RING_SLOTS,
    RING_SLOTS_PINNED,
    STREAM_HIDE_KB,
    STREAM_MIN,
    VRAM_RESERVE_MIB,
)
from strata_prefill.contract.errors import InputError

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
    # what it needs to do anything, beside --impl fast (every switch's) and --backend cuda (a
    # kernel form's): refuse_idle refuses a switch set where one of these is not met
    needs: tuple = ()
    # the most that can matter, from the pack: "experts" (layers x experts) or "layer_experts"
    most: str | None = None

    @property
    def flag(self) -> str:
        return "--" + self.keyword.replace("_", "-")

    @property
    def variables(self) -> tuple[str, ...]:
        """The names the engine reads, the one that wins first."""
        return ((self.variable,) if self.variable else ()) + self.aliases

    @property
    def requirements(self) -> tuple:
        """Everything it needs, the table's own needs last."""
        return (FAST,) + ((CUDA,) if self.kind == KERNEL_FORM else ()) + tuple(self.needs)

    def set_by(self, environ) -> str | None:
        """The variable that sets it in `environ` (its own, an older name or an opposite, the
        one resolve reads), or None."""
        for name in self.variables + self.opposites:
            if environ.get(name):
                return name
        return None

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


# ---- what a switch needs to do anything ---------------------------------------------------------
# A switch set (a run flag, a variable, a bench arm) where what it needs does not hold changes
# nothing in the run: refuse_idle refuses it, naming it and what it needs. Each need answers
# met() True, False, or None where the place that checks does not know yet (the cuda backend's
# `--expert-cache auto` is sized by the engine: the engine checks again once it has placed the
# experts). `when`: the switch's own values the need is for (None: any value it is set to).


@dataclass(frozen=True)
class Facts:
    """What is known of a run where a check runs (None: not known there).

    holds: how the expert cache holds the pack's experts, in a few words naming the switch
    that sized it (the messages' reason)."""
    impl: str = "fast"
    backend: str | None = None
    streams: bool | None = None  # some expert streams from host memory
    resident: bool | None = None  # some expert lies in the expert cache
    holds: str = ""
    layers: int | None = None
    layer_experts: int | None = None
    whole_layer: bool | None = None  # some layer has every one of its experts in the expert cache

    @property
    def experts(self) -> int | None:
        return None if self.layers is None or self.layer_experts is None else self.layers * self.layer_experts


def facts_of(impl: str, backend: str | None, expert_cache, config=None, label=None) -> Facts:
    """The Facts a command line gives before any engine exists: `expert_cache` the setting (a
    number of slots, AUTO or None), `config` the pack's (None: not open yet). A number of slots
    says which experts stream; auto: the sim holds every expert, the cuda backend sizes the cache
    from its free memory (known to the engine only). label(keyword) names a switch."""
    label = label or flag_label
    if config is None or impl != "fast":
        return Facts(impl, backend)
    total, ec = config.n_layer * config.n_expert, label("expert_cache")
    shape = dict(layers=config.n_layer, layer_experts=config.n_expert)
    if expert_cache is None or expert_cache == AUTO:
        if backend == "sim":
            return Facts(impl, backend, False, True, f"the sim holds all {total} unless {ec} N is below that",
                         whole_layer=True, **shape)
        return Facts(impl, backend, **shape)
    return placed_facts(impl, backend, int(expert_cache), total, f"{ec} {int(expert_cache)}", **shape)


def placed_facts(impl: str, backend: str | None, slots: int, total: int, by: str, layers: int,
                 layer_experts: int) -> Facts:
    """Facts where the expert cache's slots are known (`by` says who set them)."""
    holds = f"{by} holds all {total}" if slots >= total else (f"{by} holds none" if slots <= 0
                                                              else f"{by} holds {slots} of {total}")
    # place_experts spreads the slots evenly over the layers: one holds all of its experts once
    # there are more than layers x (experts - 1)
    return Facts(impl, backend, slots < total, slots > 0, holds, layers, layer_experts,
                 slots > layers * (layer_experts - 1))


@dataclass(frozen=True)
class FastPath:
    """--impl fast: every switch's (they shape the fast path's run; the reference reads none)."""
    when: tuple | None = None

    def met(self, values, facts: Facts):
        return facts.impl == "fast"

    def text(self, label) -> str:
        return "--impl fast"

    def instead(self, values, facts: Facts, label, origin) -> str:
        return f"this run is --impl {facts.impl}"


@dataclass(frozen=True)
class Cuda:
    """--backend cuda: a kernel form's (the sim runs the NumPy definitions whatever it says)."""
    when: tuple | None = None

    def met(self, values, facts: Facts):
        return None if facts.backend is None else facts.backend == "cuda"

    def text(self, label) -> str:
        return "--backend cuda"

    def instead(self, values, facts: Facts, label, origin) -> str:
        return f"this run is --backend {facts.backend}"


@dataclass(frozen=True)
class Streams:
    """Some expert streams from host memory: an expert cache smaller than the pack."""
    when: tuple | None = None

    def met(self, values, facts: Facts):
        return facts.streams

    def text(self, label) -> str:
        return "experts that stream (an expert cache smaller than the pack)"

    def instead(self, values, facts: Facts, label, origin) -> str:
        return f"every expert is resident ({facts.holds})"


@dataclass(frozen=True)
class Resident:
    """Some expert lies in the expert cache."""
    when: tuple | None = None

    def met(self, values, facts: Facts):
        return facts.resident

    def text(self, label) -> str:
        return "resident experts (an expert cache of at least one slot)"

    def instead(self, values, facts: Facts, label, origin) -> str:
        return f"none is resident ({facts.holds})"


@dataclass(frozen=True)
class WholeLayer:
    """Some layer has all of its experts in the expert cache (the slots spread evenly over the
    layers: more than layers x (experts - 1) of them)."""
    when: tuple | None = None

    def met(self, values, facts: Facts):
        return facts.whole_layer

    def text(self, label) -> str:
        return "a layer whose experts are all resident (an expert cache of more than layers x (experts - 1) slots)"

    def instead(self, values, facts: Facts, label, origin) -> str:
        return f"no layer holds all of its experts ({facts.holds})"


def _shown(value) -> str:
    return str(int(value)) if isinstance(value, bool) else str(value)


@dataclass(frozen=True)
class Is:
    """Another switch's value: one of `values`, or with `other` any value but those."""
    keyword: str
    values: tuple
    other: bool = False
    when: tuple | None = None

    def met(self, values, facts: Facts):
        v = getattr(values, self.keyword)
        return (v in self.values) != self.other

    def text(self, label) -> str:
        return f"{label(self.keyword)} {'other than ' if self.other else ''}{' or '.join(map(_shown, self.values))}"

    def instead(self, values, facts: Facts, label, origin) -> str:
        return f"{label(self.keyword)} is {_shown(getattr(values, self.keyword))}{origin(self.keyword)}"


@dataclass(frozen=True)
class AnyOf:
    """One of several needs."""
    needs: tuple
    when: tuple | None = None

    def met(self, values, facts: Facts):
        got = [n.met(values, facts) for n in self.needs]
        return True if True in got else (False if all(g is False for g in got) else None)

    def text(self, label) -> str:
        return " or ".join(n.text(label) for n in self.needs)

    def instead(self, values, facts: Facts, label, origin) -> str:
        return " and ".join(n.instead(values, facts, label, origin) for n in self.needs
                            if n.met(values, facts) is False)


FAST, CUDA, STREAMS, RESIDENT, WHOLE_LAYER = FastPath(), Cuda(), Streams(), Resident(), WholeLayer()


def flag_label(keyword: str) -> str:
    """A switch as `run` names it: its flag."""
    return "--" + keyword.replace("_", "-")


ON, OFF = True, False
SWITCHES = (
    Switch("group_gather", "STRATA_PREFILL_GROUP_GATHER", ON, SCHEDULE, OnOff(),
           "1: one wait, gather and event per MMQ group (ring_in_place: runs of up to ring_run experts); "
           "0: one each per expert",
           opposites=("STRATA_PREFILL_GATHER_ONE",), needs=(AnyOf((STREAMS, Is("in_place", (OFF,)))),)),
    Switch("quant_gather", "STRATA_PREFILL_QUANT_GATHER", OFF, SCHEDULE, OnOff(),
           "1: the MoE input quantized by a per-row gather; 0: by a per-token scatter",
           aliases=("STRATA_QUANT_GATHER",)),
    Switch("expert_cache", None, AUTO, SCHEDULE, Count(0, auto=True, metavar="N|auto"),
           "VRAM slots for resident experts, the rest stream from page-locked host memory (auto: "
           "what free memory less --vram-reserve-mib holds; sim: all); at most the pack's experts "
           "(layers x experts)", most="experts"),
    Switch("vram_reserve_mib", None, VRAM_RESERVE_MIB, SCHEDULE, Count(0, metavar="MIB"),
           "device memory (MiB) --expert-cache auto leaves free on cuda",
           needs=(CUDA, Is("expert_cache", (AUTO,)))),
    Switch("ring", "STRATA_PREFILL_RING", None, SCHEDULE, Count(1),
           "ring slots of the streamed walk",
           default_text=f"{RING_SLOTS}, {RING_SLOTS_PINNED} when at least {PINNED_SHARE:.0%} of the "
                        "streamed bytes are page-locked",
           needs=(STREAMS,), most="experts"),
    Switch("stream_min", "STRATA_PREFILL_STREAM_MIN", AUTO, SCHEDULE, Count(1, auto=True, metavar="N|auto"),
           "auto: each layer of a chunk (or window) streams every streamed expert where its routing is "
           "expected to reach enough of them (--stream-hide; the coverage of the same layer of the prompt's last chunk scaled "
           "to this one's tokens, else this chunk's previous layer; layer 0 of the first chunk from "
           f"{STREAM_MIN} tokens), and stages its routed ones after its routing otherwise "
           "(strata_prefill.fast.schedule.choose_layer); N: every layer of a chunk of at least N tokens streams, smaller "
           "ones stage (the old rule); run --timing prints each chunk's walks and why", needs=(STREAMS,)),
    Switch("stream_hide", "STRATA_PREFILL_STREAM_HIDE", STREAM_HIDE_KB, SCHEDULE, Count(0, metavar="KB"),
           "stream_min auto: the KB of copies one token's compute of a layer hides; a layer of a chunk "
           "of T tokens streams where the bytes it would copy for experts its routing skips fit in T "
           "times this (strata_prefill.fast.schedule.stream_need), else it stages", needs=(STREAMS, Is("stream_min", (AUTO,)))),
    Switch("choose_ahead", "STRATA_PREFILL_CHOOSE_AHEAD", 2, SCHEDULE, Count(1, metavar="N"),
           "stream_min auto: a layer's walk is chosen from the routing of the nearest of the N streaming "
           "layers before it that has routed, so a streamed layer's copies can join the pass once the "
           "layer N before it has routed (N - 1 layers earlier than with 1) and the link goes on from "
           "one layer's copies to the next one's without waiting for the host to read the layer "
           "before's routing (strata_prefill.fast.schedule.choose_layer); 1: from the nearest only, once it has routed",
           needs=(STREAMS, Is("stream_min", (AUTO,)))),
    Switch("stage_head", "STRATA_PREFILL_STAGE_HEAD", AUTO, SCHEDULE, Count(0, auto=True, metavar="N|auto"),
           "stage_in_ring: a staged layer's first N streamed experts (by id) are copied before its "
           "routing is known, right behind the layer before it, so the link works while the layer "
           "before finishes and this one's attention and router run; its routed ones beyond them after "
           "its routing, as before; auto: what the link copies in the time a staged layer leaves it "
           "idle (strata_prefill.fast.schedule.stage_head); 0: only routed experts, after the routing",
           needs=(STREAMS, Is("stage_in_ring", (ON,))), most="layer_experts"),
    Switch("head_predict", "STRATA_PREFILL_HEAD_PREDICT", OFF, SCHEDULE, OnOff(),
           "stage_head: 1: a staged layer's head is the streamed experts its own router, run on the "
           "layer before's residual while that layer routes, names most often (ties: lower ids), "
           "rather than its lowest ids; the walk visits the head first, then the routed rest (runs "
           "cut where ids fall); costs a norm, router and top-k over the unit's first PREDICT_ROWS "
           "rows and a count read per such layer (strata_prefill.fast.schedule.predicted_head); 0: the lowest ids",
           needs=(STREAMS, Is("in_place", (ON,), when=(ON,)), Is("ring_in_place", (ON,), when=(ON,)),
                  Is("stage_in_ring", (ON,), when=(ON,)), Is("stage_head", (0,), other=True, when=(ON,)))),
    Switch("window", "STRATA_PREFILL_WINDOW", AUTO, SCHEDULE, Count(1, auto=True, metavar="N|auto|off", off=True),
           "layer-major windows of N tokens (whole chunks, N at least the prompt's chunk; more than the "
           "prompt holds is taken as the prompt's chunks): a window's chunks run "
           "layer by layer, attention per chunk, the MoE half once over all of its tokens, so a streamed "
           "expert is copied once per window and layer; auto: where experts stream, the most whole chunks "
           "whose window buffers fit in half the free device memory (sim: a fixed 1 GiB), at most the "
           "prompt, and one chunk where every expert is resident; off: one chunk a window; run prints "
           "the window taken"),
    Switch("copy_coalesce", "STRATA_PREFILL_COPY_COALESCE", ON, SCHEDULE, OnOff(),
           "1: adjacent ring slots of adjacent host blobs in one copy; 0: one copy per expert",
           needs=(STREAMS,)),
    Switch("stage_in_ring", "STRATA_PREFILL_STAGE_IN_RING", ON, SCHEDULE, OnOff(),
           "1: a staged layer's routed streamed experts join the unit's pass of the streamed walk's "
           "ring, behind the layers before it (all of a layer's copies queued at once where they fit, "
           "coalesced); 0: they go through the 8-slot staging ring, a pass of their own", needs=(STREAMS,)),
    Switch("flush_on_skip", "STRATA_PREFILL_FLUSH_ON_SKIP", OFF, SCHEDULE, OnOff(),
           "1: the streamed walk gathers what an open group holds whenever it meets a ring entry "
           "the routing skipped; 0: the group is held across skipped entries (released unused at "
           "once) and gathered once, earlier only where its entries span the ring (the gathered walk: "
           "a run of the in-ring walk is never cut at a skip)",
           needs=(STREAMS, AnyOf((Is("ring_in_place", (OFF,)), Is("in_place", (OFF,))), when=(ON,)))),
    Switch("overlap_plan", "STRATA_PREFILL_OVERLAP_PLAN", ON, SCHEDULE, OnOff(),
           "1: the MoE-input quantize and the shared expert are queued before the host reads the "
           "routing counts, so the device runs them while the host plans the walk; 0: the host "
           "waits for the counts right after the router, the shared expert runs after the walk"),
    Switch("fuse_group", "STRATA_PREFILL_FUSE_GROUP", ON, SCHEDULE, OnOff(),
           "1: a group's gate and up products in one launch, SwiGLU and the quantize of H in one "
           "(4 launches a group); 0: one launch each (6)"),
    Switch("in_place", "STRATA_PREFILL_IN_PLACE", ON, SCHEDULE, OnOff(),
           "1: a layer's routed resident experts are multiplied where they lie in the expert cache "
           "(one launch for all their gate/up products, one SwiGLU+quantize of H, one down), and "
           "streamed ones are gathered in groups, or with ring_in_place 1 multiplied in their ring "
           "slots; 0: every routed expert, resident or streamed, goes through the group buffers",
           needs=(AnyOf((RESIDENT, Is("ring_in_place", (ON,)))),)),
    Switch("device_plan", "STRATA_PREFILL_DEVICE_PLAN", ON, SCHEDULE, OnOff(),
           "1: a layer whose experts are all resident is planned on the device: its routing counts "
           "never come back to the host; the in-place products read their row tiles, cut from the "
           "routing tables by one small launch, over the most tiles the layer's rows can cut into "
           "(the padding exits at once); 0: the host reads the counts back and uploads the tiles",
           needs=(WHOLE_LAYER, Is("in_place", (ON,)))),
    Switch("ring_in_place", "STRATA_PREFILL_RING_IN_PLACE", ON, SCHEDULE, OnOff(),
           "1: streamed experts are multiplied where their copies land in the ring (one launch per "
           "product for a run of ring entries, no gather), each slot released after the last product "
           "that reads it; 0: gathered into the group buffers first, an MMQ group at a time (with in_place "
           "0 every expert is gathered)",
           needs=(STREAMS, Is("in_place", (ON,), when=(ON,)))),
    Switch("ring_run", "STRATA_PREFILL_RING_RUN", RING_RUN, SCHEDULE, Count(1),
           "ring_in_place: the most routed experts one run multiplies (one wait, one launch per "
           "product, one event); runs are also cut where their entries would span the ring",
           needs=(STREAMS, Is("in_place", (ON,)), Is("ring_in_place", (ON,)), Is("group_gather", (ON,))),
           most="layer_experts"),
    Switch("device_embed", "STRATA_PREFILL_DEVICE_EMBED", ON, KERNEL_FORM, OnOff(),
           "1: the prompt's token_embd rows are dequantized on the device (embed.cu, for the types "
           "with an embed_kernel in contract/qformats.py; another type's rows on the host); 0: every "
           "type's on the host, then uploaded"),
)
BY_KEYWORD = {sw.keyword: sw for sw in SWITCHES}
#: switches that were kernel forms until their A/B settled: variable -> the form every run now
#: takes. Set, one is refused by name rather than ignored (a script that sets it A/Bs nothing).
RETIRED = {
    "STRATA_PREFILL_LEAN_ATTENTION": "the lean per-(query, key) float work",
    "STRATA_PREFILL_PAIR_ATTENTION": "the pair kernel, attention_pair.cu",
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


def refuse_idle(keywords: dict | None, facts: Facts, label=flag_label, environ=None, where: str = "") -> None:
    """An InputError for the first switch set (a keyword, given as a `run` flag or a bench arm,
    or a variable of `environ`, default os.environ) whose requirements (Switch.requirements)
    `facts` says are not met, or whose value is more than the pack can use (Switch.most): one
    line naming the switch as it was set, what it needs and what holds instead. The one rule of
    every surface: `run` before the pack is opened (facts of the command line) and once its
    header is read, bench for each arm, the engine once it has placed the experts. label(keyword)
    names a switch given as a keyword (run: its flag; bench: its arm name); `where` goes first."""
    for _keyword, _most, message in idle(keywords, facts, label, environ):
        raise InputError(where + message)


def idle(keywords: dict | None, facts: Facts, label=flag_label, environ=None) -> list[tuple[str, int | None, str]]:
    """Every switch set that refuse_idle refuses, in the table's order: (keyword, the most it can
    take where that is what it passed, else None; the message)."""
    keywords = {k: v for k, v in (keywords or {}).items() if v is not None}
    environ = os.environ if environ is None else environ
    values = resolve(keywords, environ)
    source: dict[str, str | None] = {}  # keyword -> the variable that set it (None: a keyword)
    for sw in SWITCHES:
        if sw.keyword in keywords:
            source[sw.keyword] = None
        elif (var := sw.set_by(environ)) is not None:
            source[sw.keyword] = var

    def origin(keyword: str) -> str:
        if keyword not in source:
            return " (the default)"
        return "" if source[keyword] is None else f" ({source[keyword]})"

    out = []
    for sw in SWITCHES:
        if sw.keyword not in source:
            continue
        value = getattr(values, sw.keyword)
        var = source[sw.keyword]
        spelled = f"{label(sw.keyword)} {_shown(value)}" if var is None else f"{var}={environ[var]}"
        unmet = next((n for n in sw.requirements
                      if (n.when is None or value in n.when) and n.met(values, facts) is False), None)
        most = None if sw.most is None else getattr(facts, sw.most)
        if unmet is not None:
            out.append((sw.keyword, None, f"{spelled} needs {unmet.text(label)}: "
                                          f"{unmet.instead(values, facts, label, origin)}: it does nothing"))
        elif most is not None and isinstance(value, int) and not isinstance(value, bool) and value > most:
            what = (f"the pack has {most:,} experts ({facts.layers} layers x {facts.layer_experts})"
                    if sw.most == "experts" else f"a layer of the pack has {most:,} experts")
            out.append((sw.keyword, most, f"{spelled}: {what}: more can do nothing more: at most {most:,}"))
    return out


def settle(keywords: dict, facts: Facts) -> dict:
    """`keywords` as the rule takes them, for a table of runs (verify/cases.py) that sets
    switches across placements: each switch that would do nothing dropped, each value past what
    can matter set to the most (no variable read). Dropping one switch can make another idle or
    not (its default then holds): repeated until nothing is refused."""
    kw = {k: v for k, v in keywords.items() if v is not None}
    while found := idle(kw, facts, environ={}):
        keyword, most, _ = found[0]
        if most is None:
            del kw[keyword]
        else:
            kw[keyword] = most
    return kw


def window_taken(setting, chunk: int, n_tok: int) -> tuple[int, str]:
    """A window of `setting` (a number of tokens or OFF_WORD; AUTO is the engine's) for a prompt
    of n_tok tokens cut into chunks of `chunk`: its tokens (whole chunks; `chunk` itself for one
    chunk a window) and why, in a few words. The prompt's chunk is the smaller of the chunk and
    the prompt: a number less than that holds no whole chunk, an InputError; one past the
    prompt's chunks is taken as the prompt's, and the reason says so."""
    if setting == OFF_WORD:
        return chunk, "--window off: one chunk a window"
    unit = max(1, min(int(chunk), int(n_tok)))
    w = int(setting)
    if w < unit:
        raise InputError(f"--window {w} is less than the chunk ({unit} tokens, "
                         f"{'--prefill' if unit == chunk else 'the whole prompt'}): a window holds whole chunks")
    have, whole = -(-int(n_tok) // unit), w // unit
    if whole > have:
        return chunk * have, (f"--window {w}: the prompt's {have} chunk(s) of {unit}, fewer than the "
                              f"{whole} it would hold")
    return chunk * whole, f"--window {w}: {whole} whole chunk(s)"


# ---- the user guide's table -----------------------------------------------------------------
TABLE_DOC = "docs/user-guide.md"  # the document that holds the table, from the repository's root
BEGIN = f"<!-- switches: made by fast/options.py (python3 -m strata_prefill.fast.options {TABLE_DOC}); do not edit -->"
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


def needs_cell(sw: Switch) -> str:
    """What the switch needs, as the README says it: its declared needs, then those only some
    of its values have ("1 also: ..."); --impl fast is every switch's and goes unsaid."""
    def said(need) -> str:
        return need.text(lambda kw: f"`{kw}`").replace(" (an expert cache smaller than the pack)", "").replace(
            " (an expert cache of at least one slot)", "")

    always = [said(n) for n in sw.requirements if n is not FAST and n.when is None]
    if sw.most:
        always.append({"experts": "at most the pack's experts", "layer_experts": "at most a layer's experts"}[sw.most])
    parts = ["; ".join(always)] if always else []
    for when in dict.fromkeys(n.when for n in sw.requirements if n.when is not None):
        also = ", ".join(said(n) for n in sw.requirements if n.when == when)
        parts.append(f"{' or '.join(map(_shown, when))} also: {also}")
    return "; ".join(parts) or "-"


def markdown_table() -> str:
    """The switches as a Markdown table: one row each, in the table's order."""
    rows = ["| keyword | `run` flag | variable | default | kind | values | needs | what it does |",
            "|---|---|---|---|---|---|---|---|"]
    for sw in SWITCHES:
        rows.append(f"| `{sw.keyword}` | `{sw.flag}` | {_variable_cell(sw)} | {sw.shown_default()} | "
                    f"{sw.kind} | {sw.value.values} | {needs_cell(sw)} | {sw.help} |")
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
        print(f"usage: python3 -m strata_prefill.fast.options {TABLE_DOC}   (rewrites its switch table)", file=sys.stderr)
        return 2
    from strata_prefill.formats import atomic

    path = argv[0]
    with open(path, encoding="utf-8") as f:
        text = f.read()
    atomic.write_text(path, with_table(text))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
