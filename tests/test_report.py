"""The first-difference report finds planted differences and names them exactly."""
import numpy as np
import pytest

from strata_prefill.contract import q8_1
from strata_prefill.report import compare_records, describe_q8_byte, diff_array, diff_q8_buffer


def q8_pairs(rng, rows=24, K=256, layout=q8_1.Layout.D4):
    x = rng.standard_normal((rows, K)).astype(np.float32)
    return q8_1.quantize_rows(x, layout)


@pytest.mark.parametrize("layout", list(q8_1.Layout))
def test_planted_code_byte_is_named(layout):
    rng = np.random.default_rng(1)
    a = q8_pairs(rng, layout=layout)
    b = a.copy()
    b[13, 1, 16 + 70] ^= 0x01  # row 13 = token 3 rank 1 (K=4), block 1, code 70
    b[20, 0, 16 + 3] ^= 0x80
    miss = diff_q8_buffer("L02.moe_in_q8_1", a, b, k_used=4, layout=layout)
    text = str(miss)
    assert "pair row 13 (token 3, rank 1)" in text
    assert "128-value block 1" in text and "32-value block 6" in text  # 4*1 + 70//32
    assert "byte 86" in text and "code 70" in text
    assert "2 of 96 blocks differ" in text


def test_planted_header_byte_is_named_by_layout():
    rng = np.random.default_rng(2)
    for layout, offset, word in [(q8_1.Layout.D4, 9, "d2 (float32 scale"),
                                 (q8_1.Layout.DS4, 6, "s1 (half sum"),
                                 (q8_1.Layout.D2S6, 2, "d1 (half scale"),
                                 (q8_1.Layout.D2S6, 8, "s2 (half sum")]:
        a = q8_pairs(rng, layout=layout)
        b = a.copy()
        b[5, 0, offset] ^= 0x10
        text = str(diff_q8_buffer("L00.down_in_q8_1", a, b, k_used=8, layout=layout))
        assert f"byte {offset} of the block" in text and word in text, text
        assert "token 0, rank 5" in text
    assert "code 0" in describe_q8_byte(16, q8_1.Layout.D4)


def test_planted_float_is_named_with_position_and_both_values():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((4, 256)).astype(np.float32)
    b = a.copy()
    b[2, 77] = np.nextafter(b[2, 77], np.float32(np.inf))  # one ulp
    miss = diff_array("L01.resid", a, b, positions=np.array([0, 64, 128, 192]))
    text = str(miss)
    assert "position 128" in text and "element 77 (32-value block 2)" in text
    assert f"0x{a[2, 77].view(np.uint32):08x}" in text and f"0x{b[2, 77].view(np.uint32):08x}" in text
    assert "1 of 1024 elements differ" in text


def test_compare_records_reports_the_earliest_layer_first():
    rng = np.random.default_rng(4)
    ra = {"L00.resid": rng.standard_normal((2, 8)).astype(np.float32),
          "L01.resid": rng.standard_normal((2, 8)).astype(np.float32),
          "L00.moe_in_q8_1": q8_pairs(rng, rows=8),
          "L00.slot": np.arange(8, dtype=np.int32)}
    rb = {k: v.copy() for k, v in ra.items()}
    rb["L01.resid"][0, 0] += 1
    rb["L00.moe_in_q8_1"][3, 0, 40] ^= 1
    rb["L00.slot"][0] = 5  # chunk-dependent: not compared
    miss = compare_records(ra, rb, k_used=2)
    assert miss.record == "L00.moe_in_q8_1"
    assert compare_records(ra, {k: v.copy() for k, v in ra.items()}, k_used=2) is None
    del rb["L01.resid"]
    rb["L00.moe_in_q8_1"] = ra["L00.moe_in_q8_1"].copy()
    assert "only in the first run" in str(compare_records(ra, rb, k_used=2))
