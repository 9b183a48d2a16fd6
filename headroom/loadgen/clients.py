"""Protocol clients behind one seam: `send(sample) -> ClientReply`, timestamps on the injected clock.

    v2-http             KServe V2 JSON to {url}/v2/models/{model}/infer
    v2-grpc             KServe V2 gRPC via tritonclient.grpc.aio (see clients_grpc.py); url is host:port
    openai-chat         {url}/v1/chat/completions, streamed (SSE) unless stream=False
    openai-completions  {url}/v1/completions, streamed unless stream=False
    openai-embeddings   {url}/v1/embeddings
    image               raw PNG bytes POSTed to the URL as given (the full route, e.g. http://h:8000/classify)

HTTP goes through httpx (clients_httpx.py, the default) or aiohttp (clients_aiohttp.py, `http_client="aiohttp"`),
which costs the generator about 5x less CPU per request; both share the request encoding and SSE parsing here.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from headroom.core.clock import Clock
from headroom.loadgen.records import ClientReply
from headroom.loadgen.workloads import Sample

PROTOCOLS: tuple[str, ...] = (
    "v2-http",
    "v2-grpc",
    "openai-chat",
    "openai-completions",
    "openai-embeddings",
    "image",
)

HTTP_CLIENTS: tuple[str, ...] = ("httpx", "aiohttp")


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """How to reach the server and shape each request."""

    url: str  # base URL (http://host:port) or, for `image`, the full route; host:port for v2-grpc
    model: str  # model name for V2 routes and the OpenAI `model` field
    protocol: str = "v2-http"  # one of PROTOCOLS
    timeout_s: float = 60.0  # per-request timeout; a request over it is recorded with status "timeout"
    max_connections: int = 256  # pooled connections (and the cap on requests in flight)
    input_name: str = ""  # V2 input tensor name; "" = "input" for images, "text" for text
    text_shape: tuple[int, ...] = (1, 1)  # V2 shape of one text sample: [batch, 1] for a batching model, [1] if not
    stream: bool = True  # OpenAI chat/completions: request a streamed reply (needed for TTFT/TPOT/ITL)
    ignore_eos: bool = False  # OpenAI: send ignore_eos so the server generates exactly max_tokens (vLLM)
    default_max_tokens: int = 64  # OpenAI: max_tokens when the sample names none
    http_client: str = "httpx"  # HTTP library: "httpx" (pooled AsyncClient) or "aiohttp" (~5x less CPU/request)

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"unknown protocol {self.protocol!r}; choose one of {', '.join(PROTOCOLS)}")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        if self.http_client not in HTTP_CLIENTS:
            raise ValueError(f"unknown http_client {self.http_client!r}; choose one of {', '.join(HTTP_CLIENTS)}")
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {self.max_connections}")


class ProtocolClient(Protocol):
    """The seam every protocol implements."""

    async def send(self, sample: Sample) -> ClientReply:
        """Send one request and report what happened; never raises for server or network errors."""
        ...

    async def aclose(self) -> None:
        """Release connections."""
        ...


def parse_server_timing(values: list[str]) -> tuple[tuple[str, float], ...]:
    """`Server-Timing: queue;dur=1.5, infer;dur=3;desc="x"` -> (("queue", 1.5), ("infer", 3.0)).

    Entries without a numeric `dur` are skipped; several headers are concatenated in order.
    """
    out: list[tuple[str, float]] = []
    for value in values:
        for entry in value.split(","):
            parts = [p.strip() for p in entry.split(";")]
            name = parts[0]
            if not name:
                continue
            for param in parts[1:]:
                key, _, raw = param.partition("=")
                if key.strip().lower() == "dur":
                    with contextlib.suppress(ValueError):
                        out.append((name, float(raw.strip().strip('"'))))
                    break
    return tuple(out)


def v2_json_body(sample: Sample, input_name: str, text_shape: tuple[int, ...] = (1, 1)) -> dict[str, Any]:
    """The V2 JSON body for one sample: an image as FP32 [1, 1, 8, 8], text as BYTES `text_shape` (one string)."""
    if sample.body is not None:
        return sample.body
    if sample.pixels is not None:
        return {
            "inputs": [
                {
                    "name": input_name or "input",
                    "shape": list(sample.pixels.shape),
                    "datatype": "FP32",
                    "data": [float(v) for v in sample.pixels.reshape(-1)],
                }
            ]
        }
    return {"inputs": [{"name": input_name or "text", "shape": list(text_shape), "datatype": "BYTES",
                        "data": [sample.text]}]}


def openai_body(config: ClientConfig, sample: Sample) -> dict[str, Any]:
    """The OpenAI request body for `sample` under `config.protocol`."""
    if sample.body is not None:
        given: dict[str, Any] = dict(sample.body)
        given.setdefault("model", config.model)
        if config.protocol != "openai-embeddings" and config.stream:
            given["stream"] = True
            given.setdefault("stream_options", {"include_usage": True})
        return given
    if config.protocol == "openai-embeddings":
        return {"model": config.model, "input": sample.text}
    body: dict[str, Any] = {
        "model": config.model,
        "max_tokens": sample.max_output_tokens or config.default_max_tokens,
    }
    if config.protocol == "openai-chat":
        body["messages"] = [{"role": "user", "content": sample.text}]
    else:
        body["prompt"] = sample.text
    if config.stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    if config.ignore_eos:
        body["ignore_eos"] = True
    return body


def _chunk_content(chunk: dict[str, Any], protocol: str) -> str:
    choices = chunk.get("choices") or []
    if not choices or not isinstance(choices[0], dict):
        return ""
    if protocol == "openai-chat":
        delta = choices[0].get("delta") or {}
        return str(delta.get("content") or delta.get("reasoning_content") or "")
    return str(choices[0].get("text") or "")


_JSON_HEADERS = {"content-type": "application/json"}


def _json_bytes(body: dict[str, Any]) -> bytes:
    """orjson is several times cheaper than json.dumps, and generator CPU is what limits the offered rate."""
    return orjson.dumps(body)


def target_url(config: ClientConfig) -> str:
    """The URL every request of `config.protocol` goes to."""
    base = config.url.rstrip("/")
    return {
        "v2-http": f"{base}/v2/models/{config.model}/infer",
        "openai-chat": f"{base}/v1/chat/completions",
        "openai-completions": f"{base}/v1/completions",
        "openai-embeddings": f"{base}/v1/embeddings",
        "image": config.url,
    }[config.protocol]


def encode_request(config: ClientConfig, sample: Sample) -> tuple[bytes, dict[str, str]]:
    """The body bytes and headers of one request (JSON pre-encoded with orjson, or the raw PNG)."""
    if config.protocol == "image":
        if not sample.png:
            raise ValueError("the image protocol needs an image workload (--workload digits)")
        return sample.png, {"content-type": "image/png"}
    if config.protocol == "v2-http":
        return _json_bytes(v2_json_body(sample, config.input_name, config.text_shape)), _JSON_HEADERS
    return _json_bytes(openai_body(config, sample)), _JSON_HEADERS


def is_streamed(config: ClientConfig) -> bool:
    return config.protocol in ("openai-chat", "openai-completions") and config.stream


def unary_reply(
    config: ClientConfig, status: int, sent_s: float, end_s: float, timing_headers: list[str], body: bytes
) -> ClientReply:
    """A ClientReply for a non-streamed response (usage read from OpenAI bodies)."""
    ok = status // 100 == 2
    output_tokens = input_tokens = 0
    if ok and config.protocol in ("openai-chat", "openai-completions", "openai-embeddings"):
        parsed = orjson.loads(body)
        usage = (parsed.get("usage") if isinstance(parsed, dict) else None) or {}
        output_tokens = int(usage.get("completion_tokens") or 0)
        input_tokens = int(usage.get("prompt_tokens") or 0)
    return ClientReply(
        ok=ok,
        status=str(status),
        sent_s=sent_s,
        end_s=end_s,
        output_tokens=output_tokens,
        input_tokens=input_tokens,
        server_timing_ms=parse_server_timing(timing_headers),
        error="" if ok else body[:200].decode("utf-8", "replace"),
    )


class SseCollector:
    """Reads an OpenAI SSE stream line by line: content-chunk arrival times and the final usage."""

    def __init__(self, protocol: str) -> None:
        self._protocol = protocol
        self.chunk_times_s: list[float] = []
        self.usage: dict[str, Any] = {}

    def feed(self, line: str, now_s: float) -> bool:
        """Take one line received at `now_s`; True once `data: [DONE]` arrived."""
        if not line.startswith("data:"):
            return False
        data = line[5:].strip()
        if data == "[DONE]":
            return True
        chunk = orjson.loads(data)
        if isinstance(chunk, dict):
            if isinstance(chunk.get("usage"), dict):
                self.usage = chunk["usage"]
            if _chunk_content(chunk, self._protocol):
                self.chunk_times_s.append(now_s)
        return False

    def reply(self, sent_s: float, end_s: float, timing_headers: list[str]) -> ClientReply:
        got = bool(self.chunk_times_s)
        return ClientReply(
            ok=got,
            status="200" if got else "empty_stream",
            sent_s=sent_s,
            end_s=end_s,
            chunk_times_s=tuple(self.chunk_times_s),
            output_tokens=int(self.usage.get("completion_tokens") or len(self.chunk_times_s)),
            input_tokens=int(self.usage.get("prompt_tokens") or 0),
            server_timing_ms=parse_server_timing(timing_headers),
            error="" if got else "the stream carried no content",
        )


def failure(status: str, sent_s: float, end_s: float, error: str) -> ClientReply:
    """A client-side failure (timeout, refused connection, bad body)."""
    return ClientReply(ok=False, status=status, sent_s=sent_s, end_s=end_s, error=error[:200])


class HttpClient:
    """What the HTTP clients share: every protocol but v2-grpc, posted to one target URL."""

    def __init__(self, config: ClientConfig, clock: Clock) -> None:
        if config.protocol == "v2-grpc":
            raise ValueError(f"{type(self).__name__} does not speak v2-grpc; use make_client")
        self._config = config
        self._clock = clock
        self._target = target_url(config)

    def _failure(self, status: str, sent_s: float, error: str) -> ClientReply:
        """A client-side failure of a request sent at `sent_s`, ending now."""
        return failure(status, sent_s, self._clock.now_s(), error)


def make_client(config: ClientConfig, clock: Clock) -> ProtocolClient:
    """The client for `config.protocol` (and, for HTTP, `config.http_client`)."""
    if config.protocol == "v2-grpc":
        from headroom.loadgen.clients_grpc import GrpcV2Client

        return GrpcV2Client(config, clock)
    if config.http_client == "aiohttp":
        from headroom.loadgen.clients_aiohttp import AiohttpClient

        return AiohttpClient(config, clock)
    from headroom.loadgen.clients_httpx import HttpxClient

    return HttpxClient(config, clock)
