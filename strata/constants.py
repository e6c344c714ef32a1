"""The project's shared sizes, in one place: both implementations, the kernels' wrappers and
the tests import them from here (a kernel receives them as compile-time defines)."""
from __future__ import annotations

# ---- the expert walk --------------------------------------------------------------------
MMQ_GROUP = 16  # consecutive routed experts gathered and multiplied together (one launch)
GROUP_TAIL_BYTES = 256  # zeroed bytes after a group buffer's last expert (MMQ reads past it)
WEIGHT_TAIL_BYTES = 16  # readable bytes the MMQ kernel may touch past a dense weight's end

# ---- streaming (docs/how-it-works.md, "Streaming") ---------------------------------------
RING_SLOTS = 96  # STRATA_PREFILL_RING default
RING_SLOTS_PINNED = 384  # the default where at least PINNED_SHARE of streamed bytes are pinned
PINNED_SHARE = 0.90
STAGING_SLOTS = 8  # the staged walk's own ring (stage_in_ring 0)
STREAM_MIN = 1024  # the coverage rule's prior (no routing of a layer measured yet): units from here stream
STREAM_HIDE_KB = 110  # STRATA_PREFILL_STREAM_HIDE default: KB of copies a token's compute of a layer hides (docs/results)
# stage_head auto: the link time a staged layer would leave idle before its routing reaches the
# host (the layer before's last products, its own attention and router, the host's read of the
# counts), a fixed part and a part per token of the unit (fast.schedule.stage_head), fitted to the
# H200 traces of docs/results/2026-12-04-staged-heads.md (1.7 ms a layer at 1,030 tokens, 5.0 at 4,096)
STAGE_GAP_S = 0.5e-3
STAGE_GAP_PER_TOKEN_S = 1.1e-6
# head_predict: the unit's first rows the predictor routes (its cost stays that of a short chunk
# however long the unit, and a layer that then streams wastes little; the head takes the experts
# these rows name most often)
PREDICT_ROWS = 256
COALESCE_MAX = 8  # experts one coalesced copy takes at most: copies of eight experts reach the
# link's peak rate (docs/benchmarks.md, "The machine"), and the walk's first gather of a run
# waits for no more than that
RING_RUN = 64  # STRATA_PREFILL_RING_RUN default: routed experts one ring_in_place run multiplies
# (fewer, larger launches than an MMQ group's; docs/results/2026-12-02-ring-in-place-8layer.md)
COPY_BYTES_PER_S = 55.3e9  # host-to-device rate of page-locked copies on the H200 (docs/benchmarks.md,
# "The machine"): the floor of a streamed walk, and the sim's modelled copy time in traces
VRAM_RESERVE_MIB = 2048  # --vram-reserve-mib default, kept free by --expert-cache auto

# ---- q8_1 buffers (block_q8_1_mmq) --------------------------------------------------------
QK8_1 = 32  # values per scale block
Q8_1_BLOCK_VALUES = 128  # values per buffer block
Q8_1_HEADER_BYTES = 16
Q8_1_BLOCK_BYTES = Q8_1_HEADER_BYTES + Q8_1_BLOCK_VALUES  # 144
Q8_1_ROW_ALIGN = 512  # rows are padded to a multiple of this many values

# ---- attention ------------------------------------------------------------------------------
KEY_BLOCK = 64  # keys merged per online-softmax step
QK_BLOCK = 32  # values per int8 Q/K scale
ROPE_MIN_ROWS = 256  # positions of the first RoPE table; it then grows by doubling

# ---- dumps ----------------------------------------------------------------------------------
RESIDUAL_STRIDE = 64  # positions sampled by the residual dumps (pos % 64 == 0)

# ---- packs ------------------------------------------------------------------------------------
PACK_FORMAT = 3  # bumped when the pack layout changes: a cached default pack of another is remade
# (3: the header records its writer and the tensors' sha256 digests, strata/make_pack.py)
