"""The LLMs of a repository wired to one server's registry, lifecycle and data plane: their engines (not started),
the OpenAI and V2 generate routes, `/v2/llm/prefix_blocks`, the `/v1/models` cards and the gRPC generate service.

`headroom serve`'s composition root (`headroom.server.app.Server`, which keeps the `LLMFleet` to add LLMs later)
and a Ray Serve LLM replica (`headroom.ray_serve.llm_replica`) both build their LLM side on `LLMFleet`, so a
request meets the same routes either way.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry
from starlette.routing import BaseRoute

from headroom.core.lifecycle import ServingLifecycle
from headroom.gateway.middleware import GatewayConfig
from headroom.server.dataplane import DataPlane
from headroom.server.llm_front import LLMFleet


@dataclass(frozen=True, slots=True)
class LLMWiring:
    """What `wire_llms` built; the caller starts (and stops) the services."""

    services: tuple[Any, ...]  # headroom.llm.factory.LLMService, one per LLM, not started
    routes: tuple[BaseRoute, ...]  # OpenAI + generate + prefix blocks
    cards: Iterable[object]  # /v1/models entries, read when listed
    grpc: LLMFleet  # the LLMs on gRPC ModelInfer / ModelStreamInfer


def llm_fleet(registry: CollectorRegistry, lifecycle: ServingLifecycle, dataplane: DataPlane,
              gateway: GatewayConfig) -> LLMFleet:
    """An empty fleet on the server's parts. Without API keys every request runs as the anonymous tenant (or,
    trusting a router, the tenant it names)."""
    return LLMFleet(registry, lifecycle, dataplane.generative, lambda name: bool(dataplane.loaded_versions(name)),
                    None if gateway.auth_enabled else gateway.anonymous_tenant,
                    tenant_header=gateway.trust_tenant_header and not gateway.auth_enabled)


def wire_llms(entries: Sequence[Any], registry: CollectorRegistry, lifecycle: ServingLifecycle,
              dataplane: DataPlane, gateway: GatewayConfig) -> LLMWiring:
    """Wire the repository's `backend: llm` entries (non-empty) to the server's parts."""
    fleet = llm_fleet(registry, lifecycle, dataplane, gateway)
    for entry in entries:
        fleet.build(entry.config)
    return LLMWiring(tuple(fleet.services), tuple(fleet.routes()), fleet.cards(), fleet)


__all__ = ["LLMWiring", "llm_fleet", "wire_llms"]
