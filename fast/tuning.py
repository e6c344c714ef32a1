"""The fast walk's defaults and the figures fitted to one card: ring and staging sizes, the
coverage rule's prior, the link's measured rate. They shape when experts are copied, never what a
prefill computes (the contract's sizes are in contract/constants.py)."""
from __future__ import annotations

# ---- streaming (docs/how-it-works.md, "Streaming") ---------------------------------------
RING_SLOTS = 96  # the `ring` switch's default (fast/options.py)
RING_SLOTS_PINNED = 384  # the default where at least PINNED_SHARE of streamed bytes are pinned
PINNED_SHARE = 0.90
STAGING_SLOTS = 8  # the staged walk's own ring (stage_in_ring 0)
STREAM_MIN = 1024  # the coverage rule's prior (no routing of a layer measured yet): units from here stream
STREAM_HIDE_KB = 110  # the `stream_hide` switch's default: KB of copies a token's compute of a layer hides (docs/results)
# stage_head auto: the link time a staged layer would leave idle before its routing reaches the
# host (the layer before's last products, its own attention and router, the host's read of the
# counts), a fixed part and a part per token of the unit (strata_prefill.fast.schedule.stage_head), fitted to the
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
RING_RUN = 64  # the `ring_run` switch's default: routed experts one ring_in_place run multiplies
# (fewer, larger launches than an MMQ group's; docs/results/2026-12-02-ring-in-place-8layer.md)
COPY_BYTES_PER_S = 55.3e9  # host-to-device rate of page-locked copies on the H200 (docs/benchmarks.md,
# "The machine"): the floor of a streamed walk, and the sim's modelled copy time in traces
VRAM_RESERVE_MIB = 2048  # --vram-reserve-mib default, kept free by --expert-cache auto
