"""The LLMs of a repository wired to one server's registry, lifecycle and data plane: their engines (not started),
the OpenAI and V2 generate routes, `/v2/llm/prefix_blocks`, the `/v1/models` cards and the gRPC generate service.

`headroom serve`'s composition root (`headroom.server.app.Server`) and a Ray Serve LLM replica
(`headroom.ray_serve.llm_replica`) both build their LLM side here, so a request meets the same routes either way.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry
from starlette.routing import BaseRoute

from headroom.core.lifecycle import ServingLifecycle
from headroom.gateway.middleware import GatewayConfig
from headroom.server.dataplane import DataPlane


class ModelCards:
    """The LLMs' `/v1/models` entries, read when listed (weights known once loaded; none while unloaded)."""

    def __init__(self, servings: list[Any]) -> None:
        self._servings = servings

    def __iter__(self) -> Iterator[object]:
        return iter([card for serving in self._servings for card in serving.model_cards()])


@dataclass(frozen=True, slots=True)
class LLMWiring:
    """What `wire_llms` built; the caller starts (and stops) the services."""

    services: tuple[Any, ...]  # headroom.llm.factory.LLMService, one per LLM, not started
    routes: tuple[BaseRoute, ...]  # OpenAI + generate + prefix blocks
    cards: ModelCards  # /v1/models entries
    grpc: Any  # headroom.llm.grpc_generate.GrpcGenerate: the LLMs on gRPC ModelInfer / ModelStreamInfer


def wire_llms(entries: Sequence[Any], registry: CollectorRegistry, lifecycle: ServingLifecycle,
              dataplane: DataPlane, gateway: GatewayConfig) -> LLMWiring:
    """Wire the repository's `backend: llm` entries (non-empty) to the server's parts."""
    from headroom.llm.factory import build_llm_service
    from headroom.llm.generate import GenerateRoutes
    from headroom.llm.grpc_generate import GrpcGenerate
    from headroom.llm.http import openai_routes
    from headroom.llm.kv_cache import CachedBlocks
    from headroom.llm.prefix_blocks import prefix_blocks_route

    routes: list[BaseRoute] = []
    servings = {}
    services = []
    for entry in entries:
        service = build_llm_service(entry.config, registry, lifecycle)
        services.append(service)
        lifecycle.add_readiness_check(service)
        lifecycle.add_liveness_check(service)
        service.serving.observer = dataplane.generative.add(entry.config, service)
        routes.extend(openai_routes(service.serving))
        servings[entry.config.name] = service.serving
    generate = GenerateRoutes(servings, lambda name: bool(dataplane.loaded_versions(name)))

    def cached_blocks() -> dict[str, tuple[int, CachedBlocks]]:
        return {s.name: cb for s in services if (cb := s.cached_blocks()) is not None}

    # without API keys every request runs as the anonymous tenant (or, trusting a router, the tenant it names)
    tenant = None if gateway.auth_enabled else gateway.anonymous_tenant
    forwarded = gateway.trust_tenant_header and not gateway.auth_enabled
    routes.extend([*generate.routes(), prefix_blocks_route(cached_blocks, tenant, forwarded)])
    return LLMWiring(tuple(services), tuple(routes), ModelCards(list(servings.values())), GrpcGenerate(generate))


__all__ = ["LLMWiring", "ModelCards", "wire_llms"]
