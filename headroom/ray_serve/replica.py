"""The model replica of a headroom Ray Serve application: one headroom `DataPlane` per Serve replica.

The data plane is built exactly as `headroom serve`'s composition root builds it (headroom.server.app.Server:
its own Prometheus registry, `ServerMetrics`, a monotonic clock and a `ServingLifecycle`), so a request that
arrives through a `DeploymentHandle` runs the same admission, validation, dynamic batching, deadlines and
timings as one that arrives over `headroom serve`'s HTTP or gRPC. Models are loaded on demand through Serve's
model multiplexing (`@serve.multiplexed`): the handle carries the model name as the multiplexed model id, Serve
prefers replicas that already hold it, and a replica keeps at most `max_models_per_replica` models, unloading
the least recently used one (its batcher drains first) when another is needed. With `multiplex` off, every
replica loads every model before Serve routes to it (as `headroom serve` does).

Answers travel back as `ReplicaAnswer`: a response, or the headroom error (class, message, retry-after), so the
ingress answers with the status and JSON body `headroom serve` would give.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from prometheus_client import CollectorRegistry

from headroom.core.clock import MonotonicClock
from headroom.core.errors import HeadroomError, InvalidRequest, ModelNotFound, NotReady
from headroom.core.lifecycle import ServingLifecycle
from headroom.core.types import InferenceRequest, InferenceResponse
from headroom.models.artifacts import ModelLoadError
from headroom.models.repository import ModelRepository
from headroom.protocol.openai_errors import exception_body
from headroom.ray_serve.asgi_call import HttpCall, HttpHead, PagedReplica, call_asgi, replica_app, replica_header
from headroom.ray_serve.auth import replica_gateway
from headroom.ray_serve.spec import ServeAppSpec
from headroom.server.dataplane import DataPlane
from headroom.server.http_app import HttpApi, HttpLimits
from headroom.server.metrics import ServerMetrics
from headroom.server.model_manager import served_version


@dataclass(frozen=True, slots=True)
class RemoteError:
    """A headroom error raised in a replica, carried back by value (its class is imported by reference)."""

    kind: type[HeadroomError]
    message: str
    retry_after_s: float | None

    @classmethod
    def of(cls, exc: HeadroomError) -> RemoteError:
        return cls(type(exc), exc.message, exc.retry_after_s)

    def rebuild(self) -> HeadroomError:
        return self.kind(self.message, retry_after_s=self.retry_after_s)


@dataclass(frozen=True, slots=True)
class ReplicaAnswer:
    """One request's outcome in a replica: exactly one of `response` and `error`."""

    replica_id: str  # the Serve replica that answered (the ingress reports it as x-headroom-replica)
    response: InferenceResponse | None = None
    labels: dict[str, list[str]] | None = None  # class names of the classification extension
    error: RemoteError | None = None


class ResidentModel:
    """A model held by Serve's multiplexing cache; Serve calls `__del__` when it evicts it (LRU)."""

    def __init__(self, name: str, on_evict: Callable[[str], None]) -> None:
        self.name = name
        self._on_evict: Callable[[str], None] | None = on_evict

    def __del__(self) -> None:  # Serve runs it in a worker thread on eviction; the GC may run it again
        on_evict, self._on_evict = self._on_evict, None
        if on_evict is not None:
            on_evict(self.name)


class ModelReplica(PagedReplica):
    """The Serve deployment body (`headroom.ray_serve.app` decorates it). One instance per Serve replica."""

    async def __init__(self, spec: ServeAppSpec) -> None:  # type: ignore[misc]  # Serve awaits an async init
        from ray import serve

        self.spec = spec
        # as headroom.server.app.Server.__init__ builds them
        self.registry = CollectorRegistry()
        self.metrics = ServerMetrics(self.registry)
        self.clock = MonotonicClock()
        self.lifecycle = ServingLifecycle()
        self.dataplane = DataPlane(self.metrics, self.clock, lifecycle=self.lifecycle)
        self.repository = ModelRepository(Path(spec.model_repository), spec.trusted_backends)
        self.index = self.repository.scan(spec.models or None)  # a bad config fails the deployment, not a request
        self._loop = asyncio.get_running_loop()
        self._unloads: dict[str, asyncio.Task[None]] = {}  # evicted models whose batchers are draining
        self.replica_id = str(serve.get_replica_context().replica_id.unique_id)

        async def load_model(model_id: str) -> ResidentModel:
            return await self._load(model_id)

        self.get_model = serve.multiplexed(max_num_models_per_replica=spec.max_models_per_replica)(load_model)
        self.app = replica_app(HttpApi(self.dataplane, self.registry, HttpLimits(spec.max_body_bytes)), (),
                               self.registry, self.clock, replica_gateway(spec.api_keys_file))  # /v1/embeddings,
        #   as `headroom serve` answers it (with the application's API keys, if any)
        self._preloaded: list[ResidentModel] = []
        if not spec.multiplex:  # every replica serves every model, loaded before Serve routes to it
            self._preloaded = [await self._load(entry.name) for entry in self.index.models]

    async def _load(self, name: str) -> ResidentModel:
        pending = self._unloads.get(name)
        if pending is not None:  # evicted a moment ago: its old batchers must be gone before new ones come
            await asyncio.gather(pending, return_exceptions=True)
        entry = self.index.get(name)
        if entry is None:
            known = ", ".join(e.name for e in self.index.models) or "none"
            raise ModelNotFound(f"Request for unknown model: '{name}' is not found (served models: {known})")
        try:
            for version in entry.versions:
                loaded = await asyncio.to_thread(self.repository.load_version, entry, version)
                self.dataplane.add(served_version(loaded))
        except ModelLoadError as exc:
            raise NotReady(f"model '{name}' could not be loaded on replica {self.replica_id}: {exc}") from None
        return ResidentModel(name, self._evict)

    def _evict(self, name: str) -> None:
        """Thread-safe: unload `name` on the replica's loop (drain its batchers, unload its versions)."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: the replica is shutting down anyway
            self._loop.call_soon_threadsafe(self._start_unload, name)

    def _start_unload(self, name: str) -> None:
        task = asyncio.create_task(self._unload(name), name=f"unload-{name}")
        self._unloads[name] = task
        task.add_done_callback(lambda t: self._unloads.pop(name, None) if self._unloads.get(name) is t else None)

    async def _unload(self, name: str) -> None:
        with contextlib.suppress(ModelNotFound):
            for served in await self.dataplane.remove(name):
                served.model.unload()

    async def infer(self, request: InferenceRequest, routing_key: str | None = None) -> ReplicaAnswer:
        """Run one request through the data plane. `routing_key` is read by headroom's request router only."""
        from ray import serve

        try:
            model_id = serve.get_multiplexed_model_id()
            if model_id and model_id != request.model_name:
                raise InvalidRequest(f"multiplexed model id '{model_id}' does not match the request's model "
                                     f"'{request.model_name}'")
            if self.spec.multiplex:
                await self.get_model(request.model_name)
            response = await self.dataplane.infer(request)
        except HeadroomError as exc:
            return ReplicaAnswer(self.replica_id, error=RemoteError.of(exc))
        labels = self.dataplane.labels(response.model_name, response.model_version)
        return ReplicaAnswer(self.replica_id, response=response, labels=labels)

    async def http(self, call: HttpCall, model: str | None = None,
                   routing_key: str | None = None) -> AsyncGenerator[HttpHead | bytes, None]:
        """Answer one HTTP request through headroom's own routes (the ingress sends `/v1/embeddings` here),
        `model` loaded first (multiplexing; None: a model the repository lacks, which the route answers 404)."""
        if model is not None and self.spec.multiplex:
            try:
                await self.get_model(model)
            except HeadroomError as exc:
                yield HttpHead(exc.http_status,
                               ((b"content-type", b"application/json"), *replica_header(self.replica_id)))
                yield orjson.dumps(exception_body(exc))
                return
        async for item in call_asgi(self.app, call, replica_header(self.replica_id)):
            yield item

    def record_routing_stats(self) -> dict[str, Any]:
        """Serve polls this; headroom's request router reads `queue_depth` (requests admitted, not answered)."""
        return {"queue_depth": sum(self.dataplane.queue_depth(n) for n in self.dataplane.model_names())}

    def check_health(self) -> None:
        """Serve's health check: a dead batcher loop makes the replica unhealthy, so Serve replaces it."""
        if not self.dataplane.live():
            raise RuntimeError(f"replica {self.replica_id}: a batcher loop died")

