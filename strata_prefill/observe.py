"""The extra prefills of `strata-prefill run --timing` and `--trace FILE`, after the run itself
(whose printed speed stays uninstrumented): each on a fresh KV cache, the same prompt and the
same chunks.

--timing   one prefill with an event pair around every phase (fast/phases.py) and one around
           each chunk (its span, of which the host phases are shown as shares), then one with
           phase timing off and a single event pair around each chunk: the chunk's
           uninstrumented total, printed beside its phase table. The instrumented prefill is
           also traced, for the overlap of the two streams (fast/trace.py: overlap_by_layer):
           one line per chunk, one table per layer; and under each chunk's head the walk it
           took (streamed, staged, mixed or resident, layer by layer) and why (strata_prefill.fast.schedule.choose_layer)
--trace    one prefill with the compute and copy streams traced (fast/trace.py), written as
           Chrome trace JSON; when --timing is on too, it is the instrumented prefill above
Chunks are windows where the prompt ran in layer-major windows (--window): each is labelled so.
"""
from __future__ import annotations

from strata_prefill.fast.phases import format_chunk_tables, format_overlap
from strata_prefill.fast.trace import overlap_by_layer, summed, units, write_trace
from strata_prefill.session import Session


def _prefill(engine, prompt, chunk, what: str, progress: bool | None) -> Session:
    engine.be.reset_cache()
    session = Session(engine, chunk=chunk, progress=progress, progress_desc=what)
    session.prefill(prompt)
    return session


def unit_meta(session: Session, n_tok: int) -> dict:
    """What a trace's chunk indices name: the chunk and window tokens and each unit's label."""
    return {"chunk_tokens": session.chunk, "window_tokens": session.window_taken,
            "units": units(n_tok, session.chunk, session.window_taken)}


def observe(engine, prompt, chunk, timing: bool, trace_path=None, out=print,
            progress: bool | None = None) -> None:
    """Run the passes asked for; print the per-chunk tables, write the trace. progress: as
    Session's, each pass's bar named for what it is for."""
    be = engine.be
    rec = be.phases
    rec.chunk_timing = False
    be.trace_begin()  # the trace, or the spans the overlap figures are computed from
    be.phase_table()  # drop what the run itself recorded
    rec.timing = timing
    rec.chunk_timing = timing  # each unit's span in the timed prefill: what its host phases are a share of
    first = "timed and traced prefill" if timing and trace_path is not None else (
        "timed prefill" if timing else "traced prefill")
    session = _prefill(engine, prompt, chunk, first, progress)
    rec.timing = rec.chunk_timing = False
    walks = [c.line() for c in getattr(engine, "walk_choices", [])]  # each unit's walk and why
    instrumented = be.chunk_tables() if timing else []
    spans = be.trace_end()
    meta = unit_meta(session, len(prompt))
    if trace_path is not None:
        write_trace(trace_path, spans, process=f"strata-prefill {engine.name}", meta=meta)
        out(f"trace     {trace_path} (compute and copy streams; strata-prefill plot draws it)")
    if timing:
        rec.chunk_timing = True
        try:
            _prefill(engine, prompt, chunk, "chunk totals prefill", progress)
            plain = be.chunk_tables()
        finally:
            rec.chunk_timing = False
        sim = be.name == "sim"
        per_unit = [summed(overlap_by_layer(spans, chunk=i)) for i in range(len(instrumented))]
        out("")
        out(format_chunk_tables(instrumented, plain, sim=sim, labels=meta["units"], overlap=per_unit,
                                walks=walks))
        out("")
        out(format_overlap(overlap_by_layer(spans), sim=sim))
