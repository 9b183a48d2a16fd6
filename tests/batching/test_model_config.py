"""A request's latency budget at the server (`latency_budget_ms`): the shorter of the model's SLO and the client's
timeout, less the config's `slo_reserve_fraction`, the share kept for the time only the client sees."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headroom.batching.model_config import latency_budget_ms
from headroom.models.config import parse_model_config

BASE = {
    "backend": "python",
    "max_batch_size": 4,
    "inputs": [{"name": "x", "datatype": "FP32", "shape": [1]}],
    "outputs": [{"name": "y", "datatype": "FP32", "shape": [1]}],
}


def test_the_default_reserve_keeps_a_tenth_of_the_slo() -> None:
    cfg = parse_model_config({**BASE, "dynamic_batching": {"slo_p99_ms": 100}}, "m")
    assert cfg.batching.slo_reserve_fraction == 0.1
    assert latency_budget_ms(cfg, None) == pytest.approx(90.0)
    assert latency_budget_ms(cfg, 50.0) == pytest.approx(45.0)  # the client's shorter timeout, less the reserve
    assert latency_budget_ms(cfg, 500.0) == pytest.approx(90.0)  # a longer one never lengthens the SLO


@given(slo_ms=st.floats(1.0, 1e5), timeout_ms=st.none() | st.floats(0.5, 1e6), reserve=st.floats(0.0, 0.5))
def test_the_budget_is_the_shorter_bound_less_the_reserve(slo_ms: float, timeout_ms: float | None,
                                                          reserve: float) -> None:
    cfg = parse_model_config({**BASE, "dynamic_batching": {"slo_p99_ms": slo_ms, "slo_reserve_fraction": reserve}},
                             "m")
    bound = slo_ms if timeout_ms is None else min(slo_ms, timeout_ms)
    assert latency_budget_ms(cfg, timeout_ms) == pytest.approx(bound * (1 - reserve))


def test_without_an_slo_the_default_timeout_is_the_bound() -> None:
    cfg = parse_model_config({**BASE, "dynamic_batching": {"default_timeout_ms": 2000, "slo_reserve_fraction": 0}},
                             "m")
    assert latency_budget_ms(cfg, None) == 2000.0


BAD_VALUES = [
    *(("slo_reserve_fraction", v) for v in (-0.01, 0.51, 1.0, 7, math.nan, math.inf, -math.inf, "0.1", True, None,
                                             [0.1])),
    *(("refusal_pacing_ratio", v) for v in (-0.01, -4, math.nan, math.inf, "4", True, None, [4])),
]  # the reserve within 0..0.5; the pacing ratio a number >= 0 (0: off)


@pytest.mark.parametrize(("field", "bad"), BAD_VALUES)
def test_a_bad_reserve_or_pacing_ratio_is_refused_naming_the_field(field: str, bad: object) -> None:
    with pytest.raises(ValueError, match=field):
        parse_model_config({**BASE, "dynamic_batching": {field: bad}}, "m")


@given(st.floats(0.0, 0.5))
def test_every_reserve_in_range_is_accepted(reserve: float) -> None:
    cfg = parse_model_config({**BASE, "dynamic_batching": {"slo_reserve_fraction": reserve}}, "m")
    assert cfg.batching.slo_reserve_fraction == reserve


@given(st.floats(0.0, 1e6))
def test_every_refusal_pacing_ratio_from_0_is_accepted(ratio: float) -> None:
    """0 turns pacing off; the default is 8 (headroom.batching.refusal_pacing.STORM_RATIO)."""
    cfg = parse_model_config({**BASE, "dynamic_batching": {"refusal_pacing_ratio": ratio}}, "m")
    assert cfg.batching.refusal_pacing_ratio == ratio
    assert parse_model_config(BASE, "m").batching.refusal_pacing_ratio == 8.0
