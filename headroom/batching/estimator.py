"""Load estimators shared by the batcher's policies: arrival rate and per-batch service time.

Both are plain values updated by one owner (the batcher's event loop) with explicit times, so tests drive
them on a fake clock and the simulator can drive them with its own event times.

* Arrival rate: 1 / EWMA of inter-arrival gaps (unbiased for a Poisson stream, unlike an EWMA of 1/gap,
  which reads ~3.7x high at alpha 0.2), and it decays with time: read at `now`, the gap in progress counts
  as at least the current gap, so after a burst and 5 s of quiet the rate reads <= 0.2/s.
* Service time: measured batch service times (collate + predict + split + postprocess) fitted as
  `fixed + per_item x items`, warm-started with warmup's batches so it is not 0 before the first request.
  Each batch is also compared with what the fit predicted for it before it ran: the exponentially weighted
  mean and mean absolute deviation of that ratio give `tail_factor`, the factor that turns the fit's mean
  into a high quantile (admission predicts at it, so a queue is not filled up to the budget at the median).

`LoadEstimates` is one queue's pair of them and what the policies read from it: the snapshot handed to
`policy.decide` and the backlog handed to `admission.admit`. The server's batcher and the simulator each keep
one per queue and call the same methods, so both see the same windows for the same trace.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from headroom.batching.admission import Backlog
from headroom.batching.policy import QueuedItem, QueueSnapshot

DEFAULT_ALPHA = 0.2
#: One-sided standard-normal quantile of the tail admission predicts at (2.326: the 99th percentile, the SLO's).
TAIL_Z = 2.326
#: Weight of the newest batch in the dispersion estimate (slower than the fit's: ~40 batches of memory).
DISPERSION_ALPHA = 0.05
#: Standard deviation over mean absolute deviation for a normal distribution (sqrt(pi / 2)).
_SD_PER_MAD = math.sqrt(math.pi / 2)
#: A batch's measured / fitted ratio is clipped to this range before it enters the dispersion: one stall
#: (a GC pause, a descheduled process) widens the tail for a while, but not without bound.
RATIO_CLIP = (0.25, 4.0)


def _check_alpha(alpha: float) -> None:
    if not 0.0 < alpha <= 1.0:
        raise ValueError(f"alpha must be in (0, 1], got {alpha}")


@dataclass(slots=True)
class ArrivalRateEstimator:
    """1 / EWMA(inter-arrival gap), decaying while no request arrives."""

    alpha: float = DEFAULT_ALPHA  # weight of the newest gap
    mean_gap_s: float = 0.0  # EWMA of gaps (0: fewer than two arrivals seen)
    last_arrival_s: float | None = None  # time of the latest arrival

    def __post_init__(self) -> None:
        _check_alpha(self.alpha)

    def observe(self, now_s: float) -> None:
        """Record an arrival at `now_s`."""
        if self.last_arrival_s is not None:
            gap_s = max(now_s - self.last_arrival_s, 0.0)
            self.mean_gap_s = gap_s if self.mean_gap_s == 0.0 else self.mean_gap_s + self.alpha * (
                gap_s - self.mean_gap_s)
        self.last_arrival_s = now_s

    def rate_per_s(self, now_s: float) -> float:
        """Arrivals per second as seen at `now_s` (0 before two arrivals)."""
        if self.last_arrival_s is None or self.mean_gap_s <= 0.0:
            return 0.0
        return 1.0 / max(self.mean_gap_s, now_s - self.last_arrival_s)


@dataclass(slots=True)
class ServiceTimeEstimator:
    """Batch service time as a function of batch size, `fixed_s + per_item_s x items`, fitted by
    exponentially weighted least squares over measured batches (warm-started with warmup's batches), plus
    the EWMA of per-batch seconds (`mean_s`) that the adaptive window uses.

    A per-batch average alone mispredicts a queue: at overload the batches ahead are full and slow while
    the average is dominated by the many small, fast batches of quieter moments.

    The fit is a mean. How far measured batches stray from it is tracked as the ratio measured / fitted (the
    fit as it was before the batch): its EW mean (1 for an unbiased fit) and EW mean absolute deviation.
    `tail_factor` = max(1, mean + tail_z x sqrt(pi/2) x deviation) is the fit's mean scaled to the quantile
    `tail_z` of a normal with that spread; a noisy host (CPU shared with other processes) reads higher.
    """

    alpha: float = DEFAULT_ALPHA  # weight of the newest batch
    mean_s: float = 0.0  # EWMA of per-batch seconds
    tail_z: float = TAIL_Z  # the quantile (in standard deviations) `tail_factor` predicts at
    dispersion_alpha: float = DISPERSION_ALPHA  # weight of the newest batch in the ratio's mean and deviation
    ratio_mean: float = 1.0  # EW mean of measured / fitted batch time
    ratio_deviation: float = 0.0  # EW mean absolute deviation of that ratio
    _w: float = 0.0  # decayed sums for the weighted least-squares fit
    _n: float = 0.0
    _t: float = 0.0
    _nn: float = 0.0
    _nt: float = 0.0

    def __post_init__(self) -> None:
        _check_alpha(self.alpha)
        _check_alpha(self.dispersion_alpha)
        if self.mean_s < 0.0:
            raise ValueError(f"a service time is >= 0 s, got {self.mean_s}")
        if not 0.0 <= self.tail_z < math.inf:
            raise ValueError(f"tail_z must be finite and >= 0, got {self.tail_z}")

    def observe(self, service_s: float, items: int = 1) -> None:
        """Record one executed batch of `items` items that took `service_s`."""
        fitted_s = self._predicted_s(items)
        if fitted_s > 0.0:  # how far this batch strays from what the fit predicted for it
            ratio = min(max(service_s / fitted_s, RATIO_CLIP[0]), RATIO_CLIP[1])
            gap = ratio - self.ratio_mean
            self.ratio_mean += self.dispersion_alpha * gap
            self.ratio_deviation += self.dispersion_alpha * (abs(gap) - self.ratio_deviation)
        self.mean_s = service_s if self.mean_s == 0.0 else self.mean_s + self.alpha * (service_s - self.mean_s)
        keep = 1.0 - self.alpha if self._w else 0.0
        n = float(max(items, 1))
        self._w = keep * self._w + 1.0
        self._n = keep * self._n + n
        self._t = keep * self._t + service_s
        self._nn = keep * self._nn + n * n
        self._nt = keep * self._nt + n * service_s

    def fit(self) -> tuple[float, float]:
        """(fixed_s, per_item_s), both >= 0; all of a batch's time per item while sizes have not varied."""
        if self._w == 0.0:
            return 0.0, 0.0
        spread = self._w * self._nn - self._n * self._n
        if spread > 1e-9 * self._w * self._nn:
            per_item_s = (self._w * self._nt - self._n * self._t) / spread
            fixed_s = (self._t - per_item_s * self._n) / self._w
            if per_item_s >= 0.0 and fixed_s >= 0.0:
                return fixed_s, per_item_s
        return 0.0, self._t / self._n

    def _predicted_s(self, items: int) -> float:
        """The fit's time for a batch of `items`; 0 without a fit, or when every batch so far had one other
        size (a guess from one size, e.g. warmup's second batch, says nothing about the dispersion)."""
        n = float(max(items, 1))
        if self._w == 0.0:
            return 0.0
        one_size = self._w * self._nn - self._n * self._n <= 1e-9 * self._w * self._nn
        if one_size and abs(n * self._w - self._n) > 1e-9 * self._n:
            return 0.0
        fixed_s, per_item_s = self.fit()
        return fixed_s + per_item_s * n

    def tail_factor(self) -> float:
        """The fit's mean times this is the `tail_z` quantile of batch time (>= 1; 1 before any spread)."""
        return max(1.0, self.ratio_mean + self.tail_z * _SD_PER_MAD * self.ratio_deviation)


@dataclass(slots=True)
class LoadEstimates:
    """The arrival-rate and service-time estimates of one queue, and the policies' views of them."""

    arrivals: ArrivalRateEstimator = field(default_factory=ArrivalRateEstimator)
    service: ServiceTimeEstimator = field(default_factory=ServiceTimeEstimator)

    def snapshot(self, items: Sequence[QueuedItem], now_s: float) -> QueueSnapshot:
        """What `policy.decide` sees of the queue at `now_s`."""
        return QueueSnapshot(items=tuple(items), arrival_rate_per_s=self.arrivals.rate_per_s(now_s),
                             service_time_s=self.service.mean_s)

    def backlog(self, requests_ahead: int, max_batch_size: int, instances: int) -> Backlog:
        """What `admission.admit` sees ahead of a new request."""
        fixed_s, per_item_s = self.service.fit()
        return Backlog(requests_ahead=requests_ahead, fixed_s=fixed_s, per_item_s=per_item_s,
                       max_batch_size=max_batch_size, instances=instances, tail_factor=self.service.tail_factor())
