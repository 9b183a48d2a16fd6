"""The HTTP transport: KServe V2 REST (+ Triton's extensions: server/triton_routes.py), OpenAI
embeddings/models, /metrics, /openapi.json.

Handlers only translate: bytes ↔ `headroom.core.types` via `headroom.protocol.v2_http`, then one call into
the data plane. Status codes come from the error tree (headroom.core.errors), never from handlers.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import orjson
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from headroom.core.deadline import client_timeout_ms, parse_timeout_ms
from headroom.core.errors import HeadroomError, InvalidRequest, ModelNotFound
from headroom.core.server_timing import server_timing_header
from headroom.core.types import InferenceRequest, Tensor
from headroom.gateway.limits import read_body
from headroom.protocol.openai_errors import FieldError, exception_body
from headroom.protocol.v2_http import decode_infer_request, encode_infer_response, model_metadata_json
from headroom.server import embeddings
from headroom.server.dataplane import DataPlane
from headroom.server.http_errors import (
    START_KEY,
    error_response,
    error_timing,
    headroom_error_handler,
    hold,
    http_exception_handler,
)
from headroom.server.metrics import OnlySeries
from headroom.server.model_manager import ModelManager
from headroom.server.openapi import openapi_document
from headroom.server.triton_routes import TritonApi
from headroom.server.triton_settings import TritonSettings

Handler = Callable[[Request], Awaitable[Response]]


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """Input limits enforced at the HTTP edge."""

    max_body_bytes: int = 64 * 1024 * 1024  # larger bodies get 413


def _json(payload: object, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY), status_code=status,
                    media_type="application/json", headers=headers)


T = TypeVar("T")
_INFER_PATH = re.compile(r"/v2/models/([^/]+)(?:/versions/([^/]+))?/infer")


def received_s(request: Request) -> float | None:
    """When the gateway (the first ASGI layer) saw the request, on the server's clock (None without it)."""
    value = request.scope.get("state", {}).get("received_s")
    return float(value) if isinstance(value, int | float) else None


def disconnect_watcher(request: Request):  # type: ignore[no-untyped-def]
    """An awaitable factory that resolves when the client disconnects (the body must be consumed)."""

    async def wait() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    return wait


def _texts_tensor(name: str, dims: int, texts: Sequence[str]) -> Tensor:
    """`texts` as a BYTES input of one string per batch row (`dims`: the input's non-batch dimensions, all 1)."""
    shape = (len(texts), *(1 for _ in range(dims)))
    return Tensor(name, "BYTES", shape, np.array([t.encode("utf-8") for t in texts], dtype=object).reshape(shape))


async def _all_or_none(calls: list[Awaitable[T]]) -> list[T]:
    """Await `calls` side by side; the first failure cancels the others and is raised (all succeed or none)."""
    if len(calls) == 1:
        return [await calls[0]]
    tasks = [asyncio.ensure_future(call) for call in calls]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        raise


class HttpApi:
    """Route handlers bound to one data plane."""

    def __init__(self, dataplane: DataPlane, registry: CollectorRegistry, limits: HttpLimits,
                 llm_model_cards: Iterable[object] = (), manager: ModelManager | None = None,
                 settings: TritonSettings | None = None) -> None:
        self.dp = dataplane
        self.manager = manager
        self.triton = TritonApi(dataplane, manager, settings or TritonSettings())  # Triton's extensions
        self.registry = registry
        self.limits = limits
        self.llm_cards = llm_model_cards
        self._ids = itertools.count(1)
        self._created_s = int(time.time())  # /v1/models `created`

    # --- health & metadata ----------------------------------------------------------------------------
    async def server_metadata(self, request: Request) -> Response:
        meta = self.dp.server_metadata()
        return _json({"name": meta.name, "version": meta.version, "extensions": list(meta.extensions)})

    async def live(self, request: Request) -> Response:
        return _json({"live": True}) if self.dp.live() else _json({"live": False}, 503)

    async def ready(self, request: Request) -> Response:
        return _json({"ready": True}) if self.dp.ready() else _json({"ready": False}, 503)

    async def model_metadata(self, request: Request) -> Response:
        p = request.path_params
        return _json(model_metadata_json(self.dp.model_metadata(p["model"], p.get("version", ""))))

    async def model_ready(self, request: Request) -> Response:
        p = request.path_params
        ok = self.dp.model_ready(p["model"], p.get("version", ""))
        return _json({"name": p["model"], "ready": ok}, 200 if ok else 503)

    async def stats(self, request: Request) -> Response:
        p = request.path_params
        return _json({"model_stats": self.dp.model_stats(p.get("model", ""), p.get("version", ""))})

    async def metrics(self, request: Request) -> Response:
        names = request.query_params.getlist("name[]")  # Prometheus' filter: only these series (a cheap page)
        page = generate_latest(OnlySeries(self.registry, names)) if names else generate_latest(self.registry)
        return Response(page, media_type=CONTENT_TYPE_LATEST)

    async def openapi(self, request: Request) -> Response:
        return _json(openapi_document())

    # --- inference ------------------------------------------------------------------------------------
    def _request_id(self, request: Request) -> str:
        return request.headers.get("x-request-id") or f"req-{next(self._ids)}"

    async def infer(self, request: Request) -> Response:
        p = request.path_params
        request_id = self._request_id(request)
        served = self.dp.resolve(p["model"], p.get("version", ""), request_id)  # 404 before reading the body
        timeout_ms = client_timeout_ms(request.headers)
        self.dp.admit_early(p["model"], p.get("version", ""), timeout_ms, request_id,  # 503 before the body
                            received_s(request))
        body = await read_body(request, self.limits.max_body_bytes)
        header_len = request.headers.get("inference-header-content-length")
        try:
            header_length = int(header_len) if header_len is not None else None
        except ValueError:
            raise InvalidRequest("Inference-Header-Content-Length must be an integer") from None
        decoded = decode_infer_request(body, header_length, p["model"], p.get("version", ""), request_id,
                                       served.config, header_timeout_ms=timeout_ms, received_s=received_s(request))
        response = await self.dp.infer(decoded, disconnect_watcher(request))
        payload, headers = encode_infer_response(response, binary_default=decoded.binary_output_default,
                                                 labels=self.dp.labels(response.model_name, response.model_version))
        return Response(payload, headers=headers)  # Server-Timing included

    async def classify_image(self, request: Request) -> Response:
        """`POST /v2/models/{m}/classify?top_k=3&min_confidence=0.5` with a PNG/JPEG body (listing 1)."""
        p = request.path_params
        self.dp.resolve(p["model"], p.get("version", ""), self._request_id(request))
        try:
            top_k = int(request.query_params.get("top_k", "3"))
            min_conf = float(request.query_params.get("min_confidence", "0"))
        except ValueError:
            raise InvalidRequest("top_k must be an integer and min_confidence a number in 0..1") from None
        image = await read_body(request, self.limits.max_body_bytes)
        if not image:
            raise InvalidRequest("the body must be a PNG or JPEG image")
        body, timings = await self.dp.classify_image(p["model"], p.get("version", ""), image, top_k, min_conf,
                                                     disconnect_watcher(request))
        return _json(body, headers={"Server-Timing": server_timing_header(timings)})

    # --- OpenAI-compatible ----------------------------------------------------------------------------
    async def embeddings(self, request: Request) -> Response:
        """OpenAI's embeddings (`headroom.server.embeddings`); every error in OpenAI's schema."""
        try:
            return await self._embeddings(request)
        except HeadroomError as exc:
            await hold(exc)
            headers = {"Retry-After": str(max(1, round(exc.retry_after_s)))} if exc.retry_after_s else {}
            timing = error_timing(request.scope)
            if timing is not None:
                headers["Server-Timing"] = timing
            return _json(exception_body(exc), exc.http_status, headers)

    async def _embeddings(self, request: Request) -> Response:
        raw = await read_body(request, self.limits.max_body_bytes)
        timeout_ms, arrived_s = client_timeout_ms(request.headers), received_s(request)
        request_id = self._request_id(request)
        peeked = embeddings.peek_model(raw)
        if peeked is not None and self._serves_embeddings(peeked):  # 503 before the JSON is parsed and checked
            self.dp.admit_early(peeked, "", timeout_ms, request_id, arrived_s)
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise FieldError(None, f"request body is not valid JSON: {exc}", "invalid_json") from None
        req = embeddings.parse_request(body)
        served = self.dp.served(req.model)
        if not embeddings.is_embedding_model(served.config):
            raise ModelNotFound(f"model {req.model!r} is not an embedding model; /v1/embeddings serves "
                                f"{', '.join(self._embedding_models()) or 'none here'}")
        dimensions = embeddings.check_dimensions(served.config, req.dimensions)
        spec, cap = served.config.inputs[0], served.config.max_batch_size
        # more inputs than one batch holds: one request per max_batch_size of them, run side by side
        chunks = [req.texts[i:i + cap] for i in range(0, len(req.texts), cap)] if cap > 0 else [req.texts]
        calls = [InferenceRequest(request_id=request_id, model_name=req.model, model_version="",
                                  inputs=(_texts_tensor(spec.name, len(spec.shape), chunk),),
                                  timeout_ms=timeout_ms, received_s=arrived_s) for chunk in chunks]
        if peeked != req.model:  # refused now, before a thread is given its token count (it would queue there)
            self.dp.admit_early(req.model, "", timeout_ms, request_id, arrived_s)
        watcher = disconnect_watcher(request)  # one reader of the client's messages, for the first call
        # the usage count tokenizes off the loop while the model runs (a model that cannot count reports 0)
        results, tokens = await asyncio.gather(
            _all_or_none([self.dp.infer(call, watcher if i == 0 else None) for i, call in enumerate(calls)]),
            asyncio.to_thread(embeddings.count_tokens, served.model, req.texts))
        vectors = np.concatenate([np.asarray(r.outputs[0].data, dtype=np.float32).reshape(len(chunk), -1)
                                  for r, chunk in zip(results, chunks, strict=True)])
        vectors = embeddings.truncate(vectors, dimensions)
        slowest = max(results, key=lambda r: r.timings.total_ms)
        return _json(embeddings.response_body(req, vectors, tokens),
                     headers={"Server-Timing": server_timing_header(slowest.timings)})

    def refuse_early(self, path: str, timeout_header: str | None, body: bytes, arrived_s: float | None,
                     request_id: str) -> None:
        """The routes' admission before the body is parsed, from the raw request (`early_refusal`): raise
        Overloaded for `POST /v1/embeddings` (model peeked from the body) and V2 infer; nothing else is checked."""
        if path == "/v1/embeddings":
            name, version = embeddings.peek_model(body), ""
            if name is None or not self._serves_embeddings(name):
                return
        elif (infer := _INFER_PATH.fullmatch(path)) is not None:
            name, version = infer[1], infer[2] or ""
        else:
            return
        self.dp.admit_early(name, version, parse_timeout_ms(timeout_header), request_id, arrived_s)

    def _serves_embeddings(self, name: str) -> bool:
        config = self.dp.config_of(name)
        return config is not None and embeddings.is_embedding_model(config)

    def _embedding_models(self) -> list[str]:
        return [n for n in self.dp.model_names() if embeddings.is_embedding_model(self.dp.served(n).config)]

    async def models(self, request: Request) -> Response:
        """What the /v1 routes serve: the embedding models and the LLMs, each with its `max_model_len`."""
        configs = [self.dp.served(n).config for n in self.dp.model_names()]
        cards: list[object] = [*embeddings.cards(configs, self._created_s), *self.llm_cards]
        return _json({"object": "list", "data": cards})

    def routes(self) -> list[BaseRoute]:
        r = Route
        return [  # Starlette tries routes in order: the inference routes first, so they match at the first try
            r("/v2/models/{model}/infer", self.infer, methods=["POST"]),
            r("/v2/models/{model}/versions/{version}/infer", self.infer, methods=["POST"]),
            r("/v1/embeddings", self.embeddings, methods=["POST"]),
            r("/v2", self.server_metadata, methods=["GET"]),
            r("/v2/health/live", self.live, methods=["GET"]),
            r("/v2/health/ready", self.ready, methods=["GET"]),
            r("/v2/models/stats", self.stats, methods=["GET"]),
            r("/v2/models/{model}", self.model_metadata, methods=["GET"]),
            r("/v2/models/{model}/stats", self.stats, methods=["GET"]),
            r("/v2/models/{model}/versions/{version}/stats", self.stats, methods=["GET"]),
            r("/v2/models/{model}/ready", self.model_ready, methods=["GET"]),
            r("/v2/models/{model}/classify", self.classify_image, methods=["POST"]),
            r("/v2/models/{model}/versions/{version}", self.model_metadata, methods=["GET"]),
            r("/v2/models/{model}/versions/{version}/classify", self.classify_image, methods=["POST"]),
            r("/v2/models/{model}/versions/{version}/ready", self.model_ready, methods=["GET"]),
            *self.triton.routes(),
            r("/v1/models", self.models, methods=["GET"]),
            r("/metrics", self.metrics, methods=["GET"]),
            r("/openapi.json", self.openapi, methods=["GET"]),
        ]


def build_http_app(api: HttpApi, extra_routes: Sequence[BaseRoute] = ()) -> ASGIApp:
    """The ASGI app: V2 + OpenAI + metrics routes, plus any extra (LLM, dashboard) routes, all through one
    Starlette router. The scope is stamped on entry (`START_KEY`): error responses' Server-Timing counts from
    there. (A second, hand-written router for the inference routes was measured and removed: it saved 50-90 us
    of CPU per request, 1-2% of a minilm request; benchmarks/results/hot_routes_ab_2026-12-03.json.)"""
    app = Starlette(
        routes=[*api.routes(), *extra_routes],
        exception_handlers={HeadroomError: headroom_error_handler, HTTPException: http_exception_handler},
    )

    async def stamped(scope: Scope, receive: Receive, send: Send) -> None:
        scope[START_KEY] = time.monotonic()
        await app(scope, receive, send)

    return stamped


__all__ = ["HttpApi", "HttpLimits", "build_http_app", "error_response"]
