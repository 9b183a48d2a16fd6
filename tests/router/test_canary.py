"""Canary rollout through the proxy: a bad canary is rolled back, a good one is promoted to 100%."""

from __future__ import annotations

from collections import Counter

import pytest

from headroom.router.canary import CanaryTracker
from headroom.router.fake_replica import ReplicaBehaviour
from headroom.router.health import HealthConfig
from headroom.router.proxy import ProxyConfig
from headroom.router.rollout import CanaryConfig
from tests.router.test_proxy import INFER, fleet

VERSIONS = ("1", "1", "2")


async def test_a_bad_canary_is_rolled_back_and_gets_no_more_traffic() -> None:
    reps = [ReplicaBehaviour(name="base-a"), ReplicaBehaviour(name="base-b"),
            ReplicaBehaviour(name="canary", fail_status=500)]
    cfg = ProxyConfig(policy="p2c", check_interval_s=0.05, canary_version="2",
                      canary=CanaryConfig(step_duration_s=30.0, min_requests=5),
                      health=HealthConfig(consecutive_failures=1000))  # isolate the rollout from ejection
    async with fleet(reps, cfg, versions=VERSIONS) as (router, client):
        assert router.canary is not None
        statuses = []
        for _ in range(400):
            statuses.append((await client.post(INFER, content=b"{}")).status_code)
            if router.canary.state.phase == "rolled_back":
                break
        assert router.canary.state.phase == "rolled_back" and router.canary.weight == 0.0
        assert 5 <= statuses.count(500) <= 30  # ~5% of requests until the verdict
        after = Counter([(await client.post(INFER, content=b"{}")).headers["x-headroom-replica"] for _ in range(40)])
        assert "canary" not in after
        stats = (await client.get("/router/stats")).json()
        assert stats["canary"] == {"version": "2", "weight": 0.0, "phase": "rolled_back"}


async def test_a_healthy_canary_is_promoted_to_all_traffic() -> None:
    reps = [ReplicaBehaviour(name="base-a"), ReplicaBehaviour(name="base-b"), ReplicaBehaviour(name="canary")]
    cfg = ProxyConfig(policy="p2c", check_interval_s=0.05, canary_version="2",
                      canary=CanaryConfig(step_duration_s=0.2, min_requests=5, max_p99_ratio=100.0))  # CPU noise
    async with fleet(reps, cfg, versions=VERSIONS) as (router, client):
        assert router.canary is not None
        for _ in range(600):
            assert (await client.post(INFER, content=b"{}")).status_code == 200
            if router.canary.state.phase == "complete":
                break
        assert router.canary.state.phase == "complete"  # weight 1.0 from now on: no baseline traffic
        after = Counter([(await client.post(INFER, content=b"{}")).headers["x-headroom-replica"] for _ in range(20)])
        assert after == Counter({"canary": 20})
        assert [d.canary_weight for d in router.canary.history] == [0.5, 1.0, 1.0]


def test_tracker_needs_a_version() -> None:
    with pytest.raises(ValueError, match="canary_version"):
        CanaryTracker("", CanaryConfig(), 0.0)
