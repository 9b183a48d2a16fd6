"""OpenAIServing without a transport: response shapes, SSE framing, errors (400/404/429/503)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from headroom.llm.openai_protocol import ServingResponse
from headroom.llm.serving import OpenAIServing


@pytest.fixture
async def serving(tiny_serving_factory: Any) -> OpenAIServing:
    s: OpenAIServing = await tiny_serving_factory(max_waiting_requests=2)
    return s


async def _sse(resp: ServingResponse) -> list[Any]:
    assert resp.stream is not None
    events = []
    async for chunk in resp.stream:
        if chunk.startswith(":"):  # an SSE comment: only the stream's Server-Timing, right before [DONE]
            assert chunk.startswith(": server-timing ") and chunk.endswith("\n\n") and "total;dur=" in chunk
            continue
        assert chunk.startswith("data: ") and chunk.endswith("\n\n")
        payload = chunk[len("data: ") : -2]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


async def test_chat_completion_shape_and_usage(serving: OpenAIServing) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5, "temperature": 0}
    resp = await serving.create_chat_completion({**body, "ignore_eos": True})
    assert resp.status == 200 and resp.body is not None
    choice = resp.body["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["finish_reason"] == "length"
    usage = resp.body["usage"]
    assert usage["completion_tokens"] == 5 and usage["total_tokens"] == usage["prompt_tokens"] + 5
    assert resp.body["object"] == "chat.completion" and resp.body["model"] == "tiny"


async def test_streaming_chat_matches_non_streaming_and_ends_with_done(serving: OpenAIServing) -> None:
    body = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    full = await serving.create_chat_completion(body)
    events = await _sse(
        await serving.create_chat_completion({**body, "stream": True, "stream_options": {"include_usage": True}})
    )
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-1])
    assert full.body is not None and text == full.body["choices"][0]["message"]["content"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"


async def test_completion_logprobs_and_n(serving: OpenAIServing) -> None:
    body = {"prompt": "Once upon", "max_tokens": 3, "n": 2, "seed": 3, "logprobs": 2, "ignore_eos": True}
    resp = await serving.create_completion(body)
    assert resp.status == 200 and resp.body is not None, resp.body
    choices = resp.body["choices"]
    assert [c["index"] for c in choices] == [0, 1]
    lp = choices[0]["logprobs"]
    assert len(lp["tokens"]) == 3 and len(lp["top_logprobs"][0]) == 2
    assert all(v <= 0 for v in lp["token_logprobs"])


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"messages": []}, 400, "messages"),
        ({"messages": [{"role": "user", "content": "x"}], "temperature": 5}, 400, "temperature"),
        ({"messages": [{"role": "user", "content": "x"}], "model": "gpt-4"}, 404, None),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 10_000}, 400, None),
    ],
)
async def test_errors_have_openai_shape(
    serving: OpenAIServing, body: dict[str, Any], status: int, param: str | None
) -> None:
    resp = await serving.create_chat_completion(body)
    assert resp.status == status and resp.body is not None
    err = resp.body["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["param"] == param and err["message"]


async def test_context_overflow_message_says_how_to_fix(serving: OpenAIServing) -> None:
    resp = await serving.create_completion({"prompt": "a b c", "max_tokens": 10_000})
    assert resp.status == 400 and resp.body is not None
    assert "maximum context length is 512" in resp.body["error"]["message"]


async def test_full_waiting_queue_is_429_with_retry_after(serving: OpenAIServing) -> None:
    resp = await serving.create_completion({"prompt": "hi", "max_tokens": 2, "n": 3})  # 3 sequences > 2 slots
    assert resp.status == 429 and resp.headers["Retry-After"] == "1"
    assert resp.body is not None and resp.body["error"]["code"] == "rate_limit_exceeded"


async def test_not_ready_is_503() -> None:
    resp = await OpenAIServing("tiny").create_completion({"prompt": "hi"})
    assert resp.status == 503 and resp.body is not None and resp.body["error"]["type"] == "server_error"


async def test_model_cards(serving: OpenAIServing) -> None:
    (card,) = serving.model_cards()
    assert card["id"] == "tiny" and card["object"] == "model" and card["max_model_len"] == 512


async def test_request_past_its_deadline_is_504_and_aborted(serving: OpenAIServing) -> None:
    assert serving.engine is not None
    serving.request_timeout_s = 1e-9  # already over when the first output could arrive
    body = {"prompt": "Once upon a time", "max_tokens": 200, "ignore_eos": True}
    resp = await serving.create_completion(body)
    assert resp.status == 504 and resp.body is not None and resp.body["error"]["code"] == "request_timeout"
    events = await _sse(await serving.create_completion({**body, "stream": True}))
    assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "request_timeout"
    engine = serving.engine.engine
    for _ in range(500):  # the abort reaches the engine thread within a step or two
        if not engine.has_unfinished:
            break
        await asyncio.sleep(0.01)
    assert not engine.has_unfinished and engine.kv.num_free_blocks == engine.kv.num_blocks


async def test_a_tokenizer_failure_is_a_500_json_for_that_request_only(
    serving: OpenAIServing, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "temperature": 0}

    def broken(*args: object, **kwargs: object) -> str:
        raise RuntimeError("template exploded")

    assert serving.tokenizer is not None
    monkeypatch.setattr(serving.tokenizer, "apply_chat_template", broken)
    failed = await serving.create_chat_completion(body)
    assert failed.status == 500 and failed.body is not None
    assert "template exploded" in failed.body["error"]["message"]
    monkeypatch.undo()
    assert (await serving.create_chat_completion(body)).status == 200


async def test_a_failure_while_streaming_ends_the_stream_with_an_error_event(
    serving: OpenAIServing, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(token_id: int) -> str:
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")

    monkeypatch.setattr(serving, "_token_text", broken)
    body = {"prompt": "Hi", "max_tokens": 3, "temperature": 0, "logprobs": 2, "stream": True}
    events = await _sse(await serving.create_completion(body))
    assert events[-1] == "[DONE]" and "invalid start byte" in events[-2]["error"]["message"]
