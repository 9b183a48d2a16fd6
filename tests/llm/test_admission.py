"""LLM requests under the server's lifecycle: counted in flight until their response is complete, refused
with 503 + `x-headroom-draining: 1` once drain started."""

from __future__ import annotations

from typing import Any

import pytest

from headroom.llm.serving import OpenAIServing

BODY = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0, "ignore_eos": True}


@pytest.fixture
def serving(tiny_serving: Any) -> OpenAIServing:
    s: OpenAIServing = tiny_serving
    return s


async def test_a_json_response_is_released_when_returned(serving: OpenAIServing) -> None:
    resp = await serving.create_chat_completion(BODY)
    assert resp.status == 200 and serving.lifecycle.inflight == 0
    bad = await serving.create_chat_completion({"messages": []})
    assert bad.status == 400 and serving.lifecycle.inflight == 0


async def test_a_stream_is_in_flight_until_its_last_event(serving: OpenAIServing) -> None:
    resp = await serving.create_chat_completion({**BODY, "stream": True})
    assert resp.stream is not None and serving.lifecycle.inflight == 1
    events = [chunk async for chunk in resp.stream]
    assert events[-1] == "data: [DONE]\n\n" and serving.lifecycle.inflight == 0


async def test_a_stream_closed_by_the_transport_is_released_even_before_its_first_event(
    serving: OpenAIServing,
) -> None:
    resp = await serving.create_chat_completion({**BODY, "stream": True})
    assert resp.stream is not None and serving.lifecycle.inflight == 1
    await resp.stream.aclose()  # type: ignore[attr-defined]  # the client left before anything was sent
    await resp.stream.aclose()  # type: ignore[attr-defined]  # idempotent: released once
    assert serving.lifecycle.inflight == 0


async def test_draining_refuses_with_the_draining_header_and_waits_for_open_streams(serving: OpenAIServing) -> None:
    open_stream = await serving.create_chat_completion({**BODY, "stream": True})
    serving.lifecycle.start_draining()
    refused = await serving.create_completion({"prompt": "hi", "max_tokens": 2})
    assert refused.status == 503 and refused.headers["x-headroom-draining"] == "1"
    assert refused.body is not None and refused.body["error"]["code"] == "engine_unavailable"
    assert not await serving.lifecycle.wait_idle(0.0)
    assert open_stream.stream is not None
    events = [chunk async for chunk in open_stream.stream]  # the admitted stream still runs to its end
    data = [e for e in events if e.startswith("data:")]  # (the stream's Server-Timing is an SSE comment)
    assert '"finish_reason":"length"' in data[-2] and await serving.lifecycle.wait_idle(1.0)
