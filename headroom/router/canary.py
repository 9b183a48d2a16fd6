"""Canary rollout mechanism for the proxy: split requests by version, keep per-step stats, apply `rollout`.

Replicas whose `Upstream.version` equals `canary_version` form the canary arm, every other replica the
baseline arm. Each request draws its arm with `rollout.pick_version(weight, rng)`; an arm with no routable
replica sends the request to the other arm. `evaluate(now_s)` (called by the proxy's health-check loop)
feeds the current step's stats to the pure `rollout.evaluate`, resetting them when a step ends.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field

from headroom.router import rollout
from headroom.router.tail import LatencyWindow

log = logging.getLogger("headroom.router.canary")


@dataclass
class _ArmStats:
    requests: int = 0
    errors: int = 0
    latencies: LatencyWindow = field(default_factory=lambda: LatencyWindow(max_samples=2000))

    def stats(self) -> rollout.VersionStats:
        return rollout.VersionStats(self.requests, self.errors, self.latencies.percentile_s(0.99) or 0.0)


class CanaryTracker:
    """Owns the rollout state and this step's per-arm stats (one event loop)."""

    def __init__(self, canary_version: str, config: rollout.CanaryConfig, now_s: float) -> None:
        if not canary_version:
            raise ValueError("canary_version must name the version the canary replicas serve")
        self.canary_version = canary_version
        self.config = config
        self.state = rollout.start(now_s)
        self.weight = config.steps[0]
        self.arms = {"canary": _ArmStats(), "baseline": _ArmStats()}
        self.history: list[rollout.RolloutDecision] = []

    def pick(self, rng: random.Random) -> str:
        return rollout.pick_version(self.weight, rng)

    def in_arm(self, arm: str, version: str) -> bool:
        return (version == self.canary_version) == (arm == "canary")

    def record(self, arm: str, failed: bool, latency_s: float) -> None:
        s = self.arms[arm]
        s.requests += 1
        s.errors += failed
        if not failed:
            s.latencies = s.latencies.add(latency_s)

    def evaluate(self, now_s: float, canary_ejected: bool = False) -> rollout.RolloutDecision:
        decision, self.state = rollout.evaluate(self.arms["baseline"].stats(), self.arms["canary"].stats(),
                                                self.state, now_s, self.config, canary_ejected)
        if decision.canary_weight != self.weight or decision.phase != (self.history[-1].phase if self.history
                                                                        else "progressing"):
            log.warning("event=rollout_%s version=%s canary_weight=%.2f reason=%s", decision.phase,
                        self.canary_version, decision.canary_weight, decision.reason)
            self.history.append(decision)
        self.weight = decision.canary_weight
        if decision.reset_stats:
            self.arms = {"canary": _ArmStats(), "baseline": _ArmStats()}
        return decision
