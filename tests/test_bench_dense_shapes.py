"""bench/bench_dense_mmq_ab_cuda.py's products come from a preset's shape (formats/config.py),
not a list of their own: the strata shape's five, the qwen3 shape's three (no shared expert), and
its refusals before any work (a type without an MMQ kernel, rows not whole blocks)."""
import subprocess
import sys
from pathlib import Path

import pytest

from bench.bench_dense_mmq_ab_cuda import products_of
from strata_prefill.formats.config import PRESETS

ROOT = Path(__file__).resolve().parents[1]  # where `python3 -m bench...` finds the bench package


def test_the_strata_shape():
    assert products_of(PRESETS["strata"]) == [
        ("attn_q", 4096, 2560), ("attn_k/v", 512, 2560), ("attn_output", 2560, 4096),
        ("shexp gate/up", 640, 2560), ("shexp down", 2560, 640)]


def test_a_shape_without_a_shared_expert():
    assert products_of(PRESETS["qwen3-30b-a3b"]) == [
        ("attn_q", 4096, 2048), ("attn_k/v", 512, 2048), ("attn_output", 2048, 4096)]


@pytest.mark.parametrize("args, message", [
    (["--qtype", "Q9_9"], "not a type with an MMQ kernel"),
    (["--shape", "strata", "--qtype", "Q4_K"], "rows not whole Q4_K blocks: shexp down (640 values a row)"),
    (["--tokens", "1024,x"], "--tokens must be positive integers"),
    (["--tokens", "0"], "--tokens must be positive integers"),
])
def test_refusals_before_any_work(args, message):
    res = subprocess.run([sys.executable, "-m", "bench.bench_dense_mmq_ab_cuda", *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and message in res.stderr
