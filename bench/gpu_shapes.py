"""The `strata` preset's shapes and a random routing over them, for the GPU suites (host side,
NumPy only). The routing (`Routing`) lives in verify/kernel_inputs.py: the kernel rows' checks
build the same one.
"""
from __future__ import annotations

from gguf import GGMLQuantizationType as QT

from strata_prefill.contract import quants
from strata_prefill.formats.config import PRESETS
from strata_prefill.contract.constants import MMQ_GROUP
from strata_prefill.verify.kernel_inputs import Routing  # noqa: F401  (the suites import it from here)

STRATA = PRESETS["strata"]
N_EXPERT, TOP_K = STRATA.n_expert, STRATA.n_expert_used
N_EMBD, N_FF = STRATA.n_embd, STRATA.n_ff_exp
N_GROUPS = N_EXPERT // MMQ_GROUP
GU_TYPE, DOWN_TYPE = QT.IQ2_XS, QT.Q8_0  # a strata IQ2_XS pack: down falls back to Q8_0 (640 values)


def blob_bytes(gu_type=GU_TYPE, down_type=DOWN_TYPE) -> tuple[int, int]:
    """(gate = up bytes, down bytes) of one strata expert."""
    return quants.row_bytes(gu_type, N_EMBD) * N_FF, quants.row_bytes(down_type, N_FF) * N_EMBD
