"""The LLMs (`backend: llm`) a server runs and their request surfaces, for a set of LLMs that can grow while it serves.

`LLMFleet` owns the LLM services (headroom.llm.factory) and serves them on every surface through one live
table, so an LLM added after start (a directory that appeared: the poller in poll mode, a repository load in
explicit mode; `ModelManager(add_llm=fleet.add)`) is routed to without a restart:

- `POST /v1/chat/completions`, `/v1/completions`: the body's `model` picks the LLM (with a single LLM it takes
  every request, so its own checks answer a wrong name); an unknown model is a 404 in OpenAI's error schema;
- `/v2/models/{m}[/versions/{v}]/generate[_stream]` and gRPC ModelInfer / ModelStreamInfer (headroom.llm.generate,
  headroom.llm.grpc_generate), `GET /v2/llm/prefix_blocks`, the `/v1/models` cards;
- the metrics: each LLM registers its series in a registry of its own, merged at scrape time into the server's
  (`MergedRegistries`), so two LLMs never collide on a series name.

A new LLM is loaded and warmed before anything routes to it; the server stays ready meanwhile (its readiness
check joins once it serves). A failed load leaves nothing behind. The LLM modules (torch) are imported off the
event loop the first time an LLM is added to a server that started without one.
"""

from __future__ import annotations

import asyncio
import importlib
import json
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Metric
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from headroom.core.errors import ModelNotFound
from headroom.core.lifecycle import ServingLifecycle
from headroom.llm.kv_cache import CachedBlocks
from headroom.llm.prefix_blocks import prefix_blocks_route
from headroom.models.config import ModelConfig
from headroom.protocol.openai_errors import exception_body
from headroom.server.generative import GenerativeModels


class MergedRegistries(Collector):
    """Families of several registries as one set: same-named families' samples are concatenated."""

    def __init__(self) -> None:
        self._registries: list[CollectorRegistry] = []

    def add(self, registry: CollectorRegistry) -> None:
        self._registries.append(registry)

    def collect(self) -> Iterable[Metric]:
        merged: dict[str, Metric] = {}
        for registry in list(self._registries):
            for family in registry.collect():  # fresh Metric objects on every collect
                into = merged.setdefault(family.name, family)
                if into is not family:
                    into.samples.extend(family.samples)
        return list(merged.values())


class LLMFleet:
    """Name (the model directory) -> LLM service, and the routes, gRPC handler and cards over that live table."""

    def __init__(self, registry: CollectorRegistry, lifecycle: ServingLifecycle, generative: GenerativeModels,
                 is_tensor_model: Callable[[str], bool], tenant: str | None, tenant_header: bool = False) -> None:
        self.services: list[Any] = []  # every LLMService, in the order they were added
        self._servings: dict[str, Any] = {}  # directory name -> OpenAIServing
        self._lifecycle = lifecycle
        self._generative = generative
        self._is_tensor_model = is_tensor_model
        self._tenant = tenant  # the tenant every request runs as (no API keys), for the prefix-block feed
        self._tenant_header = tenant_header  # requests run as the tenant a trusted router names (x-headroom-tenant)
        self._metrics = MergedRegistries()
        registry.register(self._metrics)
        self._generate: Any = None  # headroom.llm.generate.GenerateRoutes over the table, made on first use
        self._grpc: Any = None

    def build(self, config: ModelConfig) -> Any:
        """An LLM the server starts with: routed now (503 until `start()` loaded it; the server is not ready
        until then)."""
        from headroom.llm.factory import build_llm_service

        own = CollectorRegistry()
        service = self._unique(build_llm_service(config, own, self._lifecycle))
        self._lifecycle.add_readiness_check(service)
        self._lifecycle.add_liveness_check(service)
        self._register(config, service, own)
        return service

    async def add(self, config: ModelConfig) -> None:
        """Serve an LLM that is new to this server: load and warm it, then route to it."""
        await asyncio.to_thread(_import_llm_modules)
        from headroom.llm.factory import build_llm_service

        own = CollectorRegistry()
        service = self._unique(build_llm_service(config, own, self._lifecycle))
        await service.start()  # a failure raises here: nothing was registered
        self._register(config, service, own)
        self._lifecycle.add_readiness_check(service)
        self._lifecycle.add_liveness_check(service)

    def _unique(self, service: Any) -> Any:
        """`service`, unless its OpenAI name is served already (the /v1 routes and the metrics key on it)."""
        for other in self.services:
            if other.name == service.name:
                raise ValueError(f"model '{service.config.name}': served_model_name {service.name!r} is already "
                                 f"served by model '{other.config.name}'")
        return service

    def _register(self, config: ModelConfig, service: Any, own: CollectorRegistry) -> None:
        if self._grpc is None:
            from headroom.llm.generate import GenerateRoutes
            from headroom.llm.grpc_generate import GrpcGenerate

            self._generate = self._generate or GenerateRoutes(self._servings, self._is_tensor_model)
            self._grpc = GrpcGenerate(self._generate)
        self._metrics.add(own)
        service.serving.observer = self._generative.add(config, service)
        self.services.append(service)
        self._servings[config.name] = service.serving

    def cards(self) -> Iterable[object]:
        """The `/v1/models` entries, read when listed."""
        return _Cards(self._servings)

    def cached_blocks(self) -> dict[str, tuple[int, CachedBlocks]]:
        return {s.name: cb for s in self.services if (cb := s.cached_blocks()) is not None}

    # -- HTTP ---------------------------------------------------------------------------------------------------
    def routes(self) -> list[BaseRoute]:
        out: list[BaseRoute] = [Route("/v1/chat/completions", self._chat, methods=["POST"]),
                                Route("/v1/completions", self._completion, methods=["POST"])]
        for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
            out.append(Route(f"{prefix}/generate", self._generate_once, methods=["POST"]))
            out.append(Route(f"{prefix}/generate_stream", self._generate_stream, methods=["POST"]))
        out.append(prefix_blocks_route(self.cached_blocks, self._tenant, self._tenant_header))
        return out

    async def _chat(self, request: Request) -> Response:
        return await self._openai(request, chat=True)

    async def _completion(self, request: Request) -> Response:
        return await self._openai(request, chat=False)

    async def _openai(self, request: Request, chat: bool) -> Response:
        serving = await self._pick(request)
        if isinstance(serving, Response):
            return serving
        from headroom.llm.http import openai_endpoint

        call = serving.create_chat_completion if chat else serving.create_completion
        return await openai_endpoint(call)(request)

    async def _pick(self, request: Request) -> Any:
        """The serving the body's `model` names, or the 404 response."""
        servings = list(self._servings.values())
        if len(servings) == 1:
            return servings[0]
        try:
            body = json.loads(await request.body())
        except (ValueError, UnicodeDecodeError):
            body = None
        if servings and not isinstance(body, dict):
            return servings[0]  # its endpoint answers the malformed body with its 400
        model = body.get("model") if isinstance(body, dict) else None
        for serving in servings:
            if serving.model_name == model:
                return serving
        names = ", ".join(repr(s.model_name) for s in servings) or "none"
        missing = ModelNotFound(f"the model {model!r} does not exist; this server's LLMs: {names}")
        return JSONResponse(exception_body(missing), status_code=missing.http_status)

    async def _routes(self) -> Any:
        """The generate routes over the table (their module imported off the loop: on a server without an LLM
        yet, a stray request must not stall it)."""
        if self._generate is None:
            module = await asyncio.to_thread(importlib.import_module, "headroom.llm.generate")
            self._generate = module.GenerateRoutes(self._servings, self._is_tensor_model)
        return self._generate

    async def _generate_once(self, request: Request) -> Response:
        return await (await self._routes()).generate(request)  # type: ignore[no-any-return]

    async def _generate_stream(self, request: Request) -> Response:
        return await (await self._routes()).generate_stream(request)  # type: ignore[no-any-return]

    # -- gRPC (protocol.grpc_service.GenerativeInfer) -----------------------------------------------------------
    def serves(self, name: str) -> bool:
        return name in self._servings

    # (called only for a name `serves` confirmed, so the handler exists: `_register` made it)
    async def infer(self, message: Any, request_id: str) -> Any:
        return await self._grpc.infer(message, request_id)

    def stream(self, message: Any, request_id: str) -> AsyncIterator[Any]:
        return self._grpc.stream(message, request_id)  # type: ignore[no-any-return]


def _import_llm_modules() -> None:
    for name in ("headroom.llm.factory", "headroom.llm.generate", "headroom.llm.grpc_generate", "headroom.llm.http"):
        importlib.import_module(name)


class _Cards:
    """The LLMs' `/v1/models` entries, read when listed (weights known once loaded; none while unloaded)."""

    def __init__(self, servings: dict[str, Any]) -> None:
        self._servings = servings

    def __iter__(self) -> Iterator[object]:
        return iter([card for serving in list(self._servings.values()) for card in serving.model_cards()])


__all__ = ["LLMFleet", "MergedRegistries"]
