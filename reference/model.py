"""The reference engine: the whole prompt path of a pack in NumPy, one layer at a time.

`ReferenceEngine` plugs into `strata_prefill.session.Session`, which cuts the prompt into chunks,
runs the layers, records the dumps and continues greedily. Each layer is the attention half of
the pack's architecture (reference/archs/<name>.py, picked by `general.architecture`) then the
MoE half every architecture shares (reference/moe_half.py).

The operations those halves call (the q8_1 quantization, the MMQ product of each weight type,
attention, routing, SwiGLU, the combine) are vectorized NumPy in contract/; reference/scalar.py
states each of them element by element, in docs/numerics.md's order, as plain loops that the
tests compare with the vectorized code byte for byte. Decoded weights are kept between chunks
in reference/weights.py.
"""
from __future__ import annotations

import numpy as np

from strata_prefill.contract import dense, mmq, numerics, parallel
from strata_prefill.formats import nonfinite
from strata_prefill.contract.attention import KVCache
from strata_prefill.formats.pack import Pack

from strata_prefill.reference import archs
from strata_prefill.reference.moe_half import moe_half, quantize
from strata_prefill.reference.weights import PreparedCache


class ReferenceEngine:
    name = "reference"

    def __init__(self, pack: Pack):
        # The pool's size (STRATA_PREFILL_THREADS): a bad value is named before any work.
        # Experts, heads and row slabs run on it (contract/parallel.py); no byte depends on it.
        self.threads = parallel.thread_count()
        self.pack = pack
        self.config = pack.config
        cfg = self.config
        self._attention_half = archs.module(cfg.arch).attention_half
        self.kv = KVCache(cfg.n_layer, cfg.n_head_kv, cfg.head_dim)
        self._rope = numerics.RopeTable(cfg.head_dim, cfg.rope_base, scaling=cfg.rope_scaling)
        self._weights = PreparedCache()  # decoded quantized matrices and float32 float ones
        # where a run first computed a NaN or an Inf (formats/nonfinite.py: the session reads it)
        self.watch = nonfinite.Watch(cfg.n_layer)

    def product(self, key, matrix, act) -> np.ndarray:
        """matrix (a quantized QMatrix) times decoded q8_1 rows, its decoded form cached
        under key."""
        return mmq.mmq_prepared(self._weights.get(key, matrix.qtype, matrix.data), act)

    def float_product(self, key, matrix, x: np.ndarray) -> np.ndarray:
        """matrix (an F32/F16/BF16 QMatrix) times float32 rows x, in float32
        (strata_prefill.contract.dense.float_matmul); x is not quantized. Its float32 values are cached under
        key within the cache's budget (a pack's float experts may not all fit)."""
        return dense.float_matmul(self._weights.get(key, matrix.qtype, matrix.data), x)

    def rope(self, n_pos: int):
        """The RoPE (cos, sin) covering positions 0..n_pos-1."""
        return self._rope.covering(n_pos)

    def embed(self, ids: np.ndarray) -> np.ndarray:
        return self.pack.embedding_rows(ids)

    def layer(self, layer: int, x: np.ndarray, positions: np.ndarray, dump=None) -> np.ndarray:
        x = self._attention_half(self, layer, x, positions, dump)
        return moe_half(self, layer, x, dump)

    @staticmethod
    def to_host(x: np.ndarray) -> np.ndarray:
        return x

    def last_logits(self, x: np.ndarray) -> np.ndarray:
        return self.head(x[-1:])[0]

    def head(self, x_last: np.ndarray) -> np.ndarray:
        """Output norm and lm_head on the given rows: logits [rows, vocab]."""
        out = self.pack.output()
        h = numerics.rmsnorm(x_last, self.pack.output_norm(), self.config.rms_eps)
        if out.is_float:
            return self.float_product(("output",), out, h)
        return self.product(("output",), out, quantize(h, out.qtype))
