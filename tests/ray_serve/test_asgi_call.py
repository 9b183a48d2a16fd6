"""`call_asgi`: an HTTP request through an in-process ASGI app as a head and body chunks (what an LLM replica
streams back through a Serve handle). No cluster needed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from headroom.ray_serve.asgi_call import BrokenAnswer, HttpCall, HttpHead, call_asgi, replica_header


def _app(closed: asyncio.Event) -> Starlette:
    async def echo(request: Request) -> Response:
        body = await request.json()
        return JSONResponse({"got": body, "q": request.query_params.get("x"), "h": request.headers.get("x-t")},
                            status_code=201)

    async def events(request: Request) -> Response:
        async def gen() -> AsyncIterator[bytes]:
            try:
                for i in range(1000):
                    yield f"data: {i}\n\n".encode()
                    await asyncio.sleep(0)
                    if i >= 2:
                        await asyncio.Event().wait()  # a long generation: only a disconnect ends it
            finally:
                closed.set()

        return StreamingResponse(gen(), media_type="text/event-stream")

    async def broken(request: Request) -> Response:
        raise RuntimeError("a bug")

    async def breaks(request: Request) -> Response:
        async def gen() -> AsyncIterator[bytes]:
            yield b"data: 0\n\n"
            raise RuntimeError("the generation failed")

        return StreamingResponse(gen(), media_type="text/event-stream")

    return Starlette(routes=[Route("/echo", echo, methods=["POST"]), Route("/events", events),
                             Route("/broken", broken), Route("/breaks", breaks)])


async def test_a_response_comes_back_as_its_head_then_its_body() -> None:
    call = HttpCall("POST", "/echo", b"x=1", ((b"x-t", b"v"), (b"content-type", b"application/json")), b'{"a": 1}')
    items = [item async for item in call_asgi(_app(asyncio.Event()), call, replica_header("r1"))]
    head = items[0]
    assert isinstance(head, HttpHead) and head.status == 201 and head.header("x-headroom-replica") == "r1"
    assert b"".join(i for i in items[1:] if isinstance(i, bytes)) == b'{"got":{"a":1},"q":"1","h":"v"}'


async def test_closing_a_stream_disconnects_the_app_and_ends_its_generator() -> None:
    closed = asyncio.Event()
    stream = call_asgi(_app(closed), HttpCall("GET", "/events"))
    head = await anext(stream)
    assert isinstance(head, HttpHead) and head.header("content-type").startswith("text/event-stream")  # type: ignore[union-attr]
    assert [await anext(stream) for _ in range(3)] == [b"data: 0\n\n", b"data: 1\n\n", b"data: 2\n\n"]
    await stream.aclose()  # the ingress's client went away
    await asyncio.wait_for(closed.wait(), 30.0)  # the app's generator was closed (an LLM request: aborted)


async def test_an_app_that_fails_answers_one_500() -> None:
    items = [item async for item in call_asgi(_app(asyncio.Event()), HttpCall("GET", "/broken"))]
    assert [i.status for i in items if isinstance(i, HttpHead)] == [500]  # Starlette's own 500, sent once

    async def raw(scope: object, receive: object, send: object) -> None:  # fails before any answer
        raise RuntimeError("a bug")

    items = [item async for item in call_asgi(raw, HttpCall("GET", "/"))]
    assert isinstance(items[0], HttpHead) and items[0].status == 500 and len(items) == 2
    assert b'"reason": "internal"' in bytes(items[1])  # type: ignore[arg-type]


async def test_an_app_that_fails_mid_body_raises_after_what_it_sent() -> None:
    """Not a body that looks complete: the caller (the ingress, through the handle) learns it broke."""
    stream = call_asgi(_app(asyncio.Event()), HttpCall("GET", "/breaks"))
    head = await anext(stream)
    assert isinstance(head, HttpHead) and head.status == 200
    assert await anext(stream) == b"data: 0\n\n"
    with pytest.raises(BrokenAnswer, match="failed mid-body"):
        await anext(stream)
