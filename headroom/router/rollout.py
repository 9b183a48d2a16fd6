"""Canary rollout as a pure policy: canary weight 5% -> 50% -> 100%, rolled back automatically if worse.

The mechanism counts requests, errors and latencies per version for the current step and calls `evaluate`;
each step lasts at least `step_duration_s` and `min_requests` canary requests. The canary is rolled back
(weight 0, phase "rolled_back", terminal) as soon as it has `min_requests` requests in the step and

* its error rate exceeds the baseline's by more than `max_error_rate_increase` (absolute), or
* its p99 exceeds the baseline's p99 x `max_p99_ratio`.

It is also rolled back, whatever its request count, when every canary replica has been ejected by outlier
detection (consecutive failures): an ejected canary gets no traffic, so waiting for `min_requests` would hold
the rollout forever.

When a step passes, the weight moves to the next step and the decision says to reset the per-step stats.
`pick_version` splits a single request by the current weight with an injected RNG.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

PHASES = ("progressing", "complete", "rolled_back")


@dataclass(frozen=True, slots=True)
class CanaryConfig:
    """Rollout steps and rollback thresholds."""

    steps: tuple[float, ...] = (0.05, 0.5, 1.0)  # canary traffic share per step (issue 5: 5% -> 50% -> 100%)
    step_duration_s: float = 60.0  # minimum time spent at each step before promoting
    min_requests: int = 100  # canary requests a step needs before any verdict (enough to estimate a rate)
    max_error_rate_increase: float = 0.01  # roll back when canary errors exceed baseline's by > 1 point
    max_p99_ratio: float = 1.2  # roll back when canary p99 > 1.2 x baseline p99

    def __post_init__(self) -> None:
        if not self.steps or any(not 0.0 < w <= 1.0 for w in self.steps) or list(self.steps) != sorted(
                self.steps) or self.steps[-1] != 1.0:
            raise ValueError("steps must be increasing weights in (0, 1] ending at 1.0")
        if self.min_requests < 1 or self.step_duration_s < 0 or self.max_p99_ratio < 1.0:
            raise ValueError("need min_requests >= 1, step_duration_s >= 0, max_p99_ratio >= 1")


@dataclass(frozen=True, slots=True)
class VersionStats:
    """One version's results during the current step."""

    requests: int = 0  # finished requests
    errors: int = 0  # of which failed (5xx / timeouts)
    p99_s: float = 0.0  # 99th percentile latency of the successful ones

    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0


@dataclass(frozen=True, slots=True)
class RolloutState:
    """Where the rollout is."""

    step: int = 0  # index into CanaryConfig.steps
    step_started_s: float = 0.0  # when the current step began
    phase: str = "progressing"  # progressing | complete | rolled_back


@dataclass(frozen=True, slots=True)
class RolloutDecision:
    """The weight to apply now."""

    canary_weight: float  # share of traffic for the canary version, 0..1
    phase: str  # progressing | complete | rolled_back
    reset_stats: bool  # a new step started: start counting afresh
    reason: str  # human-readable why (logged)


def start(now_s: float) -> RolloutState:
    return RolloutState(step=0, step_started_s=now_s)


def _weight(state: RolloutState, cfg: CanaryConfig) -> float:
    if state.phase == "rolled_back":
        return 0.0
    return cfg.steps[min(state.step, len(cfg.steps) - 1)]


def evaluate(baseline: VersionStats, canary: VersionStats, state: RolloutState, now_s: float,
             cfg: CanaryConfig, canary_ejected: bool = False) -> tuple[RolloutDecision, RolloutState]:
    """Judge the current step; promote, hold, or roll back (`canary_ejected`: every canary replica is
    ejected for consecutive failures right now)."""
    if state.phase != "progressing":
        return RolloutDecision(_weight(state, cfg), state.phase, False, state.phase), state
    if canary_ejected:
        new = RolloutState(state.step, state.step_started_s, "rolled_back")
        why = (f"every canary replica was ejected for consecutive failures (canary error rate "
               f"{canary.error_rate():.3f} over {canary.requests} requests)")
        return RolloutDecision(0.0, "rolled_back", True, why), new
    if canary.requests < cfg.min_requests:
        return RolloutDecision(_weight(state, cfg), "progressing", False, "waiting for canary traffic"), state
    err_gap = canary.error_rate() - baseline.error_rate()
    if err_gap > cfg.max_error_rate_increase:
        new = RolloutState(state.step, state.step_started_s, "rolled_back")
        why = f"canary error rate {canary.error_rate():.3f} vs baseline {baseline.error_rate():.3f}"
        return RolloutDecision(0.0, "rolled_back", True, why), new
    if baseline.requests and baseline.p99_s > 0 and canary.p99_s > baseline.p99_s * cfg.max_p99_ratio:
        new = RolloutState(state.step, state.step_started_s, "rolled_back")
        why = f"canary p99 {canary.p99_s * 1e3:.1f} ms vs baseline {baseline.p99_s * 1e3:.1f} ms"
        return RolloutDecision(0.0, "rolled_back", True, why), new
    if now_s - state.step_started_s < cfg.step_duration_s:
        return RolloutDecision(_weight(state, cfg), "progressing", False, "step healthy, holding"), state
    if state.step + 1 >= len(cfg.steps):
        new = RolloutState(state.step, state.step_started_s, "complete")
        return RolloutDecision(1.0, "complete", True, "canary promoted to 100%"), new
    new = RolloutState(state.step + 1, now_s, "progressing")
    weight = cfg.steps[new.step]
    return RolloutDecision(weight, "progressing", True, f"promoted to {weight:.0%}"), new


def pick_version(canary_weight: float, rng: random.Random) -> str:
    """"canary" with probability `canary_weight`, else "baseline"."""
    return "canary" if rng.random() < canary_weight else "baseline"
