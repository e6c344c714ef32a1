"""Run settings made from the switch table's declarations (fast/options.py: Switch.requirements):
one where every need of a switch is met, and, for each need, one where only that need is not.
Read from the table, so a need declared there is tested with no test changed.

A setting is a dict: impl, backend, expert_cache (slots, or "auto") and switches (keyword ->
value, the other switches the need names, set where their defaults would not do)."""
from __future__ import annotations

from strata_prefill.fast import options
from strata_prefill.fast.options import AUTO, FAST, AnyOf, Cuda, FastPath, Is, OnOff, Resident, Streams, WholeLayer

LAYERS, LAYER_EXPERTS = 2, 16  # the tiny pack
TOTAL = LAYERS * LAYER_EXPERTS
PART = 10  # an expert cache that holds some experts and streams the rest


def applies(need, value) -> bool:
    return need.when is None or value in need.when


def value_of(setting: dict, keyword: str):
    return setting["switches"].get(keyword, getattr(options.DEFAULTS, keyword))


def _put(setting: dict, keyword: str, value) -> None:
    """Set a switch, or leave it out where the value is its default (not given: nothing of its
    own to check)."""
    if value == getattr(options.DEFAULTS, keyword) and keyword not in setting["fixed"]:
        setting["switches"].pop(keyword, None)
    else:
        setting["switches"][keyword] = int(value) if isinstance(value, bool) else value


def _other_value(keyword: str, values: tuple):
    """A value of the switch not among `values`."""
    sw = options.BY_KEYWORD[keyword]
    if isinstance(sw.value, OnOff):
        return next(v for v in (False, True) if v not in values)
    candidates = ([AUTO] if sw.value.auto else []) + list(range(sw.value.minimum, sw.value.minimum + 4))
    return next(v for v in candidates if v not in values)


def met(need, setting: dict) -> bool:
    """Whether the setting meets the need (the facts a run of it has on the tiny pack)."""
    facts = facts_of(setting)
    values = options.resolve(setting["switches"], environ={})
    return need.met(values, facts) is True


def facts_of(setting: dict) -> options.Facts:
    ec = setting["expert_cache"]
    if setting["impl"] != "fast":
        return options.Facts(setting["impl"])
    if ec == AUTO and setting["backend"] == "sim":
        return options.Facts("fast", "sim", False, True, "the sim holds all", LAYERS, LAYER_EXPERTS, True)
    slots = TOTAL if ec == AUTO else int(ec)
    return options.placed_facts("fast", setting["backend"], slots, TOTAL, f"--expert-cache {ec}", LAYERS,
                                LAYER_EXPERTS)


def meet(need, setting: dict) -> None:
    if isinstance(need, FastPath):
        setting["impl"] = "fast"
    elif isinstance(need, Cuda):
        setting["backend"] = "cuda"
    elif isinstance(need, (Streams, Resident)):
        if "expert_cache" not in setting["fixed"]:
            setting["expert_cache"] = PART
    elif isinstance(need, WholeLayer):
        if "expert_cache" not in setting["fixed"]:
            setting["expert_cache"] = AUTO
    elif isinstance(need, Is):
        if not met(need, setting):
            _put(setting, need.keyword, _other_value(need.keyword, need.values) if need.other else need.values[0])
    elif isinstance(need, AnyOf):
        if not met(need, setting):
            meet(need.needs[0], setting)
    else:  # pragma: no cover - a need of a new kind: teach this module to meet it
        raise AssertionError(f"no setting meets {need!r}")


def unmeet(need, setting: dict) -> None:
    if isinstance(need, FastPath):
        setting["impl"] = "reference"
    elif isinstance(need, Cuda):
        setting["backend"] = "sim"
    elif isinstance(need, Streams):
        setting["expert_cache"] = TOTAL
    elif isinstance(need, Resident):
        setting["expert_cache"] = 0
    elif isinstance(need, WholeLayer):
        setting["expert_cache"] = PART
    elif isinstance(need, Is):
        _put(setting, need.keyword, need.values[0] if need.other else _other_value(need.keyword, need.values))
    elif isinstance(need, AnyOf):
        for n in need.needs:
            unmeet(n, setting)
    else:  # pragma: no cover
        raise AssertionError(f"no setting leaves {need!r} unmet")


def setting_for(sw, value, unmet=None) -> dict:
    """A setting that sets `sw` to `value` and meets every need of it that applies to that
    value, but `unmet` (one of them) where given."""
    setting = {"impl": "fast", "backend": "sim", "expert_cache": AUTO, "switches": {}, "fixed": {sw.keyword}}
    if sw.keyword == "expert_cache":
        setting["expert_cache"] = value
    else:
        setting["switches"][sw.keyword] = int(value) if isinstance(value, bool) else value
    for need in sw.requirements:
        if applies(need, value) and need is not unmet:
            meet(need, setting)
    if unmet is not None:
        unmeet(unmet, setting)
        if unmet is FAST:  # the reference: nothing else of the fast path set
            setting["switches"] = {sw.keyword: setting["switches"].get(sw.keyword, value)}
            setting["expert_cache"] = AUTO
    return setting


def cases() -> list[tuple]:
    """(switch, need) for every need of every switch: what the tests derive from the table."""
    return [(sw, need) for sw in options.SWITCHES for need in sw.requirements]


def values(sw, need=None) -> list:
    """Values of `sw` a test may set: within its type, those `need` applies to, up to the most
    the tiny pack can use."""
    if isinstance(sw.value, OnOff):
        out = [False, True]
    else:
        most = {"experts": TOTAL, "layer_experts": LAYER_EXPERTS, None: 40}[sw.most]
        out = ([AUTO] if sw.value.auto else []) + ([options.OFF_WORD] if sw.value.off else []) + list(
            range(sw.value.minimum, most + 1))
    return [v for v in out if need is None or applies(need, v)]


def settled(pack, backend: str = "sim", **kw) -> dict:
    """FastEngine keywords as the switch table's rule takes them on `pack` (options.settle): a
    switch that would do nothing there dropped, a value past the most set to it; for tests that
    draw switches at random (the sim's auto cache holds every expert)."""
    cfg = pack.config
    total = cfg.n_layer * cfg.n_expert
    cache = kw.get("expert_cache", AUTO)
    slots = total if cache in (AUTO, None) else int(cache)
    facts = options.placed_facts("fast", backend, slots, total, f"--expert-cache {cache}", cfg.n_layer, cfg.n_expert)
    return options.settle(kw, facts)
