"""The reference engine: the whole qwen3moe prompt path in NumPy, one layer at a time.

`ReferenceEngine` plugs into `strata.session.Session`, which cuts the prompt into chunks,
runs the layers, records the dumps and continues greedily. Each layer is the attention half
(reference/attention_half.py) then the MoE half (reference/moe_half.py).
"""
from __future__ import annotations

import numpy as np

from strata import mmq, numerics
from strata.attention import KVCache
from strata.pack import Pack

from reference.attention_half import attention_half
from reference.moe_half import moe_half, quantize


class ReferenceEngine:
    name = "reference"

    def __init__(self, pack: Pack):
        self.pack = pack
        self.config = pack.config
        cfg = self.config
        self.kv = KVCache(cfg.n_layer, cfg.n_head_kv, cfg.head_dim)
        self._rope = (np.zeros((0, cfg.head_dim // 2), np.float32),) * 2
        self._weights = mmq.PreparedCache()

    def product(self, key, matrix, act) -> np.ndarray:
        """matrix (a QMatrix) times decoded q8_1 rows, its decoded form cached under key."""
        return mmq.mmq_prepared(self._weights.get(key, matrix.qtype, matrix.data), act)

    def rope(self, n_pos: int):
        """The RoPE table for positions 0..n_pos-1 (each entry depends on its position only,
        so growing the table never changes an entry)."""
        if self._rope[0].shape[0] < n_pos:
            cfg = self.config
            size = max(n_pos, 2 * self._rope[0].shape[0], 256)
            self._rope = numerics.rope_table(size, cfg.head_dim, cfg.rope_base)
        return self._rope

    def embed(self, ids: np.ndarray) -> np.ndarray:
        return self.pack.embedding_rows(ids)

    def layer(self, layer: int, x: np.ndarray, positions: np.ndarray, dump=None) -> np.ndarray:
        x = attention_half(self, layer, x, positions, dump)
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
        return self.product(("output",), out, quantize(h, out.qtype))
