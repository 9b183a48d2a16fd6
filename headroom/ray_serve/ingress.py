"""The HTTP ingress of a headroom Ray Serve application: KServe V2 over Serve's HTTP proxy, answered by the model
replicas through a `DeploymentHandle`.

Serve's proxy hands each HTTP request to `HttpIngress.__call__` as a Starlette request. The ingress only
translates (as headroom's own HTTP transport does, with the same codec, `headroom.protocol.v2_http`, and the
same error bodies, `headroom.server.http_errors`): it checks the model against the repository's configs (404
before the body is read), reads the body under the size limit (413), decodes and validates it (400), then calls
`ModelReplica.infer` through the handle with the model name as Serve's multiplexed model id, and encodes the
answer. Every request first passes `headroom serve`'s own gateway (`headroom.ray_serve.auth`: API keys, input
limits, per-tenant rate limits, CORS), which Serve runs on the request's own ASGI scope: `__call__` returns a
`GatewayCall`, a Starlette response that Serve sends by calling it as an ASGI app. Every accepted request gets
exactly one response:

* a model replica that dies (or becomes unreachable) under a request: the request is sent again, up to
  `max_attempts` tries with a doubling backoff (inference is idempotent); after that 503 `not_ready`;
* no answer within the request's timeout plus `load_allowance_s` (all tries together): the call is cancelled,
  504 `deadline_exceeded` (a wedged replica never wedges the ingress);
* Serve's handle queue full (`BackPressureError`) or a deployment that failed: 503; any other failure of the
  call: 500 with the error's text, never a hang or a crash of the ingress.
"""

from __future__ import annotations

import itertools
import logging
from pathlib import Path
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from headroom.core.deadline import client_timeout_ms
from headroom.core.errors import HeadroomError, ModelNotFound
from headroom.core.server_timing import server_timing_header
from headroom.core.types import InferenceRequest
from headroom.gateway.app import wrap_app
from headroom.gateway.limits import read_body
from headroom.gateway.ratelimit import RateLimiter
from headroom.models.config import ModelConfig
from headroom.models.repository import ModelRepository
from headroom.protocol.http_request import parse_header_length
from headroom.protocol.triton_config import triton_model_config
from headroom.protocol.v2_http import decode_infer_request, encode_infer_response, model_metadata_json
from headroom.ray_serve.app import LLM_DEPLOYMENT, MODELS_DEPLOYMENT
from headroom.ray_serve.asgi_call import REPLICA_HEADER
from headroom.ray_serve.auth import IngressAuth, ingress_gateway
from headroom.ray_serve.fleet_metrics import FleetMetrics
from headroom.ray_serve.grpc_ingress import GrpcIngress
from headroom.ray_serve.model_info import ServedModels, model_path
from headroom.ray_serve.openai_ingress import OpenAIIngress
from headroom.ray_serve.replica import ReplicaAnswer
from headroom.ray_serve.retries import awaited, first_result
from headroom.ray_serve.spec import ServeAppSpec
from headroom.router.request_keys import request_key
from headroom.server.http_errors import error_response

log = logging.getLogger("headroom.ray_serve")

#: This ingress replica's counters: inference requests, tries repeated after a lost model replica, requests
#: that ran out of tries (503), requests not answered in time (504), streams that broke after their head (ended
#: by an error event, `headroom.ray_serve.forward`).
STATS_PATH = "/ingress/stats"


def infer_path(path: str) -> tuple[str, str] | None:
    """(model, version) of `/v2/models/{m}[/versions/{v}]/infer`, else None."""
    parts = path.rstrip("/").split("/")  # "", "v2", "models", m, ["versions", v,] "infer"
    if len(parts) == 5 and parts[1:3] == ["v2", "models"] and parts[4] == "infer" and parts[3]:
        return parts[3], ""
    if (len(parts) == 7 and parts[1:3] == ["v2", "models"] and parts[4] == "versions" and parts[6] == "infer"
            and parts[3] and parts[5]):
        return parts[3], parts[5]
    return None


def _json(payload: object, status: int = 200) -> Response:
    return Response(orjson.dumps(payload), status_code=status, media_type="application/json")


class GatewayCall(Response):
    """The answer `HttpIngress.__call__` gives Serve: sent (Serve calls a returned Response as an ASGI app with
    the request's scope, receive and send) by running the gateway-wrapped ingress on that very request."""

    def __init__(self, app: Any) -> None:
        super().__init__()
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)


class HttpIngress(GrpcIngress):
    """The Serve deployment body of the ingress (`headroom.ray_serve.app` decorates it)."""

    def __init__(self, models: Any, spec: ServeAppSpec, llm: Any = None) -> None:
        self.models = models  # DeploymentHandle of ModelReplica (None: no tensor model)
        self.llm = llm  # DeploymentHandle of LLMReplica (None: no LLM)
        self.spec = spec
        index = ModelRepository(Path(spec.model_repository), spec.trusted_backends).scan(spec.models or None)
        self.configs: dict[str, ModelConfig] = {e.name: e.config for e in index.models}
        self.served = ServedModels.of(index)  # metadata / config / ready, answered here
        self.llm_names = frozenset(str(e.config.parameters.get("served_model_name") or e.name)
                                   for e in index.llm_models)
        self._ids = itertools.count(1)
        # GET /ingress/stats
        self.stats = {"requests": 0, "replica_lost_retries": 0, "retries_exhausted": 0, "timeouts": 0,
                      "streams_broken": 0}
        self.openai = OpenAIIngress(spec, models, llm, self.configs, self.stats)
        self.fleet = FleetMetrics({MODELS_DEPLOYMENT: models, LLM_DEPLOYMENT: llm}, self.stats)
        setup = ingress_gateway(spec)  # as `headroom serve`'s flags build it; one limiter for HTTP and gRPC
        limiter = RateLimiter(setup.config.rate_limits, setup.config.tenant_rate_limits)
        self.auth = IngressAuth.of(setup, limiter)
        self.gateway = wrap_app(self._asgi, setup, limiter=limiter)

    async def __call__(self, request: Request) -> Response:
        return GatewayCall(self.gateway)

    async def _asgi(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ingress as the ASGI app behind the gateway (the body, once read by the gateway, is in the scope)."""
        response = await self._answer(Request(scope, receive))
        await response(scope, receive, send)

    async def _answer(self, request: Request) -> Response:
        try:
            return await self._route(request)
        except HeadroomError as exc:
            return error_response(exc)
        except Exception as exc:  # a failure of the call itself (a replica's bug): one JSON 500, never a hang
            log.exception("request to %s failed", request.url.path)
            return _json({"error": f"{type(exc).__name__}: {exc}", "reason": "internal"}, 500)

    async def _route(self, request: Request) -> Response:
        path = request.url.path
        target = infer_path(path)
        if target is not None:
            if request.method != "POST":
                return _json({"error": f"use POST for {path}", "reason": "method_not_allowed"}, 405)
            return await self.infer(request, *target)
        described = model_path(path) if request.method == "GET" else None
        if described is not None:
            return self._describe(*described)
        answer = await self.openai.route(request)
        if answer is not None:
            return answer
        if request.method == "GET" and path == "/metrics":
            return await self.fleet.page()
        if request.method == "GET" and path in ("/v2/health/live", "/v2/health/ready"):
            return _json({})  # the proxy routes here only once the deployments are up
        if request.method == "GET" and path == "/v2/models":
            return _json({"models": sorted(self.configs)})
        if request.method == "GET" and path == STATS_PATH:
            return _json(self.stats)
        return _json({"error": f"no route for {request.method} {path}", "reason": "not_found"}, 404)

    def _describe(self, model: str, version: str, what: str) -> Response:
        """V2 model metadata, Triton's config, or readiness, from the repository (404 for an unknown model)."""
        if what == "config":
            return _json(triton_model_config(self.served.config(model, version)))
        if what == "ready":
            self.served.config(model, version)
            return _json({"name": model, "ready": True})
        return _json(model_metadata_json(self.served.metadata(model, version)))

    def _request_id(self) -> str:
        return f"serve-req-{next(self._ids)}"

    def _config(self, model: str) -> ModelConfig:
        config = self.configs.get(model)
        if config is None:
            known = ", ".join(sorted(self.configs)) or "none"
            raise ModelNotFound(f"Request for unknown model: '{model}' is not found (served models: {known})")
        return config

    async def infer(self, request: Request, model: str, version: str) -> Response:
        config = self._config(model)  # 404 before the body is read
        timeout_ms = client_timeout_ms(request.headers)
        body = await read_body(request, self.spec.max_body_bytes)
        header_length = parse_header_length(request.headers.get("inference-header-content-length"))
        request_id = request.headers.get("x-request-id") or self._request_id()
        decoded = decode_infer_request(body, header_length, model, version, request_id, config,
                                       header_timeout_ms=timeout_ms)
        key = request_key(self.spec.router, request.headers, body, self.spec.affinity_header)
        timeout_s = (decoded.timeout_ms or config.batching.default_timeout_ms) / 1e3 + self.spec.load_allowance_s
        answer = await self.call_replica(decoded, key, timeout_s)
        if answer.error is not None:
            response = error_response(answer.error.rebuild())
        else:
            if answer.response is None:
                raise RuntimeError("a replica answered with neither a response nor an error")
            payload, headers = encode_infer_response(answer.response, binary_default=decoded.binary_output_default,
                                                     labels=answer.labels)
            headers["Server-Timing"] = server_timing_header(answer.response.timings)
            response = Response(payload, headers=headers)
        response.headers[REPLICA_HEADER] = answer.replica_id
        return response

    async def call_replica(self, request: InferenceRequest, key: str | None, timeout_s: float) -> ReplicaAnswer:
        """`ModelReplica.infer` through the handle (`headroom.ray_serve.retries`: a lost replica is retried
        elsewhere; past `timeout_s`, all tries together, the call is cancelled and the answer is 504)."""
        handle = self.models.options(multiplexed_model_id=request.model_name) if self.spec.multiplex else self.models

        def send() -> tuple[Any, Any]:
            call = handle.infer.remote(request, routing_key=key)
            return call, awaited(call)

        answer, _ = await first_result(send, self.spec, self.stats, request.model_name, request.request_id,
                                       timeout_s)
        if not isinstance(answer, ReplicaAnswer):
            raise RuntimeError(f"a model replica answered {type(answer).__name__}, not a ReplicaAnswer")
        return answer
