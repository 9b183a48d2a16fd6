"""A real server behind the gateway for end-to-end tests: `python -m tests.gateway.gateway_server CFG.json`.

It composes the same pieces as `headroom.server.app.Server` (DataPlane → HttpApi → build_http_app) and puts
`headroom.gateway.app.wrap_app` in front, plus two test routes: `/test/stream` (SSE) and `/admin/ping`.
Spans go to `spans_file` as JSON lines (`headroom.gateway.span_export`); logs are headroom's JSON logs on
stderr, at debug level.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import uvicorn
from prometheus_client import CollectorRegistry
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from headroom.core.clock import MonotonicClock
from headroom.gateway.app import CorsConfig, GatewaySetup, wrap_app
from headroom.gateway.auth import KeyStore
from headroom.gateway.context import install_log_context
from headroom.gateway.limits import InputLimits
from headroom.gateway.middleware import GatewayConfig
from headroom.gateway.ratelimit import RateLimitConfig
from headroom.gateway.span_export import file_tracer_provider
from headroom.gateway.tls import TlsConfig, uvicorn_ssl_kwargs
from headroom.models.repository import ModelRepository
from headroom.server.dataplane import DataPlane, ServedVersion
from headroom.server.http_app import HttpApi, HttpLimits, build_http_app
from headroom.server.logging import configure_logging
from headroom.server.metrics import ServerMetrics
from headroom.server.model_manager import ModelManager


async def stream(request: Request) -> Response:
    async def events() -> AsyncIterator[bytes]:
        for i in range(3):
            yield f"data: {i}\n\n".encode()
            await asyncio.sleep(0.01)
        yield b"data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


async def admin_ping(request: Request) -> Response:
    return JSONResponse({"pong": True, "tenant": request.state.tenant})


async def main(cfg: dict[str, Any]) -> None:
    configure_logging("debug", access_log=True)
    install_log_context()
    repo = ModelRepository(Path(cfg["repo"]))
    index = repo.scan(None)
    registry = CollectorRegistry()
    dataplane = DataPlane(ServerMetrics(registry), MonotonicClock())
    dataplane.expect([e.name for e in index.models])
    api = HttpApi(dataplane, registry, HttpLimits(), (), ModelManager(repo, dataplane, "explicit"))
    app = build_http_app(
        api,
        [Route("/test/stream", stream, methods=["GET"]), Route("/admin/ping", admin_ping, methods=["GET"])],
    )
    for loaded in await repo.load_async(index):
        dataplane.add(
            ServedVersion(
                name=loaded.name,
                version=loaded.version,
                config=loaded.config,
                model=loaded.model,
                cold_start=loaded.cold_start,
            )
        )
    rate = cfg.get("rate", {})
    overrides = {t: RateLimitConfig.of(**r) for t, r in cfg.get("tenant_rates", {}).items()}
    gateway = GatewayConfig(
        auth_enabled=bool(cfg.get("keys_file")),
        limits=InputLimits(**cfg.get("limits", {})),
        rate_limits=RateLimitConfig.of(**rate),
        tenant_rate_limits=overrides,
    )
    keys = KeyStore.from_file(Path(cfg["keys_file"])) if cfg.get("keys_file") else None
    provider = None
    if cfg.get("spans_file"):
        provider = file_tracer_provider(Path(cfg["spans_file"]))
    setup = GatewaySetup(gateway, keys, CorsConfig(allow_origins=tuple(cfg.get("cors_origins", ()))))
    tls = TlsConfig(Path(cfg["tls"]["cert"]), Path(cfg["tls"]["key"])) if cfg.get("tls") else None
    config = uvicorn.Config(
        wrap_app(app, setup, tracer_provider=provider, registry=registry),
        host="127.0.0.1",
        port=cfg["port"],
        log_level="warning",
        lifespan="off",
        access_log=False,
        **uvicorn_ssl_kwargs(tls),
    )
    print(orjson.dumps({"ready": True, "port": cfg["port"]}).decode(), file=sys.stderr, flush=True)
    try:
        await uvicorn.Server(config).serve()
    finally:
        await dataplane.stop()


if __name__ == "__main__":
    asyncio.run(main(json.loads(Path(sys.argv[1]).read_text())))
