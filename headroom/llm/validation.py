"""The one place that range-checks every LLM request field (chat and completions, and `SamplingParams`).

`check_body(body, kind, vocab_size)` runs on the raw JSON object before pydantic sees it:

- a field set to `null` counts as not sent (OpenAI's SDKs and LangChain send `null` for "default");
- a field OpenAI defines but headroom does not implement is refused (`REFUSED`): 400 with
  `code: "unsupported_parameter"`; `response_format` and the tool fields are checked by
  `headroom.llm.structured_output`;
- any other field not in the request model (OpenAI's fields plus `VENDOR_EXTENSIONS`) is refused with
  `code: "unknown_parameter"`;
- every sampling and request field has a JSON type and a range (`RANGES`); a value outside it is a 400
  whose `param` names the field and whose message gives the range. Floats must be finite.

`SamplingParams.validate()` checks its own fields against the same `RANGES`, so an offline caller of the
engine gets the same limits as an HTTP client. Errors are `FieldError` (an `InvalidRequest`, status 400)
with `param` and an OpenAI `code`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from headroom.protocol.openai_errors import FieldError

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT32_MAX = 2**31 - 1
MAX_STOP_STRINGS = 16  # vLLM takes any number; OpenAI takes 4
MAX_LOGIT_BIAS_ENTRIES = 1024
TEMPERATURE_GREEDY_BELOW = 1e-5  # vLLM's _SAMPLING_EPS: a smaller temperature decodes greedily

Kind = Literal["chat", "completion"]
__all__ = ["FieldError", "check_body", "check_range", "logit_bias", "token_ids"]


@dataclass(frozen=True, slots=True)
class Range:
    """A closed or half-open numeric interval, integer-valued or not."""

    low: float
    high: float
    integer: bool = False
    low_open: bool = False  # low itself is excluded

    def describe(self) -> str:
        kind = "an integer" if self.integer else "a number"
        left = "(" if self.low_open else "["
        return f"{kind} in {left}{_num(self.low)}, {_num(self.high)}]"

    def contains(self, value: float) -> bool:
        above = value > self.low if self.low_open else value >= self.low
        return above and value <= self.high


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


RANGES: Mapping[str, Range] = {
    "temperature": Range(0.0, 2.0),
    "top_p": Range(0.0, 1.0, low_open=True),
    "top_k": Range(-1, INT32_MAX, integer=True),  # -1 and 0 turn it off
    "min_p": Range(0.0, 1.0),
    "repetition_penalty": Range(0.01, 10.0),  # 1 = off; beyond this range logits overflow or collapse
    "presence_penalty": Range(-2.0, 2.0),
    "frequency_penalty": Range(-2.0, 2.0),
    "max_tokens": Range(1, INT32_MAX, integer=True),
    "max_completion_tokens": Range(1, INT32_MAX, integer=True),
    "n": Range(1, 16, integer=True),
    "seed": Range(INT64_MIN, INT64_MAX, integer=True),  # vLLM's range (a signed 64-bit integer)
    "logprobs": Range(0, 20, integer=True),  # completions: top alternatives per token
    "top_logprobs": Range(0, 20, integer=True),  # chat
    "priority": Range(INT64_MIN, INT64_MAX, integer=True),
    "logit_bias": Range(-100.0, 100.0),  # each bias value
}

BOOLEANS = frozenset({"stream", "echo", "ignore_eos", "include_stop_str_in_output", "parallel_tool_calls"})
STRINGS = frozenset({"model", "user", "safety_identifier"})

#: Fields beyond OpenAI's API that headroom honours, with vLLM's meaning (docs/openai.md lists them).
VENDOR_EXTENSIONS = (
    "top_k", "min_p", "repetition_penalty", "ignore_eos", "stop_token_ids", "priority",
    "include_stop_str_in_output", "cache_salt",
)

_FUNCTIONS = "functions and function_call are deprecated by OpenAI and not supported; use tools and tool_choice"
#: OpenAI fields headroom does not implement: refused with the reason, never silently ignored.
REFUSED: Mapping[str, str] = {
    "functions": _FUNCTIONS,
    "function_call": _FUNCTIONS,
    "suffix": "suffix (insertion) is not supported",
    "best_of": "best_of is not supported; use n",
    "audio": "audio output is not supported",
    "modalities": "only text output is supported",
    "prediction": "predicted outputs are not supported",
    "store": "stored completions are not supported",
    "metadata": "metadata is only kept with stored completions, which are not supported",
    "reasoning_effort": "this model has no reasoning effort setting",
    "web_search_options": "web search is not supported",
    "service_tier": "there is one service tier",
    "verbosity": "this model has no verbosity setting",
    "moderation": "moderation is not supported",
    "prompt_cache_key": "prefix caching is automatic; prompt_cache_key is not supported",
    "prompt_cache_retention": "prefix caching is automatic; prompt_cache_retention is not supported",
}

_STREAM_OPTIONS = frozenset({"include_usage"})


def check_body(body: Mapping[str, Any], kind: Kind, allowed: frozenset[str], vocab_size: int | None) -> dict[str, Any]:
    """The body without its `null` fields, after every check; `allowed` is the request model's fields."""
    clean = {k: v for k, v in body.items() if v is not None}
    for name in clean:
        if name in REFUSED:
            raise FieldError(name, f"{name}: {REFUSED[name]}", "unsupported_parameter")
        if name not in allowed:
            raise FieldError(
                name,
                f"unknown field {name!r}; this route takes {', '.join(sorted(allowed))} "
                f"(vendor extensions: {', '.join(VENDOR_EXTENSIONS)})",
                "unknown_parameter",
            )
    for name, value in clean.items():
        if name in BOOLEANS and not isinstance(value, bool):
            raise FieldError(name, f"{name} must be true or false, got {_show(value)}", "invalid_type")
        if name in STRINGS and not isinstance(value, str):
            raise FieldError(name, f"{name} must be a string, got {_show(value)}", "invalid_type")
        if name == "logprobs" and kind == "chat":
            if not isinstance(value, bool):
                raise FieldError(name, f"logprobs must be true or false, got {_show(value)}", "invalid_type")
        elif name in RANGES and name != "logit_bias":
            check_range(name, value)
    _check_stop(clean.get("stop"))
    _check_stream_options(clean.get("stream_options"))
    if "stream_options" in clean and not clean.get("stream", False):
        raise FieldError("stream_options", "stream_options is only allowed when stream is true")
    if kind == "chat" and "top_logprobs" in clean and not clean.get("logprobs", False):
        raise FieldError("top_logprobs", "top_logprobs needs logprobs: true")
    if clean.get("echo", False):
        raise FieldError("echo", "echo is not supported; resend without it", "unsupported_parameter")
    if "stop_token_ids" in clean:
        token_ids(clean["stop_token_ids"], "stop_token_ids", vocab_size)
    if "logit_bias" in clean:
        logit_bias(clean["logit_bias"], vocab_size)
    return clean


def check_range(name: str, value: object) -> None:
    """`value` is a JSON number of the field's kind inside `RANGES[name]`, else FieldError."""
    rng = RANGES[name]
    ok_type = isinstance(value, int) if rng.integer else isinstance(value, int | float)
    if not ok_type or isinstance(value, bool):
        raise FieldError(name, f"{name} must be {rng.describe()}, got {_show(value)}", "invalid_type")
    number: float = value  # type: ignore[assignment]
    if isinstance(number, float) and not math.isfinite(number):
        raise FieldError(name, f"{name} must be {rng.describe()}, got {_show(value)}")
    if not rng.contains(number):
        raise FieldError(name, f"{name} must be {rng.describe()}, got {_show(value)}")


def token_ids(value: object, name: str, vocab_size: int | None) -> tuple[int, ...]:
    """A list of token ids, each in [0, vocab_size)."""
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise FieldError(name, f"{name} must be a list of integer token ids, got {_show(value)}", "invalid_type")
    high = vocab_size if vocab_size is not None else INT32_MAX
    for t in value:
        if not 0 <= t < high:
            raise FieldError(name, f"{name}: token id {t} is outside the vocabulary [0, {high})")
    return tuple(value)


def logit_bias(value: object, vocab_size: int | None) -> tuple[tuple[int, float], ...]:
    """OpenAI's `{"token id": bias}`: ids in the vocabulary, each bias a number in [-100, 100]."""
    if not isinstance(value, dict):
        raise FieldError("logit_bias", f"logit_bias must be an object of token id -> bias, got {_show(value)}",
                         "invalid_type")
    if len(value) > MAX_LOGIT_BIAS_ENTRIES:
        raise FieldError("logit_bias", f"logit_bias takes at most {MAX_LOGIT_BIAS_ENTRIES} tokens, got {len(value)}")
    high = vocab_size if vocab_size is not None else INT32_MAX
    out: list[tuple[int, float]] = []
    for key, bias in value.items():
        token = str(key).strip()
        if not token.isdigit() or not 0 <= int(token) < high:
            raise FieldError("logit_bias", f"logit_bias: key {key!r} is not a token id in [0, {high})")
        check_range("logit_bias", bias)
        out.append((int(token), float(bias)))
    return tuple(sorted(out))


def _check_stop(stop: object) -> None:
    if stop is None:
        return
    items = [stop] if isinstance(stop, str) else stop
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise FieldError("stop", f"stop must be a string or a list of strings, got {_show(stop)}", "invalid_type")
    if len(items) > MAX_STOP_STRINGS:
        raise FieldError("stop", f"stop takes at most {MAX_STOP_STRINGS} strings, got {len(items)}")
    if any(not s for s in items):
        raise FieldError("stop", "stop strings must not be empty")


def _check_stream_options(options: object) -> None:
    if options is None:
        return
    if not isinstance(options, dict):
        raise FieldError("stream_options", f"stream_options must be an object, got {_show(options)}", "invalid_type")
    for key, value in options.items():
        if key not in _STREAM_OPTIONS:
            raise FieldError(f"stream_options.{key}", f"unknown field stream_options.{key}; it takes include_usage",
                             "unknown_parameter")
        if not isinstance(value, bool):
            raise FieldError(f"stream_options.{key}", f"stream_options.{key} must be true or false", "invalid_type")


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
