"""The inference routes and the disconnect race, in process: a real DataPlane with Python models from the test
repository, the gateway in front, ASGI messages in and out (no sockets)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from prometheus_client import CollectorRegistry

from headroom.core.clock import MonotonicClock
from headroom.core.errors import Cancelled
from headroom.core.types import InferenceRequest, Tensor
from headroom.gateway.app import GatewaySetup, wrap_app
from headroom.gateway.asgi import ASGIApp, Message
from headroom.gateway.middleware import exempt_matcher, is_exempt
from headroom.models.repository import ModelRepository
from headroom.server.dataplane import DataPlane, ServedVersion
from headroom.server.http_app import HttpApi, HttpLimits, build_http_app
from headroom.server.metrics import ServerMetrics
from tests.server.conftest import build_test_repository
from tests.support.waiting import until


class Stack:
    """DataPlane → HttpApi → build_http_app → gateway, plus a way to send one HTTP request through it."""

    def __init__(self, dataplane: DataPlane, app: ASGIApp) -> None:
        self.dataplane = dataplane
        self.app = app

    async def request(self, method: str, path: str, body: bytes = b"",
                      disconnect_after_s: float | None = None) -> tuple[int, dict[bytes, bytes], bytes]:
        """Status, headers and body; with `disconnect_after_s` the client hangs up after that long."""
        sent = False
        gone = asyncio.Event()
        if disconnect_after_s is not None:
            asyncio.get_running_loop().call_later(disconnect_after_s, gone.set)

        async def receive() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        start: dict[str, Any] = {}
        chunks: list[bytes] = []

        async def send(message: Message) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
            else:
                chunks.append(message.get("body", b""))

        scope = {"type": "http", "method": method, "path": path, "raw_path": path.encode(), "root_path": "",
                 "query_string": b"", "scheme": "http", "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 9),
                 "headers": [(b"host", b"x"), (b"content-type", b"application/json"),
                             (b"content-length", str(len(body)).encode())]}
        await self.app(scope, receive, send)
        return int(start["status"]), dict(start["headers"]), b"".join(chunks)


@pytest.fixture()
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    repo = ModelRepository(build_test_repository(tmp_path))
    registry = CollectorRegistry()
    dataplane = DataPlane(ServerMetrics(registry), MonotonicClock())
    index = repo.scan(["echo", "slow", "text"])
    for loaded in await repo.load_async(index):
        dataplane.add(ServedVersion(name=loaded.name, version=loaded.version, config=loaded.config,
                                    model=loaded.model, version_dir=loaded.version_dir))
    yield Stack(dataplane, wrap_app(build_http_app(HttpApi(dataplane, registry, HttpLimits())), GatewaySetup(),
                                    registry=registry))
    await dataplane.stop()


def _echo_body(x: list[float]) -> bytes:
    return json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": x}]}).encode()


def _slow_body(delay_ms: float, tag: int) -> bytes:
    return json.dumps({"inputs": [{"name": "delay_ms", "datatype": "FP32", "shape": [1, 1], "data": [delay_ms]},
                                  {"name": "tag", "datatype": "INT64", "shape": [1, 1], "data": [tag]}]}).encode()


async def test_infer_routes_answer_with_ids_and_timing(stack: Stack) -> None:
    for path in ("/v2/models/echo/infer", "/v2/models/echo/versions/1/infer"):
        status, headers, body = await stack.request("POST", path, _echo_body([1.0, 2.5]))
        assert status == 200, body
        out = {o["name"]: o["data"] for o in orjson.loads(body)["outputs"]}
        assert out["y"] == [2.0, 5.0]
        assert b"x-request-id" in headers and b"total;dur=" in headers[b"server-timing"]
    ids = set()
    for _ in range(50):
        _, headers, _ = await stack.request("POST", "/v2/models/echo/infer", _echo_body([0.0, 0.0]))
        ids.add(headers[b"x-request-id"])
    assert len(ids) == 50 and all(len(i) == 16 for i in ids)


async def test_route_errors_keep_their_status_and_shape(stack: Stack) -> None:
    status, _, body = await stack.request("POST", "/v2/models/nope/infer", _echo_body([1.0, 2.0]))
    assert status == 404 and orjson.loads(body)["reason"]
    status, _, body = await stack.request("POST", "/v2/models/echo/infer", b'{"inputs": [')
    assert status == 400 and "error" in orjson.loads(body)
    status, _, body = await stack.request("POST", "/v2/models/echo/versions/9/infer", _echo_body([1.0, 2.0]))
    assert status == 404 and "version" in orjson.loads(body)["error"]
    status, _, body = await stack.request("POST", "/v1/embeddings", b'{"input": 3}')
    assert status == 400 and orjson.loads(body)["error"]["param"] == "input"
    # 405 for a GET on a POST route, 404 for no route at all
    assert (await stack.request("GET", "/v2/models/echo/infer"))[0] == 405
    assert (await stack.request("POST", "/v2/models/echo/x/infer"))[0] == 404
    assert (await stack.request("GET", "/v2/health/ready"))[0] == 200


async def test_client_that_leaves_while_queued_is_dropped_and_gets_cancelled(stack: Stack, tmp_path: Path) -> None:
    seen_file = tmp_path / "slow" / "1" / "seen.txt"

    def seen() -> list[str]:
        return seen_file.read_text().split() if seen_file.exists() else []

    blocker = asyncio.create_task(stack.request("POST", "/v2/models/slow/infer", _slow_body(400, 500)))
    await until(lambda: "500" in seen(), "the blocker to start executing")
    status, _, body = await stack.request("POST", "/v2/models/slow/infer", _slow_body(0, 501),
                                          disconnect_after_s=0.1)
    assert status == Cancelled.http_status and b"disconnected" in body
    assert (await blocker)[0] == 200
    # a later request runs after anything still queued (FIFO): once it ran, 501 would have run too
    assert (await stack.request("POST", "/v2/models/slow/infer", _slow_body(0, 502)))[0] == 200
    assert "500" in seen() and "502" in seen() and "501" not in seen()
    # the request task was not left cancelled: the next request on this loop works
    assert (await stack.request("POST", "/v2/models/echo/infer", _echo_body([1.0, 1.0])))[0] == 200


async def test_a_watcher_that_fails_counts_as_a_disconnect_and_outer_cancel_propagates(stack: Stack) -> None:
    req = InferenceRequest(request_id="r", model_name="slow", model_version="", inputs=(
        Tensor("delay_ms", "FP32", (1, 1), np.full((1, 1), 50.0, dtype=np.float32)),
        Tensor("tag", "INT64", (1, 1), np.full((1, 1), 7, dtype=np.int64))))

    async def broken() -> None:
        raise OSError("receive failed")

    with pytest.raises(Cancelled):
        await stack.dataplane.infer(req, broken)
    assert (await stack.dataplane.infer(req, None)).outputs[0].data.tolist() == [[7]]

    async def never() -> None:
        await asyncio.Event().wait()

    task = asyncio.create_task(stack.dataplane.infer(req, never))
    await until(lambda: stack.dataplane.inflight == 1, "the request to be in flight")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert stack.dataplane.inflight == 0


def test_exempt_matcher_agrees_with_is_exempt() -> None:
    exempt = ("/v2/health/", "/metrics")
    matches = exempt_matcher(exempt)
    for path in ("/metrics", "/metrics/x", "/metricsX", "/v2/health", "/v2/health/ready", "/v2/healthz",
                 "/v2/models/echo/infer", "/", ""):
        assert matches(path) == is_exempt(path, exempt)
    assert matches("/v2/health/live") and not matches("/v2/healthz")
