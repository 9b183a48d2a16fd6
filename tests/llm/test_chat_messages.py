"""Tool-call turns (headroom.llm.chat_messages): the whole OpenAI round trip through a real `headroom serve` and the
official `openai` SDK, with SmolLM2 served under a chat template that renders tools and tool turns
(`parameters.chat_template`, the template of tests/llm/test_tools.py); tools with a JSON response_format; strict
schemas refused naming the path; the conversation-order 400s. Plus the pure message conversion and the probe."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jsonschema  # type: ignore[import-untyped]  # no stubs installed
import openai
import pytest
import yaml

from headroom.llm.chat_messages import ToolTurns, probe_tool_turns, template_messages
from headroom.protocol.openai_errors import FieldError
from tests.llm.test_tools import PARAMS, TEMPLATE
from tests.llm.test_tools import TOOLS as TOOL_LIST
from tests.support.server import RunningServer, run_server

REPO = Path(__file__).resolve().parents[2] / "models"
ASK: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
TOOLS: Any = TOOL_LIST  # the SDK's typed params


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("tool-turns")
    config = yaml.safe_load((REPO / "smollm2" / "config.yaml").read_text())
    config["parameters"].update(chat_template=TEMPLATE, kv_cache_memory_mb=64, warmup_tokens=1)
    (tmp / "repo" / "smollm2").mkdir(parents=True)
    (tmp / "repo" / "smollm2" / "config.yaml").write_text(yaml.safe_dump(config))
    with run_server(tmp / "repo", tmp, ["--grpc-port", "-1"]) as srv:
        yield srv


@pytest.fixture
def client(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)


def _refused(client: openai.OpenAI, **kw: Any) -> dict[str, Any]:
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="smollm2", max_tokens=4, **{"messages": ASK, **kw})
    body = err.value.response.json()["error"]
    assert set(body) == {"message", "type", "param", "code"} and body["type"] == "invalid_request_error"
    return dict(body)


def test_a_tool_result_goes_back_to_the_model_through_the_openai_sdk(client: openai.OpenAI) -> None:
    messages: list[Any] = list(ASK)
    first = client.chat.completions.create(model="smollm2", messages=messages, tools=TOOLS, tool_choice="required",
                                           parallel_tool_calls=False, temperature=0, max_tokens=64)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls, choice
    for call in choice.message.tool_calls:
        assert call.type == "function"
        jsonschema.validate(json.loads(call.function.arguments), PARAMS[call.function.name])
    messages.append(choice.message)  # the SDK's own message object, as OpenAI's guide does
    messages.extend({"role": "tool", "tool_call_id": call.id, "content": '{"temperature_c": 21, "sky": "clear"}'}
                    for call in choice.message.tool_calls)
    second = client.chat.completions.create(model="smollm2", messages=messages, tools=TOOLS, tool_choice="none",
                                            temperature=0, max_tokens=16)
    answer = second.choices[0]
    assert answer.finish_reason in ("stop", "length") and answer.message.content and not answer.message.tool_calls
    assert first.usage is not None and second.usage is not None
    # the second prompt holds the first plus the rendered calls and the result
    assert second.usage.prompt_tokens > first.usage.prompt_tokens + 20
    streamed = client.chat.completions.create(model="smollm2", messages=messages, tools=TOOLS, tool_choice="none",
                                              temperature=0, max_tokens=16, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == answer.message.content


def test_auto_with_a_strict_json_format_answers_with_calls_or_that_json(client: openai.OpenAI) -> None:
    schema = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"],
              "additionalProperties": False}
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "answer", "strict": True, "schema": schema}}
    out = client.chat.completions.create(model="smollm2", messages=ASK, tools=TOOLS, tool_choice="auto",
                                         parallel_tool_calls=False, response_format=fmt, temperature=1.0, seed=3,
                                         n=6, max_tokens=96)  # one call at most: every output ends in the budget
    for choice in out.choices:
        if choice.finish_reason == "tool_calls":
            for call in choice.message.tool_calls or []:
                assert call.type == "function"
                jsonschema.validate(json.loads(call.function.arguments), PARAMS[call.function.name])
        else:
            assert choice.finish_reason == "stop", choice
            jsonschema.validate(json.loads(choice.message.content or ""), schema)
    required = client.chat.completions.create(model="smollm2", messages=ASK, tools=TOOLS, tool_choice="required",
                                              parallel_tool_calls=False, response_format=fmt, temperature=0,
                                              max_tokens=64)
    assert required.choices[0].finish_reason == "tool_calls"


def test_strict_schemas_that_break_openais_rules_are_400s_naming_the_path(client: openai.OpenAI) -> None:
    loose = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}, "required": ["a"],
             "additionalProperties": False}
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "x", "strict": True, "schema": loose}}
    body = _refused(client, response_format=fmt)
    assert body["param"] == "response_format.json_schema.schema.required" and "missing 'b'" in body["message"]
    fmt["json_schema"]["strict"] = False  # the same schema without strict: accepted and enforced
    ok = client.chat.completions.create(model="smollm2", messages=ASK, response_format=fmt, temperature=0,
                                        max_tokens=48)
    assert ok.choices[0].finish_reason in ("stop", "length")
    nested = {**loose, "required": ["a", "b"], "properties": {
        "a": {"type": "object", "properties": {"c": {"type": "string", "maxLength": 3}}, "required": ["c"],
              "additionalProperties": False}, "b": {"type": "integer"}}}
    tool: Any = {"type": "function", "function": {"name": "f", "strict": True, "parameters": nested}}
    body = _refused(client, tools=[tool])
    assert body["param"] == "tools.0.function.parameters.properties.a.properties.c.maxLength"
    assert "'maxLength' is not supported in strict mode" in body["message"]


def test_tool_turns_out_of_order_are_400s(client: openai.OpenAI) -> None:
    call: Any = {"id": "call_1", "type": "function", "function": {"name": "time", "arguments": '{"tz": "UTC"}'}}
    made: Any = {"role": "assistant", "content": None, "tool_calls": [call]}
    result: Any = {"role": "tool", "tool_call_id": "call_1", "content": "12:00"}
    assert _refused(client, messages=[*ASK, result])["param"] == "messages.1.tool_call_id"  # answers nothing
    assert _refused(client, messages=[*ASK, made, *ASK])["param"] == "messages.2"  # call left unanswered
    bad = {**made, "tool_calls": [{**call, "function": {"name": "time", "arguments": "{tz"}}]}
    body = _refused(client, messages=[*ASK, bad, result])
    assert body["param"] == "messages.1.tool_calls.0.function.arguments" and "not valid JSON" in body["message"]
    assert _refused(client, messages=[*ASK, {**result, "tool_call_id": None}])["param"] == "messages.1.tool_call_id"
    ok = client.chat.completions.create(model="smollm2", messages=[*ASK, made, result], max_tokens=2)
    assert ok.choices[0].finish_reason == "length"  # the same turns in order: accepted (without tools too)


# --- pure -----------------------------------------------------------------------------------------------------
def _msg(role: str, content: Any = "x", tool_calls: Any = None, tool_call_id: Any = None) -> Any:
    return SimpleNamespace(role=role, content=content, tool_calls=tool_calls, tool_call_id=tool_call_id)


def test_messages_reach_the_template_as_vllm_gives_them() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": [1, 2]}'}}
    empty = {"id": "c2", "type": "function", "function": {"name": "g", "arguments": ""}}
    out = template_messages([_msg("user"), _msg("assistant", None, [call, empty]), _msg("tool", "r1", None, "c1"),
                             _msg("tool", [{"type": "text", "text": "r2"}], None, "c2"), _msg("user")],
                            ToolTurns(True, True), "m")
    assert out[1] == {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"a": [1, 2]}}},
        {"id": "c2", "type": "function", "function": {"name": "g", "arguments": {}}}]}
    assert out[2] == {"role": "tool", "content": "r1", "tool_call_id": "c1"} and out[3]["content"] == "r2"
    with pytest.raises(FieldError) as err:
        template_messages([_msg("user"), _msg("assistant", None, [call])], ToolTurns(False, True), "m")
    assert err.value.param == "messages.1.tool_calls" and err.value.code == "unsupported_parameter"
    with pytest.raises(FieldError) as err:
        template_messages([_msg("user"), _msg("assistant", None, [call])], ToolTurns(True, True), "m")
    assert err.value.param == "messages.1" and "c1" in err.value.message  # the last call never answered
    for bad, param in [({**call, "id": ""}, "messages.1.tool_calls.0.id"),
                       ({**call, "x": 1}, "messages.1.tool_calls.0.x"),
                       ({**call, "type": "code"}, "messages.1.tool_calls.0")]:
        with pytest.raises(FieldError) as err:
            template_messages([_msg("user"), _msg("assistant", None, [bad])], ToolTurns(True, True), "m")
        assert err.value.param == param
    with pytest.raises(FieldError, match="tool messages only"):
        template_messages([_msg("user", tool_call_id="c1")], ToolTurns(True, True), "m")


def test_the_probe_sees_what_a_template_renders() -> None:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def render(source: str) -> Any:
        template = ImmutableSandboxedEnvironment().from_string(source)
        return lambda chat: template.render(messages=chat)

    smollm2 = "{% for m in messages %}{{ m['role'] + ': ' + m['content'] }}\n{% endfor %}"  # any role, no calls
    assert probe_tool_turns(render(smollm2)) == ToolTurns(False, True)
    assert probe_tool_turns(render(TEMPLATE)) == ToolTurns(True, True)
    assert probe_tool_turns(render("{{ raise_exception('no tools') }}")) == ToolTurns(False, False)


def test_the_documented_template_is_the_one_tested() -> None:
    import re

    doc = (Path(__file__).resolve().parents[2] / "docs" / "structured_output.md").read_text()
    block = re.search(r"```yaml\n(parameters:\n  chat_template: .*?)```", doc, re.S)
    assert block is not None and yaml.safe_load(block.group(1))["parameters"]["chat_template"] == TEMPLATE
