"""Graceful degradation: rewriting requests to a fallback model, and the proxy doing it only when busy."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from headroom.router.degrade import DegradeConfig, rewrite
from headroom.router.fake_replica import ReplicaBehaviour
from headroom.router.proxy import ProxyConfig
from tests.router.test_proxy import fleet

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
        await asyncio.sleep(0.1)
        late = await client.post("/v2/models/big/infer", content=b"{}")
        await first
        assert late.json()["model_name"] == "small" and late.headers["x-headroom-degraded-to"] == "small"
        assert router.counters["degraded"] == 1
