"""The expert-copy schedule: which of a unit's streamed experts are copied into the ring, in
what order, when, and why. A unit is a chunk, or a layer-major window; fast/walk.py walks a
layer through the ring pass this module fills, and fast/experts.py carries out its copies.

Each layer of a unit takes one of two walks, chosen by `choose_layer` when its copies must be
queued (layer 0 before the unit's first attention, layer l once the routing of one of the
`choose_ahead` streaming layers before it is on the host):

  streamed   the layer's entries are every one of its streamed experts, appended to the unit's
             ring pass behind the previous layer's, so its copies run while earlier layers
             compute and the walk also meets the entries the routing skipped;
  staged     its routed streamed experts, appended once its routing is known (through the same
             ring by default; with stage_in_ring 0 through a pass of the 8-slot staging ring),
             after a *head*: its first streamed experts by id, appended as soon as the layer is
             chosen, so the link copies them while the layer before finishes and this one's
             attention and router run, time it would otherwise spend idle (stage_head; the
             routing decides which of them the walk multiplies and which it releases unused,
             as in the streamed walk).

With head_predict the head is instead the streamed experts the layer's own router names most
often when it is run on the layer before's residual (predicted_head), ascending, and the routed
ones it lacks follow it, ascending: the ids then fall once where the head ends, and the walk
cuts its runs there. Otherwise both walks' entries ascend with the ids. By default (stream_min
auto) a layer streams where the bytes it would copy for experts its routing is expected to skip
(measured on the prompt's last unit or the unit's previous layer) fit under its own compute
(stream_need); with stream_min N every layer of a unit of N tokens or more streams.

`CopySchedule` is one unit's schedule: it opens the unit's ring pass, chooses each layer's walk
as soon as it can be chosen, queues the copies ahead of each routing, adds a staged layer's
routed ones at its routing, and answers why an expert was (or was not) copied (`why`).
`WalkChoice` is its record (run --timing prints `line()`); `PromptSchedules` keeps the current
prompt's schedules and hands each new one the measure of the last whole unit. Only integers and
the routing, which both implementations share, decide anything here: the same prompt makes the
same choices on every run, and they change what is copied and when, never a byte.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from strata_prefill.fast.tuning import COPY_BYTES_PER_S, STAGE_GAP_PER_TOKEN_S, STAGE_GAP_S, STREAM_MIN

from strata_prefill.fast.experts import PASS_HEAD, Passes, Placement, Ring, RingPass
from strata_prefill.fast.options import AUTO  # stream_min auto: the coverage rule


# ---- the rules ------------------------------------------------------------------------------
def expected_coverage(n_tok: int, k_used: int, n_expert: int) -> float:
    """The expected share of a layer's experts that n_tok tokens route at least once when each
    token picks k_used of n_expert uniformly: 1 - (1 - k/E)^n. For tokens routed independently
    it is the most any routing can expect (coverage is concave in each expert's share), so it
    bounds every estimate below from above."""
    if n_tok <= 0 or n_expert <= 0:
        return 0.0
    return 1.0 - (1.0 - min(k_used, n_expert) / n_expert) ** n_tok


def scaled_coverage(measured: float, n_measured: int, n_tok: int) -> float:
    """The coverage of n_tok tokens from `measured`, the share a unit of n_measured tokens
    reached: each expert's chance of being missed by one token taken as the measured unit's,
    spread evenly over its tokens, 1 - (1 - c)^(n / n')."""
    if n_measured <= 0:
        return 0.0
    return 1.0 - (1.0 - measured) ** (n_tok / n_measured)


def stream_need(n_tok: int, layer_bytes: int, hide_per_token: int) -> float:
    """The coverage from which a layer streams: the streamed walk copies the (1 - c) share of the
    layer's streamed bytes that no token routed, ahead of their use, where the staged walk copies
    only the routed share but after the routing, with nothing of the layer left to compute beside
    it; so the layer streams where what it copies for no token, (1 - c) * layer_bytes, fits in the
    bytes the link moves while the layer computes, n_tok * hide_per_token (hide_per_token: bytes
    a token's compute of one layer hides, the stream_hide switch in bytes)."""
    if layer_bytes <= 0:
        return 0.0
    return max(0.0, 1.0 - n_tok * hide_per_token / layer_bytes)


def stage_head(*, n_tok: int, blob_bytes: int, n_streamed: int, k_used: int, n_expert: int, setting) -> int:
    """A staged layer's head (the stage_head switch): how many of its streamed experts, lowest
    ids first, are copied before its routing is known. Without them the link would idle from the
    end of the layer before's copies until this layer's routing reaches the host (the layer
    before's last products, this one's attention and router, the host's read of its counts);
    the head fills that time, and whichever of its experts the routing skips cost link time that
    was idle anyway. auto: the experts the link copies (COPY_BYTES_PER_S) in that time, modelled
    as STAGE_GAP_S + n_tok * STAGE_GAP_PER_TOKEN_S, times the most a routing of n_tok tokens can
    cover (expected_coverage): a head entry the model's time overruns delays the routed copies by
    its whole copy and saves only where it is routed, so few tokens (a greedy step routes 2% of
    512 experts) take a head of few or none. N: N experts. At most the layer's streamed experts
    (a head of every one is the streamed walk's copies)."""
    if setting == AUTO:
        gap = STAGE_GAP_S + n_tok * STAGE_GAP_PER_TOKEN_S
        n = int(gap * COPY_BYTES_PER_S * expected_coverage(n_tok, k_used, n_expert) // max(1, int(blob_bytes)))
    else:
        n = int(setting)
    return max(0, min(n, int(n_streamed)))


def predicted_head(cnt, streamed, n: int) -> list[int]:
    """head_predict: the head of a staged layer, the n of its streamed experts (ascending ids
    in `streamed`) that the predicted routing's counts `cnt` (per expert) name most often, ties
    to the lower id, those it names at all; ascending, the order they join the pass."""
    ids = np.asarray(streamed, np.int64)
    c = np.asarray(cnt)[ids]
    named = ids[c > 0]
    ranked = named[np.lexsort((named, -c[c > 0]))]
    return sorted(int(e) for e in ranked[:max(0, int(n))])


@dataclass(frozen=True)
class LayerChoice:
    """One layer's walk in a unit: "streamed" (every streamed expert of the layer crosses the
    link, queued before its routing is known), "staged" (its first `head` streamed experts
    queued before its routing, stage_head, and its routed ones beyond them after it) or
    "resident" (it streams nothing). basis: "threshold" (stream_min N), "prior" (no routing
    measured yet: the STREAM_MIN token prior), "last unit" (the same layer of the prompt's last
    whole unit, scaled to this unit's tokens) or "layer L" (layer L of this unit, the same
    tokens); coverage: the estimate, need: the coverage the layer streams from (stream_need;
    both None under the threshold or the prior)."""

    walk: str
    basis: str
    coverage: float | None = None
    need: float | None = None
    head: int = 0  # a staged layer's streamed experts copied before its routing (stage_head)
    predicted: bool = False  # its head chosen by the predicted routing (head_predict), not by id

    @property
    def streams(self) -> bool:
        return self.walk == "streamed"


def choose_layer(*, layer: int, n_tok: int, stream_min, k_used: int, n_expert: int, streamed: list[int],
                 blob_bytes: list[int], hide_per_token: int, measured: tuple | None = None,
                 routed: list | None = None, reach: int = 1) -> LayerChoice | None:
    """The walk of `layer` in a unit of n_tok tokens, chosen when its copies must be queued:
    layer 0 before the unit's first attention, layer l > 0 once the routing of one of the `reach`
    streaming layers before it is on the host (its streamed walk's copies then follow the layer
    before's in the ring, ahead of their use).

    stream_min N (the threshold rule): streamed from N tokens, every layer alike. auto (the
    coverage rule, the default): streamed when the share c of the layer's streamed experts its
    routing is expected to reach is at least stream_need (the bytes it would copy for no token
    fit under the layer's compute). The estimate is the same layer of the last whole unit
    (`measured`: (tokens, routed[l]) of its layers' routed streamed experts), scaled to n_tok
    tokens (scaled_coverage); else the nearest of the `reach` earlier layers of this unit that
    stream anything which has routed (`routed`: the counts its layers' routings gave so far,
    None where not yet known; the choose_ahead switch), whose tokens are the same; each at most
    the uniform bound (expected_coverage). None: none of those layers has routed yet (the choice
    waits for one). With reach 2 a layer is chosen as soon as the layer two before it has
    routed, so a streamed layer's copies are in the pass a layer earlier: the link starts them
    when it finishes the layer before's, without waiting for that layer's router and the host's
    read of its counts. With neither (layer 0 of a prompt's
    first unit), the token prior: streamed from STREAM_MIN tokens. Another layer's measure can
    stage a layer the prior would stream, never stream one the prior stages: it is a weaker
    estimate than the layer's own (the 8-layer strata pack's coverage falls with depth, so the
    layer before overestimates), and below STREAM_MIN tokens a layer's compute hides little.
    Every choice that needs no routing of this unit (the threshold, a measured last unit) can
    be made at the unit's start, so the unit pass then holds every streamed layer's entries
    from its first copy on. streamed[l]: layer l's streamed experts; blob_bytes[l]: one of its
    blobs."""
    if not streamed[layer]:
        return LayerChoice("resident", "threshold" if stream_min != AUTO else "none")
    if stream_min != AUTO:
        return LayerChoice("streamed" if n_tok >= stream_min else "staged", "threshold")
    uniform = expected_coverage(n_tok, k_used, n_expert)
    if measured is not None and measured[1][layer] is not None:
        c = min(uniform, scaled_coverage(measured[1][layer] / streamed[layer], measured[0], n_tok))
        basis = "last unit"
    else:
        prev = [l for l in range(layer) if streamed[l]]
        if not prev or n_tok < STREAM_MIN:  # another layer's measure stages, never streams, below the prior
            return LayerChoice("streamed" if n_tok >= STREAM_MIN else "staged", "prior")
        known = [l for l in prev[-max(1, int(reach)):] if routed is not None and routed[l] is not None]
        if not known:
            return None  # chosen once one of those layers has routed
        src = known[-1]
        c = min(uniform, routed[src] / streamed[src])
        basis = f"layer {src}"
    need = stream_need(n_tok, int(streamed[layer]) * int(blob_bytes[layer]), hide_per_token)
    return LayerChoice("streamed" if c >= need else "staged", basis, c, need)


# ---- the record -----------------------------------------------------------------------------
@dataclass(frozen=True)
class WalkChoice:
    """The walk a unit (chunk or window) took, layer by layer, and why; made whole by its
    schedule (CopySchedule.record) and never changed after. rule: "threshold" (stream_min N:
    every layer the same) or "coverage" (stream_min auto, the default: each layer by
    choose_layer); layers: one LayerChoice per layer the unit reached; measured: the tokens of
    the earlier unit whose routing the rule read (None: none yet); streamed_bytes: what a pass of
    every streamed expert copies; routed: how many of each layer's streamed experts the unit
    routed (None: not yet), in_head: how many of those a staged layer's head held (the others
    were copied after its routing). Sequences are stored as tuples."""

    rule: str
    tokens: int
    stream_min: object
    n_streamed: int
    streamed_bytes: int
    layers: tuple = ()
    measured: int | None = None
    routed: tuple = ()  # per layer: its routed streamed experts (None: not yet)
    in_head: tuple = ()  # per layer: its routed streamed experts in its head

    def __post_init__(self):
        for name in ("layers", "routed", "in_head"):  # a list handed in is copied: the record stays as made
            object.__setattr__(self, name, tuple(getattr(self, name)))

    @property
    def walk(self) -> str:
        """streamed or staged where every layer that streams anything took that walk; mixed where
        they differ; resident where no expert streams."""
        kinds = {c.walk for c in self.layers if c.walk != "resident"}
        if self.n_streamed == 0 or not kinds:
            return "resident"
        return kinds.pop() if len(kinds) == 1 else "mixed"

    @property
    def streams(self) -> bool:
        """Every layer streamed (the unit's pass holds every streamed expert of every layer)."""
        return self.walk == "streamed"

    def line(self) -> str:
        """One line: the walk and its reason, runs of layers alike in walk and basis together."""
        if self.walk == "resident":
            return "resident: no expert streams (the expert cache holds them all)"
        size = f"{self.n_streamed} streamed experts, {_bytes(self.streamed_bytes)} a pass"
        if self.rule == "threshold":
            cmp = ">=" if self.streams else "<"
            ahead = _heads(self.layers, self.in_head)
            return (f"{self.walk}: {self.tokens} tokens {cmp} stream_min {self.stream_min}"
                    f"{'; ' + ahead if ahead else ''} ({size})")
        parts = []
        for (walk, basis), first, last, covs in _runs_of_layers(self.layers):
            span = f"L{first}" if first == last else f"L{first}-{last}"
            if walk == "resident":
                parts.append(f"{span} resident")
                continue
            parts.append(f"{span} {walk} ({self._why(walk, basis, covs, first, last)})")
        return f"{self.walk}: {self.tokens} tokens, " + "; ".join(parts) + f" ({size})"

    def _why(self, walk: str, basis: str, covs: list, first: int, last: int) -> str:
        """Why layers first..last (alike in walk and basis) took `walk`, in a few words."""
        if basis == "prior":
            why = (f"no routing of the layer measured yet, {self.tokens} tokens "
                   f"{'>=' if walk == 'streamed' else '<'} {STREAM_MIN}")
        else:
            src = (f"the last {self.measured} tokens' routing" if basis == "last unit"
                   else _source_layers(self.layers, first, last))
            why = (f"coverage {_span([c for c, _ in covs])} {'>=' if walk == 'streamed' else '<'} "
                   f"{_span([n for _, n in covs])}, from {src}")
        ahead = _heads(self.layers[first:last + 1], self.in_head[first:last + 1])
        return why + "; " + ahead if ahead else why


def _source_layers(layers, first: int, last: int) -> str:
    """Whose routing chose layers first..last (each chosen by an earlier layer's: "layer j"), in
    a few words: the previous layer's, or how many layers before them (choose_ahead)."""
    back = sorted({i - int(layers[i].basis.split()[1]) for i in range(first, last + 1)})
    if back == [1]:
        return "the previous layer's routing"
    n = str(back[0]) if len(back) == 1 else f"{back[0]}-{back[-1]}"
    return f"the routing of the layer {n} before"


def _runs_of_layers(layers) -> list:
    """Consecutive layers with the same (walk, basis kind): ((walk, basis), first, last,
    [(coverage, need)] of those that have them)."""
    out = []
    for i, c in enumerate(layers):
        key = (c.walk, "layer" if c.basis.startswith("layer") else c.basis)
        if out and out[-1][0] == key:
            out[-1][2] = i
        else:
            out.append([key, i, i, []])
        if c.coverage is not None:
            out[-1][3].append((c.coverage, c.need))
    return [tuple(r) for r in out]


def _heads(layers, in_head) -> str:
    """The staged layers' heads among `layers` in a few words, with how many of their experts
    the layers routed (in_head: per layer, as WalkChoice holds it); "" where none has one."""
    staged = [(c, h) for c, h in zip(layers, list(in_head) + [0] * len(layers)) if c.walk == "staged"]
    heads = [c.head for c, _ in staged]
    if not any(heads):
        return ""
    lo, hi = min(heads), max(heads)
    n = lo if lo == hi else f"{lo}-{hi}"
    routed = f"{sum(h for _, h in staged)} of {sum(heads)} routed"
    k = sum(c.predicted for c, _ in staged)
    if not k:
        return f"the first {n} copied ahead, {routed}"
    whose = "the head" if k == 1 == len(staged) else f"{k} of {len(staged)} heads"
    return f"{n} copied ahead, {whose} as the layer before predicted, {routed}"


def _span(values: list[float]) -> str:
    lo, hi = f"{min(values):.2f}", f"{max(values):.2f}"
    return lo if lo == hi else f"{lo}-{hi}"


def _bytes(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


# ---- one unit's schedule --------------------------------------------------------------------
@dataclass(frozen=True)
class CopyParts:
    """What every unit's schedule of an engine reads and never replaces: the backend (host
    phases, copies), the pack's config, the resolved switches, where experts live, the streamed
    walk's ring and the staging ring (the same ring under stage_in_ring), the engine's pass
    opener, and per layer one expert's blob bytes and how many of its experts stream."""

    be: object
    config: object
    options: object
    placement: Placement
    ring: Ring
    staging: Ring
    passes: Passes
    blob_bytes: tuple
    n_streamed: tuple


class CopySchedule:
    """One unit's copy schedule. Made when the unit starts (before layer 0's attention): it
    opens the unit's ring pass, chooses every layer's walk that can be chosen then, and queues
    the first PASS_HEAD copies. `after_attention` queues the rest of the due copies once layer
    0's attention is queued; `wants_prediction` / `predicted` take a next layer's predicted
    routing (head_predict); `layer_pass` takes a layer's routing and answers the pass its
    streamed experts come through; `why` says why an expert was copied; `record` is the unit's
    WalkChoice as it stands."""

    def __init__(self, parts: CopyParts, n_tok: int, measured: tuple | None = None):
        """measured: (tokens, routed streamed experts per layer) of the prompt's last whole unit,
        read by the coverage rule (None: none yet)."""
        o, n_layer = parts.options, parts.config.n_layer
        self.parts = parts
        self.tokens = int(n_tok)
        self.measured = measured if o.stream_min == AUTO else None
        self.layers: list[LayerChoice] = []  # the layers chosen so far, in layer order
        self.routed: list = [None] * n_layer  # per layer: how many of its streamed experts it routed (None: not yet)
        self.in_head = [0] * n_layer  # per layer: how many of those a staged layer's head held
        self.ahead: dict[int, list[int]] = {}  # chosen layer -> its experts queued before its routing, in entry order
        self.after: dict[int, list[int]] = {}  # routed layer -> its experts queued at its routing
        self.own_pass: dict[int, RingPass] = {}  # staged layer -> its pass of the staging ring (stage_in_ring 0)
        self._predicted: dict = {}  # layer -> its routing's counts as predicted by the layer before (head_predict)
        #: the unit's pass of the ring: its streamed (and staged) layers' entries; None: nothing streams
        self.ring_pass = parts.passes.open(parts.ring, [], head=0) if parts.placement.n_streamed else None
        self._choose_ahead()
        if self.ring_pass is not None:  # the head of a streamed layer 0's copies: before its attention
            with parts.be.host_phase("host planning"):
                self.ring_pass.copy_ahead(PASS_HEAD)

    # ---- the unit's steps -----------------------------------------------------------------
    def after_attention(self, layer: int) -> None:
        """Layer 0's attention is queued: the rest of the unit pass's due copies now (the unit
        opened it with PASS_HEAD of them, so the device starts attention without waiting for the
        host to queue them all; a staged layer 0 has none yet)."""
        if layer == 0 and self.ring_pass is not None:
            with self.parts.be.host_phase("host planning"):
                self.ring_pass.copy_ahead()

    def wants_prediction(self, layer: int) -> bool:
        """head_predict: whether `layer`'s routing should be predicted from the layer before's
        residual: it streams something, waits for the layer before's routing to be chosen (under
        the threshold rule, or with a measured last unit, every layer is chosen at the unit's
        start), could stage with a head, and the coverage rule would not stream it whatever the
        layer before routes."""
        p, o = self.parts, self.parts.options
        if (not o.head_predict or layer >= p.config.n_layer or not p.n_streamed[layer]
                or len(self.layers) > layer or not self.head_size(layer)):
            return False
        return not (o.stream_min == AUTO and stream_need(
            self.tokens, p.n_streamed[layer] * p.blob_bytes[layer], o.stream_hide * 1000) <= 0)

    def predicted(self, layer: int, counts) -> None:
        """`layer`'s predicted routing counts (backend expert_counts, read when the layer is
        chosen: reading them waits for the predictor)."""
        self._predicted[layer] = counts

    def layer_pass(self, layer: int, tab) -> tuple[RingPass, list[int]]:
        """The layer has routed (tab: its routing tables, whose counts reach the host here: the
        copies due are queued first, while the device still runs the router): the
        pass its streamed experts come through and which of them were queued before its routing,
        in entry order (all where it streams; a staged layer's head). A staged layer's routed
        streamed experts not in its head join the unit pass (or, with stage_in_ring 0, a pass of
        the staging ring of their own): PASS_HEAD of their copies are queued here and the rest by
        the walk, after the layer's resident gate/up, so neither the link nor the compute stream
        waits for the host to queue the other's work. Then the next layers' walks that waited
        for this routing are chosen, so a next layer's copies (all of them, or its head) follow
        this one's without a gap."""
        p = self.parts
        resident = p.placement.resident[layer]
        if self.ring_pass is not None:
            # the copies the ring has room for, before the host waits for this layer's counts: with
            # choose_ahead 2 the pass holds the next layer's entries by now, and their copies then
            # cost the host no time between the counts and this layer's products
            with p.be.host_phase("host planning"):
                self.ring_pass.copy_ahead()
        with p.be.host_phase("host planning"):
            if p.n_streamed[layer]:
                order = np.asarray(tab.order)
                routed = [int(e) for e in order[~resident[order]]]
            else:  # nothing of it streams: its counts are not read here (device_plan never reads them)
                routed = []
            self.routed[layer] = len(routed)
        choice = self.layers[layer]
        ahead = self.ahead.get(layer, [])
        if choice.streams:
            ring_pass = self.ring_pass
        elif p.options.stage_in_ring and self.ring_pass is not None:
            ring_pass = self.ring_pass
            with p.be.host_phase("host planning"):
                head = set(ahead)
                rest = [(layer, e) for e in routed if e not in head]
                ring_pass.extend(rest)
                ring_pass.copy_ahead(PASS_HEAD)  # the rest once the resident gate/up is queued (the walk's copy_ahead)
            self.after[layer] = [e for _, e in rest]
            self.in_head[layer] = len(routed) - len(rest)
        else:
            ring_pass = self.own_pass[layer] = p.passes.open(p.staging, [(layer, e) for e in routed])
            self.after[layer] = routed
        self._choose_ahead()
        return ring_pass, ahead

    # ---- the rules applied ----------------------------------------------------------------
    def head_size(self, layer: int) -> int:
        """stage_head's size of `layer`'s head in this unit."""
        p = self.parts
        return stage_head(n_tok=self.tokens, blob_bytes=p.blob_bytes[layer], n_streamed=p.n_streamed[layer],
                          k_used=p.config.n_expert_used, n_expert=p.config.n_expert, setting=p.options.stage_head)

    def _choose_ahead(self) -> None:
        """Choose the walk of every next layer that can be chosen now (choose_layer: under the
        threshold or with the last unit measured every one, else up to the first that needs a
        routing of this unit not yet known), up to and with the first staged one: the pass holds
        the layers' entries in layer order, and a staged layer's routed ones are known only once
        it has routed. A streamed one appends all of its streamed experts to the unit pass,
        behind the layers before it (the walk queues their copies as the ring frees slots); a
        staged one (with stage_in_ring) its head (stage_head), the rest at its routing."""
        p, o, cfg = self.parts, self.parts.options, self.parts.config
        layers = self.layers
        while len(layers) < cfg.n_layer:
            layer = len(layers)
            if layers and layers[-1].walk == "staged" and self.routed[layer - 1] is None:
                return  # that layer's routed entries come first, once it has routed
            c = choose_layer(layer=layer, n_tok=self.tokens, stream_min=o.stream_min, k_used=cfg.n_expert_used,
                             n_expert=cfg.n_expert, streamed=p.n_streamed, blob_bytes=p.blob_bytes,
                             hide_per_token=o.stream_hide * 1000, measured=self.measured, routed=self.routed,
                             reach=o.choose_ahead)
            if c is None:
                return
            streamed = p.placement.streamed(layer)
            head = []
            if c.walk == "staged" and o.stage_in_ring:
                n = self.head_size(layer)
                predicted = self._predicted.pop(layer, None)
                if predicted is not None and n:
                    with p.be.host_phase("host planning"):  # reading the counts waits for the predictor
                        head = predicted_head(predicted.cnt, streamed, n)
                else:
                    head = [int(e) for e in streamed[:n]]
                c = dataclasses.replace(c, head=len(head), predicted=predicted is not None and n > 0)
            layers.append(c)
            ahead = [int(e) for e in streamed] if c.streams else head  # a resident layer streams none
            self.ahead[layer] = ahead
            if ahead:
                self.ring_pass.extend([(layer, e) for e in ahead])

    # ---- what it did, and why -------------------------------------------------------------
    def measure(self) -> tuple | None:
        """(tokens, routed streamed experts per layer) once every layer has routed, for the next
        unit's coverage rule; None before."""
        return None if None in self.routed else (self.tokens, list(self.routed))

    def record(self) -> WalkChoice:
        """The unit's WalkChoice: its walks, layer by layer, and why, as they stand now (whole
        once its last layer has routed)."""
        p, o = self.parts, self.parts.options
        total = sum(int(n) * int(b) for n, b in zip(p.n_streamed, p.blob_bytes))
        return WalkChoice("threshold" if o.stream_min != AUTO else "coverage", self.tokens, o.stream_min,
                          int(sum(p.n_streamed)), total, layers=self.layers,
                          measured=None if self.measured is None else int(self.measured[0]), routed=self.routed,
                          in_head=self.in_head)

    def why(self, layer: int, expert: int) -> str:
        """Why this unit copied `expert` of `layer`, or did not, in one line: "copied ahead"
        (before the layer's routing: the streamed walk, or a staged layer's head), "copied after"
        (a staged layer's routed expert beyond its head) or "not copied" (resident, a staged
        layer's expert its routing skipped, or a layer not chosen or routed yet), then the
        layer's walk and its reason, and the expert's place in its pass."""
        p = self.parts
        what = f"expert {expert} of layer {layer}"
        if p.placement.resident[layer, expert]:
            return f"not copied: {what} is resident in the expert cache"
        if layer >= len(self.layers):
            return f"not copied: layer {layer}'s walk is not chosen yet (it waits for the layer before's routing)"
        c = self.layers[layer]
        walk = f"layer {layer} {c.walk} ({_choice_text(c, self.tokens, p.options.stream_min, self.measured)})"
        if expert in self.ahead.get(layer, []):
            how = ("with every streamed expert of the layer" if c.streams else
                   f"in its head of {c.head}, " + ("the ones the layer before's prediction named most"
                                                    if c.predicted else "its lowest streamed ids"))
            return f"copied ahead of its routing, {how}: {walk}{self._entry(layer, expert)}"
        if self.routed[layer] is None:
            return f"not copied yet: {walk}; {what} is past its head and the layer has not routed"
        if expert in self.after.get(layer, []):
            return f"copied after its routing, which routed it: {walk}{self._entry(layer, expert)}"
        return f"not copied: {walk}; its routing skipped {what}"

    def _entry(self, layer: int, expert: int) -> str:
        ring_pass = self.own_pass.get(layer, self.ring_pass)
        k = ring_pass.index[(layer, expert)]
        return f"; entry {k} of pass {ring_pass.pass_id} ({ring_pass.ring.place})"


def _choice_text(c: LayerChoice, tokens: int, stream_min, measured: tuple | None) -> str:
    """A layer's choice's basis in a few words (the why of CopySchedule.why)."""
    if c.basis == "threshold":
        return f"{tokens} tokens {'>=' if c.streams else '<'} stream_min {stream_min}"
    if c.basis == "prior":
        return f"no routing measured yet, {tokens} tokens {'>=' if c.streams else '<'} {STREAM_MIN}"
    src = f"the last {measured[0]} tokens' routing" if c.basis == "last unit" else f"{c.basis}'s routing"
    return f"coverage {c.coverage:.2f} {'>=' if c.streams else '<'} {c.need:.2f}, from {src}"


class PromptSchedules:
    """The schedule of the unit running now, the records of the current prompt's units before
    it, and the measure each new schedule reads: the routing of the last whole unit of the same
    prompt. A prompt from position 0 forgets the records and the measure, so the passes of run
    --timing choose as the run did. A unit's schedule (its passes, the answers of `why`) is kept
    until the next unit starts; its record after that."""

    def __init__(self, parts: CopyParts):
        self.parts = parts
        self.now: CopySchedule | None = None  # the unit running now (the last one, once a prompt is done)
        self.done: list[WalkChoice] = []  # the records of the prompt's units before it, in order
        self.measured = None  # (tokens, routed streamed experts per layer) of the last whole unit

    def begin(self, n_tok: int, first_position: int = 0) -> CopySchedule:
        """A unit (chunk or window) starts: its schedule, its ring pass open and its first
        copies queued (before layer 0's attention). The unit before it ends here: its record is
        made whole."""
        if first_position == 0:
            self.done, self.measured = [], None
        elif self.now is not None:
            self.done.append(self.now.record())
            if (m := self.now.measure()) is not None:
                self.measured = m
        self.now = CopySchedule(self.parts, n_tok, self.measured)
        return self.now

    def records(self) -> list[WalkChoice]:
        """Each unit's WalkChoice, in order: the running one's as it stands."""
        return self.done + ([] if self.now is None else [self.now.record()])
