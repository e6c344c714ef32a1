"""bench/bench_prefill_cuda.py --ab: the arm-B assignments are checked before any work (a name
outside the per-launch variables, a value its reader refuses) and leave the environment as it was."""
import os

import numpy as np
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


class _Be:
    def reset_cache(self):
        pass


class _Eng:
    be = _Be()


class _Config:
    n_vocab = 50


def _session_by_environment(monkeypatch):
    """A stand-in Session whose logits depend on STRATA_MMQ_DEFINES (as a price probe's define
    changes the bytes): arm A's empty, arm B's set."""
    class Session:
        def __init__(self, eng, progress=False):
            pass

        def prefill(self, ids):
            return np.full(4, float(len(os.environ.get(products.DEFINES_ENV, ""))), np.float32)

    monkeypatch.setattr(bp, "Session", Session)
    monkeypatch.delenv(products.DEFINES_ENV, raising=False)


def test_an_ab_stops_where_the_logits_differ(monkeypatch, capsys):
    _session_by_environment(monkeypatch)
    got = bp.ab(_Eng(), _Config(), [8], 3, {products.DEFINES_ENV: '{"MMQ_MIX": 0}'}, np.random.default_rng(0))
    assert got == 1 and "round 0: the arms' logits differ" in capsys.readouterr().err
    assert products.DEFINES_ENV not in os.environ


def test_differ_counts_the_rounds_and_times_on(monkeypatch, capsys):
    _session_by_environment(monkeypatch)
    got = bp.ab(_Eng(), _Config(), [8, 16], 3, {products.DEFINES_ENV: '{"MMQ_MIX": 0}'},
                np.random.default_rng(0), differ=True)
    out = capsys.readouterr().out
    assert got == 0
    assert [l.split()[0] for l in out.splitlines() if "logits differ in 3 of 3 rounds" in l] == ["8", "16"]


def test_differ_needs_an_ab(capsys):
    with pytest.raises(SystemExit) as e:
        bp.main(["--pack", "/nonexistent.gguf", "--differ"])
    assert e.value.code == 2 and "--differ goes with --ab" in capsys.readouterr().err
