"""What every verify/ test reports to the gate's last lines (verify/gate.py): whether it is a
kernel row or a parity row, the case it covers, and the reference cache's hits and misses
during it. Set in the process that runs the test; read where the results are gathered."""
import pytest

from verify.cases import KernelCase, ParityCase


def _row_of(item):
    params = getattr(getattr(item, "callspec", None), "params", {})
    for v in params.values():
        if isinstance(v, (KernelCase, ParityCase)):
            return v
    return None


def pytest_collection_modifyitems(items):
    """The longest parity rows first, so that no worker starts one at the end (a stable sort:
    every worker collects the same order, as pytest-xdist needs)."""
    def cost(item):
        row = _row_of(item)
        return -row.cost if isinstance(row, ParityCase) else 0

    items.sort(key=cost)


@pytest.fixture(autouse=True)
def _gate_properties(request):
    from strata_prefill import refcache

    row = _row_of(request.node)
    before = refcache.stats()
    yield
    props = request.node.user_properties
    if isinstance(row, KernelCase):
        props.append(("gate_kind", "kernel"))
        props.append(("gate_case", row.id))
    elif isinstance(row, ParityCase):
        props.append(("gate_kind", "parity"))
        props.append(("gate_case", row.case_key))
    after = refcache.stats()
    props.append(("gate_ref_hits", after["hits"] - before["hits"]))
    props.append(("gate_ref_misses", after["misses"] - before["misses"]))
