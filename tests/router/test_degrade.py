"""Graceful degradation: rewriting requests to a fallback model, and the proxy doing it only when busy."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from headroom.router.degrade import DegradeConfig, rewrite
from headroom.router.fake_replica import ReplicaBehaviour
from headroom.router.proxy import ProxyConfig
from tests.router.test_proxy import fleet
from tests.support.waiting import until

FALLBACKS = {"big": "small"}


def test_v2_paths_are_renamed_and_pinned_versions_dropped() -> None:
    assert rewrite("/v2/models/big/infer", b"x", FALLBACKS) == ("/v2/models/small/infer", b"x", "small")
    assert rewrite("/v2/models/big/versions/3/infer", b"", FALLBACKS) == ("/v2/models/small/infer", b"", "small")
    assert rewrite("/v2/models/other/infer", b"", FALLBACKS) is None


def test_openai_bodies_get_the_fallback_model() -> None:
    out = rewrite("/v1/chat/completions", orjson.dumps({"model": "big", "messages": []}), FALLBACKS)
    assert out is not None and orjson.loads(out[1]) == {"model": "small", "messages": []}
    assert rewrite("/v1/chat/completions", b'{"model": "other"}', FALLBACKS) is None
    assert rewrite("/v1/chat/completions", b"not json", FALLBACKS) is None


def test_config_rejects_a_model_falling_back_to_itself() -> None:
    with pytest.raises(ValueError, match="different"):
        DegradeConfig(fallbacks={"big": "big"})


async def test_proxy_degrades_only_when_the_fleet_is_busy() -> None:
    reps = [ReplicaBehaviour(name="a", delay_ms=300.0), ReplicaBehaviour(name="b", delay_ms=300.0)]
    cfg = ProxyConfig(policy="least_outstanding", degrade=DegradeConfig(FALLBACKS, start_utilisation=0.5))
    async with fleet(reps, cfg, capacity=4) as (router, client):
        idle = await client.post("/v2/models/big/infer", content=b"{}")
        assert idle.json()["model_name"] == "big" and "x-headroom-degraded-to" not in idle.headers
        busy = [client.post("/v2/models/big/infer", content=b"{}") for _ in range(4)]  # 4 of 8 slots
        first = asyncio.gather(*busy)
        await until(lambda: router.inflight >= 4, "4 requests in flight on big")
        late = await client.post("/v2/models/big/infer", content=b"{}")
        await first
        assert late.json()["model_name"] == "small" and late.headers["x-headroom-degraded-to"] == "small"
        assert router.counters["degraded"] == 1


async def test_a_failing_primary_falls_back_and_is_ejected_after_failures_in_a_row() -> None:
    """The replicas answer 500 for `big` (the primary crashed) and serve `small`: every request still gets an
    answer from the fallback, and after 3 failures in a row `big` is ejected, so later requests go straight
    to `small` without trying `big` first."""
    reps = [ReplicaBehaviour(name=n, delay_ms=1.0, fail_status=500, fail_models=("big",)) for n in "ab"]
    cfg = ProxyConfig(policy="round_robin", degrade=DegradeConfig(FALLBACKS, start_utilisation=1.0,
                                                                  eject_after_failures=3, ejection_s=60.0))
    async with fleet(reps, cfg) as (router, client):
        answers = [await client.post("/v2/models/big/infer", content=b"{}") for _ in range(6)]
        assert all(r.status_code == 200 and r.json()["model_name"] == "small" for r in answers)
        assert all(r.headers["x-headroom-degraded-to"] == "small" for r in answers)
        assert router.counters["degraded_on_error"] == 3  # the first three tried big, failed, fell back
        assert router.counters["degraded"] == 3  # then big was ejected: straight to small
        assert router.breaker.ejected("big", router.clock.now_s())
        other = await client.post("/v2/models/other/infer", content=b"{}")
        assert other.status_code == 200 and "x-headroom-degraded-to" not in other.headers


async def test_a_failure_without_a_fallback_passes_through_and_on_error_can_be_off() -> None:
    reps = [ReplicaBehaviour(name="a", delay_ms=1.0, fail_status=500)]
    async with fleet(reps, ProxyConfig(degrade=DegradeConfig(FALLBACKS, on_error=False))) as (router, client):
        r = await client.post("/v2/models/big/infer", content=b"{}")
        assert r.status_code == 500 and router.counters["degraded_on_error"] == 0
        r = await client.post("/v2/models/other/infer", content=b"{}")
        assert r.status_code == 500


def test_breaker_ejects_after_failures_in_a_row_and_a_success_resets() -> None:
    from headroom.router.degrade import BreakerState, breaker_record

    cfg = DegradeConfig(FALLBACKS, eject_after_failures=2, ejection_s=10.0)
    s, ejected = breaker_record(BreakerState(), "big", True, 0.0, cfg)
    s, ejected = breaker_record(s, "big", False, 1.0, cfg)  # a success in between resets the count
    s, ejected = breaker_record(s, "big", True, 2.0, cfg)
    assert not ejected and not s.ejected("big", 2.0)
    s, ejected = breaker_record(s, "big", True, 3.0, cfg)
    assert ejected and s.ejected("big", 12.9) and not s.ejected("big", 13.0)
