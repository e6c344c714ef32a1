"""A kernel compile says it is still running: fast/cuda/runtime.py's _announce writes a line
when it starts, one per heartbeat while it runs and one when it ends (no GPU needed: the
compile is stood in for by a sleep)."""
import io
import time

import pytest

from strata_prefill.fast.cuda import runtime


class _Err(io.StringIO):
    def __init__(self, tty: bool):
        super().__init__()
        self.tty = tty

    def isatty(self):
        return self.tty


@pytest.mark.parametrize("tty", [False, True])
def test_a_long_compile_is_named_while_it_runs(monkeypatch, tty):
    err = _Err(tty)
    monkeypatch.setattr(runtime.sys, "stderr", err)
    with runtime._announce("mmq", {"MMQ_BN": 64}, "sm_90", "/cache", heartbeat_s=0.1):
        time.sleep(0.55)
    text = err.getvalue()
    if tty:
        assert "\n" not in text.rstrip("\n") and text.count(" s ...") >= 4, text
    else:
        lines = text.splitlines()
        assert lines[0] == "compiling kernel mmq (MMQ_BN=64) for sm_90 into /cache ..."
        beats = [ln for ln in lines if "still compiling" in ln]
        assert len(beats) >= 4 and all(ln.startswith("compiling kernel mmq (MMQ_BN=64): still compiling, ") for ln in beats)
        assert lines[-1].startswith("compiling kernel mmq (MMQ_BN=64): ") and lines[-1].endswith(" s")


def test_a_failed_compile_says_so_and_stops_its_heartbeat(monkeypatch):
    err = _Err(False)
    monkeypatch.setattr(runtime.sys, "stderr", err)
    with pytest.raises(RuntimeError):
        with runtime._announce("kv_cache", {}, "sm_90", "/cache", heartbeat_s=0.05):
            time.sleep(0.12)
            raise RuntimeError("nvcc failed")
    n = err.getvalue().count("\n")
    time.sleep(0.2)
    assert err.getvalue().count("\n") == n  # no line after the end
    assert "compiling kernel kv_cache: failed after " in err.getvalue()
