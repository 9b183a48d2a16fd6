"""The ingress's OpenAI and generate routes: forwarded to replicas that run headroom's own HTTP routes.

* `POST /v1/chat/completions`, `POST /v1/completions` (streamed or not) and `POST
  /v2/models/{m}[/versions/{v}]/generate[_stream]`: to an LLM replica (`headroom.ray_serve.llm_replica`), with
  the routing key `headroom route` would compute (`prefix`: the prompt's prefix, so a shared system prompt finds
  its KV blocks on one replica), within `llm_timeout_s` (or the request's X-Request-Timeout-Ms);
* `POST /v1/embeddings`: to a model replica holding the embedding model (Serve multiplexing by `model`);
* `GET /v1/models`: the embedding models' cards (from the repository's configs) and the LLM replica's cards.

Everything else about these routes (validation, errors in OpenAI's or Triton's shape, Server-Timing, usage,
server-sent events) is the replicas' own, so it is what `headroom serve` answers. A stream that breaks after its
head (the replica died or raised) ends with the route's error event (`headroom.ray_serve.forward`).
"""

from __future__ import annotations

import time
from collections.abc import MutableMapping
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from headroom.core.deadline import client_timeout_ms
from headroom.core.errors import HeadroomError
from headroom.gateway.limits import read_body
from headroom.models.config import ModelConfig
from headroom.protocol.openai_errors import exception_body, openai_error_body
from headroom.ray_serve.asgi_call import HttpCall
from headroom.ray_serve.forward import forward, generate_stream_error, openai_stream_error
from headroom.ray_serve.spec import ServeAppSpec
from headroom.router.request_keys import request_key
from headroom.server import embeddings

LLM_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})
_HOP_BY_HOP = frozenset({b"host", b"connection", b"transfer-encoding", b"keep-alive", b"upgrade"})


def generate_path(path: str) -> str | None:
    """The model of `/v2/models/{m}[/versions/{v}]/generate[_stream]`, else None."""
    parts = path.rstrip("/").split("/")  # "", "v2", "models", m, ["versions", v,] "generate[_stream]"
    if parts[-1] not in ("generate", "generate_stream") or parts[1:3] != ["v2", "models"] or len(parts) < 4:
        return None
    if len(parts) == 5 or (len(parts) == 7 and parts[4] == "versions" and parts[5]):
        return parts[3] or None
    return None


def _json(payload: object, status: int = 200) -> Response:
    return Response(orjson.dumps(payload), status_code=status, media_type="application/json")


def _refusal(exc: HeadroomError, openai: bool) -> Response:
    """`exc` as `headroom serve` answers it on the route: OpenAI's error shape, or Triton's `{"error"}`."""
    response = _json(exception_body(exc) if openai else {"error": exc.message}, exc.http_status)
    if exc.retry_after_s is not None:
        response.headers["Retry-After"] = str(max(1, round(exc.retry_after_s)))
    return response


def _openai_error(status: int, message: str) -> Response:
    return _json(openai_error_body(status, message, None, None), status)


class OpenAIIngress:
    """The routes above, for one ingress replica (`HttpIngress` owns it)."""

    def __init__(self, spec: ServeAppSpec, models: Any, llm: Any, configs: dict[str, ModelConfig],
                 stats: MutableMapping[str, int]) -> None:
        self.spec = spec
        self.models = models  # DeploymentHandle of ModelReplica (None: no tensor model)
        self.llm = llm  # DeploymentHandle of LLMReplica (None: no LLM)
        self.configs = configs  # the tensor models' configs
        self.stats = stats
        self.created_s = int(time.time())

    async def route(self, request: Request) -> Response | None:
        """The answer for one of these routes, or None for another path."""
        path, method = request.url.path, request.method
        generate = generate_path(path)
        if path in LLM_PATHS or generate is not None or path == "/v1/embeddings":
            if method != "POST":
                return _json({"error": f"use POST for {path}", "reason": "method_not_allowed"}, 405)
            if generate is not None and generate in self.configs:
                return _json({"error": f"model '{generate}' is not a generative model: use /v2/models/{generate}"
                                       "/infer"}, 400)
            try:
                return await (self.embeddings(request) if path == "/v1/embeddings" else self.llm_call(request))
            except HeadroomError as exc:  # the ingress's own refusals (413, a bad timeout header, 503, 504), in
                return _refusal(exc, openai=generate is None)  # the route's error shape

        if path == "/v1/models" and method == "GET":
            return await self.model_list(request)
        return None

    async def _call(self, request: Request) -> tuple[HttpCall, bytes, float]:
        """The request as an `HttpCall` (body read under the size limit: 413), and its time bound."""
        timeout_ms = client_timeout_ms(request.headers)  # 400 for a malformed header
        body = await read_body(request, self.spec.max_body_bytes)
        headers = tuple((k, v) for k, v in request.headers.raw if k.lower() not in _HOP_BY_HOP)
        call = HttpCall(request.method, request.url.path, bytes(request.scope.get("query_string", b"")), headers, body)
        timeout_s = self.spec.llm_timeout_s if timeout_ms is None else min(self.spec.llm_timeout_s, timeout_ms / 1e3)
        return call, body, timeout_s

    async def llm_call(self, request: Request) -> Response:
        if self.llm is None:
            return _openai_error(404, "this application serves no LLM (no `backend: llm` model among its models)")
        call, body, timeout_s = await self._call(request)
        key = request_key(self.spec.router, request.headers, body, self.spec.affinity_header)
        ends = openai_stream_error if generate_path(request.url.path) is None else generate_stream_error
        return await forward(self.llm.http, call, self.spec, self.stats, "the LLM", timeout_s, ends, routing_key=key)

    async def embeddings(self, request: Request) -> Response:
        if self.models is None:
            return _openai_error(404, "this application serves no embedding model")
        call, body, timeout_s = await self._call(request)
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError:
            doc = None  # the replica's route answers the 400
        name = doc.get("model", embeddings.DEFAULT_MODEL) if isinstance(doc, dict) else None
        config = self.configs.get(name) if isinstance(name, str) else None
        model = name if config is not None and embeddings.is_embedding_model(config) else None
        handle = self.models.options(multiplexed_model_id=model) if model and self.spec.multiplex else self.models
        timeout_s = timeout_s + self.spec.load_allowance_s  # the replica may have to load the model first
        return await forward(handle.http, call, self.spec, self.stats, model or "embeddings", timeout_s, model=model)

    async def model_list(self, request: Request) -> Response:
        cards: list[Any] = embeddings.cards(list(self.configs.values()), self.created_s)
        if self.llm is not None:
            listed = await forward(self.llm.http, HttpCall("GET", "/v1/models"), self.spec, self.stats, "the LLM",
                                   self.spec.llm_timeout_s)
            if listed.status_code != 200:
                return listed
            cards += orjson.loads(bytes(listed.body)).get("data", [])
        return _json({"object": "list", "data": cards})
