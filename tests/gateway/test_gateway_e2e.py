"""End to end: a real server behind the gateway (subprocess, 127.0.0.1), real HTTP clients and sockets."""

from __future__ import annotations

import concurrent.futures
import json
import socket

import httpx
import pytest

from tests.gateway.conftest import GatewayServer

ECHO = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1.0, 2.0]}]}


def raw_exchange(server: GatewayServer, request: bytes) -> bytes:
    """Send raw bytes, read until the server closes the connection (or 30 s pass)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(request)
        received = b""
        while chunk := sock.recv(65536):  # b"" once the server closed the connection
            received += chunk
    return received


def client(server: GatewayServer, who: str | None = None) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers=server.auth(who) if who else {}, timeout=30.0)


def test_health_and_metrics_need_no_key(keyed_server: GatewayServer) -> None:
    with client(keyed_server) as c:
        assert c.get("/v2/health/live").status_code == 200
        assert c.get("/v2/health/ready").status_code == 200
        assert c.get("/metrics").status_code == 200


def test_missing_and_wrong_keys_get_401_json(keyed_server: GatewayServer) -> None:
    with client(keyed_server) as c:
        r = c.post("/v2/models/echo/infer", json=ECHO)
        assert r.status_code == 401
        assert r.json()["reason"] == "unauthenticated" and "Authorization: Bearer" in r.json()["error"]
        assert r.headers["www-authenticate"].startswith("Bearer")
        forged = keyed_server.keys["user"][:-4] + "AAAA"
        r = c.post("/v2/models/echo/infer", json=ECHO, headers={"Authorization": f"Bearer {forged}"})
        assert r.status_code == 401 and forged not in r.text
        r = c.get("/v1/models", headers={"X-API-Key": "hr_00000000_nope"})
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"


def test_user_key_infers_with_bearer_or_x_api_key(keyed_server: GatewayServer) -> None:
    with client(keyed_server, "user") as c:
        r = c.post("/v2/models/echo/infer", json=ECHO, headers={"X-Request-Id": "abc-1"})
        assert r.status_code == 200, r.text
        assert r.json()["outputs"][0]["data"] == [2.0, 4.0]
        assert r.headers["x-request-id"] == "abc-1"
    r = httpx.post(
        keyed_server.url + "/v2/models/echo/infer",
        json=ECHO,
        headers={"X-API-Key": keyed_server.keys["user"]},
    )
    assert r.status_code == 200


def test_management_endpoints_need_admin(keyed_server: GatewayServer) -> None:
    with client(keyed_server, "user") as c:
        r = c.post("/v2/repository/models/echo/load")
        assert r.status_code == 403 and r.json()["reason"] == "forbidden"
        assert c.get("/admin/ping").status_code == 403
        assert c.post("/v2/repository/index").status_code == 200  # listing is not management
    with client(keyed_server, "admin") as c:
        assert c.post("/v2/repository/models/echo/load").status_code == 200
        assert c.get("/admin/ping").json() == {"pong": True, "tenant": "main"}


@pytest.mark.parametrize(
    "path",
    [
        "/v2/models/..%2F..%2Fetc%2Fpasswd/infer",
        "/v2/models/%2e%2e/ready",
        "/v2/models/%252e%252e/ready",
        "/v2/repository/models/..%5Cwin/load",
        "/v2/models/a%2Fb/infer",
    ],
)
def test_path_traversal_in_model_names_is_400(keyed_server: GatewayServer, path: str) -> None:
    with client(keyed_server, "admin") as c:
        r = c.post(path, json=ECHO) if path.endswith(("infer", "load")) else c.get(path)
        assert r.status_code == 400, (path, r.status_code, r.text)
        assert r.json()["reason"] == "invalid_request"


def test_openai_model_name_traversal_is_400(keyed_server: GatewayServer) -> None:
    with client(keyed_server, "user") as c:
        r = c.post("/v1/embeddings", json={"model": "../../etc/passwd", "input": "hi"})
        assert r.status_code == 400 and "not allowed" in r.json()["error"]["message"]


def test_deep_json_and_oversized_headers_are_refused(keyed_server: GatewayServer) -> None:
    with client(keyed_server, "user") as c:
        deep = '{"inputs": ' + "[" * 40 + "]" * 40 + "}"
        r = c.post("/v2/models/echo/infer", content=deep, headers={"content-type": "application/json"})
        assert r.status_code == 400 and "depth" in r.json()["error"]
        r = c.get("/v2/models/echo", headers={f"x-filler-{i}": "y" for i in range(150)})
        assert r.status_code == 431
    key = keyed_server.keys["user"]
    reply = raw_exchange(
        keyed_server,
        f"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}"
        "\r\nContent-Length: 999999999999\r\n\r\n{}".encode(),
    )
    assert reply.startswith(b"HTTP/1.1 413"), reply[:200]


def test_streaming_responses_pass_through(keyed_server: GatewayServer) -> None:
    with client(keyed_server, "user") as c, c.stream("GET", "/test/stream") as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert lines == ["data: 0", "data: 1", "data: 2", "data: [DONE]"]


def test_slow_body_gets_408_and_the_connection_closed(keyed_server: GatewayServer) -> None:
    """Slowloris: declare 10 kB, send 10 bytes, stall. The server answers 408 and hangs up by itself."""
    key = keyed_server.keys["user"]
    received = raw_exchange(
        keyed_server,
        f"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\nAuthorization: "
        f"Bearer {key}\r\nContent-Type: application/json\r\nContent-Length: 10000\r\n\r\n"
        '{"inputs":'.encode(),
    )
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), received[:200]
    assert json.loads(body)["reason"] == "request_timeout"


def test_noisy_tenant_gets_429_quiet_tenant_unaffected(keyed_server: GatewayServer) -> None:
    def fire(who: str) -> httpx.Response:
        return httpx.post(
            keyed_server.url + "/v2/models/echo/infer",
            json=ECHO,
            headers=keyed_server.auth(who),
            timeout=30.0,
        )

    who = ["noisy"] * 30
    for i in range(4):  # the quiet tenant's 4 requests (within its own burst of 5) go in among the noisy ones
        who.insert(i * 7 + 3, "quiet")
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(fire, who))
    noisy = [r for w, r in zip(who, responses, strict=True) if w == "noisy"]
    quiet = [r for w, r in zip(who, responses, strict=True) if w == "quiet"]
    limited = [r for r in noisy if r.status_code == 429]
    assert limited, [r.status_code for r in noisy]
    assert all(r.status_code in (200, 429) for r in noisy)
    assert all(int(r.headers["retry-after"]) >= 1 and r.json()["reason"] == "rate_limited" for r in limited)
    assert [r.status_code for r in quiet] == [200] * 4
    metrics = httpx.get(keyed_server.url + "/metrics").text
    refused = [line for line in metrics.splitlines() if line.startswith("headroom_gateway_refused_total{")]
    assert any('tenant="noisy"' in line and 'reason="rate_limited"' in line for line in refused), refused
    assert not any('tenant="quiet"' in line for line in refused)


def test_cors_preflight_is_answered_without_a_key(keyed_server: GatewayServer) -> None:
    r = httpx.options(
        keyed_server.url + "/v2/models/echo/infer",
        headers={
            "Origin": "http://dashboard.example",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type",
        },
    )
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == "http://dashboard.example"
    r = httpx.options(
        keyed_server.url + "/v2/models/echo/infer",
        headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"},
    )
    assert "access-control-allow-origin" not in r.headers


def test_traceparent_is_continued_and_stages_recorded(keyed_server: GatewayServer) -> None:
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    parent = f"00-{trace_id}-00f067aa0ba902b7-01"
    with client(keyed_server, "user") as c:
        r = c.post(
            "/v2/models/echo/infer", json=ECHO, headers={"traceparent": parent, "X-Request-Id": "traced-1"}
        )
        assert r.status_code == 200
    spans = [s for s in keyed_server.spans() if s["trace_id"] == trace_id]
    ingress = [s for s in spans if s["parent_id"] == "00f067aa0ba902b7"]
    assert len(ingress) == 1 and ingress[0]["attributes"]["headroom.request_id"] == "traced-1"
    assert ingress[0]["attributes"]["headroom.tenant"] == "main"
    assert ingress[0]["name"] == "ingress" and ingress[0]["attributes"]["url.path"] == "/v2/models/echo/infer"
    children = {s["name"] for s in spans if s["parent_id"] == ingress[0]["span_id"]}
    assert children == {"preprocess", "queue", "batch", "compute", "postprocess"}


def test_logs_carry_tenant_and_request_id_but_never_keys(keyed_server: GatewayServer) -> None:
    with client(keyed_server, "user") as c:
        c.post("/v2/models/echo/infer", json=ECHO, headers={"X-Request-Id": "log-check-7"})
        c.post(
            "/v2/models/echo/infer", json=ECHO, headers={"Authorization": "Bearer hr_deadbeef_notarealkey"}
        )
    log = keyed_server.log()
    for key in keyed_server.keys.values():
        assert key not in log
        assert key.split("_", 2)[2] not in log  # not even the secret part
    assert "notarealkey" not in log
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    mine = [
        entry
        for entry in lines
        if entry.get("request_id") == "log-check-7" and entry.get("logger") == "headroom.gateway.access"
    ]
    assert mine and mine[0]["tenant"] == "main" and mine[0]["status"] == 200
