"""A chat request's messages -> what the chat template renders, including tool-call turns, or a 400.

OpenAI's conversation with tools: an assistant message carries `tool_calls` (`[{"id", "type": "function",
"function": {"name", "arguments": "<JSON text>"}}]`, `content` usually null) and each call is answered by a
`tool` message (`tool_call_id`, `content`). The template gets them as vLLM gives them to HF templates:

- an assistant message's `tool_calls` with each `function.arguments` parsed into a JSON object (HF's convention;
  templates render them with `tojson`), and its missing content as "";
- a tool message as `{"role": "tool", "content", "tool_call_id"}`.

OpenAI's ordering rules are kept (its 400s): a tool message answers a call of the assistant message before it,
and every call of an assistant message is answered before the conversation goes on.

Whether a template renders these turns is probed once per tokenizer (`probe_tool_turns`: a conversation with a
marked call and result is rendered and the marks looked for). A template that drops them (SmolLM2's renders
any role, so a tool message's text, but never an assistant's `tool_calls`) gets a 400 naming the field instead
of a prompt that silently lost the calls.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from headroom.protocol.openai_errors import FieldError

_MARK_NAME, _MARK_ARG, _MARK_RESULT = "probe_fn_7f3a9c", "probe_arg_7f3a9c", "probe_result_7f3a9c"


class ChatMessage(Protocol):
    """A typed request message (headroom.llm.openai_protocol.Message)."""

    @property
    def role(self) -> str: ...
    @property
    def content(self) -> str | list[dict[str, Any]] | None: ...
    @property
    def tool_calls(self) -> list[dict[str, Any]] | None: ...
    @property
    def tool_call_id(self) -> str | None: ...


@dataclass(frozen=True, slots=True)
class ToolTurns:
    """What a chat template renders of tool-call turns."""

    calls: bool  # an assistant message's tool_calls (name and arguments)
    results: bool  # a tool message's content


def probe_tool_turns(render: Callable[[list[dict[str, Any]]], str]) -> ToolTurns:
    """Render a marked call and its result with `render` (the chat template) and see which marks survive."""
    call = {"id": "probe7f3a", "type": "function",  # 9 alphanumerics: Mistral's templates insist
            "function": {"name": _MARK_NAME, "arguments": {"probe": _MARK_ARG}}}
    chat: list[dict[str, Any]] = [{"role": "user", "content": "hi"},
                                  {"role": "assistant", "content": "", "tool_calls": [call]},
                                  {"role": "tool", "content": _MARK_RESULT, "tool_call_id": "probe7f3a"}]
    try:
        text = render(chat)
    except Exception:  # a template that refuses these roles renders neither
        return ToolTurns(False, False)
    return ToolTurns(_MARK_NAME in text and _MARK_ARG in text, _MARK_RESULT in text)


def template_messages(messages: Sequence[ChatMessage], turns: ToolTurns, model_name: str) -> list[dict[str, Any]]:
    """The messages as the chat template gets them; FieldError (400) naming the field that cannot be honoured."""
    out: list[dict[str, Any]] = []
    open_calls: list[str] = []  # ids of the last assistant message's calls not answered yet
    for i, m in enumerate(messages):
        where = f"messages.{i}"
        if m.role != "tool" and open_calls:
            raise FieldError(where, f"an assistant message with tool_calls must be followed by tool messages "
                                    f"answering each tool_call_id; not answered: {', '.join(open_calls)}")
        if m.tool_call_id is not None and m.role != "tool":
            raise FieldError(f"{where}.tool_call_id", "tool_call_id belongs to tool messages only")
        if m.tool_calls is not None and m.role != "assistant":
            raise FieldError(f"{where}.tool_calls", "tool_calls belong to assistant messages only")
        message: dict[str, Any] = {"role": m.role, "content": content_text(m.content, f"{where}.content")}
        if m.role == "assistant" and m.tool_calls is not None:
            if not turns.calls:
                raise _unrendered(f"{where}.tool_calls", model_name, "an assistant message's tool_calls")
            message["tool_calls"] = _calls(m.tool_calls, f"{where}.tool_calls")
            open_calls = [c["id"] for c in message["tool_calls"]]
        elif m.role == "tool":
            if not turns.results:
                raise _unrendered(where, model_name, "tool messages")
            if not isinstance(m.tool_call_id, str) or not m.tool_call_id:
                raise FieldError(f"{where}.tool_call_id", "a tool message needs the tool_call_id it answers")
            if m.tool_call_id not in open_calls:
                raise FieldError(f"{where}.tool_call_id", f"a tool message must answer a call of the assistant "
                                                          f"message before it; no open call {m.tool_call_id!r}")
            open_calls.remove(m.tool_call_id)
            message["tool_call_id"] = m.tool_call_id
        out.append(message)
    if open_calls:
        raise FieldError(f"messages.{len(messages) - 1}", f"an assistant message with tool_calls must be followed "
                         f"by tool messages answering each tool_call_id; not answered: {', '.join(open_calls)}")
    return out


def content_text(content: str | list[dict[str, Any]] | None, param: str = "messages.content") -> str:
    """A message's text: a string, or OpenAI's text parts joined ("" for none)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if part.get("type") != "text":
            raise FieldError(param, f"only text parts are supported, got {part.get('type')!r}",
                             "unsupported_parameter")
        parts.append(str(part.get("text", "")))
    return "".join(parts)


def _calls(calls: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    if not calls:
        raise FieldError(where, "tool_calls must be a non-empty list (leave it out for a plain message)")
    out, seen = [], set()
    for j, call in enumerate(calls):
        at = f"{where}.{j}"
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(call, dict) or call.get("type") != "function" or not isinstance(fn, dict):
            raise FieldError(at, f'{at} must be {{"id", "type": "function", "function": {{"name", "arguments"}}}}')
        unknown = sorted({*set(call) - {"id", "type", "function"}, *set(fn) - {"name", "arguments"}})
        if unknown:
            raise FieldError(f"{at}.{unknown[0]}", f"unknown field {at}.{unknown[0]}", "unknown_parameter")
        if not isinstance(call.get("id"), str) or not call["id"] or call["id"] in seen:
            raise FieldError(f"{at}.id", "each tool call needs its own non-empty id")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise FieldError(f"{at}.function.name", "a tool call names its function")
        seen.add(call["id"])
        out.append({"id": call["id"], "type": "function",
                    "function": {"name": fn["name"], "arguments": _arguments(fn.get("arguments"), at)}})
    return out


def _arguments(text: object, at: str) -> dict[str, Any]:
    """A call's `arguments` (JSON text) as an object; empty or missing -> {} (as vLLM)."""
    if text is None or text == "":
        return {}
    param = f"{at}.function.arguments"
    if not isinstance(text, str):
        raise FieldError(param, f"{param} must be a string of JSON (as the model returned it)", "invalid_type")
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise FieldError(param, f"{param} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise FieldError(param, f"{param} must be a JSON object")
    return value


def _unrendered(param: str, model_name: str, what: str) -> FieldError:
    return FieldError(param, f"{param}: the chat template of model {model_name!r} does not render {what}, so "
                             "the model would never see them; this model cannot take tool-call turns",
                      "unsupported_parameter")


__all__ = ["ToolTurns", "content_text", "probe_tool_turns", "template_messages"]
