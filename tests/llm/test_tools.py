"""Tool calling (headroom.llm.tools) with a chat template that renders tools, through `OpenAIServing` over the tiny
random decoder with SmolLM2's vocabulary (SmolLM2's own template does not render tools: tests/llm/
test_structured_output.py checks its 400). The decoder's output is noise, so only the grammar makes calls."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import jsonschema  # type: ignore[import-untyped]  # no stubs installed
import pytest

from headroom.llm.async_engine import AsyncLLMEngine
from headroom.llm.config import EngineConfig
from headroom.llm.offline import build_engine
from headroom.llm.serving import OpenAIServing
from headroom.llm.tokenizer import Tokenizer
from headroom.llm.tools import parse_tool_calls, plan_tools
from tests.llm.test_serving import _sse

# a ChatML template that renders tools and tool-call turns (an assistant's calls as the JSON array the model is
# asked to answer with, a tool message as a `tool` turn); the real-server tests (test_chat_messages) serve it too
TEMPLATE = (
    "{% if tools %}<|im_start|>system\nFunctions: {{ tools | tojson }}\nAnswer with a JSON array of calls."
    "<|im_end|>\n{% endif %}{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message.get('tool_calls') %}{{ message['tool_calls'] | map(attribute='function') | list | tojson }}"
    "{% else %}{{ message['content'] }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
WEATHER: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 10}, "unit": {"enum": ["C", "F"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": "weather", "description": "Weather in a city", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "time", "parameters": {
        "type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}}, "required": ["tz"],
        "additionalProperties": False}}},
]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture
async def serving(tiny_chat_parts: Any) -> AsyncIterator[OpenAIServing]:
    cfg, state, tok = tiny_chat_parts
    tools_tok = Tokenizer(replace(tok.files, chat_template=TEMPLATE))
    engine = build_engine(cfg, state, EngineConfig(kv_cache_memory_mb=8), tools_tok)
    aengine = AsyncLLMEngine(engine)
    aengine.start()
    serving = OpenAIServing("tiny")
    serving.attach(aengine, tools_tok, engine.max_model_len)
    yield serving
    await aengine.stop()
    assert engine.kv.num_free_blocks == engine.kv.num_blocks


async def _chat(serving: OpenAIServing, **fields: Any) -> tuple[int, dict[str, Any]]:
    resp = await serving.create_chat_completion({"messages": ASK, "max_tokens": 96, "temperature": 1.0, **fields})
    assert resp.body is not None
    return resp.status, dict(resp.body)


async def test_required_tool_calls_come_back_in_openais_shape(serving: OpenAIServing) -> None:
    # the noise model may append calls until max_tokens: a seed (fixed, so deterministic) whose 3 completions close
    # their arrays in time
    status, body = await _chat(serving, tools=TOOLS, tool_choice="required", seed=3, n=3)
    assert status == 200, body
    for choice in body["choices"]:
        assert choice["finish_reason"] == "tool_calls"
        assert choice["message"]["content"] is None and choice["message"]["tool_calls"]
        for call in choice["message"]["tool_calls"]:
            assert call["type"] == "function" and call["id"].startswith("call_")
            args = json.loads(call["function"]["arguments"])
            jsonschema.validate(args, PARAMS[call["function"]["name"]])
    free = (await _chat(serving, max_tokens=1))[1]["usage"]["prompt_tokens"]
    assert body["usage"]["prompt_tokens"] > free + 20  # the template rendered the tools into the prompt


async def test_a_named_function_and_no_parallel_calls(serving: OpenAIServing) -> None:
    choice_ = {"type": "function", "function": {"name": "time"}}
    status, body = await _chat(serving, tools=TOOLS, tool_choice=choice_, parallel_tool_calls=False, seed=2)
    assert status == 200, body
    calls = body["choices"][0]["message"]["tool_calls"]
    assert len(calls) == 1 and calls[0]["function"]["name"] == "time"
    assert json.loads(calls[0]["function"]["arguments"])["tz"] in ("UTC", "CET")


async def test_streamed_tool_calls_arrive_in_one_chunk_when_the_choice_finishes(serving: OpenAIServing) -> None:
    body = {"messages": ASK, "max_tokens": 96, "temperature": 1.0, "seed": 3, "tools": TOOLS,
            "tool_choice": "required", "stream": True, "stream_options": {"include_usage": True}}
    events = await _sse(await serving.create_chat_completion(body))
    assert events[-1] == "[DONE]" and events[-2]["choices"] == [] and events[-2]["usage"]["completion_tokens"] > 0
    choices = [e["choices"][0] for e in events[:-2]]
    assert choices[0]["delta"] == {"role": "assistant", "content": ""} and len(choices) == 2
    final = choices[1]
    assert final["finish_reason"] == "tool_calls" and "content" not in final["delta"]
    calls = final["delta"]["tool_calls"]
    assert [c["index"] for c in calls] == list(range(len(calls)))
    for call in calls:
        jsonschema.validate(json.loads(call["function"]["arguments"]), PARAMS[call["function"]["name"]])
    auto = await _sse(await serving.create_chat_completion(
        {**body, "tool_choice": "auto", "max_tokens": 6, "ignore_eos": True, "stream_options": None}))
    assert auto[-2]["choices"][0]["finish_reason"] == "length" and auto[-2]["choices"][0]["delta"]["content"]


ANSWER: dict[str, Any] = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}},
                          "required": ["answer"], "additionalProperties": False}
FORMAT = {"type": "json_schema", "json_schema": {"name": "answer", "strict": True, "schema": ANSWER}}


async def test_auto_with_a_json_format_answers_with_calls_or_the_formats_json(serving: OpenAIServing) -> None:
    status, body = await _chat(serving, tools=TOOLS, tool_choice="auto", response_format=FORMAT, seed=4, n=8,
                               parallel_tool_calls=False)  # one call at most: every output ends within max_tokens
    assert status == 200, body
    kinds = set()
    for choice in body["choices"]:  # noise, shaped only by the grammar: anyOf(a call array, the format)
        if choice["finish_reason"] == "tool_calls":
            for call in choice["message"]["tool_calls"]:
                jsonschema.validate(json.loads(call["function"]["arguments"]), PARAMS[call["function"]["name"]])
            kinds.add("calls")
        else:
            assert choice["finish_reason"] == "stop", choice
            jsonschema.validate(json.loads(choice["message"]["content"]), ANSWER)
            kinds.add("format")
    assert kinds  # (which branch the noise takes is the sampler's business)


async def test_required_with_a_json_format_still_answers_with_calls(serving: OpenAIServing) -> None:
    status, body = await _chat(serving, tools=TOOLS, tool_choice="required", response_format=FORMAT, seed=5, n=2,
                               parallel_tool_calls=False)
    assert status == 200, body
    assert all(c["finish_reason"] == "tool_calls" for c in body["choices"])
    status, body = await _chat(serving, tools=TOOLS, tool_choice="none", response_format=FORMAT, seed=6)
    assert status == 200 and json.loads(body["choices"][0]["message"]["content"])["answer"] in ("yes", "no")


async def test_none_and_auto_leave_the_output_free(serving: OpenAIServing) -> None:
    for choice in ("none", "auto"):
        status, body = await _chat(serving, tools=TOOLS, tool_choice=choice, max_tokens=8, ignore_eos=True)
        assert status == 200, body
        out = body["choices"][0]
        assert out["finish_reason"] == "length" and "tool_calls" not in out["message"]  # noise is not a call


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools.0.function.name"),
        ({"tools": [{"type": "retrieval"}]}, "tools.0"),
        ({"tools": []}, "tools"),
        ({"tools": TOOLS + TOOLS[:1]}, "tools.2.function.name"),
        ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "f", "strict": True, "parameters": {
            "type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}}}]},
         "tools.0.function.parameters"),
        ({"tools": [{"type": "function", "function": {"name": "f", "strict": "yes"}}]}, "tools.0.function.strict"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parametres": {}}}]}, "tools.0.function.parametres"),
        ({"tools": TOOLS, "tool_choice": "required", "ignore_eos": True}, "ignore_eos"),
    ],
)
async def test_bad_tool_requests_are_400s_naming_the_field(
    serving: OpenAIServing, fields: dict[str, Any], param: str
) -> None:
    status, body = await _chat(serving, **fields)
    assert status == 400 and body["error"]["param"] == param, body


def test_parse_tool_calls_reads_only_call_arrays_of_known_functions() -> None:
    calls = parse_tool_calls('[{"name": "time", "arguments": {"tz": "UTC"}}]', ("time",))
    assert calls is not None and calls[0]["function"] == {"name": "time", "arguments": '{"tz": "UTC"}'}
    for text in ("hello", "[]", '[{"name": "other", "arguments": {}}]', '[{"name": "time"}]', '{"name": "time"}'):
        assert parse_tool_calls(text, ("time",)) is None
    plan = plan_tools(TOOLS, "required", False)
    assert plan.schema is not None and plan.schema["maxItems"] == 1 and plan.allowed == ("weather", "time")
