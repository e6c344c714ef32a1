"""The one table of cases, in the manner of llama.cpp's test-backend-ops: every kernel case and
every parity case is one row here, and nothing else lists them.

- `KERNEL_CASES`: one CUDA op at one shape, weight type and configuration (or kernel form), with
  the FLOPs and bytes one launch does and moves. `verify/` checks every row byte for byte
  against its NumPy definition; `bench/` times the rows marked `timed` (the shapes timed are the
  shapes checked) and reports TOP/s or GB/s from the row's own figures.
- `PARITY_CASES`: one run of the fast path (pack, prompt, chunking, switch arm, streaming
  setting, backend) compared byte for byte with the reference's run of the same prompt (kept in
  the reference cache: chunking, switches, ring and cache sizes change no bit, docs/numerics.md
  section 9).

Rows marked `quick` make up `pytest verify/ -m quick`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

# ============================================================================ kernel cases


@dataclass(frozen=True)
class KernelCase:
    """One kernel launch checked (and, if `timed`, benchmarked) at one shape."""

    op: str  # the test family: "quantize", "mmq", "attention", ...
    name: str  # unique within op: the pytest id
    shape: dict = field(default_factory=dict)  # the op's own shape arguments
    weight_type: str | None = None
    config: object = None  # a tile configuration or kernel form, None: the default
    flops: int = 0  # one launch (integer or float operations)
    bytes: int = 0  # one launch's fewest bytes moved (each input read once, each output written once)
    quick: bool = False
    timed: bool = False

    @property
    def id(self) -> str:
        return f"{self.op}-{self.name}"


KERNEL_CASES: tuple[KernelCase, ...] = ()


def kernel_rows(op: str, **where) -> list[KernelCase]:
    """The rows of one op (optionally only those whose attributes equal `where`)."""
    return [c for c in KERNEL_CASES if c.op == op and all(getattr(c, k) == v for k, v in where.items())]


# ============================================================================ parity cases


PARITY_CASES: tuple = ()
