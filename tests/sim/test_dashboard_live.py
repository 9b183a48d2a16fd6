"""Live dashboard numbers from a real Prometheus registry (the server's and the LLM engine's metric classes)
on a fake clock: rates and percentiles over the window, gauges, LLM fields, replicas, the HTTP endpoint."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.testclient import TestClient

from headroom.autoscaler.controller import AutoscalerMetrics
from headroom.core.clock import FakeClock
from headroom.core.metric_window import read_registry
from headroom.core.types import StageTimings
from headroom.dashboard.live import LiveModel, LiveSampler, live_point, point_json
from headroom.dashboard.routes import dashboard_routes
from headroom.llm.metrics import LLMMetrics
from headroom.server.metrics import ModelObserver, ServerMetrics


def _serve(m: ServerMetrics, model: str, n: int, total_ms: float, outcome: str = "success") -> None:
    for _ in range(n):
        m.observe_request(model, "1", outcome, StageTimings(total_ms=total_ms) if outcome == "success" else None)


def _model(point_models: tuple[LiveModel, ...], name: str) -> LiveModel:
    return next(m for m in point_models if m.name == name)


def test_rate_percentiles_and_batch_size_over_the_window() -> None:
    registry, clock = CollectorRegistry(), FakeClock(100.0)
    metrics = ServerMetrics(registry)
    sampler = LiveSampler(registry, clock, window_s=5.0)
    _serve(metrics, "echo", 9, total_ms=15.0)  # 9 in the (10, 20] ms bucket
    _serve(metrics, "echo", 1, total_ms=150.0)  # 1 in (100, 200]
    _serve(metrics, "echo", 2, 0.0, outcome="rejected")
    observer = ModelObserver(metrics, "echo", instances=1)
    observer.on_batch(4, 4, 0.01, 0.0)
    observer.on_batch(2, 2, 0.01, 0.0)
    observer.on_queue_depth(3)
    observer.on_busy(1.0)
    clock.advance(2.0)
    p = sampler.point()
    assert p.time_s == pytest.approx(2.0) and p.window_s == pytest.approx(2.0)
    echo = _model(p.models, "echo")
    assert echo.kind == "tensor"
    assert echo.rate_per_s == pytest.approx(10 / 2.0)
    assert echo.error_rate_per_s == pytest.approx(2 / 2.0)
    # ranks 5 and 9.9 of 10: inside (10, 20] ms at 5/9, and inside (100, 200] ms at 0.9.
    assert echo.p50_s == pytest.approx(0.010 + 0.010 * 5 / 9)
    assert echo.p99_s == pytest.approx(0.100 + 0.100 * 0.9)
    assert echo.mean_batch_size == pytest.approx(3.0)
    assert echo.queue_depth == 3 and echo.busy_fraction == pytest.approx(0.5)
    assert echo.kv_cache_usage is None and echo.ttft_p50_s is None
    assert p.replicas is None


def test_window_slides_past_old_requests() -> None:
    registry, clock = CollectorRegistry(), FakeClock()
    metrics = ServerMetrics(registry)
    sampler = LiveSampler(registry, clock, window_s=5.0)
    _serve(metrics, "echo", 12, total_ms=3.0)
    rates: list[float | None] = []
    p99s: list[float | None] = []
    for _ in range(8):  # polled once a second, nothing new after t = 0
        clock.advance(1.0)
        echo = _model(sampler.point().models, "echo")
        rates.append(echo.rate_per_s)
        p99s.append(echo.p99_s)
    # t = 1..5 compare with the start-up reading; from t = 6 the base is t = 1, after the requests.
    assert rates[:5] == pytest.approx([12 / t for t in (1, 2, 3, 4, 5)])
    assert rates[5:] == [0.0, 0.0, 0.0]
    assert p99s[0] is not None and 0.002 < p99s[0] <= 0.005
    assert p99s[5:] == [None, None, None]


def test_llm_models_replicas_and_counter_resets() -> None:
    registry, clock = CollectorRegistry(), FakeClock()
    llm = LLMMetrics(registry, "tiny-llm")
    AutoscalerMetrics(registry).desired.set(3)
    before = read_registry(registry, clock.now_s())
    for _ in range(4):
        llm.ttft.labels("tiny-llm").observe(0.03)  # (0.02, 0.04]
        llm.e2e.labels("tiny-llm").observe(0.9)  # (0.75, 1.0]
        llm.success.labels("tiny-llm", "stop").inc()
    llm.success.labels("tiny-llm", "abort").inc()
    llm.generation_tokens.labels("tiny-llm").inc(400)
    llm.running.labels("tiny-llm").set(5)
    llm.waiting.labels("tiny-llm").set(2)
    llm.kv_usage.labels("tiny-llm").set(0.25)
    after = read_registry(registry, 4.0)
    p = live_point(before, after, t0_s=0.0)
    m = _model(p.models, "tiny-llm")
    assert m.kind == "llm" and p.replicas == 3
    assert m.rate_per_s == pytest.approx(1.0) and m.error_rate_per_s == pytest.approx(0.25)
    assert m.tokens_per_s == pytest.approx(100.0)
    assert (m.running, m.queue_depth, m.kv_cache_usage) == (5, 2, 0.25)
    assert m.ttft_p50_s == pytest.approx(0.03) and m.p50_s == pytest.approx(0.875)
    assert live_point(before, after, 0.0, replicas=7).replicas == 7  # an injected count wins
    # A process restart (counters back near 0): the window counts the new values, never a negative rate.
    fresh = CollectorRegistry()
    LLMMetrics(fresh, "tiny-llm").success.labels("tiny-llm", "stop").inc()
    assert live_point(after, read_registry(fresh, 8.0), t0_s=0.0).models[0].rate_per_s == pytest.approx(1 / 4.0)
    assert live_point(after, after, t0_s=0.0).models[0].rate_per_s is None  # no time passed: no rate
    assert point_json(p)["models"][0]["name"] == "tiny-llm"


def test_live_endpoint() -> None:
    registry = CollectorRegistry()
    metrics = ServerMetrics(registry)
    clock = FakeClock()
    client = TestClient(Starlette(routes=dashboard_routes(registry=registry, clock=clock, replicas=lambda: 2)))
    _serve(metrics, "echo", 6, total_ms=1.0)
    clock.advance(3.0)
    r = client.get("/dashboard/api/live")
    assert r.status_code == 200 and r.headers["cache-control"] == "no-store"
    data = r.json()
    assert data["replicas"] == 2 and data["window_s"] == pytest.approx(3.0)
    assert data["models"][0]["name"] == "echo" and data["models"][0]["rate_per_s"] == pytest.approx(2.0)
    detached = TestClient(Starlette(routes=dashboard_routes())).get("/dashboard/api/live")
    assert detached.status_code == 404 and "headroom serve" in detached.json()["error"]
