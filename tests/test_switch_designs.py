"""The parity gate's switch designs (verify/cases.py): the defaults first, and every pair of
switches meets all four value pairs. Checked here, where no GPU is needed, so a design that
loses a pair fails CI."""
import pytest

from strata_prefill.fast import options
from strata_prefill.arms import SWITCHES as ARM_SWITCHES
from strata_prefill.verify import cases

#: the design's switches' defaults, as the switch table has them (on/off switches: 0 or 1)
DEFAULTS = {n: int(getattr(options.DEFAULTS, n)) for n in cases.SWITCH_NAMES}


def test_design_covers_every_pair_defaults_first():
    names, design = cases.SWITCH_NAMES, cases.SWITCH_DESIGN
    assert all(len(sw) == len(names) for sw in design)
    assert design[0] == tuple(DEFAULTS[n] for n in names)
    assert set(names) <= set(ARM_SWITCHES)
    for i in range(len(names)):
        for j in range(i + 1, len(names)):
            assert {(sw[i], sw[j]) for sw in design} == {(0, 0), (0, 1), (1, 0), (1, 1)}, (names[i], names[j])


def test_every_cuda_arm_meets_every_weight_type():
    """The resident rows run each arm of the design on every spread expert type of both small
    packs (the mixes' types, cases.MIX_TYPES, get a few rows each: the next test), as the switch
    table's rule takes it (a switch that does nothing where every expert is resident left out)."""
    defaults = dict(zip(cases.SWITCH_NAMES, cases.SWITCH_DESIGN[0]))
    for sw in cases.SWITCH_DESIGN[1:]:
        for preset in ("tiny", "small"):
            arm = tuple(cases._settled("cuda", preset, (), {k: v for k, v in zip(cases.SWITCH_NAMES, sw)
                                                            if defaults[k] != v}).items())
            for etype in cases.SPREAD_TYPES:
                got = [c for c in cases.parity_rows("cuda", preset=preset, expert_type=etype) if c.arm == arm]
                assert len(got) >= 2, (arm, preset, etype)


def test_every_mix_type_runs_on_cuda_resident_and_streamed():
    """Each of the mixes' types (cases.MIX_TYPES) has cuda rows with the defaults and a streamed
    one, and no row at the spread's lengths past 600 tokens; each mix has its cuda row."""
    assert set(cases.MIX_TYPES).isdisjoint(cases.SPREAD_TYPES)
    assert set(cases.MIX_TYPES) | set(cases.SPREAD_TYPES) | set(cases.CODEBOOK_TYPES) == set(cases.EXPERT_TYPES)
    for etype in cases.MIX_TYPES:
        got = [c for c in cases.parity_rows("cuda", expert_type=etype) if not c.pack_options]
        assert any(not c.arm for c in got) and any(c.options.get("stream_min") for c in got), etype
        assert max(c.tokens for c in got) <= 600, etype
    mixes = {dict(c.pack_options).get("mix") for c in cases.parity_rows("cuda")}
    assert {"Q4_K_M", "Q2_K"} <= mixes


def test_every_codebook_type_runs_resident_streamed_in_place_gathered_and_dense():
    """Each codebook type (cases.CODEBOOK_TYPES) has, on both backends, rows with the defaults,
    streamed rows multiplied where the experts lie and gathered (in_place and ring_in_place 1
    and 0), a row on the small pack, and a row as the dense matrices' type."""
    assert set(cases.CODEBOOK_TYPES).isdisjoint(set(cases.SPREAD_TYPES) | set(cases.MIX_TYPES))
    assert set(cases.CODEBOOK_TYPES) == {"IQ4_NL", "IQ4_XS", "MXFP4", "NVFP4"}
    for backend in ("cuda", "sim"):
        for etype in cases.CODEBOOK_TYPES:
            got = [c for c in cases.parity_rows(backend, expert_type=etype) if not c.pack_options]
            assert any(not c.arm for c in got), (backend, etype)
            streamed = [c.options for c in got if c.options.get("stream_min")]
            for where in (0, 1):
                assert any(o.get("in_place") == where and o.get("ring_in_place") == where for o in streamed), \
                    (backend, etype, where)
            assert any(c.preset == "small" for c in got), (backend, etype)
            dense = [c for c in cases.parity_rows(backend) if dict(c.pack_options).get("dense_type") == etype]
            assert dense and all(c.expert_type != etype for c in dense), (backend, etype)
    assert any(c.quick and c.expert_type in cases.CODEBOOK_TYPES for c in cases.parity_rows("cuda"))


def test_no_row_sets_a_switch_the_rule_refuses():
    """Every parity row's arm passes the switch table's rule on its pack and placement (the
    cuda backend's auto cache taken to hold every expert, as the gate's GPUs do)."""
    from strata_prefill.formats.config import PRESETS

    for c in cases.PARITY_CASES:
        switches = {k: v for k, v in c.options.items() if k in options.BY_KEYWORD}
        layers = dict(c.pack_options).get("layers") or PRESETS[c.preset].n_layer
        n_expert = PRESETS[c.preset].n_expert
        total, cache = layers * n_expert, switches.get("expert_cache", options.AUTO)
        facts = options.placed_facts("fast", c.backend, total if cache == options.AUTO else int(cache), total,
                                     f"expert_cache {cache}", layers, n_expert)
        options.refuse_idle(switches, facts, environ={})
    assert len({c.name for c in cases.PARITY_CASES}) == len(cases.PARITY_CASES)


def test_every_switch_earlier_form_is_quick():
    """The quick tier runs each switch's other setting once."""
    quick = [c for c in cases.parity_rows("cuda") if c.quick]
    for name, default in DEFAULTS.items():
        assert any(c.options.get(name) == 1 - default for c in quick), name
    assert {c.expert_type for c in quick} >= set(cases.SPREAD_TYPES)
    assert {c.expert_type for c in quick} & set(cases.MIX_TYPES)
    assert any(c.options.get("copy_coalesce") == 1 for c in quick)
