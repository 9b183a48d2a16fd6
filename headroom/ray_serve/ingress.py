"""The HTTP ingress of a headroom Ray Serve application: KServe V2 over Serve's HTTP proxy, answered by the model
replicas through a `DeploymentHandle`.

Serve's proxy hands each HTTP request to `HttpIngress.__call__` as a Starlette request. The ingress only
translates (as headroom's own HTTP transport does, with the same codec, `headroom.protocol.v2_http`, and the
same error bodies, `headroom.server.http_errors`): it checks the model against the repository's configs (404
before the body is read), reads the body under the size limit (413), decodes and validates it (400), then calls
`ModelReplica.infer` through the handle with the model name as Serve's multiplexed model id, and encodes the
answer. Every accepted request gets exactly one response:

* a model replica that dies (or becomes unreachable) under a request: the request is sent again, up to
  `max_attempts` tries with a doubling backoff (inference is idempotent); after that 503 `not_ready`;
* no answer within the request's timeout plus `load_allowance_s` (all tries together): the call is cancelled,
  504 `deadline_exceeded` (a wedged replica never wedges the ingress);
* Serve's handle queue full (`BackPressureError`) or a deployment that failed: 503; any other failure of the
  call: 500 with the error's text, never a hang or a crash of the ingress.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from pathlib import Path
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from headroom.core.deadline import client_timeout_ms
from headroom.core.errors import DeadlineExceeded, HeadroomError, ModelNotFound, NotReady, Overloaded
from headroom.core.server_timing import server_timing_header
from headroom.core.types import InferenceRequest
from headroom.gateway.limits import read_body
from headroom.models.config import ModelConfig
from headroom.models.repository import ModelRepository
from headroom.protocol.http_request import parse_header_length
from headroom.protocol.v2_http import decode_infer_request, encode_infer_response
from headroom.ray_serve.replica import ReplicaAnswer
from headroom.ray_serve.spec import ServeAppSpec
from headroom.router.request_keys import request_key
from headroom.server.http_errors import error_response

log = logging.getLogger("headroom.ray_serve")

#: Response header naming the Serve replica that answered (as the router's x-headroom-replica).
REPLICA_HEADER = "x-headroom-replica"
#: This ingress replica's counters: inference requests, tries repeated after a lost model replica, requests
#: that ran out of tries (503), requests not answered in time (504).
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


async def _result(call: Any) -> ReplicaAnswer:
    """Await a DeploymentResponse (a coroutine, so that asyncio.wait_for can bound it)."""
    answer: ReplicaAnswer = await call
    return answer


def _json(payload: object, status: int = 200) -> Response:
    return Response(orjson.dumps(payload), status_code=status, media_type="application/json")


class HttpIngress:
    """The Serve deployment body of the ingress (`headroom.ray_serve.app` decorates it)."""

    def __init__(self, models: Any, spec: ServeAppSpec) -> None:
        self.models = models  # DeploymentHandle of ModelReplica
        self.spec = spec
        index = ModelRepository(Path(spec.model_repository), spec.trusted_backends).scan(spec.models or None)
        self.configs: dict[str, ModelConfig] = {e.name: e.config for e in index.models}
        self._ids = itertools.count(1)
        # GET /ingress/stats
        self.stats = {"requests": 0, "replica_lost_retries": 0, "retries_exhausted": 0, "timeouts": 0}

    async def __call__(self, request: Request) -> Response:
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
        if request.method == "GET" and path in ("/v2/health/live", "/v2/health/ready"):
            return _json({})  # the proxy routes here only once the deployments are up
        if request.method == "GET" and path == "/v2/models":
            return _json({"models": sorted(self.configs)})
        if request.method == "GET" and path == STATS_PATH:
            return _json(self.stats)
        return _json({"error": f"no route for {request.method} {path}", "reason": "not_found"}, 404)

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
        request_id = request.headers.get("x-request-id") or f"serve-req-{next(self._ids)}"
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
        """`ModelReplica.infer` through the handle; a replica lost under the request is retried elsewhere; past
        `timeout_s` (all tries together) the call is cancelled and the answer is 504."""
        from ray.exceptions import RayActorError
        from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError, ReplicaUnavailableError

        handle = self.models.options(multiplexed_model_id=request.model_name) if self.spec.multiplex else self.models
        backoff_s = self.spec.retry_backoff_s
        attempt = 0
        self.stats["requests"] += 1
        deadline_s = time.monotonic() + timeout_s
        while True:
            attempt += 1
            call = handle.infer.remote(request, routing_key=key)
            try:
                answer: ReplicaAnswer = await asyncio.wait_for(_result(call), max(0.0, deadline_s - time.monotonic()))
                return answer
            except TimeoutError:
                call.cancel()
                self.stats["timeouts"] += 1
                raise DeadlineExceeded(f"no answer from the model replicas of '{request.model_name}' within "
                                       f"{timeout_s:.1f} s (the request's timeout plus {self.spec.load_allowance_s} "
                                       "s for a model load)") from None
            except (RayActorError, ReplicaUnavailableError) as exc:
                log.warning("request %s: model replica lost (%s), try %d of %d", request.request_id,
                            type(exc).__name__, attempt, self.spec.max_attempts)
                if attempt >= self.spec.max_attempts:
                    self.stats["retries_exhausted"] += 1
                    raise NotReady(f"the model replicas serving '{request.model_name}' failed {attempt} times "
                                   f"under this request (last: {type(exc).__name__}); retry later",
                                   retry_after_s=1.0) from None
                self.stats["replica_lost_retries"] += 1
                await asyncio.sleep(backoff_s)
                backoff_s *= 2
            except BackPressureError:
                raise Overloaded(f"the model replicas of '{request.model_name}' have a full queue",
                                 retry_after_s=1.0) from None
            except DeploymentUnavailableError as exc:
                raise NotReady(f"the model deployment is unavailable: {exc.message}") from None
