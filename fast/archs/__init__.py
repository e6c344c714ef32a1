"""Each architecture's attention half in the fast engine, a module per architecture of the
registry (formats/archs), under the same module name: `attention_half(engine, layer, x,
positions, dump)` over the backend's steps (fast/backend_base.py). The shared steps (the MoE
half, the walk, the schedule) stay in fast/."""
from __future__ import annotations

import importlib

from strata_prefill.formats import archs


def module(arch: str):
    """The fast engine's module of architecture `arch` (a PackError for an unknown one)."""
    return importlib.import_module(f"{__name__}.{archs.module_name(arch)}")
