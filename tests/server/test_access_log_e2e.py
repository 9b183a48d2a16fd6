"""The access log of a real `headroom serve`: one `headroom.access` line per inference request, in one format,
also for requests refused before their body is read (unknown model 404, admission 503) and for those that the
gateway refuses before the data plane sees them (401, 408, 413, 429)."""

from __future__ import annotations

import asyncio
import json
import socket
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.server.conftest import build_test_repository
from tests.server.test_serve_gateway import _create_key
from tests.support.server import TRUST_PYTHON, RunningServer, run_server

WAIT_S = 30.0


@pytest.fixture(scope="module")
def logged_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A server of its own: the long request below would skew the shared server's `slow` estimates."""
    repo = build_test_repository(tmp_path_factory.mktemp("access-repo"))
    with run_server(repo, tmp_path_factory.mktemp("access-logs"), [*TRUST_PYTHON, "--grpc-port", "-1"]) as srv:
        yield srv


def _access_lines(server: RunningServer, request_id: str) -> list[dict[str, Any]]:
    lines = []
    for line in server.log().splitlines():
        if request_id in line and line.startswith("{"):
            record = json.loads(line)
            if record.get("logger") == "headroom.access" and record.get("request_id") == request_id:
                lines.append(record)
    return lines


async def _one_line(server: RunningServer, request_id: str) -> dict[str, Any]:
    """The request's access line: exactly one (polled with a bound; it is written before the response)."""
    deadline = time.monotonic() + WAIT_S
    while not (lines := _access_lines(server, request_id)):
        assert time.monotonic() < deadline, f"no access line for {request_id}"
        await asyncio.sleep(0.05)
    assert len(lines) == 1, lines
    gateway_lines = [line for line in server.log().splitlines()
                     if request_id in line and '"headroom.gateway.access"' in line]
    assert not gateway_lines, gateway_lines  # one line per request: the gateway's own stays off under serve
    return lines[0]


def _slow_body(delay_ms: float, tag: int) -> dict[str, object]:
    return {"inputs": [{"name": "delay_ms", "datatype": "FP32", "shape": [1, 1], "data": [delay_ms]},
                       {"name": "tag", "datatype": "INT64", "shape": [1, 1], "data": [tag]}]}


async def _queue_depth(client: httpx.AsyncClient, model: str) -> int:
    stats = (await client.get(f"/v2/models/{model}/stats")).json()["model_stats"]
    return sum(int(s["queue_depth"]) for s in stats)


async def _await_depth(client: httpx.AsyncClient, depth: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while await _queue_depth(client, "slow") < depth:  # bounded poll: the server has no event to await
        assert time.monotonic() < deadline, f"slow's queue never reached {depth}"
        await asyncio.sleep(0.02)


async def test_refusals_before_the_body_get_one_access_line_in_the_same_format(logged_server: RunningServer) -> None:
    server = logged_server
    ids = {kind: f"{kind}-{uuid.uuid4().hex}" for kind in ("ok", "unknown", "full")}
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        ok = await client.post("/v2/models/slow/infer", json=_slow_body(0, 900), headers={"x-request-id": ids["ok"]})
        assert ok.status_code == 200, ok.text
        unknown = await client.post("/v2/models/nope/infer", json=_slow_body(0, 901),
                                    headers={"x-request-id": ids["unknown"]})
        assert unknown.status_code == 404, unknown.text
        # slow: max_batch_size 1, max_queue_size 3. One long request runs (and holds the queue for 8 s, a wide
        # margin on a loaded machine); two instant ones wait behind it: the queue is full.
        blockers = [asyncio.create_task(client.post("/v2/models/slow/infer", json=_slow_body(8000, 910)))]
        await _await_depth(client, 1)
        blockers += [asyncio.create_task(client.post("/v2/models/slow/infer", json=_slow_body(0, 911 + i)))
                     for i in range(2)]
        await _await_depth(client, 3)
        full = await client.post("/v2/models/slow/infer", json=_slow_body(0, 919),
                                 headers={"x-request-id": ids["full"]})
        assert full.status_code == 503 and "queue is full" in full.json()["error"], full.text
        assert all(r.status_code == 200 for r in await asyncio.gather(*blockers))
    accepted = await _one_line(server, ids["ok"])
    assert accepted["status"] == 200 and accepted["model"] == "slow"
    not_found = await _one_line(server, ids["unknown"])
    assert not_found["status"] == 404 and not_found["model"] == "nope" and not_found["reason"] == "model_not_found"
    refused = await _one_line(server, ids["full"])
    assert refused["status"] == 503 and refused["model"] == "slow" and refused["reason"] == "overloaded"
    assert set(refused) == set(accepted) == set(not_found)  # one format


def test_gateway_refusals_get_one_access_line_in_the_same_format(tmp_path_factory: pytest.TempPathFactory) -> None:
    """401 (no key), 413 (body over --max-body-mb), 429 (over the tenant's rate) and 408 (a body that stops
    arriving) are answered by the gateway, before the data plane: each still gets its one `headroom.access`
    line, in the data plane's format, with the status and the reason."""
    tmp = tmp_path_factory.mktemp("refusals")
    keys_file = tmp / "keys.yaml"
    key = _create_key(keys_file, "acme", "user")
    repo = build_test_repository(tmp_path_factory.mktemp("refusals-repo"))
    args = [*TRUST_PYTHON, "--grpc-port", "-1", "--model", "echo", "--api-keys-file", str(keys_file),
            "--rate-limit-rps", "0.5", "--rate-limit-burst", "2", "--max-body-mb", "0.01", "--body-timeout-s", "1"]
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}
    url = "/v2/models/echo/infer"
    with run_server(repo, tmp, args) as srv, httpx.Client(base_url=srv.url, timeout=60) as client:
        ids = {kind: f"{kind}-{uuid.uuid4().hex}" for kind in ("ok", "401", "413", "408")}
        assert client.post(url, json=body, headers={"x-api-key": key, "x-request-id": ids["ok"]}).status_code == 200
        assert client.post(url, json=body, headers={"x-request-id": ids["401"]}).status_code == 401
        big = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4000], "data": [1.0] * 4000}]}
        assert client.post(url, json=big, headers={"x-api-key": key, "x-request-id": ids["413"]}).status_code == 413
        statuses = {}
        for i in range(6):  # a burst of 2 at 0.5/s: one of these is refused
            rid = f"429-{i}-{uuid.uuid4().hex}"
            statuses[rid] = client.post(url, json=body, headers={"x-api-key": key, "x-request-id": rid}).status_code
        ids["429"] = next(rid for rid, code in statuses.items() if code == 429)
        with socket.create_connection(("127.0.0.1", srv.http_port)) as slow:  # 40 of 100 bytes, then silence
            slow.sendall(f"POST {url} HTTP/1.1\r\nHost: x\r\nX-API-Key: {key}\r\nX-Request-Id: {ids['408']}\r\n"
                         "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n".encode() + b"{" * 40)
            slow.settimeout(30.0)
            assert slow.recv(65536).startswith(b"HTTP/1.1 408")
        accepted = asyncio.run(_one_line(srv, ids["ok"]))
        assert accepted["status"] == 200 and accepted["model"] == "echo"
        for kind, reason in (("401", "unauthenticated"), ("413", "payload_too_large"), ("429", "rate_limited"),
                             ("408", "request_timeout")):
            line = asyncio.run(_one_line(srv, ids[kind]))
            assert (line["status"], line["reason"], line["model"]) == (int(kind), reason, "echo"), line
            assert set(line) == set(accepted), line  # one format
