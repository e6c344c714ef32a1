"""Where the cuda backend keeps experts: the expert cache (VRAM slots of resident experts), the
host tier (page-locked host memory, streamed experts' blobs [gate | up | down] in (layer, id)
order), the rings' VRAM slots, and the copy stream that fills them.

The copy stream is created non-blocking, so it never waits for the legacy default stream; the
compute stream waits for its copies through events only (fast/walk.py decides which). Reading
the pack into page-locked memory happens once, at load; registering the pack's file mapping
with cuMemHostRegister instead was tried on the H200 machine and failed with "invalid
argument", so it is not attempted.
"""
from __future__ import annotations

import atexit
import hashlib
import os
import sys
import time
import weakref

import numpy as np

from strata_prefill.contract.constants import GROUP_TAIL_BYTES
from strata_prefill.contract.errors import DeviceError
from strata_prefill.formats.progress import Progress

from strata_prefill.fast.cuda import runtime
from strata_prefill.fast.experts import Place, adjacent_runs

NON_BLOCKING = 1  # CU_STREAM_NON_BLOCKING

# The host tier of the last engine dropped in this process, page-locked and filled: an engine of
# the same pack file and placement made next (a benchmark's next arm, the gate's next row) takes
# it as it is instead of locking and reading the same gigabytes again. One at most, and none
# while an engine holds it; freed before the CUDA context at exit.
_kept_host: dict = {}
_exit_clear: list = []  # registered once, at the first keep: after the context's own exit hook, so it runs first


def _host_key(pack, placement, blob_bytes) -> str:
    """What a filled host tier's bytes depend on: the pack file (path, inode, size and mtime:
    a rewritten file misses) and which experts it holds, where."""
    st = os.stat(pack.path)
    h = hashlib.sha256(f"{os.path.abspath(pack.path)}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}|{blob_bytes}".encode())
    h.update(np.ascontiguousarray(placement.resident).tobytes())
    return h.hexdigest()


def _keep_host(key: str, host) -> None:
    """weakref.finalize's callback for a dropped ExpertTiers: keep its filled host tier."""
    if not _exit_clear:
        atexit.register(_kept_host.clear)
        _exit_clear.append(True)
    _kept_host.clear()
    _kept_host[key] = host


class ExpertTiers:
    def __init__(self, pack, placement, ring_slots: int, staging_slots: int, progress: bool | None = None,
                 stress=None):
        import pycuda.driver as cuda

        self.cuda = cuda
        self.stress = stress  # strata_prefill.fast.cuda.stress.Stress: a spin before each copy (None: off)
        cfg = pack.config
        self.placement = placement
        self.blob_bytes = [pack.expert_blob_size(l) for l in range(cfg.n_layer)]
        self.slot_bytes = max(self.blob_bytes)
        self.copy_stream = cuda.Stream(flags=NON_BLOCKING)

        # the expert cache: one allocation per layer, residents in id order, and GROUP_TAIL_BYTES
        # after the last blob: the MMQ kernel reads the cache in place (in_place) and may touch
        # up to 15 bytes past a matrix's end
        self._cache = []
        for l in range(cfg.n_layer):
            ids = np.nonzero(placement.resident[l])[0]
            nbytes = max(1, len(ids)) * self.blob_bytes[l] + GROUP_TAIL_BYTES
            dev = runtime.alloc(nbytes, f"the expert cache of layer {l} ({len(ids)} experts, {nbytes >> 20} MiB)")
            for i, e in enumerate(ids):  # the blob's three parts straight from the file's pages: no joined copy
                at = int(dev) + i * self.blob_bytes[l]
                for part in pack.expert_parts(l, int(e)):
                    cuda.memcpy_htod(at, part)
                    at += part.nbytes
            rank = np.cumsum(placement.resident[l]) - 1
            self._cache.append((dev, rank))

        # the host tier: every streamed blob, page-locked, in (layer, id) order
        sizes = np.array([self.blob_bytes[l] for l in range(cfg.n_layer) for _ in placement.streamed(l)], np.int64)
        self.host_offset = np.zeros(placement.resident.shape, np.int64)
        starts = np.concatenate([[0], np.cumsum(sizes)])
        self.host_offset[~placement.resident] = starts[:-1]
        total = int(starts[-1])
        self.host_bytes = total
        key = _host_key(pack, placement, self.blob_bytes) if total else None
        kept = _kept_host.pop(key, None) if key else None
        if kept is not None:
            self.host = kept
        else:
            if total:  # another pack's or placement's tier, freed before more is locked
                _kept_host.clear()
            try:
                self.host = cuda.pagelocked_empty(max(total, 1), np.uint8)
            except Exception as e:  # noqa: BLE001 - the driver's own error text goes into the line
                raise DeviceError(f"could not page-lock {total / 1e9:.2f} GB for the host tier "
                                  f"({' '.join(str(e).split())}); a larger --expert-cache streams less") from e
            self._fill_host(pack, progress)
        if key is not None:
            weakref.finalize(self, _keep_host, key, self.host)

        # the rings' slots, and GROUP_TAIL_BYTES after the last: with ring_in_place the MMQ kernel
        # reads the slots in place, up to 15 bytes past a matrix's end
        self.rings = {name: (runtime.alloc(max(1, n) * self.slot_bytes + GROUP_TAIL_BYTES, f"{n} {name} slots"), n)
                      for name, n in ((Place.RING, ring_slots), (Place.STAGE, staging_slots))}
        self.copy_timing = False
        self.copy_spans: list = []  # (start event, end event, bytes, note) when copy_timing is on

    def _fill_host(self, pack, progress) -> None:
        p = self.placement
        todo = [(l, int(e)) for l in range(p.resident.shape[0]) for e in p.streamed(l)]
        if not todo:
            return
        # None: a bar on a terminal, else a line every 10 s of a long fill (formats/progress.py)
        n_layer = p.resident.shape[0]
        t0 = time.perf_counter()
        with Progress(self.host_bytes, "host tier", "B", progress, unit_scale=True) as bar:
            for l, e in todo:
                bar.at(f"layer {l + 1}/{n_layer}")
                off = int(self.host_offset[l, e])
                for part in pack.expert_parts(l, e):  # into the page-locked tier directly: no joined copy
                    self.host[off:off + part.nbytes] = part
                    off += part.nbytes
                bar.step(self.blob_bytes[l])
        dt = time.perf_counter() - t0
        print(f"host tier: {len(todo)} experts, {self.host_bytes / 1e9:.2f} GB read into page-locked memory "
              f"in {dt:.2f} s ({self.host_bytes / 1e9 / max(dt, 1e-9):.2f} GB/s)", file=sys.stderr)

    # ---- addresses --------------------------------------------------------------------
    def cache_addr(self, layer: int, expert: int) -> int:
        dev, rank = self._cache[layer]
        return int(dev) + int(rank[expert]) * self.blob_bytes[layer]

    def cache_offsets(self, layer: int, experts) -> tuple[int, np.ndarray]:
        """(the layer's cache base address, int64 byte offsets of each resident expert's blob)."""
        dev, rank = self._cache[layer]
        return int(dev), rank[np.asarray(experts, np.int64)].astype(np.int64) * self.blob_bytes[layer]

    def slot_addr(self, ring: Place, slot: int) -> int:
        dev, _ = self.rings[ring]
        return int(dev) + int(slot) * self.slot_bytes

    def addr(self, layer: int, where: Place, index: int) -> int:
        """A member's blob: (Place.CACHE, expert) or (ring, slot)."""
        return self.cache_addr(layer, index) if where == Place.CACHE else self.slot_addr(where, index)

    # ---- the copy stream ----------------------------------------------------------------
    def copy(self, ring: Place, slots, experts, wait_for, counters, note: dict | None = None):
        """Wait for wait_for on the copy stream, copy experts' host blobs into slots (adjacent
        ones merged), record and return an event. With copy_timing, an event pair goes around
        the copies (after the waits: the span is the copy's own time) and note is kept with it.
        In the stress mode a spin goes between the waits and the copies: they land late."""
        cuda, stream = self.cuda, self.copy_stream
        for ev in wait_for:
            stream.wait_for_event(ev)
            counters["copy_waits"] += 1
        if self.stress is not None:
            self.stress.before_copy(stream)
        start = None
        if self.copy_timing:
            start = cuda.Event()
            start.record(stream)
        runs = adjacent_runs(slots, experts, self.placement.host_index, self.blob_bytes, self.slot_bytes)
        nbytes = 0
        for run in runs:
            l0, e0 = experts[run[0]]
            off = int(self.host_offset[l0, e0])
            n = sum(self.blob_bytes[experts[i][0]] for i in run)
            cuda.memcpy_htod_async(self.slot_addr(ring, slots[run[0]]), self.host[off:off + n], stream)
            nbytes += n
        counters["copies"] += len(runs)
        counters["copy_bytes"] += nbytes
        counters["copy_events"] += 1
        done = cuda.Event(cuda.event_flags.DISABLE_TIMING) if start is None else cuda.Event()
        done.record(stream)
        if start is not None:
            self.copy_spans.append((start, done, nbytes, note or {}))
        return done

    def copy_busy(self) -> tuple[float, int]:
        """(seconds the copy stream spent copying, bytes) since the last call (timing on)."""
        secs, nbytes = 0.0, 0
        for start, end, n, _note in self.copy_spans:
            end.synchronize()
            secs += start.time_till(end) / 1e3
            nbytes += n
        self.copy_spans.clear()
        return secs, nbytes
