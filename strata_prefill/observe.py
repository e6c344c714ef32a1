"""The extra prefills of `strata-prefill run --timing` and `--trace FILE`, after the run itself
(whose printed speed stays uninstrumented): each on a fresh KV cache, the same prompt and the
same chunks.

--timing   one prefill with an event pair around every phase (fast/phases.py), then one with
           phase timing off and a single event pair around each chunk: the chunk's
           uninstrumented total, printed beside its phase table
--trace    one prefill with the compute and copy streams traced (fast/trace.py), written as
           Chrome trace JSON; when --timing is on too, it is the instrumented prefill above
"""
from __future__ import annotations

from fast.phases import format_chunk_tables
from fast.trace import write_trace
from strata.session import Session


def _prefill(engine, prompt, chunk, what: str, progress: bool | None) -> None:
    engine.be.reset_cache()
    Session(engine, chunk=chunk, progress=progress, progress_desc=what).prefill(prompt)


def observe(engine, prompt, chunk, timing: bool, trace_path=None, out=print,
            progress: bool | None = None) -> None:
    """Run the passes asked for; print the per-chunk tables, write the trace. progress: as
    Session's, each pass's bar named for what it is for."""
    be = engine.be
    rec = be.phases
    rec.chunk_timing = False
    if trace_path is not None:
        be.trace_begin()
    be.phase_table()  # drop what the run itself recorded
    rec.timing = timing
    first = "timed and traced prefill" if timing and trace_path is not None else (
        "timed prefill" if timing else "traced prefill")
    _prefill(engine, prompt, chunk, first, progress)
    rec.timing = False
    instrumented = be.chunk_tables() if timing else []
    if trace_path is not None:
        write_trace(trace_path, be.trace_end(), process=f"strata-prefill {engine.name}")
        out(f"trace     {trace_path} (compute and copy streams; strata-prefill plot draws it)")
    if timing:
        rec.chunk_timing = True
        try:
            _prefill(engine, prompt, chunk, "chunk totals prefill", progress)
            plain = be.chunk_tables()
        finally:
            rec.chunk_timing = False
        out("")
        out(format_chunk_tables(instrumented, plain, sim=be.name == "sim"))
