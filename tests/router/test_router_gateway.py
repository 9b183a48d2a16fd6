"""The gateway in front of the router (`headroom route` / `serve --replicas` with gateway flags): a real
router (in-process uvicorn) in front of a real fake replica, wrapped exactly as `run_fleet` wraps it."""

from __future__ import annotations

import random
from pathlib import Path

import httpx

from headroom.gateway.app import gateway_setup
from headroom.gateway.auth import create_key
from headroom.gateway.slow_headers import HeaderDeadlineProtocol
from headroom.router.cli import gateway_front
from headroom.router.fake_replica import ReplicaBehaviour, make_app, serve_asgi
from headroom.router.proxy import ProxyConfig, Router
from headroom.router.upstream import Upstream

BODY = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1.0, 2.0]}]}


async def test_keys_and_tenant_buckets_apply_at_the_router(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.yaml"
    acme, ops = create_key(keys_file, "acme"), create_key(keys_file, "ops", "admin")
    setup = gateway_setup(keys_file, rate_limit_rps=1.0, rate_limit_burst=2.0)
    replica = ReplicaBehaviour(delay_ms=1.0)
    async with serve_asgi(make_app(replica)) as replica_url:
        router = Router([Upstream("r0", replica_url)], ProxyConfig(policy="round_robin"), rng=random.Random(0))
        app, interceptors, protocol = gateway_front(router, setup, None, None)
        assert len(interceptors) == 1  # gRPC gets the same keys and buckets
        assert isinstance(protocol, type) and issubclass(protocol, HeaderDeadlineProtocol)
        async with serve_asgi(app, lifespan="on") as url:  # type: ignore[arg-type]
            await router.check_once()
            async with httpx.AsyncClient(base_url=url, timeout=10.0) as client:
                assert (await client.get("/v2/health/ready")).status_code == 200  # health needs no key
                anonymous = await client.post("/v2/models/m/infer", json=BODY)
                assert anonymous.status_code == 401 and anonymous.json()["reason"] == "unauthenticated"
                assert replica.served == 0  # refused at the router: the replica never saw it
                auth = {"Authorization": f"Bearer {acme}"}
                statuses = [(await client.post("/v2/models/m/infer", json=BODY, headers=auth)).status_code
                            for _ in range(4)]
                assert statuses[:2] == [200, 200] and 429 in statuses[2:]  # one bucket for the whole fleet
                served = replica.served
                assert served == statuses.count(200)
                other = await client.post("/v2/models/m/infer", json=BODY, headers={"X-API-Key": ops})
                assert other.status_code == 200  # another tenant is not throttled by acme's bucket
    assert acme not in keys_file.read_text()


def test_without_gateway_flags_the_router_app_is_unwrapped() -> None:
    router = Router([], ProxyConfig())
    app, interceptors, protocol = gateway_front(router, None, None, None)
    assert app is router.app and interceptors == [] and protocol == "auto"
