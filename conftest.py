"""Fixtures shared by tests/ and verify/: synthetic packs, made once and kept; and the gate's
plumbing (workers sized to the machine, its last lines: verify/gate.py)."""
import pytest

from strata_prefill.formats.make_pack import make_pack
from strata_prefill.contract.quants import SUPPORTED_TYPES
from strata_prefill.verify import gate

EXPERT_TYPES = [t.name for t in SUPPORTED_TYPES]  # the registry's (contract/qformats.py)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """Before pytest-xdist reads -n: give the run its workers and their BLAS threads."""
    gate.plan_workers(config)


def pytest_configure(config):
    gate.configure(config)


def pytest_sessionstart(session):
    gate.start_ahead(session.config)


@pytest.fixture(scope="session")
def make_test_pack(tmp_path_factory):
    """make_test_pack(preset, expert_type="Q8_0", **kw) -> Pack, made once per arguments and
    kept on disk between sessions (verify/gate.py:kept_pack), so workers and later runs share
    one file (and the reference cache, keyed by the pack's content, hits)."""
    from strata_prefill.formats.pack import Pack

    cache = {}

    def get(preset="tiny", expert_type="Q8_0", **kw):
        key = (preset, expert_type, tuple(sorted(kw.items())))
        if key not in cache:
            path = gate.kept_pack(preset, expert_type, kw, tmp_path_factory)
            cache[key] = Pack.open(path)
        return cache[key]

    return get
