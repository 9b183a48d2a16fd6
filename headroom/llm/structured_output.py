"""OpenAI's structured-output fields at the edge: `response_format`, `tools`, `tool_choice` -> a grammar or a 400.

- `response_format: {"type": "text"}` (or absent): no grammar.
- `{"type": "json_object"}`: any JSON object.
- `{"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}}` (OpenAI's shape): output
  that validates against `schema`. The schema is enforced whatever `strict` says (a grammar either holds or not);
  `strict: true` also refuses a schema that breaks OpenAI's strict-mode rules (headroom.llm.strict_schema).
- `tools` / `tool_choice` / `parallel_tool_calls`: accepted only where the model's chat template renders tools
  (`template_supports_tools`), planned by `headroom.llm.tools`; elsewhere a 400 that says the model's template
  has no tool support. With a JSON `response_format` (OpenAI's meaning: calls follow the tools, a text answer
  the format): `none` -> the format; `auto` -> anyOf(a call array, the format); `required` / named -> the calls.

JSON is generated compactly (no optional whitespace: a small model given free whitespace can spend its whole
budget on newlines). The grammar text is llguidance's (`LLMatcher.grammar_from_json_schema`); compiling it
against the vocabulary is `headroom.llm.grammar`'s job. Every refusal is a `FieldError` naming the field.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from headroom.llm.grammar import GrammarCompiler, new_matcher
from headroom.llm.openai_protocol import BaseRequest, ChatRequest
from headroom.llm.strict_schema import check_strict
from headroom.llm.tools import ToolPlan, plan_tools
from headroom.protocol.openai_errors import FieldError

_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # OpenAI's rule for json_schema.name and function names
_TOOL_FIELDS = ("tools", "tool_choice", "parallel_tool_calls")


def response_format_schema(value: object) -> dict[str, Any] | None:
    """The JSON schema OpenAI's `response_format` asks for (`json_object`: any object); None for plain text.
    A `json_schema` with `strict: true` must also keep OpenAI's strict-mode rules (headroom.llm.strict_schema)."""
    if not isinstance(value, dict):
        raise FieldError("response_format", f"response_format must be an object, got {_show(value)}", "invalid_type")
    kind = value.get("type")
    extra = sorted(set(value) - {"type", "json_schema"})
    if extra:
        raise FieldError(f"response_format.{extra[0]}", f"unknown field response_format.{extra[0]}",
                         "unknown_parameter")
    if kind == "text":
        _no_schema(value, "text")
        return None
    if kind == "json_object":
        _no_schema(value, "json_object")
        return {"type": "object"}
    if kind == "json_schema":
        return _json_schema_body(value.get("json_schema"))
    raise FieldError("response_format.type",
                     f"response_format.type must be 'text', 'json_object' or 'json_schema', got {_show(kind)}")


def response_format_grammar(value: object) -> str | None:
    """The llguidance grammar text for OpenAI's `response_format`; None for plain text."""
    schema = response_format_schema(value)
    return None if schema is None else schema_grammar(schema, "response_format.json_schema.schema")


def schema_grammar(schema: dict[str, Any], param: str) -> str:
    """llguidance's grammar for a JSON schema; FieldError naming `param` when llguidance cannot read it."""
    import llguidance

    try:
        return str(llguidance.LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": False}))
    except BaseException as exc:  # ValueError / TypeError for a bad schema, or a Rust panic: this request's 400
        if isinstance(exc, KeyboardInterrupt | SystemExit | GeneratorExit):
            raise
        raise FieldError(param, f"{param}: the schema cannot be used: {exc}") from None


def check_tools(body: dict[str, Any], template_supports_tools: bool, model_name: str) -> ToolPlan | None:
    """The plan for the tool fields sent (None: none sent), or a FieldError naming the first field sent when this
    model cannot honour them."""
    sent = [f for f in _TOOL_FIELDS if f in body]
    if not sent:
        return None
    if not template_supports_tools:
        raise FieldError(
            sent[0],
            f"{sent[0]}: the chat template of model {model_name!r} does not support tools (it never renders "
            "them), so this model cannot call tools; resend without tools, tool_choice and parallel_tool_calls",
            "unsupported_parameter",
        )
    if "tools" not in body:
        raise FieldError(sent[0], f"{sent[0]} needs tools")
    return plan_tools(body["tools"], body.get("tool_choice"), body.get("parallel_tool_calls"))


def template_supports_tools(chat_template: str | None) -> bool:
    """Whether a Jinja chat template renders a `tools` list (HF's convention: the variable is named `tools`)."""
    return bool(chat_template) and re.search(r"\btools\b", chat_template or "") is not None


def _json_schema_body(spec: object) -> dict[str, Any]:
    param = "response_format.json_schema"
    if not isinstance(spec, dict):
        raise FieldError(param, f"{param} must be an object with name and schema, got {_show(spec)}", "invalid_type")
    extra = sorted(set(spec) - {"name", "schema", "strict", "description"})
    if extra:
        raise FieldError(f"{param}.{extra[0]}", f"unknown field {param}.{extra[0]}", "unknown_parameter")
    name = spec.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise FieldError(f"{param}.name", f"{param}.name must be 1-64 letters, digits, '_' or '-', got {_show(name)}")
    strict = spec.get("strict", False)
    if strict is not None and not isinstance(strict, bool):
        raise FieldError(f"{param}.strict", f"{param}.strict must be true or false", "invalid_type")
    if "description" in spec and not isinstance(spec["description"], str):
        raise FieldError(f"{param}.description", f"{param}.description must be a string", "invalid_type")
    schema = spec.get("schema", {})  # OpenAI: absent = any JSON
    if not isinstance(schema, dict):
        raise FieldError(f"{param}.schema", f"{param}.schema must be a JSON schema object, got {_show(schema)}",
                         "invalid_type")
    if strict:
        check_strict(schema, f"{param}.schema")
    return schema


def _no_schema(value: dict[str, Any], kind: str) -> None:
    if "json_schema" in value:
        raise FieldError("response_format.json_schema", f"response_format.json_schema is only for type json_schema, "
                         f"not {kind}")


def _show(value: object) -> str:
    text = json.dumps(value) if isinstance(value, dict | list) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass(frozen=True, slots=True)
class OutputPlan:
    """How a request's output is constrained and read back."""

    grammar: str | None = None  # llguidance grammar the output must follow; None = free text
    tools: ToolPlan | None = None  # the request's tools (chat templates that render them)


def output_plan(req: BaseRequest, chat_template: str | None, model_name: str,
                compiler: GrammarCompiler | None) -> OutputPlan:
    """The request's output plan, its grammar compiled and cached by `compiler`, or a FieldError (400).
    Blocking (a first schema compiles against the vocabulary): call it in a worker thread."""
    tools = None
    if isinstance(req, ChatRequest):
        tools = check_tools(req.model_dump(include=set(_TOOL_FIELDS), exclude_none=True),
                            template_supports_tools(chat_template), model_name)
    fmt = response_format_schema(req.response_format) if req.response_format is not None else None
    schema, param = fmt, "response_format.json_schema.schema"
    if tools is not None and tools.schema is not None:  # required / named: the output is the calls
        schema, param = tools.schema, "tools"  # (response_format shapes text answers: this turn has none)
    elif tools is not None and tools.parse_calls and fmt is not None:  # auto: the calls, or the format's JSON
        schema, param = {"anyOf": [tools.calls_schema, fmt]}, "response_format.json_schema.schema"
    if schema is None:
        return OutputPlan(None, tools)
    if req.ignore_eos:
        raise FieldError("ignore_eos", "ignore_eos cannot be combined with a JSON response_format or required "
                         "tool calls (the output ends where the JSON does)")
    grammar = schema_grammar(schema, param)
    new_matcher(compiler, grammar)  # compiles (and caches) it now: a schema llguidance refuses is a 400 here
    return OutputPlan(grammar, tools)
