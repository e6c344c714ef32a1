"""bench/plot_phases.py reads the benchmark's phase tables and draws every phase."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("plot_phases", ROOT / "bench" / "plot_phases.py")
plot_phases = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plot_phases)

SAMPLE = """loaded 8 layers x 512 experts to VRAM in 5.6 s

2048 tokens: 101.2 ms median of 2, 20,247 tokens/s
phase                        ms   share
products                  37.83   31.2%
attention                 36.19   29.8%
swiglu+quantize H         17.28   14.2%
total                    121.31

8192 tokens: 232.3 ms median of 2, 35,262 tokens/s
phase                        ms   share
attention                 95.10   42.5%
products                  81.85   36.6%
total                    223.68
"""


def test_parse_and_draw(tmp_path):
    runs = plot_phases.parse(SAMPLE)
    assert [(n, r) for n, r, _ in runs] == [(2048, 20247.0), (8192, 35262.0)]
    assert runs[0][2] == {"products": 37.83, "attention": 36.19, "swiglu+quantize H": 17.28}
    log = tmp_path / "prefill.log"
    log.write_text(SAMPLE)
    out = tmp_path / "p.svg"
    assert plot_phases.main([str(log), str(out)]) == 0
    text = out.read_text()
    assert text.startswith("<svg") and "swiglu+quantize H" in text and "35,262 tokens/s" in text


def test_no_tables_is_an_error(tmp_path, capsys):
    log = tmp_path / "empty.log"
    log.write_text("nothing here\n")
    assert plot_phases.main([str(log), str(tmp_path / "x.svg")]) == 2
    assert "no phase tables" in capsys.readouterr().err
