"""Input limits checked at the edge, as pure functions: headers, JSON, model names, LLM knobs, slow bodies.

Each check raises a HeadroomError subclass with a 4xx status and a message that says which limit and how to
change it; each limit is a field of `InputLimits` (0 disables it where that makes sense).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import unquote

import orjson
from starlette.requests import Request

from headroom.core.errors import InvalidRequest, PayloadTooLarge
from headroom.gateway.errors import HeadersTooLarge


@dataclass(frozen=True, slots=True)
class InputLimits:
    """Limits on every input the gateway sees (defaults are generous for local use)."""

    max_body_bytes: int = 64 * 1024 * 1024  # request bodies above this: 413 (before buffering them)
    max_header_count: int = 100  # more request headers than this: 431
    max_header_bytes: int = 16 * 1024  # summed size of all header names and values: 431
    max_json_depth: int = 32  # nesting of [ and { in a JSON body: 400 (0 = unchecked)
    max_json_string_bytes: int = 4 * 1024 * 1024  # longest JSON string (escaped form): 400 (0 = unchecked)
    json_scan_max_bytes: int = 8 * 1024 * 1024  # JSON bodies above this skip the depth/string scan (cost)
    max_tokens: int = 8192  # LLM `max_tokens` / `max_completion_tokens` above this: 400 (0 = unchecked)
    max_n: int = 16  # LLM `n` (choices per request) above this: 400 (0 = unchecked)
    max_prompt_chars: int = 1_000_000  # LLM prompt / messages text above this: 400 (0 = unchecked)
    body_timeout_s: float = 60.0  # the whole body must arrive within this: 408 (0 = no limit)
    min_body_rate_bytes_per_s: float = 1024.0  # after the grace period, bodies slower than this: 408
    body_grace_s: float = 5.0  # seconds before the minimum rate applies
    headers_timeout_s: float = 10.0  # request line + headers within this of its first byte / the connect: 408

    def __post_init__(self) -> None:
        for name in (
            "max_body_bytes",
            "max_header_count",
            "max_header_bytes",
            "max_json_depth",
            "max_json_string_bytes",
            "json_scan_max_bytes",
            "max_tokens",
            "max_n",
            "max_prompt_chars",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"InputLimits.{name} must be >= 0")
        if min(self.body_timeout_s, self.min_body_rate_bytes_per_s, self.body_grace_s, self.headers_timeout_s) < 0:
            raise ValueError("body_timeout_s, min_body_rate_bytes_per_s, body_grace_s and headers_timeout_s "
                             "must be >= 0")


def check_headers(headers: Iterable[tuple[bytes, bytes]], limits: InputLimits) -> None:
    count = 0
    size = 0
    for name, value in headers:
        count += 1
        size += len(name) + len(value)
    if limits.max_header_count and count > limits.max_header_count:
        raise HeadersTooLarge(f"{count} request headers exceed the limit of {limits.max_header_count}")
    if limits.max_header_bytes and size > limits.max_header_bytes:
        raise HeadersTooLarge(
            f"request headers of {size} bytes exceed the limit of {limits.max_header_bytes}"
        )


def check_content_length(value: bytes | None, limits: InputLimits) -> int | None:
    """The declared body length (None if absent); 400 if malformed, 413 if above the limit."""
    return check_declared_length(value, limits.max_body_bytes)


# The one body-limit mechanism: the declared length is checked before anything is read, then every received
# chunk is counted, so nothing over the limit is ever buffered. The gateway's ASGI reader, the server's
# handlers and the router all use these two functions.
def check_declared_length(value: bytes | str | None, max_body_bytes: int) -> int | None:
    """The declared body length (None if absent); 400 if malformed, 413 if above `max_body_bytes` (0: none)."""
    if value is None:
        return None
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    if not text.isdigit():
        raise InvalidRequest("Content-Length must be a non-negative integer")
    declared = int(text)
    if max_body_bytes and declared > max_body_bytes:
        raise PayloadTooLarge(
            f"request body of {declared} bytes exceeds the limit of {max_body_bytes} "
            "bytes; send less, or raise the server's body limit"
        )
    return declared


def count_body_chunk(received_bytes: int, chunk: bytes, max_body_bytes: int) -> int:
    """Bytes received after `chunk`; 413 as soon as they pass `max_body_bytes` (0: no limit)."""
    received_bytes += len(chunk)
    if max_body_bytes and received_bytes > max_body_bytes:
        raise PayloadTooLarge(f"request body exceeds the limit of {max_body_bytes} bytes")
    return received_bytes


#: The ASGI scope key under which the gateway leaves the body it has already read and checked, so that the
#: handler does not read it a second time (`read_body` takes it from there). A body sent with
#: `Content-Encoding: gzip | deflate` is there decoded (`headroom.gateway.content_encoding`).
BODY_SCOPE_KEY = "headroom.body"


async def read_body(request: Request, max_body_bytes: int) -> bytes:
    """A Starlette request's body under the limit (`check_declared_length`, then `count_body_chunk`).

    Behind the gateway the body was already read once (`BODY_SCOPE_KEY`): it is only held to this limit."""
    buffered = request.scope.get(BODY_SCOPE_KEY)
    if isinstance(buffered, bytes):
        count_body_chunk(0, buffered, max_body_bytes)
        return buffered
    check_declared_length(request.headers.get("content-length"), max_body_bytes)
    chunks: list[bytes] = []
    received = 0
    async for chunk in request.stream():
        received = count_body_chunk(received, chunk, max_body_bytes)
        chunks.append(chunk)
    return b"".join(chunks)


_ESCAPE = re.compile(rb"\\.", re.DOTALL)
_STRING = re.compile(rb'"[^"]*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")  # deleted by translate


def check_json_shape(body: bytes, limits: InputLimits) -> None:
    """Nesting depth and string length of a JSON document, without parsing it (C-speed regex + translate).

    Malformed JSON is left to the real parser; this only refuses documents that are too deep or hold a string
    that is too long. Bodies above `json_scan_max_bytes` are not scanned.
    """
    if not body or (limits.json_scan_max_bytes and len(body) > limits.json_scan_max_bytes):
        return
    if not limits.max_json_depth and not limits.max_json_string_bytes:
        return
    unescaped = _ESCAPE.sub(b"__", body)  # same length; `\"` no longer ends a string
    if limits.max_json_string_bytes and len(body) - 2 > limits.max_json_string_bytes:  # else none can be too long
        longest = max((len(m) for m in _STRING.findall(unescaped)), default=2) - 2
        if longest > limits.max_json_string_bytes:
            raise InvalidRequest(
                f"a JSON string of {longest} bytes exceeds the limit of {limits.max_json_string_bytes} bytes"
            )
    if limits.max_json_depth:
        brackets = _STRING.sub(b"", unescaped).translate(None, _NOT_BRACKETS)
        if brackets.count(b"[") + brackets.count(b"{") <= limits.max_json_depth:
            return  # fewer openings than the limit: no walk needed (this runs on every JSON request)
        depth = deepest = 0
        for b in brackets:
            if b in (0x5B, 0x7B):  # [ {
                depth += 1
                deepest = max(deepest, depth)
            else:
                depth -= 1
        if deepest > limits.max_json_depth:
            raise InvalidRequest(f"JSON nesting depth {deepest} exceeds the limit of {limits.max_json_depth}")


_MODEL_PATH = re.compile(r"^/v2/(?:repository/)?models/([^/]*)")
_BAD_MODEL_CHARS = re.compile(r"[\x00-\x1f\x7f\\]")


def check_model_name(name: str, where: str) -> None:
    """Refuse names that could walk a file system: `..`, `/`, `\\`, control characters, empty."""
    if not name or name in (".", "..") or ".." in name or "/" in name or _BAD_MODEL_CHARS.search(name):
        raise InvalidRequest(
            f"{where}: model name {name[:80]!r} is not allowed; use letters, digits, '.', '_', "
            "'-' without '..', '/' or '\\'"
        )


def check_model_path(raw_path: bytes) -> None:
    """The model segment of `/v2/models/{m}/...` and `/v2/repository/models/{m}/...`, as sent (undecoded)."""
    try:
        text = raw_path.decode("ascii")
    except UnicodeDecodeError:
        raise InvalidRequest("the request path must be ASCII (percent-encode other characters)") from None
    decoded_once = unquote(text)
    if "/.." in decoded_once or "\\" in decoded_once:
        raise InvalidRequest("the request path must not contain '..' or '\\' segments")
    match = _MODEL_PATH.match(text)
    if match is not None:
        check_model_name(unquote(unquote(match.group(1))), "path")


LLM_PATHS = ("/v1/completions", "/v1/chat/completions")
EMBEDDING_PATHS = ("/v1/embeddings",)
_GENERATE_PATH = re.compile(r"^/v2/models/[^/]+(/versions/[^/]+)?/generate(_stream)?$")


def is_llm_path(path: str) -> bool:
    """An LLM generation route: the OpenAI ones and Triton's `/v2/models/{m}/generate[_stream]`."""
    return path in LLM_PATHS or _GENERATE_PATH.match(path) is not None


def _count_int(body: Mapping[str, object], key: str) -> int:
    value = body.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _prompt_chars(body: Mapping[str, object]) -> int:
    total = 0
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        total += len(prompt)
    elif isinstance(prompt, list):
        total += sum(len(p) if isinstance(p, str) else 1 for p in prompt)
    messages = body.get("messages")
    if isinstance(messages, list):
        for m in messages:
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, str):
                total += len(content)
            elif isinstance(content, list):
                total += sum(len(str(part.get("text", ""))) for part in content if isinstance(part, dict))
    return total


@dataclass(frozen=True, slots=True)
class TokenEstimate:
    """The LLM tokens an OpenAI request may use, charged to the tenant's bucket before it runs."""

    prompt_tokens: int  # prompt characters / 4 + 1 (embeddings: the inputs' characters / 4 + 1)
    completion_tokens: int  # `max_tokens` (16 when absent) × `n`: reserved, the unused part is refunded

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def check_openai_body(path: str, body: bytes, limits: InputLimits) -> int:
    """Model name and LLM knobs of an OpenAI request; returns the LLM tokens it may use (for rate limits)."""
    return estimate_openai_body(path, body, limits).total


def estimate_openai_body(path: str, body: bytes, limits: InputLimits) -> TokenEstimate:
    """Check the model name and LLM knobs of an OpenAI request (400s) and estimate the tokens it may use.

    The estimate is prompt characters / 4 (+1) plus `max_tokens × n`; a body that is not a JSON object is left
    to the handler (which answers 400). Embeddings count prompt characters / 4 only.
    """
    try:
        doc = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        return TokenEstimate(0, 0)
    if not isinstance(doc, dict):
        return TokenEstimate(0, 0)
    if _GENERATE_PATH.match(path) is not None:  # Triton generate: text_input + sampling keys, maybe in parameters
        params = doc.get("parameters")
        doc = {**(params if isinstance(params, dict) else {}), **doc, "prompt": doc.get("text_input")}
    model = doc.get("model")
    if isinstance(model, str):
        check_model_name(model, "'model'")
    if path in EMBEDDING_PATHS:
        inputs = doc.get("input")
        chars = (
            len(inputs)
            if isinstance(inputs, str)
            else sum(len(t) for t in inputs if isinstance(t, str))
            if isinstance(inputs, list)
            else 0
        )
        return TokenEstimate(chars // 4 + 1, 0)
    max_tokens = max(_count_int(doc, "max_tokens"), _count_int(doc, "max_completion_tokens"))
    if limits.max_tokens and max_tokens > limits.max_tokens:
        raise InvalidRequest(f"max_tokens={max_tokens} exceeds this server's limit of {limits.max_tokens}")
    n = _count_int(doc, "n") or 1
    if limits.max_n and n > limits.max_n:
        raise InvalidRequest(f"n={n} exceeds this server's limit of {limits.max_n} choices per request")
    chars = _prompt_chars(doc)
    if limits.max_prompt_chars and chars > limits.max_prompt_chars:
        raise InvalidRequest(
            f"the prompt has {chars} characters, above this server's limit of "
            f"{limits.max_prompt_chars}; shorten it"
        )
    return TokenEstimate(chars // 4 + 1, (max_tokens or 16) * n)


def body_deadline_s(limits: InputLimits, started_s: float, received_bytes: int) -> float:
    """The time by which more body bytes must arrive (inf: no deadline) — the slow-client policy.

    Two rules, whichever is earlier: the whole body within `body_timeout_s` of the first byte wait, and,
    after `body_grace_s`, on average at least `min_body_rate_bytes_per_s` (so `received_bytes` buys time).
    """
    deadline = started_s + limits.body_timeout_s if limits.body_timeout_s > 0 else float("inf")
    if limits.min_body_rate_bytes_per_s > 0:
        deadline = min(
            deadline, started_s + limits.body_grace_s + received_bytes / limits.min_body_rate_bytes_per_s
        )
    return deadline
