"""Autoscaling policy on replayed traces with a fake clock: steps, sawtooths, clamps, cooldown."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import pytest

from headroom.autoscaler.policy import (
    AutoscaleDecision,
    AutoscalerConfig,
    AutoscalerState,
    MetricsSample,
    decide,
    normalised_load,
)
from headroom.core.clock import FakeClock

SYNC_S = 15.0  # HPA sync period
SAMPLE_S = 5.0


def _replay(offered: Callable[[float], float], duration_s: float, cfg: AutoscalerConfig,
            start_replicas: int = 1) -> list[tuple[float, AutoscaleDecision]]:
    """Offered load in "replicas' worth of work"; utilisation = offered / serving replicas (capped at 1)."""
    clock = FakeClock()
    state = AutoscalerState(replicas=start_replicas)
    window: list[MetricsSample] = []
    out = []
    while clock.now_s() < duration_s:
        clock.advance(SAMPLE_S)
        now = clock.now_s()
        n = state.replicas  # replicas become ready at once in this replay (warm pool)
        window.append(MetricsSample(now, n, utilisation=min(1.0, offered(now) / n)))
        window = [s for s in window if now - s.time_s < 600]
        if now % SYNC_S == 0:
            d, state = decide(window, state, now, cfg)
            out.append((now, d))
    return out


def test_scales_up_within_one_window_on_a_step() -> None:
    cfg = AutoscalerConfig()
    step_at = 300.0
    trace = _replay(lambda t: 0.4 if t < step_at else 3.0, 600.0, cfg)
    before = [d.replicas for t, d in trace if t < step_at]
    assert set(before) == {1}
    first_up = min(t for t, d in trace if d.replicas > 1)
    assert step_at < first_up <= step_at + cfg.window_s
    final = trace[-1][1]
    assert final.replicas >= 4 and cfg.scale_down_utilisation <= 3.0 / final.replicas <= cfg.scale_up_utilisation


def test_does_not_flap_on_a_sawtooth() -> None:
    cfg = AutoscalerConfig()
    period_s = 120.0  # shorter than the 300 s scale-down stabilisation window
    trace = _replay(lambda t: 2.5 if (t % period_s) < period_s / 2 else 0.2, 1800.0, cfg)
    counts = [d.replicas for _, d in trace]
    changes = [(a, b) for a, b in itertools.pairwise(counts) if a != b]
    downs = [c for c in changes if c[1] < c[0]]
    assert changes and not downs  # scaled up for the peaks, never scaled down between them
    assert max(counts) <= 6


def test_scales_down_only_after_the_stabilisation_window_and_stops_at_min() -> None:
    cfg = AutoscalerConfig(min_replicas=2)
    trace = _replay(lambda t: 3.0 if t < 300 else 0.1, 1500.0, cfg, start_replicas=6)
    first_down = min(t for t, d in trace if t > 300 and d.replicas < trace[0][1].replicas)
    assert first_down >= 300 + cfg.scale_down_stabilisation_s
    assert trace[-1][1].replicas == 2


def test_scale_up_rate_is_limited_to_double_or_four_per_period() -> None:
    cfg = AutoscalerConfig(max_replicas=64)
    state = AutoscalerState(replicas=10)
    window = [MetricsSample(1.0, 10, utilisation=1.0)] * 1
    d, state = decide(window, state, 1.0, cfg)
    assert d.replicas == 20  # ceil(10 x 1.0 / 0.5) = 20 = 2x
    d, _ = decide([MetricsSample(2.0, 10, utilisation=1.0)], state, 2.0, cfg)
    assert d.replicas == 20  # the period's cap (2x the count at its start) is spent


def test_max_replicas_clamps_and_hold_band_keeps_count() -> None:
    cfg = AutoscalerConfig(max_replicas=3)
    d, _ = decide([MetricsSample(1.0, 2, utilisation=1.0)], AutoscalerState(replicas=2), 1.0, cfg)
    assert d.replicas == 3
    d, _ = decide([MetricsSample(1.0, 2, utilisation=0.5)], AutoscalerState(replicas=2), 1.0, cfg)
    assert d.replicas == 2 and d.reason == "hold" and d.warm_pool == cfg.warm_pool


def test_no_samples_means_no_change() -> None:
    d, _ = decide([], AutoscalerState(replicas=3), 10.0, AutoscalerConfig())
    assert d.replicas == 3 and d.reason == "no_data" and math.isnan(d.utilisation)


def test_other_metrics_normalise_per_replica() -> None:
    rps = AutoscalerConfig(metric="requests_per_replica", per_replica_full=40.0)  # KEDA example: 40 req/s/pod
    assert normalised_load(MetricsSample(0.0, 2, requests_per_s=60.0), rps) == pytest.approx(0.75)
    q = AutoscalerConfig(metric="queue_depth", per_replica_full=8.0)
    assert normalised_load(MetricsSample(0.0, 4, queue_depth=16), q) == pytest.approx(0.5)
    d, _ = decide([MetricsSample(1.0, 1, requests_per_s=80.0)], AutoscalerState(replicas=1), 1.0, rps)
    assert d.replicas == 4  # 80 req/s at 40 each is 200%; aim for 50% each


def test_bad_config_is_explained() -> None:
    with pytest.raises(ValueError, match="use one of"):
        AutoscalerConfig(metric="cpu")
    with pytest.raises(ValueError, match="scale_down_utilisation"):
        AutoscalerConfig(scale_down_utilisation=0.8)


def test_samples_from_before_a_scale_up_do_not_inflate_the_recommendation() -> None:
    """Constant demand of 1.2 replica-units served first by 1, then by 2 replicas: the target stays 3
    (1.2 / 0.5 = 2.4 -> 3), never 4 from multiplying the old per-replica load by the new replica count."""
    from headroom.autoscaler.policy import AutoscalerConfig, AutoscalerState, MetricsSample, decide

    cfg = AutoscalerConfig(metric="utilisation", window_s=60.0, max_replicas=8, cooldown_s=0.0)
    window = [MetricsSample(time_s=t, ready_replicas=1, utilisation=1.0) for t in (1.0, 2.0)]
    window += [MetricsSample(time_s=t, ready_replicas=2, utilisation=0.7) for t in (3.0, 4.0)]
    decision, _ = decide(window, AutoscalerState(replicas=2), 5.0, cfg)
    assert decision.replicas <= 3
