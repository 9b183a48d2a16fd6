"""The LLM replica of a headroom Ray Serve application: headroom's own LLM engine and HTTP routes per Serve replica.

`LLMReplica` builds what `headroom serve` builds for its `backend: llm` models (`headroom.server.llm_wiring`):
its own Prometheus registry, `ServerMetrics`, a `ServingLifecycle`, a `DataPlane` that knows the generative
models, one `LLMService` per LLM (engine loaded, started and warmed before Serve routes to the replica), and the
same Starlette app behind the same gateway middleware (with the application's API keys, each request runs as its
key's tenant, whose prefix cache it shares; without, all as the anonymous tenant: `headroom.ray_serve.auth`):
`/v1/chat/completions`, `/v1/completions` (streamed or not), `/v1/models`, `/v2/models/{m}/generate[_stream]`,
`/v2/llm/prefix_blocks`, `/metrics`. The ingress forwards the HTTP request as an `HttpCall` through a streaming
`DeploymentHandle` and gets the head and the body chunks back (`headroom.ray_serve.asgi_call`), so answers,
errors, Server-Timing and server-sent events are byte for byte those of `headroom serve`.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

from google.protobuf.message import DecodeError
from prometheus_client import CollectorRegistry

from headroom.core.clock import MonotonicClock
from headroom.core.errors import HeadroomError, InvalidRequest
from headroom.core.lifecycle import ServingLifecycle
from headroom.gateway.context import RequestContext, bind_context, reset_context
from headroom.models.repository import ModelRepository
from headroom.protocol.generated import headroom_inference_pb2 as pb
from headroom.ray_serve.asgi_call import HttpCall, HttpHead, PagedReplica, call_asgi, replica_app, replica_header
from headroom.ray_serve.auth import replica_gateway
from headroom.ray_serve.replica import RemoteError
from headroom.ray_serve.spec import ServeAppSpec
from headroom.server.dataplane import DataPlane
from headroom.server.http_app import HttpApi, HttpLimits
from headroom.server.llm_wiring import wire_llms
from headroom.server.metrics import ServerMetrics


class LLMReplica(PagedReplica):
    """The Serve deployment body (`headroom.ray_serve.app` decorates it). One instance per Serve replica."""

    async def __init__(self, spec: ServeAppSpec) -> None:  # type: ignore[misc]  # Serve awaits an async init
        from ray import serve

        self.spec = spec
        self.replica_id = str(serve.get_replica_context().replica_id.unique_id)
        self.registry = CollectorRegistry()
        self.clock = MonotonicClock()
        self.lifecycle = ServingLifecycle()
        self.dataplane = DataPlane(ServerMetrics(self.registry), self.clock, lifecycle=self.lifecycle)
        index = ModelRepository(Path(spec.model_repository), spec.trusted_backends).scan(spec.models or None)
        # as `headroom serve [--api-keys-file]`: each request runs as its key's tenant, or all as the anonymous one
        gateway = replica_gateway(spec.api_keys_file)
        wiring = wire_llms(index.llm_models, self.registry, self.lifecycle, self.dataplane, gateway.config)
        self.services = wiring.services
        self.grpc = wiring.grpc  # the LLMs on gRPC ModelInfer (through Serve's gRPC proxy and the ingress)
        for service in self.services:  # loaded and warmed before Serve routes here (a failure fails the replica)
            await service.start()
        api = HttpApi(self.dataplane, self.registry, HttpLimits(spec.max_body_bytes), wiring.cards)
        self.app = replica_app(api, wiring.routes, self.registry, self.clock, gateway)

    async def http(self, call: HttpCall, routing_key: str | None = None) -> AsyncGenerator[HttpHead | bytes, None]:
        """Answer one HTTP request (streamed: the head, then body chunks). `routing_key` is the request
        router's."""
        async for item in call_asgi(self.app, call, replica_header(self.replica_id)):
            yield item

    async def grpc_infer(self, message: bytes, request_id: str,
                         tenant: str = "") -> tuple[bytes | None, RemoteError | None]:
        """gRPC ModelInfer on an LLM (`text_input` -> `text_output`), as `headroom serve` answers it, as `tenant`
        (the ingress's authenticated caller: its prefix-cache scope). Messages travel serialized (the generated
        classes do not pickle); a headroom error comes back by value."""
        token = bind_context(RequestContext(request_id, tenant, "", ""))
        try:
            response = await self.grpc.infer(pb.ModelInferRequest.FromString(message), request_id)
            return response.SerializeToString(), None
        except HeadroomError as exc:
            return None, RemoteError.of(exc)
        except DecodeError as exc:
            return None, RemoteError.of(InvalidRequest(f"not a ModelInferRequest: {exc}"))
        finally:
            reset_context(token)

    def record_routing_stats(self) -> dict[str, Any]:
        """Serve polls this; headroom's request router reads `queue_depth` (requests admitted, not answered)."""
        return {"queue_depth": self.lifecycle.inflight}

    def check_health(self) -> None:
        """Serve's health check: an engine loop that died makes the replica unhealthy, so Serve replaces it."""
        if not self.lifecycle.live():
            raise RuntimeError(f"LLM replica {self.replica_id}: an engine loop died")

    async def __del__(self) -> None:
        """Serve calls this when it stops the replica (after draining): stop the engine threads."""
        for service in self.services:
            await service.stop()
