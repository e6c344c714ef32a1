"""What every verify/ test reports to the gate's last lines (verify/gate.py): whether it is a
kernel row or a parity row, the case it covers, and the reference cache's hits and misses
during it. Set in the process that runs the test; read where the results are gathered."""
import pytest

from strata_prefill.verify.cases import KernelCase, ParityCase


def _row_of(item):
    params = getattr(getattr(item, "callspec", None), "params", {})
    for v in params.values():
        if isinstance(v, (KernelCase, ParityCase)):
            return v
    return None


def pytest_collection_modifyitems(items):
    """The order the workers take: the rows with no reference to wait for and the longest runs
    (32K against the fast path's own resident run) first, then the kernel rows (the benchmarked
    sizes, largest first), then the parity rows from the cheapest reference up, while verify/precompute.py computes the
    references from the costliest down (a stable sort: every worker collects the same order,
    as pytest-xdist needs). Where the gate has recorded this source's test times
    (verify/gate.py:record_durations), the longest first instead."""
    from strata_prefill.verify import gate

    seconds = gate.durations_for_order()
    if seconds:  # the last runs' times of this source: the longest first, a test not yet timed before all
        items.sort(key=lambda item: -seconds.get(item.nodeid, float("inf")))
        return

    def order(item):
        row = _row_of(item)
        if isinstance(row, KernelCase):  # the benchmarked sizes (up to 32K tokens) first
            return -float(row.bytes) if row.timed else 0.0
        if not isinstance(row, ParityCase):
            return 0.0
        return -1e15 - row.cost if row.base == "resident" else row.cost

    items.sort(key=order)


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
