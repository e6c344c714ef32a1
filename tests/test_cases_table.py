"""The kernel rows of verify/cases.py (`KERNEL_CASES`), without a GPU: ids unique, every row
checked by a verify test and every verify kernel test parametrized over rows, FLOPs and bytes
as a hand count gives them, a quick row in every op (and every MMQ weight type), every timed
row checked and timed by a GPU suite."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from strata_prefill.verify.cases import KERNEL_CASES, MMQ_TYPES, kernel_rows, key_of, params, sample_index

ROOT = Path(__file__).resolve().parents[1]
KERNEL_FILES = ["verify/test_kernels_cuda.py", "verify/test_model_kernels_cuda.py", "verify/test_float_dense_cuda.py",
                "verify/test_float_rows_cuda.py"]
BENCH_KERNEL_SUITES = ["bench/test_bench_q8_1_cuda.py", "bench/test_bench_gather_cuda.py", "bench/test_bench_mmq_cuda.py",
                       "bench/test_bench_attention_cuda.py", "bench/test_bench_router_cuda.py"]
BY_ID = {c.id: c for c in KERNEL_CASES}


def collect(*args: str) -> list[str]:
    """The node ids `pytest --collect-only -q` lists (a fresh process: the GPU tests collect
    here, and skip only when run)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_CURRENT"))}
    env["PYTHONPATH"] = str(ROOT)
    res = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          "-p", "no:xdist", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return [line for line in res.stdout.splitlines() if "::" in line]


def row_ids(node_ids: list[str]) -> dict[str, set[str]]:
    """test function -> the row ids in its parameter ids (a row id is one of the parameter
    ids joined by "-", the others being a suite's own parameters)."""
    out: dict[str, set[str]] = {}
    for node in node_ids:
        func, _, param = node.partition("[")
        found = out.setdefault(func, set())
        param = param.rstrip("]")
        for i in range(len(param) + 1):  # a row id is a suffix or prefix of the parameter id
            for part in (param[i:], param[:len(param) - i]):
                if part in BY_ID:
                    found.add(part)
    return out


@pytest.fixture(scope="module")
def verify_ids() -> dict[str, set[str]]:
    return row_ids(collect(*KERNEL_FILES))


def test_row_ids_are_unique_and_name_their_op():
    ids = [c.id for c in KERNEL_CASES]
    assert len(ids) == len(set(ids)), sorted({i for i in ids if ids.count(i) > 1})
    for c in KERNEL_CASES:
        assert c.id == f"{c.op}-{c.name}" and re.fullmatch(r"[A-Za-z0-9_.,:+-]+", c.name), c.id


def test_every_row_is_checked_and_every_kernel_test_reads_the_table(verify_ids):
    checked = set().union(*verify_ids.values())
    missing = [c.id for c in KERNEL_CASES if c.id not in checked]
    assert not missing, f"{len(missing)} rows no verify test checks, e.g. {missing[:5]}"
    without = [f for f, rows in verify_ids.items() if not rows]
    assert not without, f"verify kernel tests not parametrized over rows of verify/cases.py: {without}"
    for func, rows in verify_ids.items():  # each test reads one op (a few tests share one by form)
        assert len({BY_ID[r].op for r in rows}) == 1, (func, sorted({BY_ID[r].op for r in rows}))


def test_the_quick_tier_is_the_quick_rows():
    quick = row_ids(collect(*KERNEL_FILES, "-m", "quick"))
    got = set().union(*quick.values())
    assert got == {c.id for c in KERNEL_CASES if c.quick}


def test_every_op_has_a_small_quick_row():
    ops = {c.op for c in KERNEL_CASES}
    for op in ops:
        rows = kernel_rows(op, quick=True)
        assert rows, f"{op}: no quick row"
        assert not any(c.timed for c in rows), f"{op}: a benchmarked size in the quick tier"
    for t in MMQ_TYPES:
        assert kernel_rows("mmq", weight_type=t, quick=True), f"no quick MMQ row of {t}"


def test_every_timed_row_is_timed_by_a_gpu_suite_and_only_those():
    timed = row_ids(collect(*BENCH_KERNEL_SUITES))
    got = set().union(*timed.values())
    want = {c.id for c in KERNEL_CASES if c.timed}
    assert got == want, (sorted(want - got)[:5], sorted(got - want)[:5])
    for c in KERNEL_CASES:
        if c.timed:
            assert c.flops or c.bytes, c.id  # every suite reports TOP/s or GB/s from the row


def test_flops_and_bytes_by_hand():
    # 300 q8_1 rows of K 512 by 384 x 512 Q8_0 weights: 2 * 300 * 384 * 512 operations; the
    # weights 384 rows of 16 blocks of 34 bytes, the rows 4 blocks of 144 bytes (K padded to
    # 512), the outputs 300 x 384 float32
    (c,) = kernel_rows("mmq_dense", weight_type="Q8_0")
    assert c.flops == 117_964_800
    assert c.bytes == 384 * 16 * 34 + 300 * 4 * 144 + 300 * 384 * 4 == 842_496
    # one layer's gate and up at 2,048 tokens top-10: 20,480 rows by 2 x (640 x 2560) IQ2_XS over
    # all 512 experts (10 blocks of 74 bytes a row), the rows 20 blocks of 144 bytes
    (c,) = [r for r in kernel_rows("mmq_layer", weight_type="IQ2_XS", timed=True) if r.shape["tokens"] == 2048]
    assert c.flops == 2 * 20_480 * 640 * 2560 * 2 == 134_217_728_000
    assert c.bytes == 512 * 2 * 640 * 740 + 20_480 * 2880 + 2 * 20_480 * 640 * 4 == 648_806_400
    # causal attention of 100 queries at 0..99 over themselves, 4 heads of 64: 5,050 (query,
    # key) pairs, 4 * 64 * 2 operations a pair and head; q and out float32, each key's K and V
    # codes (64 + 64), two K scales and one V scale (4 bytes each), per KV head; the positions
    c = BY_ID["attention-prefill-100-hd64-s1-pair"]
    assert c.flops == 4 * 4 * 64 * 5050 == 5_171_200
    assert c.bytes == 2 * 100 * 4 * 64 * 4 + 100 * 4 * (128 + 12) + 400 == 261_200
    # the router product at 301 tokens, BF16 512 x 2560
    c = BY_ID["float_dense-T301-N512-K2560-BF16-tile"]
    assert c.flops == 2 * 301 * 512 * 2560 == 789_053_440
    assert c.bytes == 512 * 2560 * 2 + 301 * 2560 * 4 + 301 * 512 * 4 == 6_320_128
    # 37 tokens of 256 routed to 4 of 16 experts: x, the 148-entry table, 148 rows of 4 blocks
    c = BY_ID["quantize-T37-K256-E16-k4-D4"]
    assert c.flops == 0 and c.bytes == 37 * 256 * 4 + 148 * 4 + 148 * 4 * 144 == 123_728
    # grouped MMQ of the tiny gate: rows 0, 1, 9, 130, 0, 40, 3 (five experts with rows)
    c = BY_ID["mmq-tiny-512x256-Q4_1"]
    assert c.flops == 2 * 183 * 512 * 256
    assert c.bytes == 5 * 512 * 8 * 20 + 183 * 4 * 144 + 183 * 512 * 4


def test_sample_index_spreads_and_keeps_the_ends():
    assert sample_index(10, None).tolist() == list(range(10))
    assert sample_index(5, 8).tolist() == list(range(5))
    s = sample_index(32768, 8)
    assert s[0] == 0 and s[-1] == 32767 and len(s) == 8 and (s[1:] > s[:-1]).all()


def test_params_carry_the_id_and_the_quick_mark():
    rows = kernel_rows("add")
    ps = params(rows)
    assert [p.id for p in ps] == [c.id for c in rows]
    assert [any(m.name == "quick" for m in p.marks) for p in ps] == [c.quick for c in rows]


def test_keys_and_extra_info_are_json():
    for c in KERNEL_CASES:
        json.dumps({"shape": key_of(c.shape), "config": key_of(c.config)})
    assert key_of({"positions": range(3, 9), "rows": (1, 2)}) == {"positions": {"range": [3, 9]}, "rows": [1, 2]}


def test_the_gate_compiles_ahead_every_configuration_the_kernel_rows_load():
    from strata_prefill.verify.cases import ahead_modules, kernel_rows, mmq_configs

    mods = {(name, tuple(sorted(d.items()))) for name, d in ahead_modules()}
    configs = [c for c in mmq_configs() if c is not None]
    from strata_prefill.fast.cuda import products

    assert configs and all((name, tuple(sorted(d.items()))) in mods
                           for c in configs for name, d in products.mmq_modules(c))  # every type's build
    from strata_prefill.fast.cuda import attention

    for c in kernel_rows("attention_tile_config"):
        module = attention.ATTEND_TILE_MODULES[c.form]
        assert any(name == module and set(c.config.items()) <= set(d) for name, d in mods), c.id
    quick = {(name, tuple(sorted(d.items()))) for name, d in ahead_modules(quick=True)}
    assert quick <= mods
