"""The fast engine's per-layer weights by field, from the architecture's tensor table.

`LayerWeights(backend, pack, layer)` answers `W.attn_q`, `W.ffn_norm`, ... with the backend's
handle of that tensor (`backend.w`), the fields being those of the architecture's `Layer`
(formats/archs/<name>.py: the table the reference's Pack.layer fills too), so a misspelt field
fails on its first use instead of naming a tensor no pack holds. Each handle is uploaded on its
first use, as before (the same upload order); a group the block does not hold (the shared
expert's) reads None. The stacked experts are not handles: the walk reaches them through
fast/experts.py, so asking for one is an error.
"""
from __future__ import annotations

from strata_prefill.formats.archs.spec import layer_names

_EXPERT_ROLES = ("expert_gu", "expert_down")


class LayerWeights:
    def __init__(self, backend, pack, layer: int):
        spec = pack.config.spec
        self._be = backend
        self.index = layer
        self._fields = {t.field for t in spec.BLOCK_TENSORS}
        self._experts = {t.field for t in spec.BLOCK_TENSORS if t.role in _EXPERT_ROLES}
        self._names = layer_names(spec, layer, set(pack.tensor_names()).__contains__)

    def __getattr__(self, field: str):
        if field.startswith("_") or field not in self._fields:
            raise AttributeError(f"a layer has no weight {field!r}")
        if field in self._experts:
            raise AttributeError(f"{field}: the experts are reached through the walk (fast/experts.py)")
        name = self._names.get(field)
        return None if name is None else self._be.w(name)

    @property
    def has_shexp(self) -> bool:
        return "ffn_gate_shexp" in self._names
