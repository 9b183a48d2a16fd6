"""Deadline-aware admission (pure): predicted delay from the backlog against the request's budget."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headroom.batching.admission import Backlog, admit, refusal_message


def test_nothing_ahead_is_always_admitted_even_if_one_batch_overruns_the_budget() -> None:
    decision = admit(Backlog(requests_ahead=0, service_time_s=0.5, max_batch_size=8), budget_s=0.1)
    assert decision.admitted and decision.predicted_s == 0.5 and decision.retry_after_s == 0.0


@pytest.mark.parametrize(
    ("ahead", "service_s", "batch", "instances", "budget_s", "admitted", "predicted_s", "retry_s"),
    [
        (8, 0.02, 8, 1, 0.1, True, 0.04, 0.02),  # one full batch ahead, then its own: 40 ms
        (9, 0.02, 8, 1, 0.1, True, 0.06, 0.04),  # a ninth request opens a second batch ahead
        (40, 0.02, 8, 1, 0.1, False, 0.12, 0.10),  # five batches ahead: 120 ms > 100 ms
        (40, 0.02, 8, 2, 0.1, True, 0.06, 0.05),  # two instances halve it
        (3, 0.4, 1, 1, 0.1, False, 1.6, 1.2),  # a model that does not batch
    ],
)
def test_predicted_delay_is_batches_ahead_plus_its_own_times_service(
        ahead: int, service_s: float, batch: int, instances: int, budget_s: float, admitted: bool,
        predicted_s: float, retry_s: float) -> None:
    decision = admit(Backlog(ahead, service_s, batch, instances), budget_s)
    assert decision.admitted is admitted
    assert decision.predicted_s == pytest.approx(predicted_s)
    assert decision.retry_after_s == pytest.approx(retry_s)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(ahead=st.integers(0, 10_000), service_s=st.floats(0.0, 5.0), batch=st.integers(1, 256),
       instances=st.integers(1, 8), budget_s=st.floats(0.0, 60.0), more=st.integers(1, 1000))
def test_admission_is_monotonic_in_the_backlog_and_the_budget(ahead: int, service_s: float, batch: int,
                                                             instances: int, budget_s: float, more: int) -> None:
    base = admit(Backlog(ahead, service_s, batch, instances), budget_s)
    longer_queue = admit(Backlog(ahead + more, service_s, batch, instances), budget_s)
    larger_budget = admit(Backlog(ahead, service_s, batch, instances), budget_s * 2 + 1.0)
    assert not (longer_queue.admitted and not base.admitted)
    assert not (base.admitted and not larger_budget.admitted)
    assert longer_queue.retry_after_s >= base.retry_after_s
    assert math.isfinite(base.predicted_s) and base.retry_after_s <= base.predicted_s


@pytest.mark.parametrize("bad", [dict(requests_ahead=-1), dict(service_time_s=-0.1), dict(max_batch_size=0),
                                 dict(instances=0)])
def test_backlog_validates(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Backlog(**{"requests_ahead": 1, "service_time_s": 0.01, **bad})  # type: ignore[arg-type]


def test_refusal_message_says_why_with_the_numbers() -> None:
    backlog = Backlog(40, 0.02, 8)
    text = refusal_message("minilm", backlog, admit(backlog, 0.1), 0.1)
    assert "model 'minilm' is overloaded: 40 requests ahead at 20.0 ms per batch" in text
    assert "predict 120 ms" in text and "latency budget of 100 ms" in text and "retry after 0.10 s" in text
