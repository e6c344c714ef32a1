"""What the two backends share: array plumbing that is the same for NumPy arrays and
pycuda GPUArrays, phase timing over each backend's `phases` (a strata_prefill.fast.phases.PhaseRecorder on the
backend's clock: CUDA events on the compute stream, or host time on the sim), and the RoPE
table's growth."""
from __future__ import annotations

import contextlib
import weakref

from strata_prefill.contract.numerics import RopeTable

from strata_prefill.fast.options import DEFAULTS, KERNEL_FORMS


class BackendBase:
    _rope = None  # a strata_prefill.contract.numerics.RopeTable, made on first use
    #: the engine's resolved switches (fast/options.py; use_options), the table's defaults until
    #: then. A backend reads only the kernel forms (KERNEL_FORMS), as attributes
    #: (self.<keyword>): they change speed, never bits; the sim runs the NumPy definitions
    #: whatever they say
    options = DEFAULTS

    def use_options(self, options) -> None:
        """The engine's resolved switches (a strata_prefill.fast.options.FastOptions)."""
        self.options = options

    def __getattr__(self, name):
        """A kernel form by its keyword (self.<keyword>): the options' value."""
        if name in KERNEL_FORMS:
            return getattr(self.options, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def expert_types(self, layer: int):
        """The quant types of a layer's expert tensors, as the pack (``self.pack``) holds them."""
        return self.pack.expert_types(layer)

    def released(self, *, ring, slots, tags, event) -> None:
        """Ring slots released (fast/experts.py): nothing to do on the device; the sim checks it."""

    def prepare_batches(self, *, layer, batches, add: bool = False) -> None:
        """Nothing to prepare ahead (the cuda backend uploads the batches' tile lists here)."""

    @staticmethod
    def oom_guard(what: str):
        """Where the device can run out of memory, an error that names `what` (cuda)."""
        return contextlib.nullcontext()

    # ---- phase timing (fast/phases.py); the sim adds its trace naming and stream syncs ----
    @property
    def timing(self) -> bool:
        """Phase timing on or off."""
        return self.phases.timing

    @timing.setter
    def timing(self, on: bool) -> None:
        self.phases.timing = bool(on)

    def phase(self, name: str, **args):
        """Markers around a phase's launches, when timing or tracing is on."""
        return self.phases.phase(name, **args)

    def host_phase(self, name: str):
        return self.phases.host_phase(name)

    def chunk_begin(self) -> None:
        self.phases.chunk_begin()

    def chunk_end(self) -> None:
        self.phases.chunk_end()

    def phase_table(self) -> dict:
        """Seconds per phase since the last call (waits for the markers; on the sim, host time of
        enqueueing and whatever the scheduler ran meanwhile: the sim is for schedules, not
        speed)."""
        return self.phases.phase_table()

    def chunk_tables(self) -> list:
        """Seconds per phase and per chunk since the last call (strata_prefill.fast.phases.ChunkTimes)."""
        return self.phases.chunk_tables()

    @staticmethod
    def view(a, shape):
        return a.reshape(shape)

    @staticmethod
    def shape(a):
        return a.shape

    @staticmethod
    def last_row(x):
        n = int(x.shape[0])
        return x[n - 1:n]

    @staticmethod
    def rows(x, r0: int, r1: int):
        return x[r0:r1]

    def rope_table(self, need: int):
        """The RoPE table covering positions 0..need-1: strata_prefill.contract.numerics.RopeTable's growth, with
        the backend's `_make_rope(n)` building (and, on the GPU, uploading) each size."""
        if self._rope is None:
            cfg = self.config
            # weakly: a closure over self kept by self is a cycle (see CudaBackend.__init__)
            make = weakref.WeakMethod(self._make_rope)
            self._rope = RopeTable(cfg.head_dim, cfg.rope_base, build=lambda n, _hd, _base: make()(n))
        return self._rope.covering(need)

    # ---- the NaN/Inf watch (formats/nonfinite.py): each backend's nonfinite_reset makes its value
    _nonfinite = None

    def _watch(self):
        """The watch's value, made (nonfinite_reset) at the run's first mark."""
        if self._nonfinite is None:
            self.nonfinite_reset()
        return self._nonfinite
