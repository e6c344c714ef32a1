"""docs/debugging.md's transcript is what the report prints for the bug the doc plants: the
16th routed expert's bound one row short, in the sim. The doc's own planting snippet is run
here, and the transcript regenerated and compared line by line."""
import re
from pathlib import Path

from strata_prefill.fast import walk
from strata_prefill.cli import main

DOC = Path(__file__).resolve().parent.parent / "docs" / "debugging.md"


def doc_transcript() -> str:
    text = DOC.read_text()
    m = re.search(r"<!-- transcript: tests/test_debugging_doc.py -->\n```\n(.*?)```\n<!-- end transcript -->",
                  text, re.S)
    assert m, "the marked transcript block is missing from docs/debugging.md"
    return m.group(1)


def doc_plant() -> str:
    """The doc's Python snippet that plants the bug."""
    m = re.search(r"Planted in the sim.*?```python\n(.*?)```", DOC.read_text(), re.S)
    assert m, "the planting snippet is missing from docs/debugging.md"
    return m.group(1)


def test_the_doc_transcript_is_what_the_report_prints(make_test_pack, tmp_path, monkeypatch, capsys):
    pack = make_test_pack("small", "Q8_0")  # = strata-prefill make-pack small.gguf --preset small
    monkeypatch.chdir(tmp_path)
    common = ["--pack", str(pack.path), "--prompt-tokens", "48", "--prefill", "32", "--greedy", "1",
              "--dump-level", "ops", "--no-progress"]
    assert main(["run", "--impl", "reference", "--dump-dir", "A", *common]) == 0
    orig = walk.split_resident
    monkeypatch.setattr(walk, "split_resident", orig)  # undone at the end, whatever the snippet does
    exec(doc_plant(), {})
    assert walk.split_resident is not orig, "the doc's snippet planted nothing"
    # the sim fills new buffers with NaN: the run itself says where the unwritten row is (exit 1)
    assert main(["run", "--impl", "fast", "--backend", "sim", "--device-plan", "0", "--dump-dir", "B", *common]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "NaN first in layer 0, op gate (L00.gate) of chunk 0, position 28 (top-K rank 5)" in line
    assert "NaN first in layer 0, op gate (L00.gate) of chunk 0, position 28 (top-K rank 5)" in DOC.read_text()
    assert main(["diff", "A", "B"]) == 1
    assert capsys.readouterr().out == doc_transcript()
    monkeypatch.setattr(walk, "split_resident", orig)
    assert main(["run", "--impl", "fast", "--backend", "sim", "--dump-dir", "C", *common]) == 0
    capsys.readouterr()
    assert main(["diff", "A", "C"]) == 0  # step 4: the fix
    assert capsys.readouterr().out == "layers.spd: identical records\n"
