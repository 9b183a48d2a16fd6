"""The router's policy pipeline on a fake clock, without transports (the HTTP/gRPC parity test drives it whole)."""

from __future__ import annotations

import random

import pytest
from prometheus_client import CollectorRegistry

from headroom.core.clock import FakeClock
from headroom.router import health as hp
from headroom.router.config import ProxyConfig
from headroom.router.metrics import RouterMetrics
from headroom.router.pipeline import Pipeline
from headroom.router.upstream import Attempt, Upstream


def _pipeline(config: ProxyConfig, *ids: str) -> Pipeline:
    metrics = RouterMetrics(CollectorRegistry(), lambda: pytest.fail("no scrape in these tests"))
    pipe = Pipeline(config, FakeClock(), random.Random(0), metrics)
    pipe.set_upstreams([Upstream(rid, f"http://{rid}", capacity=1) for rid in ids])
    for rid in ids:
        _, pipe.health = hp.record_check(pipe.health, rid, True, 0.0, config.health)
    return pipe


def test_only_admitted_requests_deposit_into_the_budgets_and_enter() -> None:
    pipe = _pipeline(ProxyConfig(), "a")
    tokens = pipe.retry_state.tokens
    pipe.replicas["a"].outstanding = 1  # the fleet is full: everything new is shed
    assert pipe.admit().verdict == "shed"
    assert pipe.retry_state.tokens == tokens and pipe.counters["shed"] == 1 and pipe.counters["requests"] == 1
    pipe.replicas["a"].outstanding = 0
    assert pipe.admit().admitted and pipe.enter() == 1
    assert pipe.retry_state.tokens == pytest.approx(tokens + 0.2) and pipe.counters["requests"] == 2
    pipe.leave()
    assert pipe.inflight == 0


def test_the_concurrency_limit_counts_requests_in_flight_on_any_transport() -> None:
    pipe = _pipeline(ProxyConfig(adaptive_concurrency=True, shedding=False), "a")
    for _ in range(3):  # probing minRTT: 3 at a time
        assert pipe.admit().admitted
        pipe.enter()
    a = pipe.admit()
    assert a.verdict == "limited" and a.limit == 3 and pipe.counters["limited"] == 1
    pipe.done(0.01, 1, False)  # a sample at low concurrency ends the probe
    assert not pipe.vegas.probing and pipe.vegas.min_rtt_s == 0.01


def test_a_finished_attempt_is_folded_in_once() -> None:
    cfg = ProxyConfig(health=hp.HealthConfig(consecutive_failures=1, max_ejected_fraction=1.0))
    pipe = _pipeline(cfg, "a", "b")
    attempt = Attempt(pipe.replicas["a"], pipe.clock)
    attempt.outcome = "connect_error"  # refused: a failure, and not ready until a check passes
    pipe.finish(attempt)
    pipe.finish(attempt)
    assert pipe.replicas["a"].outstanding == 0 and pipe.replicas["a"].failures == 1
    assert not pipe.health.get("a").ready and pipe.health.get("a").times_ejected == 1
    server_error = Attempt(pipe.replicas["b"], pipe.clock)
    server_error.outcome = "grpc_internal"  # a gRPC server error counts as an HTTP 5xx does
    pipe.finish(server_error)
    assert pipe.health.get("b").ejected_until_s > 0 and pipe.replicas["b"].failures == 1
    assert pipe.pick(None, set()) is not None  # every ready replica ejected: panic routing still picks one


def test_removed_replicas_lose_their_health_and_late_attempts_are_ignored() -> None:
    pipe = _pipeline(ProxyConfig(), "a", "b")
    attempt = Attempt(pipe.replicas["a"], pipe.clock)
    pipe.set_upstreams([Upstream("b", "http://b")])
    attempt.outcome = "http_500"
    pipe.finish(attempt)
    assert "a" not in pipe.health.replicas and set(pipe.replicas) == {"b"}
    assert pipe.health.get("b").consecutive_failures == 0


def test_retries_off_a_dead_or_draining_replica_are_not_charged_to_the_budget() -> None:
    """Every request sent to a replica before it died (refused) or started draining moves to the others, however
    many there were; a not_ready (loading) or lost-connection retry still spends the budget."""
    pipe = _pipeline(ProxyConfig(), "a", "b")
    while pipe.allow_retry():  # empty the bucket
        pass
    denied = pipe.counters["retries_denied"]
    assert all(pipe.allow_retry("connect_error") for _ in range(50))
    assert all(pipe.allow_retry("draining") for _ in range(50))
    assert not pipe.allow_retry("not_ready") and not pipe.allow_retry("connection_lost")
    assert pipe.retry_state.tokens < 1.0 and pipe.counters["retries_denied"] == denied + 2
