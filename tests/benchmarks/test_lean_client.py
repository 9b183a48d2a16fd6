"""The reliability suite's lean load generator against a real uvicorn server on 127.0.0.1: Content-Length and
chunked answers, keep-alive reuse, `Connection: close`, a refused port, the open loop's schedule and lag records,
and the closed loop's count. No wall-clock assertions: counts, statuses and orderings only."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from benchmarks.reliability.lean_client import closed_loop, encode_post, open_loop


async def _echo(request: Request) -> Response:
    body = await request.body()
    return JSONResponse({"n": len(body)}, status_code=200 if body != b"refuse" else 503)


async def _chunked(request: Request) -> Response:
    await request.body()

    async def parts() -> AsyncIterator[bytes]:
        for part in (b"ab", b"cde", b"f"):
            yield part

    return StreamingResponse(parts(), media_type="text/plain")


async def _closing(request: Request) -> Response:
    await request.body()
    return JSONResponse({"ok": True}, headers={"Connection": "close"})


APP = Starlette(routes=[Route("/echo", _echo, methods=["POST"]), Route("/chunked", _chunked, methods=["POST"]),
                        Route("/closing", _closing, methods=["POST"])])


@contextmanager
def _server() -> Iterator[str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(APP, log_level="warning", lifespan="off", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30.0
    while not server.started:  # bounded: uvicorn has no event to await from another thread
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30.0)
        sock.close()


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with _server() as base:
        yield base


def test_encode_post_is_one_keep_alive_request() -> None:
    host, port, payload = encode_post("http://127.0.0.1:9/v2/models/m/infer?x=1", b'{"a":1}')
    assert (host, port) == ("127.0.0.1", 9)
    assert payload.startswith(b"POST /v2/models/m/infer?x=1 HTTP/1.1\r\nHost: 127.0.0.1:9\r\n")
    assert payload.endswith(b"Content-Length: 7\r\n\r\n{\"a\":1}")
    with pytest.raises(ValueError, match="http://host:port"):
        encode_post("https://example.com/x", b"")


def test_open_loop_answers_statuses_and_schedule(url: str) -> None:
    run = asyncio.run(open_loop(url + "/echo", b"0123456789", rate_per_s=100.0, duration_s=0.5))
    assert [o.status for o in run.outcomes] == [200] * 50
    assert [o.intended_s for o in run.outcomes] == [i / 100.0 for i in range(50)]
    assert all(o.lag_s >= 0.0 and o.latency_s >= o.lag_s for o in run.outcomes)
    assert 1 <= run.connections_opened <= 50  # kept-alive connections are reused
    summary = run.lag_summary()
    assert summary["client_lag_p50_ms"] is not None and summary["client_cpu_share"] is not None
    refused = asyncio.run(open_loop(url + "/echo", b"refuse", rate_per_s=20.0, duration_s=0.1))
    assert [(o.status, o.error) for o in refused.outcomes] == [(503, '{"n":6}')] * 2  # the body's start


def test_chunked_and_closing_answers(url: str) -> None:
    chunked = asyncio.run(open_loop(url + "/chunked", b"x", rate_per_s=50.0, duration_s=0.1))
    assert [o.status for o in chunked.outcomes] == [200] * 5
    closing = asyncio.run(open_loop(url + "/closing", b"x", rate_per_s=50.0, duration_s=0.1))
    assert [o.status for o in closing.outcomes] == [200] * 5
    assert closing.connections_opened == 5  # every answer closed its connection


def test_a_refused_connection_is_an_outcome_not_an_exception() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nobody listens once this closes
    run = asyncio.run(open_loop(f"http://127.0.0.1:{port}/x", b"x", rate_per_s=20.0, duration_s=0.1))
    assert [o.status for o in run.outcomes] == [0, 0]
    assert all(o.error == "ConnectionRefusedError" for o in run.outcomes)


def test_closed_loop_counts_successes(url: str) -> None:
    assert asyncio.run(closed_loop(url + "/echo", b"abc", seconds=0.3, concurrency=2)) > 0
    assert asyncio.run(closed_loop(url + "/echo", b"refuse", seconds=0.2, concurrency=2)) == 0
