"""The prompt-path driver both implementations share: chunking, positions, the layer loop,
greedy continuation, dumps and the progress bar.

An engine (reference or fast) supplies four things: `embed(ids)`, `layer(l, x, positions,
dump)` (attention half then MoE half; it owns its KV cache), `last_logits(x)` (output norm and
lm_head on the chunk's last position: host float32 logits), `to_host(x)` and `config`. An
engine that times or traces per chunk (the fast one) also has `chunk_begin()`, called before a
chunk's embedding, and `chunk_end()`, after its last layer. Everything else, including every
dump switch, is here, so the two implementations cannot drift in how a run is cut or recorded.

Layer-major windows (the fast engine's `window` switch): an engine with
`window_tokens(chunk, n_tok)` names how many tokens of whole chunks a window holds. A window of
more than one chunk is embedded at once and runs layer by layer through
`window_layer(l, x, spans, dump)`: the attention half per chunk (spans: each chunk's
positions, in order), the MoE half once over the window. A window is one unit of the record
file (one header, its positions all of its chunks'), of the residual dump and of
chunk_begin/chunk_end; a window of one chunk is exactly the chunk loop without windows.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from strata_prefill.formats import dumps, records
from strata_prefill.contract.errors import InputError
from strata_prefill.formats.progress import Progress

AUTO_CHUNK = 8192  # `--prefill auto`


def parse_chunk(value) -> int:
    """`auto` or a positive integer."""
    if value is None or value == "auto":
        return AUTO_CHUNK
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise InputError(f"--prefill must be 'auto' or a positive integer, got {value!r}") from None
    if n <= 0:
        raise InputError(f"--prefill must be positive, got {n}")
    return n


class LayerDump:
    """The project's record file `DIR/layers.spd` (docs/dumps.md): a header per chunk, then
    records `L{layer:02d}.{name}`.

    level "layer" writes the router, the q8_1 buffers and the sampled residual; level "ops"
    adds every op's output (formats/records.py). Engines ask `dump.ops` before downloading
    what only the op level records."""

    def __init__(self, directory: str | Path, level: str = "layer", only: tuple[int, int] | None = None):
        if level not in records.LEVELS:
            raise InputError(f"dump level must be one of {', '.join(records.LEVELS)}, got {level!r}")
        self.dir = Path(directory)
        self.level = level
        self.records = dumps.RecordWriter(self.dir / dumps.RECORD_FILE)
        #: (unit, layer): record that layer of that unit only (the session then hands the engine
        #: no dump elsewhere, so nothing else is downloaded); None: everything
        self.only = only

    def wants(self, unit: int, layer: int | None) -> bool:
        """Whether `layer` of `unit` is recorded (layer None: the unit's embedding)."""
        return self.only is None or (layer is not None and self.only == (unit, layer))

    @property
    def ops(self) -> bool:
        return self.level == "ops"

    def begin_chunk(self, index: int, positions: np.ndarray) -> None:
        """Every record up to the next header belongs to chunk `index` at these positions."""
        self.records.write("chunk", np.array([index], np.int64))
        self.records.write("positions", np.asarray(positions, np.int64))

    def layer(self, layer: int, name: str, array: np.ndarray) -> None:
        self.records.write(f"L{layer:02d}.{name}", array)

    def op(self, layer: int, name: str, array: np.ndarray, slot: np.ndarray | None = None) -> None:
        """An op's output (host array), at the op level only. slot: the array's rows are
        expert-sorted; they are written in pair order (row i <- row slot[i])."""
        if self.ops:
            self.layer(layer, name, array if slot is None else np.asarray(array)[slot])

    def global_(self, name: str, array: np.ndarray) -> None:
        self.records.write(name, array)


def parse_dump_level(value) -> str:
    """The dump level from its argument, else STRATA_PREFILL_DUMP_LEVEL, else "layer"."""
    return value or os.environ.get("STRATA_PREFILL_DUMP_LEVEL") or "layer"


@dataclass
class RunResult:
    prompt_tokens: int
    chunk: int
    n_chunks: int
    logits: np.ndarray  # first-token logits, float32 [vocab]
    greedy: list[int] = field(default_factory=list)
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    # index of the first greedy token picked from logits holding NaN or Inf (after the first:
    # the first-token logits are `logits`), else None
    greedy_nonfinite: int | None = None
    window: int = 0  # tokens of a layer-major window (whole chunks); the chunk without windows
    # where the run first computed a NaN or an Inf (formats/nonfinite.py), else None: the first
    # non-finite record of the layer the engine's watch named (a strata_prefill.formats.nonfinite.Found, from a
    # replay that records that layer alone), or the watch's own answer (a Seen) where the replay
    # was not made or its records are all finite. A run that saw one in its prefill makes no
    # greedy step.
    nonfinite: object = None


class Session:
    """A prompt and its continuation on one engine; the KV cache carries across calls."""

    def __init__(self, engine, chunk="auto", dump_dir=None, dump_first_logits=None, dump_r=None,
                 progress: bool | None = None, dump_level: str | None = None,
                 progress_desc: str = "prefill"):
        self.engine = engine
        self.config = engine.config
        self.chunk = parse_chunk(chunk)
        env = os.environ
        self.dump_first_logits = dump_first_logits or env.get("STRATA_DUMP_FIRST_LOGITS") or None
        self.dump_r = dump_r or env.get("STRATA_PREFILL_DUMP_R") or None
        self.layer_dump = LayerDump(dump_dir, parse_dump_level(dump_level)) if dump_dir else None
        # None: a bar where stderr is a terminal, else a line every 10 s of long work
        # (formats/progress.py); True: the bar anyway; False: nothing
        self.progress = progress
        self.progress_desc = progress_desc
        # the window depends on the prompt's length (a window holds whole chunks of it): a bad one
        # is refused at the start of the prefill, before any layer runs
        self.window_of = getattr(engine, "window_tokens", None)
        self.window_taken = self.chunk  # the window of the last prefill
        self.n_past = 0
        self._chunks_done = 0  # the residual dump is truncated on a run's first chunk
        self._residuals: dumps.ResidualWriter | None = None
        self.watch = getattr(engine, "watch", None)  # strata_prefill.formats.nonfinite.Watch: where NaN or Inf first
        self._stop_after: tuple[int, int] | None = None  # (unit, layer): a replay ends there

    # ---- input checks ---------------------------------------------------------------
    def _check_tokens(self, ids) -> np.ndarray:
        ids = np.asarray(ids)
        if ids.ndim != 1 or ids.size == 0:
            raise InputError("the prompt is empty")
        if not np.issubdtype(ids.dtype, np.integer):
            raise InputError("token ids must be integers")
        bad = (ids < 0) | (ids >= self.config.n_vocab)
        if bad.any():
            i = int(np.argmax(bad))
            raise InputError(f"token id {int(ids[i])} at prompt position {i} is out of range "
                             f"(vocabulary has {self.config.n_vocab} tokens)")
        if self.n_past + ids.size > self.config.context_length:
            raise InputError(f"{self.n_past + ids.size} tokens exceed the context length "
                             f"{self.config.context_length}")
        return ids.astype(np.int32)

    # ---- the prompt path ------------------------------------------------------------
    def prefill(self, ids) -> np.ndarray:
        """Run the prompt in chunks; return the logits after its last token."""
        ids = self._check_tokens(ids)
        window = self.window_taken = self.window(ids.size)
        n_windows = -(-ids.size // window)
        # one step is one layer of one chunk (of one window); the bar names both
        with Progress(n_windows * self.config.n_layer, self.progress_desc,
                      "chunk-layer" if window == self.chunk else "window-layer", self.progress) as bar:
            return self._prefill(ids, bar, window)

    def window(self, n_tok: int) -> int:
        """The tokens of a window (whole chunks) for a prompt of n_tok: the chunk without windows."""
        return self.chunk if self.window_of is None else self.window_of(self.chunk, n_tok)

    def _prefill(self, ids: np.ndarray, bar: Progress | None, window: int | None = None) -> np.ndarray:
        n_layer = self.config.n_layer
        window = window or self.chunk
        starts = list(range(0, ids.size, window))
        logits = None
        begin = getattr(self.engine, "chunk_begin", None)
        end = getattr(self.engine, "chunk_end", None)
        for index, c0 in enumerate(starts):
            chunk_ids = ids[c0:c0 + window]
            positions = np.arange(self.n_past, self.n_past + chunk_ids.size, dtype=np.int64)
            spans = [positions[i:i + self.chunk] for i in range(0, positions.size, self.chunk)]
            if begin is not None:
                begin()
            x = self.engine.embed(chunk_ids)
            at = self._chunks_done  # the unit's index in the record file and the watch
            if self.watch is not None:
                self.watch.unit = at
            if self.layer_dump is not None:
                self.layer_dump.begin_chunk(at, positions)
                if self.layer_dump.ops and self.layer_dump.wants(at, None):
                    self.layer_dump.global_("embed", self.engine.to_host(x))
            unit = "chunk" if window == self.chunk else "window"
            for layer in range(n_layer):
                if bar is not None:
                    bar.at(f"{unit} {index + 1}/{len(starts)}, layer {layer + 1}/{n_layer}")
                dump = self.layer_dump if self.layer_dump is not None and self.layer_dump.wants(at, layer) else None
                if len(spans) == 1:
                    x = self.engine.layer(layer, x, positions, dump)
                else:
                    x = self.engine.window_layer(layer, x, spans, dump)
                if dump is not None:
                    keep = positions % dumps.RESIDUAL_STRIDE == 0
                    dump.layer(layer, "resid_pos", positions[keep])
                    dump.layer(layer, "resid", self.engine.to_host(x)[keep])
                if bar is not None:
                    bar.step()
                if self._stop_after == (at, layer):
                    raise _ReplayDone
            if end is not None:
                end()
            if self.dump_r:
                if self._residuals is None:
                    self._residuals = dumps.ResidualWriter(self.dump_r)
                self._residuals.write(positions, self.engine.to_host(x))
            self._chunks_done += len(spans)
            self.n_past += chunk_ids.size
            if c0 == starts[-1]:
                logits = self.engine.last_logits(x)
        return logits

    def close(self) -> None:
        """Put the dumps in place (each is written to a temp, formats/dumps.py): `run` does it
        at its end; a caller of `prefill` alone calls it when done."""
        if self._residuals is not None:
            self._residuals.close()
        if self.layer_dump is not None:
            self.layer_dump.records.close()

    def discard(self) -> None:
        """Drop the dumps' temps, leaving their targets as they were."""
        if self._residuals is not None:
            self._residuals.discard()
        if self.layer_dump is not None:
            self.layer_dump.records.discard()

    def run(self, prompt, greedy: int = 0) -> RunResult:
        """Prefill the prompt, dump its logits, then `greedy` tokens by one-token chunks; the
        dumps are put in place at the end (`close`), or dropped if the run fails."""
        try:
            result = self._run(prompt, greedy)
        except BaseException:
            self.discard()
            raise
        self.close()
        return result

    def _run(self, prompt, greedy: int) -> RunResult:
        ids = self._check_tokens(prompt)
        fresh = self.n_past == 0 and self._chunks_done == 0  # a replay can repeat it
        if self.watch is not None:
            self.watch.reset()
        t0 = time.perf_counter()
        logits = self.prefill(ids)
        t1 = time.perf_counter()
        # the logits are on the host, so every mark queued before them has run: no wait. A
        # replay (_name_nonfinite) knows what it looks for: it runs on to its layer.
        watching = self.watch is not None and self._stop_after is None
        seen = self.watch.first() if watching else None
        if self.dump_first_logits:
            dumps.write_first_logits(self.dump_first_logits, logits)
        if self.layer_dump is not None:
            self.layer_dump.global_("first_logits", logits[None])
        first = logits
        out = [greedy_token(logits)] if greedy > 0 and seen is None else []
        bad = None  # RunResult.greedy_nonfinite
        # the first greedy token is the prefill's; each further one is a one-token step
        with Progress(len(out) and greedy - 1, "greedy", "token", self.progress) as bar:
            while out and len(out) < greedy:
                bar.at(f"token {len(out) + 1}/{greedy}")
                logits = self._prefill(self._check_tokens([out[-1]]), None)
                if bad is None and not np.isfinite(logits).all():
                    bad = len(out)
                out.append(greedy_token(logits))
                bar.step()
        if seen is None and watching and greedy > 1:
            seen = self.watch.first()
        t2 = time.perf_counter()
        n_chunks = -(-ids.size // self.chunk)
        found = None
        if seen is not None:  # the run's own op records name it where it keeps them (`run` reads them)
            own = self.layer_dump is not None and self.layer_dump.ops
            found = (self._name_nonfinite(ids, greedy, seen) if fresh and not own else None) or seen
        return RunResult(ids.size, self.chunk, n_chunks, first, out, t1 - t0, t2 - t1, bad, self.window_taken,
                         nonfinite=found)

    def _name_nonfinite(self, ids: np.ndarray, greedy: int, seen):
        """The first non-finite record of the (unit, layer) the watch named (a
        strata_prefill.formats.nonfinite.Found with its op, position and element), from a replay of the run on
        the same engine (the same chunks and greedy steps: the same bits) that records every op
        of that layer of that unit and nothing else, and stops after it; None where those
        records are all finite (the watch saw what no op records: the shared expert's gate or
        up) or the engine has no pack. The replay's files are removed."""
        import shutil
        import tempfile

        from strata_prefill.formats import nonfinite

        pack = getattr(self.engine, "pack", None)
        if pack is None:
            return None
        folder = Path(tempfile.mkdtemp(prefix="strata-prefill-nonfinite-"))
        try:
            replay = Session(self.engine, chunk=self.chunk, progress=self.progress,
                             progress_desc=f"naming where NaN or Inf first appear (layer {seen.layer})")
            replay.dump_first_logits = replay.dump_r = None  # never the run's own files
            replay.layer_dump = LayerDump(folder, "ops", only=(seen.unit, seen.layer))
            replay._stop_after = (seen.unit, seen.layer)
            try:
                replay._run(ids, greedy)
            except _ReplayDone:
                pass
            replay.layer_dump.records.close()
            return nonfinite.in_records(folder / "layers.spd", records.q8_layouts(pack),
                                        self.config.n_expert_used)
        finally:
            shutil.rmtree(folder, ignore_errors=True)


class _ReplayDone(Exception):
    """A replay (Session._name_nonfinite) has recorded the layer it was made for."""


def greedy_token(logits: np.ndarray) -> int:
    """argmax, ties to the lowest id."""
    return int(np.argmax(logits))
