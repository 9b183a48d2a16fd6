"""The composition root: builds the object graph for `headroom serve` and runs it.

    ServerConfig ─► Server.run()
        registry, clock, metrics ─► DataPlane ─► HttpApi ─► Starlette app ─► uvicorn (HTTP)
                                        └──────► gRPC servicer ─► grpc.aio server
        ModelRepository.scan() ─► load tensor models in threads ─► DataPlane.add (ready when all loaded)
                               └► `backend: llm` entries ─► headroom.llm service ─► OpenAI routes

HTTP and gRPC come up first (liveness answers while models load; readiness is 503 until every model is
loaded and warmed). Tensor and LLM requests share one `ServingLifecycle` (headroom.core.lifecycle):
SIGTERM/SIGINT stops admitting both (503 + `x-headroom-draining: 1`), reports not-ready at once, lets
in-flight requests and streams finish (bounded by `drain_timeout_s`), then stops the transports, the
engines and the batchers, and `run()` returns with `exit_code` 0. If a background loop dies (an LLM engine's
step loop, a batcher's loop), liveness turns false, the other models drain the same way, and `exit_code`
is 1, so that a supervisor restarts the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import uvicorn
from prometheus_client import CollectorRegistry
from starlette.routing import BaseRoute

from headroom.core.clock import MonotonicClock
from headroom.core.errors import ModelNotFound
from headroom.core.lifecycle import ServingLifecycle
from headroom.dashboard.routes import dashboard_routes
from headroom.gateway.app import GatewaySetup, wrap_app
from headroom.gateway.grpc_auth import GatewayInterceptor
from headroom.gateway.ratelimit import RateLimiter
from headroom.gateway.slow_headers import header_deadline_protocol
from headroom.gateway.tls import TlsConfig, grpc_server_credentials, uvicorn_ssl_kwargs
from headroom.lifecycle.cascade_metrics import CascadeCollector
from headroom.lifecycle.drift_feed import DriftFeed, DriftFeedConfig
from headroom.lifecycle.offline import PredictionStore
from headroom.lifecycle.residency import ResidencyConfig
from headroom.models.repository import ModelRepository, RepositoryIndex
from headroom.models.trust import DEFAULT_TRUSTED
from headroom.server.dataplane import DataPlane
from headroom.server.early_refusal import EarlyRefusalMiddleware
from headroom.server.gc_monitor import GcMonitor
from headroom.server.grpc_admin import TritonAdminServicer
from headroom.server.http_app import HttpApi, HttpLimits, build_http_app
from headroom.server.llm_wiring import llm_fleet
from headroom.server.metrics import ServerMetrics
from headroom.server.model_manager import ModelManager, served_version
from headroom.server.repository_poll import RepositoryPoller
from headroom.server.tied import TiedNotifier, TiedStartMiddleware
from headroom.server.triton_settings import TritonSettings

log = logging.getLogger("headroom.server")


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """Everything `headroom serve` is told."""

    model_repository: Path = Path("models")  # directory of <model>/config.yaml + versions
    host: str = "127.0.0.1"  # bind address for HTTP and gRPC
    http_port: int = 8000  # HTTP port (0 = pick a free one)
    grpc_port: int = 8001  # gRPC port (0 = pick a free one; -1 = no gRPC)
    models: tuple[str, ...] | None = None  # serve only these model directories (None = all)
    limits: HttpLimits = field(default_factory=HttpLimits)  # HTTP input limits
    drain_timeout_s: float = 30.0  # how long SIGTERM waits for in-flight requests
    log_level: str = "info"  # logging level for headroom's loggers
    gateway: GatewaySetup = field(default_factory=GatewaySetup)  # auth, rate limits, input limits, CORS
    tls: TlsConfig | None = None  # certificate + key: HTTPS and gRPC over TLS
    trace_spans_file: Path | None = None  # write OpenTelemetry spans here as JSON lines
    precomputed: Path | None = None  # SQLite store from `headroom batch`: answer from it before the model
    model_memory_budget_bytes: int = 0  # > 0: load models on demand under this budget, evict LRU (0 = load all)
    drift: DriftFeedConfig = field(default_factory=DriftFeedConfig)  # input-drift sampling and PSI threshold
    model_control_mode: str = "none"  # Triton's: none | explicit (load/unload API open) | poll (watch the repo)
    load_models: tuple[str, ...] = ("*",)  # explicit mode: the models loaded at start ("*" = all)
    repository_poll_s: float = 15.0  # poll mode: seconds between repository scans
    trusted_backends: frozenset[str] = DEFAULT_TRUSTED  # model code it may load (headroom.models.trust)
    freeze_gc_at_ready: bool = True  # gc.freeze() once the models are loaded: full collections then skip the
    #   start-up heap (each paused the process 190-270 ms, about once a minute under load; server/gc_monitor.py)


class _UvicornServer(uvicorn.Server):
    """uvicorn without its own signal handlers: the Server below owns SIGTERM/SIGINT (drain first)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class Server:
    """One headroom process: transports, data plane, models. `await run()` until stopped."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.registry = CollectorRegistry()
        self.metrics = ServerMetrics(self.registry)
        self.clock = MonotonicClock()
        store = PredictionStore(config.precomputed) if config.precomputed is not None else None
        self.lifecycle = ServingLifecycle()  # admission, drain and health of every request, tensor and LLM
        self.lifecycle.on_fatal(self._on_fatal)
        self.dataplane = DataPlane(self.metrics, self.clock, precomputed=store, lifecycle=self.lifecycle)
        self.drift = DriftFeed(config.drift, self.registry)
        self.registry.register(CascadeCollector(self._served_models))
        self.gc_monitor = GcMonitor(self.registry)
        self.tied = TiedNotifier()  # tied copies tell `headroom route --tied` when they start executing
        gateway = config.gateway.config  # without API keys every request runs as its anonymous tenant
        self.llm = llm_fleet(self.registry, self.lifecycle, self.dataplane, gateway)
        self._llm_grpc: Any = None  # the LLMs on gRPC ModelInfer / ModelStreamInfer (the fleet, once routed)
        self._llm_start: set[str] = set()  # the LLMs loaded at start (explicit mode: --load-model)
        self._stop = asyncio.Event()
        self._http: _UvicornServer | None = None
        self._grpc: Any = None
        self._load_task: asyncio.Task[None] | None = None
        self._poll_task: asyncio.Task[None] | None = None
        self.http_port: int = config.http_port
        self.grpc_port: int = config.grpc_port
        self.load_error: BaseException | None = None
        self.exit_code = 0  # 1 once a background loop died: the process must be restarted

    # -- wiring ------------------------------------------------------------------------------------------
    def _llm_routes(self, index_llm: tuple[Any, ...]) -> tuple[list[BaseRoute], Iterable[object]]:
        """The LLM routes (server/llm_front.py): with an LLM at start, or in a mode that can add one later."""
        if not index_llm and self.config.model_control_mode == "none":
            return [], []  # no LLM, and none can come: the LLM modules (torch) are never imported
        for entry in index_llm:
            self.llm.build(entry.config)
        self._llm_grpc = self.llm
        return self.llm.routes(), self.llm.cards()

    async def run(self, on_ready: Callable[[Server], None] | None = None) -> None:
        """Start everything, serve until SIGTERM/SIGINT or `stop()`, then drain and shut down."""
        self.gc_monitor.install()
        repo = ModelRepository(self.config.model_repository, self.config.trusted_backends)
        index = repo.scan(self.config.models)
        all_llm = index.llm_models  # explicit mode: every LLM gets its routes; those not loaded start unloaded
        manager = ModelManager(repo, self.dataplane, self.config.model_control_mode, self.config.models,
                               add_llm=self.llm.add)
        if self.config.model_control_mode == "explicit" and "*" not in self.config.load_models:
            unknown = set(self.config.load_models) - {e.name for e in (*index.models, *index.llm_models)}
            if unknown:
                raise ValueError(f"--load-model: no model directory named {sorted(unknown)} in {repo.root}")
            index = RepositoryIndex(tuple(e for e in index.models if e.name in self.config.load_models),
                                    tuple(e for e in index.llm_models if e.name in self.config.load_models))
        expected = [e.name for e in index.models]
        if self.config.model_memory_budget_bytes > 0:
            residency = manager.enable_budget(index, ResidencyConfig(self.config.model_memory_budget_bytes),
                                              self.clock, self.registry)
            expected = sorted(residency.pinned)  # always resident; the rest of the initial set: ready() below
            self.lifecycle.add_readiness_check(residency)
        self.dataplane.attach_lifecycle(manager.residency, self.drift)
        self.dataplane.expect(expected)
        llm_routes, cards = self._llm_routes(all_llm)
        self._llm_start = {e.name for e in index.llm_models}
        api = HttpApi(self.dataplane, self.registry, self.config.limits, cards, manager,
                      TritonSettings(self.config.trace_spans_file))
        gw = self.config.gateway
        self.limiter = RateLimiter(gw.config.rate_limits, gw.config.tenant_rate_limits)
        provider = None
        if self.config.trace_spans_file:  # opentelemetry's SDK only when spans are exported (cold start)
            from headroom.gateway.span_export import file_tracer_provider

            provider = file_tracer_provider(self.config.trace_spans_file)
        dashboard = dashboard_routes(registry=self.registry, clock=self.clock)
        # One access line per request: the data plane writes it (HTTP and gRPC alike); the gateway's own line
        # stays for what the data plane never sees (LLM routes: llm_access_log; its refusals: gateway/access.py).
        quiet = replace(gw, config=replace(gw.config, access_log=False))
        tied = TiedStartMiddleware(build_http_app(api, [*llm_routes, *dashboard]), self.tied)
        http_app = EarlyRefusalMiddleware(tied, api.refuse_early, self.clock.now_s)  # 503s in front of Starlette
        app = wrap_app(http_app, quiet, self.clock, provider, self.registry, self.limiter)
        headers_timeout_s = gw.config.limits.headers_timeout_s
        protocol = header_deadline_protocol(headers_timeout_s) if headers_timeout_s > 0 else "auto"
        uv_config = uvicorn.Config(app, host=self.config.host, port=self.config.http_port, log_level="warning",
                                   lifespan="off", access_log=False, timeout_graceful_shutdown=5, http=protocol,
                                   **uvicorn_ssl_kwargs(self.config.tls))
        self._http = _UvicornServer(uv_config)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self.stop)
        http_task = asyncio.create_task(self._http.serve(), name="http-server")
        while not self._http.started:
            if http_task.done():
                await http_task  # surfaces bind errors
                raise RuntimeError(f"HTTP server failed to start on {self.config.host}:{self.config.http_port}")
            await asyncio.sleep(0.01)
        self.http_port = self._http.servers[0].sockets[0].getsockname()[1]
        if self.config.grpc_port >= 0:
            from headroom.protocol.grpc_service import bind_grpc_server

            interceptor = GatewayInterceptor(gw.keys, self.limiter if self.limiter.enabled else None, self.clock)
            creds = grpc_server_credentials(self.config.tls) if self.config.tls is not None else None
            self._grpc, self.grpc_port = await bind_grpc_server(
                self.dataplane, self.config.host, self.config.grpc_port, labels=self.dataplane.labels,
                interceptors=[interceptor], credentials=creds,
                admin=[TritonAdminServicer(api.triton)], configs=self.dataplane.config_of,
                generative=self._llm_grpc)
        self._load_task = asyncio.create_task(self._load(repo, index, manager, on_ready), name="model-loader")
        try:
            await self._stop.wait()
        finally:
            await self._shutdown(http_task)

    async def _load(self, repo: ModelRepository, index: Any, manager: ModelManager,
                    on_ready: Callable[[Server], None] | None) -> None:
        try:
            for service in list(self.llm.services):
                if service.config.name in self._llm_start:
                    await service.start()
                else:  # explicit mode, not in --load-model: served once loaded through the repository API
                    service.serving.unloaded = True
            if manager.residency is not None:  # memory budget: pinned first, then others while they fit
                await manager.residency.start()
            else:
                for loaded in await repo.load_async(index):
                    self.dataplane.add(served_version(loaded))
        except Exception as exc:  # a model that cannot load: keep serving health, report it, never ready
            self.load_error = exc
            log.error("model loading failed: %s", exc)
            return
        log.info("ready: models %s", ", ".join(self.dataplane.model_names()))
        if self.config.model_control_mode == "poll":
            poller = RepositoryPoller(repo.root, manager, self.config.repository_poll_s, names=self.config.models)
            self._poll_task = asyncio.create_task(poller.run(), name="repository-poll")
        if self.config.freeze_gc_at_ready:
            self.gc_monitor.freeze_heap()
        if on_ready is not None:
            on_ready(self)

    def _served_models(self) -> list[tuple[str, str, Any]]:
        """(name, version, model) of every served tensor model version (for scrape-time collectors)."""
        dp, out = self.dataplane, []
        for name in dp.model_names():
            for version in dp.loaded_versions(name):
                with contextlib.suppress(ModelNotFound):  # unloaded between the listing and the lookup
                    out.append((name, version, dp.served(name, version).model))
        return out

    def llm_model_names(self) -> list[str]:
        """Names of the generative models served by the LLM engine."""
        return [str(card["id"]) for s in self.llm.services for card in s.serving.model_cards()]

    def stop(self) -> None:
        """Begin a graceful shutdown (safe to call from a signal handler)."""
        self.lifecycle.start_draining()
        self._stop.set()

    def _on_fatal(self, component: str, exc: BaseException) -> None:
        """A background loop died (the lifecycle logged its traceback): drain the rest and exit non-zero."""
        self.exit_code = 1
        self.stop()

    async def _shutdown(self, http_task: asyncio.Task[None]) -> None:
        if not await self.lifecycle.wait_idle(self.config.drain_timeout_s):
            log.warning("drain timeout: %d requests still in flight after %.1f s", self.lifecycle.inflight,
                        self.config.drain_timeout_s)
        for task in (self._load_task, self._poll_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self._grpc is not None:
            from headroom.protocol.grpc_service import stop_grpc_server

            await stop_grpc_server(self._grpc, 1.0)
        if self._http is not None:
            self._http.should_exit = True
            with contextlib.suppress(asyncio.CancelledError):
                await http_task
        for service in list(self.llm.services):
            await service.stop()
        await self.dataplane.stop()
        await self.tied.close()
        self.drift.close()
        self.gc_monitor.uninstall()
        log.info("stopped")
