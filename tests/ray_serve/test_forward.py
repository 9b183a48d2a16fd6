"""The ingress's forwarding of a streamed LLM answer that breaks after its head: the real `HttpIngress` on a real
uvicorn server on 127.0.0.1, read with the official openai SDK and httpx, in front of a replica stand-in that runs a
real Starlette app through `call_asgi` (what `LLMReplica.http` yields) with a failure injected mid-stream: the app
raises, the replica dies (`ActorDiedError` from the handle's stream, as Ray raises it), or it goes silent. Every
break ends with the route's error event, never a silent cut. No Ray cluster needed."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from headroom.ray_serve.ingress import HttpIngress
from headroom.ray_serve.spec import ServeAppSpec
from headroom.router.fake_replica import serve_asgi
from tests.support.serve_handles import AsgiHandle

MESSAGES: Any = [{"role": "user", "content": "hi"}]


def _replica_app(failure: str) -> Starlette:
    """Two events of an answer, then `failure`: "raise" (the app fails), "hang" (nothing more), "none" (done)."""

    async def answer(request: Request) -> Response:
        generate = request.url.path.endswith("generate_stream")

        async def events() -> AsyncIterator[bytes]:
            for word in ("Hello", " there"):
                doc = ({"model_name": "m", "model_version": "", "text_output": word} if generate else
                       {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "m",
                        "choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}]})
                yield f"data: {json.dumps(doc)}\n\n".encode()
            if failure == "raise":
                raise RuntimeError("the engine step failed")
            if failure == "hang":
                await asyncio.Event().wait()
            if not generate:
                yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/chat/completions", answer, methods=["POST"]),
                             Route("/v2/models/m/generate_stream", answer, methods=["POST"])])


def _handle(failure: str, die_after: int | None = None) -> AsgiHandle:
    return AsgiHandle(lambda: _replica_app(failure), die_after)


def _ingress(handle: AsgiHandle, tmp_path: Path, llm_timeout_s: float = 30.0) -> tuple[HttpIngress, Starlette]:
    """The real ingress (an empty repository: no tensor model) with `handle` as its LLM deployment."""
    spec = ServeAppSpec(str(tmp_path), llm_timeout_s=llm_timeout_s)
    ingress = HttpIngress(None, spec, handle)

    async def endpoint(request: Request) -> Response:
        return await ingress(request)

    return ingress, Starlette(routes=[Route("/{path:path}", endpoint, methods=["GET", "POST"])])


async def _chat_until_error(url: str) -> tuple[str, openai.APIError]:
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60.0)
    text = ""
    with pytest.raises(openai.APIError) as err:
        async for chunk in await client.chat.completions.create(model="m", messages=MESSAGES, stream=True):
            text += chunk.choices[0].delta.content or ""
    return text, err.value


@pytest.mark.parametrize(("failure", "die_after", "status", "code", "said"), [
    ("hang", 3, 503, "engine_unavailable", "was lost mid-answer (ActorDiedError)"),  # head + 2 events, then dead
    ("raise", None, 500, None, "failed mid-answer (BrokenAnswer"),
])
async def test_a_chat_stream_that_breaks_ends_with_an_openai_error_event(
        tmp_path: Path, failure: str, die_after: int | None, status: int, code: str | None, said: str) -> None:
    handle = _handle(failure, die_after)
    ingress, app = _ingress(handle, tmp_path)
    async with serve_asgi(app) as url:
        text, error = await _chat_until_error(url)
    assert text == "Hello there"  # what was sent before the break reached the client
    body = error.body
    assert isinstance(body, dict) and said in body["message"] and "incomplete" in body["message"], body
    assert body["code"] == code and body["type"] == ("server_error" if status in (500, 503) else "timeout_error")
    assert ingress.stats["streams_broken"] == 1
    closed = handle.streams[0].closed
    assert closed is not None  # the handle call was cancelled: the replica's app is closed (the engine aborts)
    await closed


async def test_a_silent_stream_ends_with_a_timeout_event_and_a_complete_one_with_none(tmp_path: Path) -> None:
    silent = _handle("hang")
    ingress, app = _ingress(silent, tmp_path, llm_timeout_s=1.0)
    async with serve_asgi(app) as url:
        text, error = await _chat_until_error(url)
    assert text == "Hello there" and isinstance(error.body, dict) and error.body["code"] == "request_timeout"
    assert ingress.stats["timeouts"] == 1 and ingress.stats["streams_broken"] == 0

    complete = _handle("none")
    ingress, app = _ingress(complete, tmp_path)
    async with serve_asgi(app) as url:
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60.0)
        chunks = [c async for c in await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)]
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Hello there"
    assert ingress.stats["streams_broken"] == 0


async def test_a_generate_stream_that_breaks_ends_with_tritons_error_event(tmp_path: Path) -> None:
    ingress, app = _ingress(_handle("hang", die_after=3), tmp_path)
    body = {"text_input": "hi"}
    async with (serve_asgi(app) as url, httpx.AsyncClient(timeout=60.0) as client,
                client.stream("POST", url + "/v2/models/m/generate_stream", json=body) as r):
        assert r.status_code == 200
        events = [json.loads(line[5:]) async for line in r.aiter_lines() if line.startswith("data:")]
    assert [e.get("text_output") for e in events[:2]] == ["Hello", " there"]
    assert len(events) == 3 and set(events[2]) == {"error"} and "lost mid-answer" in events[2]["error"]
    assert ingress.stats["streams_broken"] == 1
