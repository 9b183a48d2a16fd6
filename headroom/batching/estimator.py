"""Load estimators shared by the batcher's policies: arrival rate and per-batch service time.

Both are plain values updated by one owner (the batcher's event loop) with explicit times, so tests drive
them on a fake clock and the simulator can drive them with its own event times.

* Arrival rate: 1 / EWMA of inter-arrival gaps (unbiased for a Poisson stream, unlike an EWMA of 1/gap,
  which reads ~3.7x high at alpha 0.2), and it decays with time: read at `now`, the gap in progress counts
  as at least the current gap, so after a burst and 5 s of quiet the rate reads <= 0.2/s.
* Service time: measured batch service times (collate + predict + split + postprocess) fitted as
  `fixed + per_item x items`, warm-started with warmup's batches so it is not 0 before the first request.
* Delay calibration (`headroom.batching.calibration`): the factor that turns the fit's mean into the delay
  admission predicts, steered by whether the admitted requests met their budgets.

`LoadEstimates` is one queue's set of them and what the policies read from it: the snapshot handed to
`policy.decide` and the backlog handed to `admission.admit`. The server's batcher and the simulator each keep
one per queue and call the same methods, so both see the same windows for the same trace.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from headroom.batching.admission import Backlog
from headroom.batching.calibration import DelayCalibration
from headroom.batching.policy import QueuedItem, QueueSnapshot

DEFAULT_ALPHA = 0.2


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
    """

    alpha: float = DEFAULT_ALPHA  # weight of the newest batch
    mean_s: float = 0.0  # EWMA of per-batch seconds
    _w: float = 0.0  # decayed sums for the weighted least-squares fit
    _n: float = 0.0
    _t: float = 0.0
    _nn: float = 0.0
    _nt: float = 0.0

    def __post_init__(self) -> None:
        _check_alpha(self.alpha)
        if self.mean_s < 0.0:
            raise ValueError(f"a service time is >= 0 s, got {self.mean_s}")

    def observe(self, service_s: float, items: int = 1) -> None:
        """Record one executed batch of `items` items that took `service_s`."""
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


@dataclass(slots=True)
class LoadEstimates:
    """The arrival-rate, service-time and delay-calibration estimates of one queue, and the policies' views of
    them."""

    arrivals: ArrivalRateEstimator = field(default_factory=ArrivalRateEstimator)
    service: ServiceTimeEstimator = field(default_factory=ServiceTimeEstimator)
    delays: DelayCalibration = field(default_factory=DelayCalibration)

    def snapshot(self, items: Sequence[QueuedItem], now_s: float) -> QueueSnapshot:
        """What `policy.decide` sees of the queue at `now_s`."""
        return QueueSnapshot(items=tuple(items), arrival_rate_per_s=self.arrivals.rate_per_s(now_s),
                             service_time_s=self.service.mean_s)

    def backlog(self, requests_ahead: int, max_batch_size: int, instances: int, now_s: float) -> Backlog:
        """What `admission.admit` sees ahead of a new request, predicting at the delay calibration's factor
        (`headroom.batching.calibration`)."""
        fixed_s, per_item_s = self.service.fit()
        return Backlog(requests_ahead=requests_ahead, fixed_s=fixed_s, per_item_s=per_item_s,
                       max_batch_size=max_batch_size, instances=instances,
                       tail_factor=self.delays.factor_at(now_s))
