"""End to end over HTTP: a real `headroom serve` process, real clients (httpx, tritonclient.http)."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as triton_http

from headroom.core.server_timing import parse_server_timing
from tests.server.conftest import seen_tags
from tests.support.server import TRUST_PYTHON, RunningServer
from tests.support.waiting import until, until_async


def metric(text: str, name: str, **labels: str) -> float:
    """Sum of a Prometheus sample family matching the labels."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_health_and_metadata(server: RunningServer) -> None:
    client = httpx.Client(base_url=server.url)
    assert client.get("/v2/health/live").json() == {"live": True}
    assert client.get("/v2/health/ready").status_code == 200
    meta = client.get("/v2").json()
    assert meta["name"] == "headroom" and "binary_tensor_data" in meta["extensions"]
    model = client.get("/v2/models/echo").json()
    assert model["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 2]}]
    assert client.get("/v2/models/echo/versions/1/ready").status_code == 200
    assert client.get("/openapi.json").json()["openapi"].startswith("3.")


def test_tritonclient_http_round_trip_json_and_binary(server: RunningServer) -> None:
    client = triton_http.InferenceServerClient(server.http_target)
    assert client.is_server_ready() and client.is_model_ready("echo")
    x = np.array([[1.5, -2.0], [3.0, 4.0]], dtype=np.float32)
    for binary in (False, True):
        inp = triton_http.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x, binary_data=binary)
        out = triton_http.InferRequestedOutput("y", binary_data=binary)
        result = client.infer("echo", [inp], outputs=[out])
        np.testing.assert_array_equal(result.as_numpy("y"), x * 2)
    text = np.array([[b"hello"], [b"w\xc3\xb6rld"]], dtype=object)
    tin = triton_http.InferInput("text", [2, 1], "BYTES")
    tin.set_data_from_numpy(text, binary_data=True)
    res = client.infer("text", [tin])
    assert [bytes(b) for b in res.as_numpy("upper").reshape(-1)] == [b"HELLO", b"W\xc3\xb6RLD"]


STAGES = ("queue", "batch_wait", "preprocess", "compute", "postprocess", "other")


async def test_server_timing_stages_are_disjoint_and_sum_to_the_total(server: RunningServer) -> None:
    """Every stage is its own measured interval (preprocess is real, not a remainder; batch_wait excludes the
    queue), `other` is the rest, and they add up to `total` within the header's rounding, also under batching."""
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        responses = await asyncio.gather(*(client.post("/v2/models/echo/infer", json=body) for _ in range(8)))
    for r in responses:
        assert r.status_code == 200, r.text
        assert r.json()["outputs"][0]["data"] == [2.0, 4.0]
        stages = parse_server_timing(r.headers["server-timing"])
        assert set(STAGES) | {"total"} == set(stages)
        assert all(stages[s] >= 0 for s in STAGES)
        assert sum(stages[s] for s in STAGES) == pytest.approx(stages["total"], abs=1.0)  # ms


def test_error_responses_carry_server_timing(server: RunningServer) -> None:
    for method, path, body in (("POST", "/v2/models/nope/infer", b'{"inputs": []}'),  # the inference route
                               ("POST", "/v2/models/echo/infer", b"{not json"),
                               ("GET", "/v2/models/nope", b"")):  # through Starlette's exception handler
        r = httpx.request(method, server.url + path, content=body, headers={"content-type": "application/json"})
        assert r.status_code in (400, 404), r.text
        stages = parse_server_timing(r.headers["server-timing"])
        assert stages.keys() == {"other", "total"} and stages["other"] == stages["total"] >= 0
    emb = httpx.post(server.url + "/v1/embeddings", json={"model": "nope", "input": "x"})
    assert emb.status_code == 404 and "total" in parse_server_timing(emb.headers["server-timing"])


async def test_concurrent_requests_form_batches_larger_than_one(server: RunningServer) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        before = metric((await client.get("/metrics")).text, "headroom_batch_requests_count", model="echo")
        body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 1]}],
                "outputs": [{"name": "batch"}]}
        responses = await asyncio.gather(*(client.post("/v2/models/echo/infer", json=body) for _ in range(12)))
        assert all(r.status_code == 200 for r in responses)
        sizes = [r.json()["outputs"][0]["data"][0] for r in responses]
        assert max(sizes) > 1  # the model itself saw a batch of several requests
        text = (await client.get("/metrics")).text
    batches = metric(text, "headroom_batch_requests_count", model="echo") - before
    assert 1 <= batches < 12  # fewer executions than requests
    assert metric(text, "headroom_requests_total", model="echo", outcome="success") >= 12


@pytest.mark.parametrize(("path", "body", "status", "needle"), [
    ("/v2/models/nope/infer", b'{"inputs": []}', 404, "unknown model"),
    ("/v2/models/echo/versions/9/infer", b'{"inputs": []}', 404, "'echo' version 9 is not found"),
    ("/v2/models/echo/infer", b"{not json", 400, "JSON"),
    ("/v2/models/echo/infer", b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 3], '
                              b'"data": [1, 2, 3]}]}', 400, "shape"),
    ("/v2/models/echo/infer", b'{"inputs": [{"name": "x", "datatype": "INT32", "shape": [1, 2], '
                              b'"data": [1, 2]}]}', 400, "datatype"),
    ("/v2/models/echo/infer", b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], '
                              b'"data": [1]}]}', 400, ""),
    ("/v2/models/echo/infer", b'{"inputs": [{"name": "zz", "datatype": "FP32", "shape": [1, 2], '
                              b'"data": [1, 2]}]}', 400, ""),
])
def test_bad_requests_get_clear_errors_and_the_server_stays_healthy(
    server: RunningServer, path: str, body: bytes, status: int, needle: str
) -> None:
    r = httpx.post(server.url + path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    assert needle.lower() in r.json()["error"].lower()
    assert httpx.get(server.url + "/v2/health/ready").status_code == 200
    assert server.alive()


def test_oversized_body_gets_413(test_repo: Path, tmp_path: Path) -> None:
    from tests.support.server import run_server

    args = ["--max-body-mb", "0.01", "--model", "echo", "--grpc-port", "-1", *TRUST_PYTHON]
    with run_server(test_repo, tmp_path, args) as srv:
        data = list(range(5000))
        r = httpx.post(f"{srv.url}/v2/models/echo/infer",
                       json={"inputs": [{"name": "x", "datatype": "FP32", "shape": [2500, 2], "data": data}]})
        assert r.status_code == 413 and "limit" in r.json()["error"]
        big = "x" * 20_000
        emb = httpx.post(f"{srv.url}/v1/embeddings", json={"model": "echo", "input": big})  # OpenAI route
        assert emb.status_code == 413 and "limit" in emb.text

        def chunked() -> Iterator[bytes]:  # no Content-Length: refused while the bytes arrive
            for _ in range(20):
                yield b" " * 1000

        streamed = httpx.post(f"{srv.url}/v2/models/echo/infer", content=chunked(),
                              headers={"content-type": "application/json"})
        assert streamed.status_code == 413 and "limit" in streamed.json()["error"]
        assert httpx.get(srv.url + "/v2/health/ready").status_code == 200


def _slow_body(delay_ms: float, tag: int) -> dict[str, object]:
    return {"inputs": [{"name": "delay_ms", "datatype": "FP32", "shape": [1, 1], "data": [delay_ms]},
                       {"name": "tag", "datatype": "INT64", "shape": [1, 1], "data": [tag]}]}


async def _slow_depth_is(client: httpx.AsyncClient, depth: int) -> None:
    """Wait until `slow` holds `depth` admitted, unfinished requests (its queue-depth gauge)."""
    async def holds() -> bool:
        return metric((await client.get("/metrics")).text, "headroom_queue_depth", model="slow") == depth

    await until_async(holds, f"slow's queue depth to reach {depth}")


async def _executing(test_repo: Path, tag: int) -> None:
    """Wait until the slow model started the request tagged `tag` (it writes the tag before sleeping)."""
    await until(lambda: tag in seen_tags(test_repo), f"slow to start request {tag}")


async def test_full_queue_gives_503_with_retry_after_and_is_counted(server: RunningServer) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        tasks = [asyncio.create_task(client.post("/v2/models/slow/infer", json=_slow_body(400, 100 + i)))
                 for i in range(3)]
        await _slow_depth_is(client, 3)
        t0 = time.monotonic()
        r = await client.post("/v2/models/slow/infer", json=_slow_body(0, 199))
        reject_s = time.monotonic() - t0
        assert r.status_code == 503 and "Retry-After" in r.headers and "queue is full" in r.json()["error"]
        assert reject_s < 1.0  # rejected at once, not after queueing
        assert all(t.status_code == 200 for t in await asyncio.gather(*tasks))
        text = (await client.get("/metrics")).text
    assert metric(text, "headroom_requests_total", model="slow", outcome="rejected") >= 1


async def _settle_service_estimate(client: httpx.AsyncClient, tag: int) -> None:
    """Ten instant batches pull slow's service-time EWMA (alpha 0.2) under 0.11x whatever earlier tests left."""
    for i in range(10):
        assert (await client.post("/v2/models/slow/infer", json=_slow_body(0, tag + i))).status_code == 200


async def test_expired_deadline_gives_504_and_the_model_never_sees_it(server: RunningServer,
                                                                      test_repo: Path) -> None:
    """Admitted on a short predicted delay (the estimate says batches are instant), the request's deadline
    then passes behind a 1 s batch: 504, never executed."""
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        await _settle_service_estimate(client, 310)
        blocker = asyncio.create_task(client.post("/v2/models/slow/infer", json=_slow_body(1000, 300)))
        await _executing(test_repo, 300)
        r = await client.post("/v2/models/slow/infer", json=_slow_body(0, 301),
                               headers={"X-Request-Timeout-Ms": "500"})
        assert r.status_code == 504, r.text
        assert (await blocker).status_code == 200
        # The V2 `timeout` parameter works the same way.
        await _settle_service_estimate(client, 320)
        body = _slow_body(0, 302)
        body["parameters"] = {"timeout": 500_000}  # microseconds, Triton's convention
        blocker = asyncio.create_task(client.post("/v2/models/slow/infer", json=_slow_body(1000, 303)))
        await _executing(test_repo, 303)
        r2 = await client.post("/v2/models/slow/infer", json=body)
        assert r2.status_code == 504, r2.text
        await blocker
        text = (await client.get("/metrics")).text
    assert 301 not in seen_tags(test_repo) and 302 not in seen_tags(test_repo)
    assert metric(text, "headroom_requests_total", model="slow", outcome="timeout") >= 2


async def test_a_predicted_delay_over_the_budget_gets_503_at_once(server: RunningServer, test_repo: Path) -> None:
    """Deadline-aware admission: after a 1 s batch the estimate is >= 200 ms per batch, so one request ahead
    predicts >= 400 ms; a 300 ms budget (header or V2 `timeout`) is refused while the blocker still runs."""
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        await _settle_service_estimate(client, 330)
        assert (await client.post("/v2/models/slow/infer", json=_slow_body(1000, 340))).status_code == 200
        blocker = asyncio.create_task(client.post("/v2/models/slow/infer", json=_slow_body(1000, 341)))
        await _executing(test_repo, 341)
        r = await client.post("/v2/models/slow/infer", json=_slow_body(0, 342), headers={"X-Request-Timeout-Ms": "300"})
        body = _slow_body(0, 343)
        body["parameters"] = {"timeout": 300_000}
        r2 = await client.post("/v2/models/slow/infer", json=body)
        assert not blocker.done()
        for reply in (r, r2):
            assert reply.status_code == 503 and reply.json()["reason"] == "overloaded", reply.text
            budget = re.search(r"latency budget of (\d+) ms", reply.json()["error"])  # 300 less the time spent
            assert budget and 150 <= int(budget.group(1)) <= 300 and int(reply.headers["Retry-After"]) >= 1
        assert (await blocker).status_code == 200
        text = (await client.get("/metrics")).text
    assert 342 not in seen_tags(test_repo) and 343 not in seen_tags(test_repo)
    assert metric(text, "headroom_requests_total", model="slow", outcome="rejected") >= 2


def test_disconnected_client_is_dropped_from_the_queue(server: RunningServer, test_repo: Path) -> None:
    blocker = httpx.AsyncClient(base_url=server.url, timeout=30)

    async def scenario() -> None:
        first = asyncio.create_task(blocker.post("/v2/models/slow/infer", json=_slow_body(600, 400)))
        await _executing(test_repo, 400)
        body = json.dumps(_slow_body(0, 401)).encode()
        # A raw socket client that sends its request, then hangs up while the request is queued.
        sock = socket.create_connection(("127.0.0.1", server.http_port))
        sock.sendall(b"POST /v2/models/slow/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        await _slow_depth_is(blocker, 2)  # the blocker and the queued request
        sock.close()
        assert (await first).status_code == 200
        await _slow_depth_is(blocker, 0)  # the hung-up request left the queue without running
        await blocker.aclose()

    asyncio.run(scenario())
    assert 401 not in seen_tags(test_repo)
    text = httpx.get(server.url + "/metrics").text
    assert metric(text, "headroom_requests_total", model="slow", outcome="cancelled") >= 1
    assert metric(text, "headroom_queue_depth", model="slow") == 0


def test_metrics_expose_every_stage_histogram(server: RunningServer) -> None:
    r = httpx.post(f"{server.url}/v2/models/echo/infer",  # labelled series appear once a request was served
                   json={"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]})
    assert r.status_code == 200, r.text
    text = httpx.get(server.url + "/metrics").text
    for family in ("headroom_queue_wait_seconds", "headroom_batch_wait_seconds", "headroom_preprocess_seconds",
                   "headroom_compute_seconds", "headroom_postprocess_seconds",
                   "headroom_request_duration_seconds", "headroom_batch_size", "headroom_queue_depth",
                   "headroom_inflight_requests", "headroom_duty_cycle", "headroom_cold_start_seconds"):
        assert re.search(rf"^{family}", text, re.M), family


def test_model_statistics_count_requests_and_cold_start(server: RunningServer) -> None:
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [3, 2], "data": [1, 2, 3, 4, 5, 6]}]}
    assert httpx.post(f"{server.url}/v2/models/echo/infer", json=body).status_code == 200
    stats = httpx.get(f"{server.url}/v2/models/echo/stats").json()["model_stats"][0]
    assert stats["name"] == "echo" and stats["version"] == "1"
    assert stats["inference_stats"]["success"]["count"] >= 1
    assert stats["inference_count"] >= 3 and stats["execution_count"] >= 1
    assert {s["stage"] for s in stats["cold_start"]} >= {"warmup"}
    assert httpx.get(f"{server.url}/v2/models/nope/stats").status_code == 404


async def test_multistream_frames_batch_together_and_name_missing_streams(server: RunningServer) -> None:
    def body(frame: str, stream: str) -> dict[str, object]:
        return {"parameters": {"frame_id": frame, "stream_id": stream},
                "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}],
                "outputs": [{"name": "batch"}]}

    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        complete = await asyncio.gather(*(client.post("/v2/models/cams/infer", json=body("f1", s))
                                          for s in ("front", "left", "right")))
        assert [r.json()["outputs"][0]["data"][0] for r in complete] == [3, 3, 3]
        assert all("missing_streams" not in r.json().get("parameters", {}) for r in complete)
        t0 = time.monotonic()
        partial = await asyncio.gather(*(client.post("/v2/models/cams/infer", json=body("f2", s))
                                         for s in ("front", "right")))
        waited_s = time.monotonic() - t0
    assert waited_s >= 0.25  # ran at the sync deadline, not before
    for r in partial:
        assert r.json()["parameters"]["missing_streams"] == ["left"]
        assert r.json()["outputs"][0]["data"][0] == 2


def test_dashboard_is_mounted_and_simulates(server: RunningServer) -> None:
    page = httpx.get(f"{server.url}/dashboard")
    assert page.status_code == 200 and "<html" in page.text.lower()
    presets = httpx.get(f"{server.url}/dashboard/api/presets").json()
    assert presets["presets"]


def test_the_start_up_heap_is_frozen_once_ready_and_collections_are_timed(server: RunningServer) -> None:
    text = httpx.get(server.url + "/metrics").text
    assert metric(text, "headroom_gc_frozen_objects") > 10_000  # modules, framework and models, frozen at ready
    assert metric(text, "headroom_gc_pause_seconds_count", generation="0") >= 1  # young collections happen
