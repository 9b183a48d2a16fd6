"""Serve's autoscaling_config derived from headroom's autoscaler policy: a pure function, checked against
Serve's own validation (`ray.serve.config.AutoscalingConfig`)."""

from __future__ import annotations

import pytest
from ray.serve.config import AutoscalingConfig

from headroom.autoscaler.policy import AutoscalerConfig
from headroom.ray_serve.autoscaling import serve_autoscaling


def test_utilisation_targets_half_of_a_full_replica_and_keeps_the_hpa_damping() -> None:
    cfg = AutoscalerConfig(min_replicas=1, max_replicas=6, window_s=15.0, scale_down_stabilisation_s=300.0,
                           cooldown_s=60.0, target_utilisation=0.5)
    out = serve_autoscaling(cfg, replica_capacity=8, initial_replicas=2)
    assert out.target_ongoing_requests == 4.0  # 50% of the 8 requests one replica serves at once
    assert (out.min_replicas, out.max_replicas, out.initial_replicas) == (1, 6, 2)
    assert out.look_back_period_s == 15.0 and out.upscale_delay_s == 0.0 and out.downscale_delay_s == 300.0
    AutoscalingConfig.model_validate(out.as_dict())  # Serve accepts it as is


def test_queue_depth_uses_the_depth_one_replica_holds() -> None:
    cfg = AutoscalerConfig(metric="queue_depth", per_replica_full=6.0, target_utilisation=0.4,
                           scale_down_utilisation=0.2, scale_up_utilisation=0.8)
    assert serve_autoscaling(cfg, replica_capacity=32, initial_replicas=1).target_ongoing_requests == 2.4


def test_requests_per_replica_needs_a_latency_to_become_ongoing_requests() -> None:
    cfg = AutoscalerConfig(metric="requests_per_replica", per_replica_full=40.0)  # KEDA example: 40 req/s
    with pytest.raises(ValueError, match="latency"):
        serve_autoscaling(cfg, replica_capacity=8, initial_replicas=1)
    out = serve_autoscaling(cfg, replica_capacity=8, initial_replicas=1, request_latency_s=0.05)
    assert out.target_ongoing_requests == pytest.approx(1.0)  # 40 req/s x 50 ms x 50%


def test_a_window_shorter_than_serves_metric_push_interval_is_raised_to_what_serve_accepts() -> None:
    import warnings

    out = serve_autoscaling(AutoscalerConfig(window_s=2.0), replica_capacity=8, initial_replicas=1)
    assert out.look_back_period_s == 11.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Serve's FutureWarning (look-back <= the 10 s push interval) would raise
        AutoscalingConfig.model_validate(out.as_dict())


def test_the_longer_of_cooldown_and_stabilisation_delays_a_scale_down() -> None:
    cfg = AutoscalerConfig(scale_down_stabilisation_s=30.0, cooldown_s=90.0)
    assert serve_autoscaling(cfg, replica_capacity=8, initial_replicas=1).downscale_delay_s == 90.0


def test_initial_replicas_are_clamped_to_the_range() -> None:
    cfg = AutoscalerConfig(min_replicas=2, max_replicas=3)
    assert serve_autoscaling(cfg, 8, initial_replicas=1).initial_replicas == 2
    assert serve_autoscaling(cfg, 8, initial_replicas=9).initial_replicas == 3


def test_a_capacity_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="replica_capacity"):
        serve_autoscaling(AutoscalerConfig(), replica_capacity=0, initial_replicas=1)
