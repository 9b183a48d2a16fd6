"""Deadline-aware admission (pure): predicted delay from the backlog against the request's budget."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headroom.batching.admission import Backlog, admit, refusal_message


def test_nothing_ahead_is_always_admitted_even_if_one_batch_overruns_the_budget() -> None:
    decision = admit(Backlog(requests_ahead=0, fixed_s=0.5, per_item_s=0.0, max_batch_size=8), budget_s=0.1)
    assert decision.admitted and decision.predicted_s == 0.5 and decision.retry_after_s == 0.0


@pytest.mark.parametrize(
    ("ahead", "batch", "instances", "budget_s", "admitted", "predicted_s", "retry_s"),
    [
        (8, 8, 1, 0.1, True, 2 * 0.01 + 9 * 0.00125, 0.01 + 8 * 0.00125),  # a full batch ahead, then its own
        (7, 8, 1, 0.1, True, 0.01 + 8 * 0.00125, 0.01 + 7 * 0.00125),  # it joins the batch ahead
        (40, 8, 1, 0.1, False, 6 * 0.01 + 41 * 0.00125, 5 * 0.01 + 40 * 0.00125),  # 111 ms > 100 ms
        (40, 8, 2, 0.1, True, (6 * 0.01 + 41 * 0.00125) / 2, (5 * 0.01 + 40 * 0.00125) / 2),  # two instances
        (3, 1, 1, 0.04, False, 4 * 0.01125, 3 * 0.01125),  # a model that does not batch: 45 ms > 40 ms
    ],
)
def test_predicted_delay_drains_the_queue_in_batches_of_fixed_plus_per_item_time(
        ahead: int, batch: int, instances: int, budget_s: float, admitted: bool, predicted_s: float,
        retry_s: float) -> None:
    decision = admit(Backlog(ahead, 0.01, 0.00125, batch, instances), budget_s)
    assert decision.admitted is admitted
    assert decision.predicted_s == pytest.approx(predicted_s)
    assert decision.retry_after_s == pytest.approx(retry_s)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(ahead=st.integers(0, 10_000), fixed_s=st.floats(0.0, 1.0), per_item_s=st.floats(0.0, 0.1),
       batch=st.integers(1, 256), instances=st.integers(1, 8), budget_s=st.floats(0.0, 60.0),
       more=st.integers(1, 1000), tail=st.floats(1.0, 5.0))
def test_admission_is_monotonic_in_the_backlog_and_the_budget(ahead: int, fixed_s: float, per_item_s: float,
                                                             batch: int, instances: int, budget_s: float,
                                                             more: int, tail: float) -> None:
    base = admit(Backlog(ahead, fixed_s, per_item_s, batch, instances, tail), budget_s)
    longer_queue = admit(Backlog(ahead + more, fixed_s, per_item_s, batch, instances, tail), budget_s)
    larger_budget = admit(Backlog(ahead, fixed_s, per_item_s, batch, instances, tail), budget_s * 2 + 1.0)
    wider_tail = admit(Backlog(ahead, fixed_s, per_item_s, batch, instances, tail + 0.5), budget_s)
    assert not (longer_queue.admitted and not base.admitted)
    assert not (base.admitted and not larger_budget.admitted)
    assert not (wider_tail.admitted and not base.admitted)
    assert longer_queue.retry_after_s >= base.retry_after_s
    assert math.isfinite(base.predicted_s) and base.retry_after_s <= base.predicted_s


def test_the_tail_factor_scales_the_prediction_but_not_the_retry_after() -> None:
    """40 ahead in batches of 8 at 10 ms + 1.25 ms per item predict 111.25 ms at the mean. With batch times
    spread so that their p99 is 1.3x the fit, the same backlog predicts 144.6 ms: over a 130 ms budget that
    the mean would have fitted; the backlog still drains in 100 ms on average (Retry-After)."""
    at_mean = admit(Backlog(40, 0.01, 0.00125, 8), budget_s=0.13)
    at_tail = admit(Backlog(40, 0.01, 0.00125, 8, tail_factor=1.3), budget_s=0.13)
    assert at_mean.admitted and at_mean.predicted_s == pytest.approx(0.11125)
    assert not at_tail.admitted and at_tail.predicted_s == pytest.approx(0.144625)
    assert at_tail.retry_after_s == at_mean.retry_after_s == pytest.approx(0.1)
    assert admit(Backlog(0, 0.5, 0.0, tail_factor=3.0), budget_s=0.1).admitted  # nothing ahead: still admitted


@pytest.mark.parametrize("bad", [dict(requests_ahead=-1), dict(fixed_s=-0.1), dict(per_item_s=-1e-3),
                                 dict(max_batch_size=0), dict(instances=0), dict(tail_factor=0.9),
                                 dict(tail_factor=math.inf), dict(tail_factor=math.nan)])
def test_backlog_validates(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Backlog(**{"requests_ahead": 1, "fixed_s": 0.01, "per_item_s": 0.001, **bad})  # type: ignore[arg-type]


def test_refusal_message_says_why_with_the_numbers() -> None:
    backlog = Backlog(40, 0.01, 0.00125, 8, tail_factor=1.25)
    text = refusal_message("minilm", backlog, admit(backlog, 0.1), 0.1)
    assert ("model 'minilm' is overloaded: 40 requests ahead (batches of up to 8 at 10.0 ms + 1.25 ms per item, "
            "x1.25 for the tail of measured delays)") in text
    assert "predict 139 ms" in text and "latency budget of 100 ms" in text and "retry after 0.10 s" in text
