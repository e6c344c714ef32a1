"""The architectures this project runs: `general.architecture` -> its module, the one table.

Each module (formats/archs/spec.py says what it holds) sits over the shared steps; its attention
half lives in reference/archs/ and fast/archs/ under the module's own name, which
`module_name` gives both implementations (docs/architectures.md). A pack names its
architecture in `general.architecture`; ModelConfig and Pack pick the module here.
"""
from __future__ import annotations

from types import ModuleType

from strata_prefill.formats.archs import gpt_oss, qwen3moe
from strata_prefill.contract.errors import PackError

#: general.architecture -> its module
ARCHS: dict[str, ModuleType] = {m.NAME: m for m in (qwen3moe, gpt_oss)}
#: the architecture make-pack writes and a ModelConfig built without one is
DEFAULT = qwen3moe.NAME


def known() -> str:
    """The known architectures' names, for a refusal: `qwen3moe` or `a, b or c`."""
    names = list(ARCHS)
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def get(name: str) -> ModuleType:
    """The module of architecture `name`; a PackError naming the known ones for another."""
    arch = ARCHS.get(name)
    if arch is None:
        raise PackError(f"wrong architecture: expected {known()}, got {name}")
    return arch


def module_name(name: str) -> str:
    """The Python module name of architecture `name` (`gpt-oss`: gpt_oss), under which
    reference/archs/ and fast/archs/ hold its attention half."""
    return get(name).__name__.rsplit(".", 1)[-1]
