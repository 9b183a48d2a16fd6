"""The router discovering its replicas from a (fake) Kubernetes API server's EndpointSlices."""

from __future__ import annotations

import asyncio
import contextlib
import random
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from headroom.router.fake_replica import ReplicaBehaviour, make_app, serve_asgi
from headroom.router.k8s_discovery import DiscoveryConfig, K8sEndpointsFleet, upstreams_from_slices
from headroom.router.proxy import ProxyConfig, Router

CFG = DiscoveryConfig(service="headroom-replicas", capacity=6)


def _slice(endpoints: list[dict[str, Any]], http_port: int = 8000, grpc_port: int = 8001) -> dict[str, Any]:
    return {"ports": [{"name": "http", "port": http_port}, {"name": "grpc", "port": grpc_port}],
            "endpoints": endpoints}


def _ep(ip: str, pod: str, ready: bool | None = True, terminating: bool = False) -> dict[str, Any]:
    cond: dict[str, bool] = {"terminating": terminating}
    if ready is not None:
        cond["ready"] = ready
    return {"addresses": [ip], "conditions": cond, "targetRef": {"kind": "Pod", "name": pod}}


def test_only_ready_serving_endpoints_become_upstreams() -> None:
    doc = {"items": [
        _slice([_ep("10.0.0.2", "pod-b"), _ep("10.0.0.1", "pod-a", ready=None),
                _ep("10.0.0.3", "pod-c", ready=False), _ep("10.0.0.4", "pod-d", terminating=True)]),
        _slice([_ep("fd00::5", "pod-e")], http_port=9000),
        {"ports": [{"name": "metrics", "port": 9090}], "endpoints": [_ep("10.0.0.9", "pod-x")]},  # no http port
    ]}
    ups = upstreams_from_slices(doc, CFG)
    assert [u.replica_id for u in ups] == ["pod-a", "pod-b", "pod-e"]
    assert ups[0].base_url == "http://10.0.0.1:8000" and ups[0].grpc_target == "10.0.0.1:8001"
    assert ups[2].base_url == "http://[fd00::5]:9000" and all(u.capacity == 6 for u in ups)
    assert upstreams_from_slices({"items": None}, CFG) == ()


def test_config_needs_a_service() -> None:
    with pytest.raises(ValueError, match="--k8s-service"):
        DiscoveryConfig(service="")


def _fake_api(state: dict[str, Any], seen: list[str]) -> Starlette:
    async def slices(request: Request) -> JSONResponse:
        seen.append(f"{request.path_params['ns']} {request.query_params.get('labelSelector')}")
        return JSONResponse({"kind": "EndpointSliceList", "items": state["items"]})

    return Starlette(routes=[Route("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices", slices)])


async def _until(predicate: Any, what: str) -> None:
    for _ in range(500):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


async def test_router_follows_the_endpoint_slices() -> None:
    a, b = ReplicaBehaviour(name="a"), ReplicaBehaviour(name="b")
    async with contextlib.AsyncExitStack() as stack:
        urls = [await stack.enter_async_context(serve_asgi(make_app(x))) for x in (a, b)]
        eps = [_ep("127.0.0.1", f"pod-{n}") for n in "ab"]
        ports = [urlsplit(u).port or 0 for u in urls]
        state: dict[str, Any] = {"items": [_slice([eps[0]], ports[0]), _slice([eps[1]], ports[1])]}
        seen: list[str] = []
        api = await stack.enter_async_context(serve_asgi(_fake_api(state, seen)))
        router = Router([], ProxyConfig(policy="round_robin", check_interval_s=0.02), rng=random.Random(0))
        fleet = K8sEndpointsFleet(DiscoveryConfig(service="hr-replicas", namespace="prod", api_url=api,
                                                  poll_interval_s=30.0), router.set_upstreams)
        router_url = await stack.enter_async_context(serve_asgi(router.app, lifespan="on"))
        await fleet.scale_to(2, 0)  # the first read of the slices
        stack.push_async_callback(fleet.close)
        assert seen[0] == "prod kubernetes.io/service-name=hr-replicas"
        assert [u.replica_id for u in fleet.serving()] == ["pod-a", "pod-b"]
        await _until(lambda: sum(s.ready for s in router.snapshots()) == 2, "both replicas ready")
        client = await stack.enter_async_context(httpx.AsyncClient(base_url=router_url, timeout=10.0))
        names = [(await client.post("/v2/models/m/infer", content=b"{}")).json()["replica"] for _ in range(4)]
        assert sorted(names) == ["a", "a", "b", "b"]

        state["items"] = [_slice([eps[0]], ports[0]), _slice([{**eps[1], "conditions": {"ready": False}}],
                                                             ports[1])]  # pod-b stops being ready
        async with httpx.AsyncClient() as api_client:
            await fleet.refresh(api_client)
        assert [u.replica_id for u in fleet.serving()] == ["pod-a"] and "gone pod-b" in fleet.events
        names = [(await client.post("/v2/models/m/infer", content=b"{}")).json()["replica"] for _ in range(4)]
        assert names == ["a"] * 4
