"""OpenAI tool calling for chat templates that render tools: the request's tools -> a plan, the output -> tool_calls.

The model is asked (by its own chat template, which gets `tools`) to answer with the calls as one JSON array,
`[{"name": <function>, "arguments": {...}}]`:

- `tool_choice: "none"`: tools are rendered, the output is text;
- `"auto"` (the default when tools are sent): the output is free (with a JSON response_format: such an array
  or the format's JSON, `calls_schema`); when it is exactly such an array naming known functions it comes back
  as `tool_calls`, else as text;
- `"required"` or `{"type": "function", "function": {"name": ...}}`: the output is constrained (a JSON schema:
  each call's `name` one of the allowed functions, its `arguments` that function's `parameters`), so it always
  parses into `tool_calls`. `parallel_tool_calls: false` allows one call.
- a function's `strict: true` applies OpenAI's strict-mode rules to its `parameters` (headroom.llm.strict_schema).

Calls come back in OpenAI's shape with `finish_reason: "tool_calls"`; streamed, a choice that may be calls is
held back and sent as one chunk when it finishes (`final_tool_delta`). Every refusal is a FieldError (400).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from headroom.llm.request import SequenceOutput
from headroom.llm.strict_schema import check_strict
from headroom.protocol.openai_errors import FieldError

_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
MAX_TOOLS = 128


@dataclass(frozen=True, slots=True)
class ToolPlan:
    """What a request's tools mean for its generation."""

    tools: tuple[dict[str, Any], ...]  # the functions as sent (what the chat template renders)
    allowed: tuple[str, ...]  # function names the output may call
    schema: dict[str, Any] | None  # the JSON schema the output must follow (required / named); None = free
    parse_calls: bool  # turn an output that is a call array into tool_calls (auto, required, named)
    calls_schema: dict[str, Any] | None = None  # a call array of the allowed functions (auto: with a JSON
    #   response_format the output is this or the format's JSON)


def plan_tools(tools: object, tool_choice: object, parallel_tool_calls: object) -> ToolPlan:
    """Validate OpenAI's tool fields (for a template that renders tools) and plan the generation."""
    sent, functions = _functions(tools)
    names = tuple(f["name"] for f in functions)
    params = {f["name"]: f.get("parameters", {"type": "object"}) for f in functions}
    parallel = True if parallel_tool_calls is None else parallel_tool_calls
    if not isinstance(parallel, bool):
        raise FieldError("parallel_tool_calls", "parallel_tool_calls must be true or false", "invalid_type")
    choice = "auto" if tool_choice is None else tool_choice
    if choice == "none":
        return ToolPlan(sent, names, None, False)
    if choice == "auto":
        return ToolPlan(sent, names, None, True, _calls_schema(names, params, parallel))
    if choice == "required":
        allowed = names
    elif isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if name not in names:
            raise FieldError("tool_choice", f"tool_choice names function {name!r}, which is not in tools")
        allowed = (name,)
    else:
        raise FieldError("tool_choice", "tool_choice must be 'none', 'auto', 'required' or "
                         '{"type": "function", "function": {"name": ...}}')
    schema = _calls_schema(allowed, params, parallel)
    return ToolPlan(sent, allowed, schema, True, schema)


def _calls_schema(allowed: tuple[str, ...], params: dict[str, Any], parallel: bool) -> dict[str, Any]:
    """A JSON array of calls, each `{"name": <one of allowed>, "arguments": <its parameters>}`."""
    call = [{"type": "object", "properties": {"name": {"const": n}, "arguments": params[n]},
             "required": ["name", "arguments"], "additionalProperties": False} for n in allowed]
    schema: dict[str, Any] = {"type": "array", "items": {"anyOf": call}, "minItems": 1}
    if not parallel:
        schema["maxItems"] = 1
    return schema


def parse_tool_calls(text: str, allowed: tuple[str, ...]) -> list[dict[str, Any]] | None:
    """OpenAI `tool_calls` when `text` is a JSON array of calls to allowed functions; None otherwise."""
    try:
        calls = json.loads(text)
    except ValueError:
        return None
    if not isinstance(calls, list) or not calls:
        return None
    out = []
    for call in calls:
        if not isinstance(call, dict) or call.get("name") not in allowed or not isinstance(call.get("arguments"), dict):
            return None
        out.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                    "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])}})
    return out


def with_tool_calls(choice: dict[str, Any], plan: ToolPlan) -> dict[str, Any]:
    """A final chat choice whose text is a call array, as OpenAI's tool_calls (`finish_reason: "tool_calls"`)."""
    message = choice.get("message") or {}
    calls = parse_tool_calls(message.get("content") or "", plan.allowed) if choice["finish_reason"] == "stop" else None
    if not plan.parse_calls or calls is None:
        return choice
    return {**choice, "message": {"role": "assistant", "content": None, "tool_calls": calls},
            "finish_reason": "tool_calls"}


def final_tool_delta(out: SequenceOutput, plan: ToolPlan) -> dict[str, Any]:
    """A streamed choice's one chunk (sent when it finished): its calls as `delta.tool_calls` with
    `finish_reason: "tool_calls"`, or, when the text is not a call array, the whole text as `delta.content`."""
    finish = out.finish_reason.value if out.finish_reason else None
    calls = parse_tool_calls(out.text, plan.allowed) if finish == "stop" else None
    if calls is None:
        return {"index": out.index, "delta": {"content": out.text}, "logprobs": None, "finish_reason": finish}
    delta = {"tool_calls": [{"index": i, **call} for i, call in enumerate(calls)]}
    return {"index": out.index, "delta": delta, "logprobs": None, "finish_reason": "tool_calls"}


def _functions(tools: object) -> tuple[tuple[dict[str, Any], ...], list[dict[str, Any]]]:
    """(the tools as sent, their `function` objects), each checked."""
    if not isinstance(tools, list) or not tools:
        raise FieldError("tools", "tools must be a non-empty list of {\"type\": \"function\", \"function\": {...}}",
                         "invalid_type")
    if len(tools) > MAX_TOOLS:
        raise FieldError("tools", f"tools takes at most {MAX_TOOLS} functions, got {len(tools)}")
    out: list[dict[str, Any]] = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
        if not isinstance(fn, dict):
            raise FieldError(f"tools.{i}", f"tools.{i} must be {{\"type\": \"function\", \"function\": {{...}}}}")
        if not isinstance(fn.get("name"), str) or not _NAME.match(fn["name"]):
            raise FieldError(f"tools.{i}.function.name", "a function name is 1-64 letters, digits, '_' or '-'")
        if "parameters" in fn and not isinstance(fn["parameters"], dict):
            raise FieldError(f"tools.{i}.function.parameters", "parameters must be a JSON schema object",
                             "invalid_type")
        unknown = sorted(set(fn) - {"name", "description", "parameters", "strict"})
        if unknown:
            raise FieldError(f"tools.{i}.function.{unknown[0]}", f"unknown field tools.{i}.function.{unknown[0]}",
                             "unknown_parameter")
        strict = fn.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise FieldError(f"tools.{i}.function.strict", "strict must be true or false", "invalid_type")
        if strict:
            check_strict(fn.get("parameters", {"type": "object", "properties": {}, "additionalProperties": False}),
                         f"tools.{i}.function.parameters")
        if any(f["name"] == fn["name"] for f in out):
            raise FieldError(f"tools.{i}.function.name", f"function {fn['name']!r} is defined twice")
        out.append(fn)
    return tuple(tools), out
