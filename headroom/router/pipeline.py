"""The router's request pipeline: the one place that applies the policies, for every transport (HTTP and gRPC).

Each step calls a pure policy (a function of snapshots, state, `now` and the injected RNG) and keeps the state
it returns; the transports (`headroom.router.proxy` for HTTP, `headroom.router.grpc_proxy` for gRPC) only move
bytes and translate outcomes. Per request:

    admit      shed.admit            coordinated shedding, then the adaptive (Vegas) concurrency limit
    degrade    degrade.rewrite       a fallback model under load or while the primary is ejected (HTTP: JSON/paths)
    arm        rollout.pick_version  the canary arm (an arm without a routable replica yields to the other)
    choose     policies.choose       a replica among the routable ones of that arm (health.apply stamps them)
    retry      tail.budget_withdraw  another replica for attempts that never started (or lost their connection)
    hedge      tail.hedge_delay_s    a backup copy after the p95 (HTTP), under the hedge budget
    finish     health.record_result  outlier ejection, readiness, peak-EWMA, latency window, canary stats, metrics
    done       shed.vegas_update     the limiter learns from the request's latency

The health-check loop feeds `record_checks` and `evaluate_rollout`. Everything here runs on the router's event
loop; nothing awaits.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence

from headroom.core.clock import Clock
from headroom.router import degrade, tail
from headroom.router import health as hp
from headroom.router.canary import CanaryTracker
from headroom.router.config import ProxyConfig
from headroom.router.metrics import RouterMetrics
from headroom.router.policies import choose
from headroom.router.prefix_index import PrefixIndex
from headroom.router.probes import record_probes
from headroom.router.request_keys import PrefixKey, RouteKey
from headroom.router.shed import Admission, ShedState, admit, vegas_initial, vegas_update
from headroom.router.snapshot import ReplicaSnapshot, RouterState, routable
from headroom.router.upstream import Attempt, ReplicaRuntime, Upstream

log = logging.getLogger("headroom.router")

#: Counters every transport shares (`/router/stats`, `headroom_router_events`).
COUNTERS = ("requests", "shed", "limited", "retries", "retries_denied", "hedges", "hedge_wins", "no_replica",
            "upstream_failed", "degraded", "degraded_on_error", "tied", "tied_unsent", "tied_withdrawn", "cancelled")


class Pipeline:
    """Owns the replica table and every policy's state; one instance per router, shared by its transports."""

    def __init__(self, config: ProxyConfig, clock: Clock, rng: random.Random, metrics: RouterMetrics,
                 prefix: PrefixIndex | None = None) -> None:
        self.config = config
        self.clock = clock
        self.rng = rng
        self.metrics = metrics
        self.prefix = prefix  # cache_aware: which KV blocks each replica holds
        self.replicas: dict[str, ReplicaRuntime] = {}
        self.health = hp.HealthState()
        self.route_state = RouterState()
        now = clock.now_s()
        self.retry_state = config.retry_budget.fresh(now)
        self.hedge_state = config.hedge_budget.fresh(now)
        self.latencies = tail.LatencyWindow()
        self.vegas = vegas_initial(config.vegas)
        self.shed_state = ShedState()  # RED's averaged utilisation
        self.inflight = 0  # admitted requests not yet answered (every transport)
        self.canary = CanaryTracker(config.canary_version, config.canary, now) if config.canary_version else None
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.breaker = degrade.BreakerState()  # per primary model: failures in a row, ejections

    # ------------------------------------------------------------------------------------ replica table
    def set_upstreams(self, upstreams: Sequence[Upstream]) -> None:
        """Replace the replica set. New replicas start not ready; removed ones lose their health and series."""
        wanted = {u.replica_id: u for u in upstreams}
        for rid in list(self.replicas):
            if rid not in wanted:
                del self.replicas[rid]
                self.health = self.health.without(rid)
                self.metrics.forget(rid)
        for rid, u in wanted.items():
            if rid in self.replicas:
                self.replicas[rid].upstream = u
            else:
                self.replicas[rid] = ReplicaRuntime(u)

    def snapshots(self) -> tuple[ReplicaSnapshot, ...]:
        return hp.apply([rt.snapshot() for rt in self.replicas.values()], self.health)

    # ----------------------------------------------------------------------------------------- admission
    def admit(self) -> Admission:
        """Count one new request and decide it; an admitted one deposits into the retry and hedge budgets and
        must be followed by `enter` (and, when answered, `leave`)."""
        c = self.config
        now = self.clock.now_s()
        self.counters["requests"] += 1
        a = admit(self.snapshots(), self.inflight, self.vegas, now, self.rng, c.shed, c.shedding,
                  c.vegas if c.adaptive_concurrency else None, self.shed_state)
        self.shed_state = a.shed.state
        if not a.admitted:
            self.counters[a.verdict] += 1
            return a
        self.retry_state = tail.budget_deposit(self.retry_state, now, c.retry_budget)
        self.hedge_state = tail.budget_deposit(self.hedge_state, now, c.hedge_budget)
        return a

    def enter(self) -> int:
        """An admitted request is now in flight; returns the in-flight count it started at (for the limiter)."""
        self.inflight += 1
        return self.inflight

    def leave(self) -> None:
        self.inflight -= 1

    def done(self, latency_s: float, inflight_at_start: int, dropped: bool) -> None:
        """A request's answer is complete: the adaptive concurrency limit learns from it."""
        if self.config.adaptive_concurrency and latency_s > 0:
            self.vegas = vegas_update(self.vegas, latency_s, inflight_at_start, dropped, self.config.vegas)

    # -------------------------------------------------------------------------------------- degradation
    def degrade(self, path: str, body: bytes, utilisation: float) -> tuple[str, bytes, str] | None:
        """(path, body, fallback) when this request should go to its model's fallback now, else None."""
        cfg = self.config.degrade
        if not cfg.fallbacks:
            return None
        ejected = bool(self.breaker.ejected_until_s) and self.breaker.ejected(degrade.model_of(path, body),
                                                                              self.clock.now_s())
        if utilisation < cfg.start_utilisation and not ejected:
            return None
        rewritten = degrade.rewrite(path, body, cfg.fallbacks)
        if rewritten is not None:
            self.counters["degraded"] += 1
        return rewritten

    def primary_result(self, model: str, failed: bool) -> None:
        """Feed a model-with-a-fallback's result to its circuit breaker."""
        cfg = self.config.degrade
        self.breaker, ejected = degrade.breaker_record(self.breaker, model, failed, self.clock.now_s(), cfg)
        if ejected:
            log.warning("event=model_ejected model=%s fallback=%s ejection_s=%.0f", model, cfg.fallbacks[model],
                        cfg.ejection_s)

    # ---------------------------------------------------------------------------------- choosing replicas
    def arm(self) -> str:
        """Draw this request's rollout arm; an arm without a routable replica yields to the other."""
        if self.canary is None:
            return ""
        arm = self.canary.pick(self.rng)
        if not any(self.canary.in_arm(arm, s.version) for s in routable(self.snapshots(), self.clock.now_s())):
            arm = "baseline" if arm == "canary" else "canary"
        return arm

    def pick(self, key: RouteKey, exclude: set[str], arm: str = "") -> ReplicaRuntime | None:
        """Choose a replica with the configured policy; None when no replica is routable."""
        snaps = [s for s in self.snapshots() if s.replica_id not in exclude
                 and (self.canary is None or not arm or self.canary.in_arm(arm, s.version))]
        now, blocks = self.clock.now_s(), key if isinstance(key, PrefixKey) else None
        snaps = self.prefix.stamp(snaps, blocks, now) if self.prefix is not None else snaps
        decision, self.route_state = choose(self.config.policy, snaps,
                                            key.placement_key() if isinstance(key, PrefixKey) else key,
                                            self.route_state, now, self.rng, self.config.routing)
        if self.prefix is not None:  # cache_aware: count the decision (/metrics), remember where the blocks went
            self.prefix.note_decision(decision.reason, decision.replica_id, blocks, now)
        return None if decision.replica_id is None else self.replicas[decision.replica_id]

    def allow_retry(self, after_outcome: str = "", from_replica: str = "") -> bool:
        """Withdraw one retry from the budget (free after an out-of-rotation outcome, see
        `tail.OUT_OF_ROTATION`: a dead or draining replica's requests move to the others); counts the retry or
        its denial, and the retry against `from_replica`, where the last attempt failed."""
        allowed = after_outcome in tail.OUT_OF_ROTATION
        if not allowed:
            allowed, self.retry_state = tail.budget_withdraw(self.retry_state, self.clock.now_s(),
                                                             self.config.retry_budget)
        self.counters["retries" if allowed else "retries_denied"] += 1
        if allowed and from_replica in self.replicas:
            self.replicas[from_replica].retried_away += 1
        return allowed

    def second_copy_delay_s(self) -> float | None:
        """When to send a hedged or tied second copy (None = never)."""
        c = self.config
        return c.tied_delay_s if c.tied else tail.hedge_delay_s(self.latencies, c.hedge) if c.hedging else None

    def allow_second_copy(self, to_replica: str = "") -> bool:
        """Withdraw one hedge (or tied copy) from the hedge budget; counts it when allowed (and against
        `to_replica`, which gets the copy)."""
        allowed, self.hedge_state = tail.budget_withdraw(self.hedge_state, self.clock.now_s(),
                                                         self.config.hedge_budget)
        if allowed:
            self.counters["tied" if self.config.tied else "hedges"] += 1
            if to_replica in self.replicas:
                self.replicas[to_replica].hedges += 1
        return allowed

    # ------------------------------------------------------------------------------------------ outcomes
    def finish(self, attempt: Attempt, latency_s: float | None = None) -> None:
        """Fold a finished attempt in, once: its slot, health, readiness, latency window, canary, metrics."""
        if attempt.recorded:
            return
        attempt.recorded = True
        if latency_s is None:
            latency_s = attempt.finish()
        rid = attempt.replica.upstream.replica_id
        if rid not in self.replicas:
            return  # removed (drained) while this request was in flight
        self.metrics.observe_attempt(rid, attempt.outcome, latency_s)
        event, self.health = hp.record_result(self.health, rid, attempt.failed, self.clock.now_s(),
                                              self.config.health)
        if event is not None:
            log.warning("event=%s replica=%s until_s=%.1f", event.kind, event.replica_id, event.until_s)
            if event.kind == "ejected":
                self.replicas[rid].ejections += 1
        if attempt.outcome in ("connect_error", "draining"):
            self.mark_unready(rid)
        if attempt.outcome == "ok":
            self.latencies = self.latencies.add(latency_s)
        if self.canary is not None and attempt.arm and not tail.retryable(attempt.outcome):
            self.canary.record(attempt.arm, attempt.failed, latency_s)

    def mark_unready(self, replica_id: str) -> None:
        """The replica refused a connection or is draining: no new traffic there until a check passes."""
        event, self.health = hp.record_check(self.health, replica_id, False, self.clock.now_s(), self.config.health)
        if event is not None:
            log.info("event=not_ready replica=%s reason=refused_or_draining", replica_id)

    # ------------------------------------------------------------------------------------- health checks
    def record_checks(self, runtimes: Sequence[ReplicaRuntime], ready: Sequence[bool]) -> None:
        """Fold one round of readiness probes in (replicas removed meanwhile are skipped)."""
        self.health = record_probes(self.health, runtimes, ready, self.replicas, self.clock.now_s(),
                                    self.config.health)

    def evaluate_rollout(self) -> None:
        """Advance or roll back a running canary rollout (called after each round of checks)."""
        if self.canary is None:
            return
        now = self.clock.now_s()
        arm = [s for s in self.snapshots() if self.canary.in_arm("canary", s.version)]
        self.canary.evaluate(now, bool(arm) and all(s.ejected(now) for s in arm))
