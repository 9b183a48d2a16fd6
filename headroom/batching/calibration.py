"""Delay calibration: a feedback loop that keeps admitted requests within their budget at the SLO's rate.

Admission predicts a request's delay from the service-time fit (`admission.Backlog.drain_s`, at the fit's
mean). The fit is a model of *batches*; a request's real delay also holds what it leaves out: the noise of
batch times, the rest of the batch already running when the request arrived, the requests admitted after it
that join its own batch, the policy's window, and a host whose cores the HTTP work shares. Under overload
these decide whether an admitted request meets its SLO.

So admission predicts at `factor` x the mean, and the factor is steered by what happened to the requests it
admits (a stochastic-approximation quantile, multiplicative both ways):

* a request that finished past its budget raises the factor by `up` (x 1.05);
* a close call that made it (a prediction of at least `NEAR_BUDGET` of its budget) lowers it by
  `down` = up x miss_rate / (1 - miss_rate).

At equilibrium misses x up = hits x down, so at most `MISS_RATE` of close calls miss: a quarter of the
SLO's 1%, because misses come in clumps (one slow batch holds ~20 requests) and the time around the batcher
that admission cannot see (the HTTP parser, a client on the same cores) pushes some more past the SLO as the
client measures it (minilm at 2x capacity, 3 runs each: 0.5% gave the client a p99 of 96.8-100.8 ms,
0.25% 97.6-101.2 ms with steps of 5%; see BENCHMARKS.md). The steps are 5% up and 0.0125% down: after a
burst of misses (a stalled host) the factor comes back down at ~3% a second at that load, not ~1%.
Requests with budget to spare move nothing: an idle server does not talk itself into optimism. The factor
starts cautious (`INITIAL_FACTOR`) and relaxes back there once 3 s have passed without a miss
(`factor_at`, half-life 2 s): without that, the factor that a sweep's overloaded rates had raised stayed up at
moderate load and refused requests there long after. Close calls do not hold the relaxation off: a raised
factor makes close calls of ordinary requests (it predicts them near the budget), so counting them kept
minilm at x2.6 at 280 requests/s, where the accepted p99 was 40 ms against a 90 ms budget, and it refused
0.4% of requests (session 16). The quiet lasts 3 s, not 1: under overload, misses come in clumps a second or
two apart, and relaxing between them let the client's p99 drift to 96.5-101 ms (94.5 with 3 s). Relaxing
only downwards (leaving a factor the close calls had lowered below the start) was tried: at 350 requests/s
it admitted more, missed, and refused 3.1% instead of 0.9%.

Every finished request is judged *as the current factor would have admitted it*: a request admitted under a
smaller factor that the current one would refuse says nothing about the current factor, and is ignored.
Without that, the misses of a queue admitted before the first raise (one batch of them arrives at once) each
raised the factor again and drove it to its ceiling at the start of every overload, from where it took tens
of seconds to come down.

The server's batcher and the simulator each keep one per queue (`LoadEstimates.delays`) and feed it the
same way, so both admit the same for the same trace.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: A request is a close call when its prediction was at least this share of its budget.
NEAR_BUDGET = 0.5
#: The share of close calls allowed to miss their budget (a quarter of the SLO's 1%: see the module's text).
MISS_RATE = 0.0025
#: The factor's relative step up on a miss.
UP = 0.05
#: The factor's bounds: predict at least the fit's mean, and at most four times it.
FACTOR_RANGE = (1.0, 4.0)
#: Where the factor starts: cautious (minilm's batch times on a 2-core host: p99 ~1.7x the median), so the
#: first overload after start is not admitted at the mean; the loop lowers it as close calls make it.
INITIAL_FACTOR = 1.5
#: Seconds without a miss after which the factor relaxes back to `INITIAL_FACTOR` ...
QUIET_S = 3.0
#: ... halving its distance from it every this many seconds.
HALF_LIFE_S = 2.0


def is_close_call(predicted_s: float, budget_s: float) -> bool:
    """Was admitting a request with this prediction against `budget_s` a close call?"""
    return 0.0 < budget_s < math.inf and predicted_s >= NEAR_BUDGET * budget_s


@dataclass(slots=True)
class DelayCalibration:
    """The factor admission's mean prediction is scaled by, steered by admitted requests' outcomes."""

    factor: float = INITIAL_FACTOR  # admission predicts at factor x the fit's mean
    miss_rate: float = MISS_RATE  # the share of close calls allowed past their budget
    up: float = UP  # relative step up on a miss
    misses: int = 0  # requests past their budget that raised the factor (lifetime)
    close_calls: int = 0  # close calls within their budget that lowered it (lifetime)
    last_miss_s: float = -math.inf  # when the last miss raised the factor
    set_s: float = -math.inf  # when `factor` was last written (relaxation runs from then or the quiet's start)

    def __post_init__(self) -> None:
        if not 0.0 < self.miss_rate < 0.5:
            raise ValueError(f"miss_rate must be in (0, 0.5), got {self.miss_rate}")
        if not 0.0 < self.up < 1.0:
            raise ValueError(f"up must be in (0, 1), got {self.up}")
        if not FACTOR_RANGE[0] <= self.factor <= FACTOR_RANGE[1]:
            raise ValueError(f"factor must be within {FACTOR_RANGE}, got {self.factor}")

    @property
    def down(self) -> float:
        """Relative step down on a close call that made it: the equilibrium of `miss_rate` misses."""
        return self.up * self.miss_rate / (1.0 - self.miss_rate)

    def factor_at(self, now_s: float) -> float:
        """The factor as of `now_s`: after `QUIET_S` without a miss, relaxed back towards `INITIAL_FACTOR`
        (halving the distance every `HALF_LIFE_S`). What it learnt at the boundary is forgotten once the load
        left it: a burst of misses does not leave a moderately loaded server refusing requests."""
        start_s = max(self.set_s, self.last_miss_s + QUIET_S)
        if now_s <= start_s:
            return self.factor
        return INITIAL_FACTOR + (self.factor - INITIAL_FACTOR) * math.exp2(-(now_s - start_s) / HALF_LIFE_S)

    def observe(self, delay_s: float, budget_s: float, expected_s: float, now_s: float) -> None:
        """Record a request that finished at `now_s`: `delay_s` from its admission to the end of its batch,
        `budget_s` its latency budget then (inf: none), `expected_s` admission's mean prediction for it (0: none)."""
        if expected_s <= 0.0 or not 0.0 < budget_s < math.inf:
            return
        factor = self.factor_at(now_s)
        predicted_s = factor * expected_s
        if predicted_s > budget_s:
            return  # the current factor would have refused it
        if delay_s > budget_s:
            self.misses += 1
            self.last_miss_s = now_s
            factor = min(FACTOR_RANGE[1], factor * (1.0 + self.up))
        elif predicted_s >= NEAR_BUDGET * budget_s:
            self.close_calls += 1
            factor = max(FACTOR_RANGE[0], factor * (1.0 - self.down))
        else:
            return
        self.factor, self.set_s = factor, now_s
