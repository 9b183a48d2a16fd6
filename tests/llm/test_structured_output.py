"""Structured output through the real server (uvicorn on 127.0.0.1) and the official `openai` SDK: json_object and
json_schema (100 generated objects of a held-out schema validate with `jsonschema`), streaming beside a free
request whose greedy output is unchanged, tools refused for SmolLM2's template, and every invalid combination a
400 in OpenAI's error schema. Plus the edge parser's pure functions."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import jsonschema  # type: ignore[import-untyped]  # no stubs installed
import openai
import pytest

from headroom.llm.structured_output import check_tools, response_format_grammar, template_supports_tools
from headroom.protocol.openai_errors import FieldError
from tests.llm.test_http import _Server

# held out: written for this test only, never used while developing the grammar integration
CITY: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 1, "maxLength": 12},
        "population": {"type": "integer", "minimum": 0, "maximum": 40000000},
        "capital": {"type": "boolean"},
        "zone": {"enum": ["north", "south", "east", "west"]},
    },
    "required": ["city", "population", "capital", "zone"],
    "additionalProperties": False,
}
PROMPTS = ["Describe a city as JSON.", "Tell me about Paris.", "A small town by the sea.", "Any city.", "Tokyo?"]
TOOL: Any = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}


def _chat(client: openai.OpenAI, content: str, **kw: Any) -> Any:
    return client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": content}], **kw)


def _refused(client: openai.OpenAI, **kw: Any) -> dict[str, Any]:
    with pytest.raises(openai.BadRequestError) as err:
        _chat(client, "hi", max_tokens=4, **kw)
    body = err.value.response.json()["error"]
    assert set(body) == {"message", "type", "param", "code"} and body["type"] == "invalid_request_error"
    return dict(body)


def test_json_object_returns_a_parseable_object(client: openai.OpenAI) -> None:
    out = _chat(client, "Give me a JSON object describing a cat.", max_tokens=48, temperature=0,
                response_format={"type": "json_object"})
    choice = out.choices[0]
    if choice.finish_reason == "stop":  # ran to the grammar's end
        assert isinstance(json.loads(choice.message.content), dict)
    else:  # cut by max_tokens: still the JSON grammar's prefix
        assert choice.finish_reason == "length" and choice.message.content.startswith("{")


@pytest.mark.timeout(900)  # 100 sampled sequences: seconds on a quiet machine, minutes on a loaded one
async def test_100_objects_of_a_held_out_schema_all_validate(live: tuple[_Server, openai.OpenAI]) -> None:
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{live[0].port}/v1", api_key="unused", max_retries=0)
    # strict: false: minLength / maxLength are outside OpenAI's strict subset (test_strict_schema), yet enforced
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY, "strict": False}}
    outs = await asyncio.gather(*(
        client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": prompt}],
                                       max_tokens=64, temperature=1.0, seed=seed, n=10, response_format=fmt)
        for prompt in PROMPTS for seed in (1, 2)
    ))
    await client.close()
    objects = []
    print("completion tokens per request:", [out.usage.completion_tokens for out in outs if out.usage])
    for out in outs:
        for choice in out.choices:
            assert choice.finish_reason == "stop", choice.message.content
            objects.append(json.loads(choice.message.content or ""))
    assert len(objects) == 100
    for obj in objects:
        jsonschema.validate(obj, CITY)
    assert len({json.dumps(o, sort_keys=True) for o in objects}) > 10  # sampled, not one object repeated


def test_completions_take_response_format_too(client: openai.OpenAI) -> None:
    schema = {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 2, "maxItems": 3}
    out = client.completions.create(
        model="smollm2", prompt="Three colours:", max_tokens=32, temperature=0,
        extra_body={"response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": schema}}},
    )
    assert out.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(out.choices[0].text), schema)


async def test_a_constrained_stream_beside_a_free_one_leaves_the_free_greedy_output_unchanged(
    live: tuple[_Server, openai.OpenAI],
) -> None:
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{live[0].port}/v1", api_key="unused", max_retries=0)
    free_kw: Any = {"max_tokens": 32, "temperature": 0, "stream": True, "extra_body": {"ignore_eos": True}}
    long_json: Any = {"type": "json_schema", "json_schema": {
        "name": "ints", "schema": {"type": "array", "items": {"type": "integer"}, "minItems": 80}}}
    finished: list[str] = []

    async def text(stream: Any, name: str, first: asyncio.Event | None = None) -> str:
        parts: list[str] = []
        async for chunk in stream:
            if first is not None:
                first.set()
            parts.extend(c.delta.content or "" for c in chunk.choices)
        finished.append(name)
        return "".join(parts)

    msgs: Any = [{"role": "user", "content": "Write a short story about a robot."}]
    alone = await text(await client.chat.completions.create(model="smollm2", messages=msgs, **free_kw), "alone")
    started = asyncio.Event()
    constrained = asyncio.create_task(text(await client.chat.completions.create(
        model="smollm2", messages=msgs, max_tokens=200, temperature=0, stream=True, response_format=long_json,
    ), "constrained", started))
    await asyncio.wait_for(started.wait(), 120)
    beside = await text(await client.chat.completions.create(model="smollm2", messages=msgs, **free_kw), "beside")
    json_text = await asyncio.wait_for(constrained, 240)
    await client.close()
    assert finished == ["alone", "beside", "constrained"]  # the free one ran while the constrained one decoded
    assert beside == alone and len(alone) > 0
    assert json_text.startswith("[") and all(c in "[],-0123456789" for c in json_text)


def test_tools_are_refused_because_the_template_does_not_render_them(client: openai.OpenAI) -> None:
    body = _refused(client, tools=[TOOL])
    assert body["param"] == "tools" and body["code"] == "unsupported_parameter"
    assert "chat template of model 'smollm2' does not support tools" in body["message"]
    assert _refused(client, tools=[TOOL], tool_choice="required")["param"] == "tools"
    assert _refused(client, tool_choice="auto")["param"] == "tool_choice"
    assert _refused(client, parallel_tool_calls=True)["param"] == "parallel_tool_calls"
    # SmolLM2's template renders any role (a tool message's text) but never an assistant's tool_calls: refused
    call = {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}
    turns: Any = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [call]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="smollm2", messages=turns, max_tokens=4)
    body = err.value.response.json()["error"]
    assert body["param"] == "messages.1.tool_calls" and body["code"] == "unsupported_parameter"
    assert "does not render an assistant message's tool_calls" in body["message"]


@pytest.mark.parametrize(
    ("response_format", "param"),
    [
        ({"type": "xml"}, "response_format.type"),
        ({"type": "json_schema"}, "response_format.json_schema"),
        ({"type": "json_schema", "json_schema": {"schema": {}}}, "response_format.json_schema.name"),
        ({"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}}, "response_format.json_schema.name"),
        ({"type": "json_schema", "json_schema": {"name": "a", "schema": []}}, "response_format.json_schema.schema"),
        ({"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "foo"}}},
         "response_format.json_schema.schema"),
        ({"type": "json_schema", "json_schema": {"name": "a", "schema": {"pattern": "(("}}},
         "response_format.json_schema.schema"),
        ({"type": "json_schema", "json_schema": {"name": "a", "strict": "yes"}}, "response_format.json_schema.strict"),
        ({"type": "json_schema", "json_schema": {"name": "a", "schemas": {}}}, "response_format.json_schema.schemas"),
        ({"type": "json_object", "json_schema": {"name": "a"}}, "response_format.json_schema"),
        ({"type": "json_object", "extra": 1}, "response_format.extra"),
    ],
)
def test_invalid_response_formats_are_400s_naming_the_field(
    client: openai.OpenAI, response_format: Any, param: str
) -> None:
    assert _refused(client, response_format=response_format)["param"] == param


def test_invalid_combinations_are_400s(client: openai.OpenAI) -> None:
    body = _refused(client, response_format={"type": "json_object"}, extra_body={"ignore_eos": True})
    assert body["param"] == "ignore_eos"
    assert _refused(client, extra_body={"functions": [TOOL["function"]]})["code"] == "unsupported_parameter"
    assert _refused(client, extra_body={"response_format": "json"})["code"] == "invalid_type"
    ok = _chat(client, "hi", max_tokens=3, temperature=0, response_format={"type": "text"})  # text = as before
    assert ok.choices[0].finish_reason == "length"


def test_edge_parser_pure_functions() -> None:
    assert response_format_grammar({"type": "text"}) is None
    assert "json_schema" in str(response_format_grammar({"type": "json_object"}))
    assert template_supports_tools("{% if tools %}{{ tools | tojson }}{% endif %}")
    assert not template_supports_tools("{{ message['content'] }} toolsmith") and not template_supports_tools(None)
    check_tools({}, False, "m")  # nothing sent: nothing to refuse
    with pytest.raises(FieldError, match="tool_choice needs tools"):
        check_tools({"tool_choice": "auto"}, True, "m")
