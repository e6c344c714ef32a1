"""The contract's sizes, in one place: both implementations, the kernels' wrappers and the
tests import them from here (a kernel receives them as compile-time defines). The walk's own
defaults and the figures fitted to one card are in fast/tuning.py."""
from __future__ import annotations

# ---- the expert walk --------------------------------------------------------------------
MMQ_GROUP = 16  # consecutive routed experts gathered and multiplied together (one launch)
GROUP_TAIL_BYTES = 256  # zeroed bytes after a group buffer's last expert (MMQ reads past it)
WEIGHT_TAIL_BYTES = 16  # readable bytes the MMQ kernel may touch past a dense weight's end


# ---- q8_1 buffers (block_q8_1_mmq) --------------------------------------------------------
QK8_1 = 32  # values per scale block
Q8_1_BLOCK_VALUES = 128  # values per buffer block
Q8_1_HEADER_BYTES = 16
Q8_1_BLOCK_BYTES = Q8_1_HEADER_BYTES + Q8_1_BLOCK_VALUES  # 144
Q8_1_ROW_ALIGN = 512  # rows are padded to a multiple of this many values

# ---- attention ------------------------------------------------------------------------------
KEY_BLOCK = 64  # keys merged per online-softmax step
Q_QMAX = 255  # the bound of Q's codes, one scale per head row (9 bits)
K_QMAX = 511  # the bound of K's codes, one scale per head row (10 bits)
ROPE_MIN_ROWS = 256  # positions of the first RoPE table; it then grows by doubling

# ---- dumps ----------------------------------------------------------------------------------
RESIDUAL_STRIDE = 64  # positions sampled by the residual dumps (pos % 64 == 0)

# ---- packs ------------------------------------------------------------------------------------
PACK_FORMAT = 3  # bumped when the pack layout changes: a cached default pack of another is remade
# (3: the header records its writer and the tensors' sha256 digests, formats/make_pack.py)
