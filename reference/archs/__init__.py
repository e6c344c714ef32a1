"""Each architecture's attention half in the reference, a module per architecture of the
registry (formats/archs), under the same module name: `attention_half(model, layer, x,
positions, dump)`. The shared steps (norms, products, the MoE half) stay in reference/."""
from __future__ import annotations

import importlib

from strata_prefill.formats import archs


def module(arch: str):
    """The reference's module of architecture `arch` (a PackError for an unknown one)."""
    return importlib.import_module(f"{__name__}.{archs.module_name(arch)}")
