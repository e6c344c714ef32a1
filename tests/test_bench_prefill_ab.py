"""bench/bench_prefill_cuda.py --ab: the arm-B assignments are checked before any work (a name
outside the per-launch variables, a value its reader refuses) and leave the environment as it was."""
import os

import pytest

from bench import bench_prefill_cuda as bp
from strata_prefill.contract.errors import InputError
from strata_prefill.fast.cuda import products


def test_assignments_taken_and_environment_kept(monkeypatch):
    monkeypatch.delenv(products.DEFINES_ENV, raising=False)
    monkeypatch.setenv(products.CONFIG_ENV, '{"MMQ_BN": 64}')
    got = bp.ab_assignments([f'{products.DEFINES_ENV}={{"MMQ_MIX_AT": 1}}', f"{products.CONFIG_ENV}={{}}"])
    assert got == {products.DEFINES_ENV: '{"MMQ_MIX_AT": 1}', products.CONFIG_ENV: "{}"}
    assert products.DEFINES_ENV not in os.environ  # checked, then put back
    assert os.environ[products.CONFIG_ENV] == '{"MMQ_BN": 64}'


@pytest.mark.parametrize("item, words", [
    ("STRATA_PREFILL_TIMING=1", "NAME one of"),  # read once, not at each launch
    ("STRATA_MMQ_DEFINES", "NAME=VALUE"),
    ('STRATA_MMQ_DEFINES={"MMQ_BN": 1.5}', "of integers"),
    ("STRATA_MMQ_CONFIG=[1]", "JSON object"),
])
def test_bad_assignment_is_one_line(monkeypatch, item, words):
    monkeypatch.delenv(products.DEFINES_ENV, raising=False)
    monkeypatch.delenv(products.CONFIG_ENV, raising=False)
    with pytest.raises(InputError, match=words):
        bp.ab_assignments([item])
    assert products.DEFINES_ENV not in os.environ and products.CONFIG_ENV not in os.environ


def test_command_line_refuses_before_loading(capsys):
    with pytest.raises(SystemExit) as e:
        bp.main(["--pack", "/nonexistent.gguf", "--ab", "FOO=1"])
    assert e.value.code == 2 and "NAME one of" in capsys.readouterr().err
