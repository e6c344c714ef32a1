"""Float dense products on the GPU: fast/cuda/kernels/float_dense.cu, whose definition is
strata_prefill.contract.dense.float_matmul (F32, F16 or BF16 weights times float32 rows, no quantize).
Launches go through the backend's runtime.Device (counted as "float_dense")."""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as QT

from strata_prefill.contract.errors import InputError

from strata_prefill.fast.cuda import runtime
from strata_prefill.fast.cuda.runtime import ptr

__all__ = ["float_dense"]

_KERNEL = {QT.F32: "f32", QT.F16: "f16", QT.BF16: "bf16"}
_WARPS = 8  # FD_WARPS in the kernel
_TOK = 4  # FD_TOK in the kernel
#: float_dense.cu's forms: "warp" (one warp per weight row and 4 tokens) and "tile" (a warp per
#: 8 rows x 8 tokens, a CTA per 16 rows x 32 tokens); the same bits. "auto": tile from
#: TILE_MIN tokens and rows, where its 64 partials per lane are not mostly padding.
VARIANTS = ("auto", "warp", "tile")
TILE_MIN = 8
_TILE = (16, 32, 256)  # float_dense_tile_geometry: rows, tokens, threads per CTA
_GRID_Y_MAX = 65535  # CUDA's limit on gridDim.y, which walks the tiled form's token tiles
#: float_dense.cu defines for the tiled form (FT_MINB: CTAs per SM asked of the compiler)
TILE_CONFIG: dict = {}


def float_dense(dev, qtype, w, N: int, K: int, x, T: int, out, *, ldx: int | None = None,
                ldo: int | None = None, variant: str = "auto") -> None:
    """out float32 [T, ldo] <- x [T, ldx] float32 times weight rows w [N, K] of `qtype`
    (F32, F16 or BF16, contiguous rows) = strata_prefill.contract.dense.float_matmul; ldx, ldo default K, N.
    ``variant`` picks the kernel form (:data:`VARIANTS`)."""
    try:
        qtype = QT(qtype)
        suffix = _KERNEL[qtype]
    except (ValueError, KeyError):
        raise InputError(f"float_dense: not a float type: {getattr(qtype, 'name', qtype)}") from None
    if variant not in VARIANTS:
        raise InputError(f"float_dense: unknown variant {variant!r} (one of {VARIANTS})")
    N, K, T = int(N), int(K), int(T)
    if N <= 0 or T <= 0:
        return
    tile_grid_y = -(-T // _TILE[1])
    if variant == "auto":
        variant = "tile" if min(N, T) >= TILE_MIN and tile_grid_y <= _GRID_Y_MAX else "warp"
    elif variant == "tile" and tile_grid_y > _GRID_Y_MAX:
        raise InputError(f"float_dense: the tiled form covers at most {_GRID_Y_MAX * _TILE[1]} tokens a launch, "
                         f"got {T}")
    args = (ptr(w), ptr(x), np.int64(K if ldx is None else ldx), ptr(out), np.int64(N if ldo is None else ldo),
            N, K, T)
    if variant == "tile":
        rows, toks, threads = _TILE
        f = runtime.function("float_dense", f"float_dense_tile_{suffix}", "PPqPqiii", dict(TILE_CONFIG))
        dev.launch(f, "float_dense", (-(-N // rows), -(-T // toks), 1), (threads, 1, 1), *args)
        return
    warps = N * -(-T // _TOK)
    f = runtime.function("float_dense", f"float_dense_{suffix}", "PPqPqiii")
    dev.launch(f, "float_dense", (-(-warps // _WARPS), 1, 1), (32 * _WARPS, 1, 1), *args)
