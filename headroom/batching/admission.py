"""Deadline-aware admission: admit a request only if its predicted delay fits its latency budget.

A pure function of (backlog, budget): no clock, no state. The batcher calls it on every submit, and the
HTTP route calls it through the data plane before reading the body, with the budget the headers allow.
Batch service time is modelled as `fixed_s + per_item_s x items` (`headroom.batching.estimator`), and
the queue is served in batches of up to `max_batch_size`, `instances` at a time:

    drain_s(k)     = (ceil(k / max_batch_size) x fixed_s + k x per_item_s) / instances
    predicted_s    = tail_factor x drain_s(requests_ahead + 1)   # the queue ahead, then the request itself
    admit          = requests_ahead == 0 or predicted_s <= budget_s
    retry_after_s  = drain_s(requests_ahead)          # time for the backlog to drain (its expected value)

The fit predicts the *mean* batch time. Admitting at the mean lets the queue fill until the typical request
just meets the budget, so the slower half of them miss it. `tail_factor` (>= 1) turns the prediction into a
high quantile, so a request is admitted only if its delay fits the budget at that quantile. It is the
dispersion of batch times around the fit (`ServiceTimeEstimator.tail_factor`: mean + z x standard deviation
of measured / fitted), corrected by a feedback loop on the admitted requests' own delays
(`headroom.batching.calibration`: at most 1% of close calls may finish past their budget).

A request with nothing ahead of it is always admitted: it is the fastest the model can serve, and its batch
keeps the service-time estimate current. The budget is the smaller of the model's SLO (its default timeout
when no SLO is configured) and the client's timeout, minus the time already spent. Requests are counted
as one item each (a multi-item request counts once).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Backlog:
    """What is ahead of a new request at one model version."""

    requests_ahead: int  # admitted and not yet answered (queued, preprocessing or executing)
    fixed_s: float  # estimated seconds per batch regardless of its size
    per_item_s: float  # estimated seconds per item in a batch
    max_batch_size: int = 1  # requests one batch can take (1 for a model that does not batch)
    instances: int = 1  # batches that execute concurrently
    tail_factor: float = 1.0  # a high quantile of batch time over the fit's mean (1: predict at the mean)

    def __post_init__(self) -> None:
        if self.requests_ahead < 0 or self.fixed_s < 0 or self.per_item_s < 0:
            raise ValueError("requests_ahead, fixed_s and per_item_s must be >= 0")
        if self.max_batch_size < 1 or self.instances < 1:
            raise ValueError("max_batch_size and instances must be >= 1")
        if not 1.0 <= self.tail_factor < math.inf:
            raise ValueError(f"tail_factor must be finite and >= 1, got {self.tail_factor}")

    def drain_s(self, items: int) -> float:
        """Seconds to serve `items` requests from an empty start, in batches of up to max_batch_size."""
        batches = math.ceil(items / self.max_batch_size)
        return (batches * self.fixed_s + items * self.per_item_s) / self.instances


@dataclass(frozen=True, slots=True)
class AdmissionDecision:
    """The verdict and the numbers behind it (they go into the 503's message)."""

    admitted: bool  # False: answer 503 with Retry-After
    predicted_s: float  # predicted time until the request's own batch finishes, at the tail quantile
    expected_s: float  # the same at the fit's mean (what the delay calibration judges the factor by)
    retry_after_s: float  # predicted time for the backlog ahead to drain


def admit(backlog: Backlog, budget_s: float) -> AdmissionDecision:
    """Admit unless the backlog ahead plus the request itself would overrun `budget_s`."""
    expected_s = backlog.drain_s(backlog.requests_ahead + 1)
    predicted_s = backlog.tail_factor * expected_s
    admitted = backlog.requests_ahead == 0 or predicted_s <= budget_s
    return AdmissionDecision(admitted=admitted, predicted_s=predicted_s, expected_s=expected_s,
                             retry_after_s=backlog.drain_s(backlog.requests_ahead))


def refusal_message(model: str, backlog: Backlog, decision: AdmissionDecision, budget_s: float) -> str:
    """Why a request was refused, for the 503's JSON body."""
    return (
        f"model '{model}' is overloaded: {backlog.requests_ahead} requests ahead (batches of up to "
        f"{backlog.max_batch_size} at {backlog.fixed_s * 1e3:.1f} ms + {backlog.per_item_s * 1e3:.2f} ms per "
        f"item, x{backlog.tail_factor:.2f} for the tail of measured delays) predict "
        f"{decision.predicted_s * 1e3:.0f} ms until this request is served, over its latency budget of "
        f"{budget_s * 1e3:.0f} ms (the model's SLO or the client's timeout, whichever is shorter, less the time "
        f"already spent and the config's slo_reserve_fraction); retry after "
        f"{decision.retry_after_s:.2f} s"
    )
