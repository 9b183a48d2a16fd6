"""`headroom route`: a router in front of N `headroom serve` replicas, local processes or Ray actors.

    headroom route --replicas 2 --model digits                        # local processes on this machine
    headroom route --backend ray --replicas 2 --model digits          # Ray actors on a local Ray cluster
    headroom route --backend ray --ray-address auto --placement spread   # join an existing Ray cluster

Both backends are replica managers with the same interface (`headroom.router.replicas.ReplicaFleet`), so the
router, health checks, warm pool, draining and the autoscaler work the same on either.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import grpc
import typer
import uvicorn
from opentelemetry.trace import TracerProvider
from prometheus_client import CollectorRegistry
from rich.console import Console
from starlette.types import ASGIApp

from headroom.autoscaler.actuator import ColdStartTiming
from headroom.autoscaler.controller import AutoscalerController
from headroom.autoscaler.policy import AutoscalerConfig
from headroom.core.clock import MonotonicClock
from headroom.core.strict_mapping import ConfigError
from headroom.core.tied_wire import CALLBACK_PREFIX
from headroom.gateway.app import GatewaySetup, gateway_setup, wrap_app
from headroom.gateway.grpc_auth import GatewayInterceptor
from headroom.gateway.ratelimit import RateLimiter
from headroom.gateway.slow_headers import header_deadline_protocol
from headroom.gateway.span_export import file_tracer_provider
from headroom.models.trust import parse_trusted
from headroom.router.fleet_config import (
    FleetConfig,
    apply_flags,
    dump_fleet_config,
    given_flags,
    load_fleet_config,
)
from headroom.router.grpc_proxy import GrpcProxy
from headroom.router.k8s_discovery import DiscoveryConfig, K8sEndpointsFleet
from headroom.router.load_sample import router_sampler
from headroom.router.policies import POLICIES
from headroom.router.proxy import ProxyConfig, Router
from headroom.router.ray_cluster import RayClusterConfig, connect_ray, ray_serve_command, shutdown_ray
from headroom.router.ray_replicas import RayColdStart, RayReplicaConfig, RayReplicaManager
from headroom.router.replicas import (
    CommandFactory,
    LocalReplicaManager,
    ReplicaFleet,
    ReplicaManagerConfig,
)
from headroom.router.rollout_api import rollout_routes
from headroom.router.rollout_fleet import CanaryFactory, RolloutError, RolloutFleet, RolloutSpec, pinned_repository
from headroom.router.upstream import Upstream

BACKENDS = ("local", "ray")
#: Builds the replica manager once the router exists: on_change -> manager.
FleetFactory = Callable[[Callable[[tuple[Upstream, ...]], None]], ReplicaFleet]


class DrainFirstServer(uvicorn.Server):
    """uvicorn re-raises a captured Ctrl-C / SIGTERM the moment it stops serving, which would interrupt the
    replicas' drain that follows; this one only stops serving (a second Ctrl-C during the drain still aborts)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        original = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)


def serve_command(model_repository: Path, models: Sequence[str], drain_timeout_s: float,
                  extra_args: Sequence[str] = ()) -> CommandFactory:
    """argv for one `headroom serve` replica on the given HTTP and gRPC ports (gRPC -1 = off); `extra_args`
    are passed to every replica (e.g. the memory budget and drift flags of `serve --replicas`)."""
    def command(port: int, grpc_port: int) -> Sequence[str]:
        argv = [sys.executable, "-m", "headroom.cli.main", "serve", "--http-port", str(port), "--grpc-port",
                str(grpc_port),
                "--model-repository", str(model_repository), "--drain-timeout-s", str(drain_timeout_s),
                "--no-access-log", "--trust-tenant-header"]  # on loopback: only the router reaches it
        for m in models:
            argv += ["--model", m]
        return [*argv, *extra_args]
    return command


def describe_cold_start(cs: ColdStartTiming) -> str:
    """One console line per replica start (Ray starts also say where and how long placement took)."""
    where = ""
    if isinstance(cs, RayColdStart):
        where = f" on node {cs.node_ip} ({cs.node_id[:8]}), actor {cs.scheduled_s:.2f} s,"
    return (f"  {cs.replica_id}{where} process {cs.spawn_s:.2f} s, listening {cs.listening_s:.2f} s, "
            f"ready {cs.ready_s:.2f} s")


def gateway_front(router: Router, gateway: GatewaySetup | None, tracer_provider: TracerProvider | None,
                  registry: CollectorRegistry | None,
                  ) -> tuple[ASGIApp, list[grpc.aio.ServerInterceptor], type[asyncio.Protocol] | str]:
    """The router's HTTP app, gRPC interceptors and uvicorn protocol with the gateway in front (API keys,
    tenant buckets, input limits, slow-client deadlines), exactly as `headroom serve` applies it; the router
    is where a fleet's limits must live (per-replica buckets would multiply them by N)."""
    if gateway is None:
        return router.app, [], "auto"
    limiter = RateLimiter(gateway.config.rate_limits, gateway.config.tenant_rate_limits)
    clock = MonotonicClock()
    # replicas' tied-request start notices carry no API key: their random single-use tag is the credential
    cfg = dataclasses.replace(gateway.config, exempt_paths=(*gateway.config.exempt_paths, CALLBACK_PREFIX))
    app = wrap_app(router.app, dataclasses.replace(gateway, config=cfg), clock, tracer_provider, registry, limiter)
    interceptor = GatewayInterceptor(gateway.keys, limiter if limiter.enabled else None, clock)
    timeout_s = gateway.config.limits.headers_timeout_s
    return app, [interceptor], header_deadline_protocol(timeout_s) if timeout_s > 0 else "auto"


async def run_fleet(make_fleet: FleetFactory, replicas: int, proxy: ProxyConfig, host: str, port: int,
                    autoscale: AutoscalerConfig | None = None, console: Console | None = None,
                    stop: asyncio.Event | None = None, grpc_port: int = -1,
                    registry: CollectorRegistry | None = None,
                    tracer_provider: TracerProvider | None = None,
                    gateway: GatewaySetup | None = None,
                    make_canary: CanaryFactory | None = None) -> RolloutFleet:
    """Serve the router on host:port (and gRPC on `grpc_port` unless -1) in front of the fleet `make_fleet`
    builds, until SIGINT/SIGTERM or `stop`; then drain every replica and return the fleet."""
    console = console or Console(stderr=True)
    registry = registry or CollectorRegistry()  # the router's /metrics: its own, the gateway's, the autoscaler's
    router = Router([], proxy, tracer_provider=tracer_provider, registry=registry)
    fleet = RolloutFleet(make_fleet, router, make_canary)  # `headroom rollout` starts new versions through it
    router.app.router.routes[0:0] = rollout_routes(fleet)
    app, interceptors, protocol = gateway_front(router, gateway, tracer_provider, registry)
    grpc_proxy = GrpcProxy(router, interceptors) if grpc_port >= 0 else None
    server = DrainFirstServer(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on",
                                             http=protocol))
    tasks: list[asyncio.Task[None]] = []

    async def bring_up() -> None:
        with console.status(f"starting {replicas} replica(s) (each loads and warms its models)..."):
            await fleet.scale_to(replicas, autoscale.warm_pool if autoscale else 0)
        for cs in fleet.cold_starts:
            console.print(describe_cold_start(cs))
        console.print(f"[bold green]router ready[/] on http://{host}:{port} — {len(fleet.serving())} "
                      f"replica(s), policy {proxy.policy}; stats at /router/stats, Prometheus at /metrics "
                      "(every replica: /metrics/replicas)")
        if autoscale is not None:
            ctl = AutoscalerController(router_sampler(router), fleet, autoscale, MonotonicClock(),
                                       initial_replicas=replicas, registry=registry)
            tasks.append(asyncio.create_task(ctl.run(), name="autoscaler"))

    async def stop_when_told(event: asyncio.Event) -> None:
        await event.wait()
        server.should_exit = True

    if grpc_proxy is not None:
        bound = await grpc_proxy.start(host, grpc_port)
        console.print(f"gRPC (inference.GRPCInferenceService) on {host}:{bound}")
    tasks.append(asyncio.create_task(bring_up(), name="replica-bring-up"))
    if stop is not None:
        tasks.append(asyncio.create_task(stop_when_told(stop), name="stop-watcher"))
    try:
        await server.serve()
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if grpc_proxy is not None:
            await grpc_proxy.close()
        with console.status("draining replicas..."):
            await fleet.close()
        console.print(f"stopped: drained {sum(e.startswith('drained ') for e in fleet.events)} replica(s)")
    return fleet


async def run_cluster(command: CommandFactory, replicas: int, proxy: ProxyConfig,
                      manager_cfg: ReplicaManagerConfig,
                      host: str, port: int, autoscale: AutoscalerConfig | None = None,
                      console: Console | None = None, stop: asyncio.Event | None = None,
                      grpc_port: int = -1,
                      tracer_provider: TracerProvider | None = None,
                      gateway: GatewaySetup | None = None,
                      canary_command: Callable[[RolloutSpec], CommandFactory] | None = None) -> LocalReplicaManager:
    """`run_fleet` with local replica processes."""
    manager_cfg = dataclasses.replace(manager_cfg, grpc=grpc_port >= 0)
    managers: list[LocalReplicaManager] = []

    def make(on_change: Callable[[tuple[Upstream, ...]], None]) -> ReplicaFleet:
        managers.append(LocalReplicaManager(command, manager_cfg, on_change=on_change))
        return managers[0]

    def make_canary(spec: RolloutSpec, on_change: Callable[[tuple[Upstream, ...]], None]) -> ReplicaFleet:
        if canary_command is None:
            raise RolloutError("no command for new-version replicas")
        cfg = dataclasses.replace(manager_cfg, id_prefix=f"{manager_cfg.id_prefix}-v{spec.version}")
        return LocalReplicaManager(canary_command(spec), cfg, on_change=on_change)

    await run_fleet(make, replicas, proxy, host, port, autoscale, console, stop, grpc_port,
                    tracer_provider=tracer_provider, gateway=gateway,
                    make_canary=make_canary if canary_command is not None else None)
    return managers[0]


def _fail(console: Console, message: str, code: int = 2) -> typer.Exit:
    console.print(f"[bold red]error:[/] {message}")
    return typer.Exit(code=code)


def _parse_resources(specs: Sequence[str]) -> tuple[tuple[str, float], ...]:
    out = []
    for spec in specs:
        name, sep, amount = spec.partition("=")
        try:
            value = float(amount) if sep else 1.0
        except ValueError:
            raise ValueError(f"--actor-resource {spec!r}: the amount after '=' must be a number") from None
        if not name:
            raise ValueError(f"--actor-resource {spec!r}: write NAME or NAME=AMOUNT, e.g. llm_node=0.01")
        out.append((name, value))
    return tuple(out)


def route(
    ctx: typer.Context,
    config: Path | None = typer.Option(None, "--config", help="router.yaml: the fleet, every router policy and the "
                                "autoscaler in one validated file (docs/router.md); flags given here override it."),
    print_config: bool = typer.Option(False, "--print-config", help="Print the merged configuration as YAML "
                                      "(the --config format) and exit."),
    replicas: int = typer.Option(2, min=1, help="Replicas to start (each a full `headroom serve`)."),
    discover: str = typer.Option("none", help="'k8s': start no replicas; route to the ready endpoints of the "
                                 "Kubernetes Service --k8s-service (EndpointSlice API; `headroom deploy k8s` "
                                 "renders this router). 'none': the backend starts the replicas."),
    k8s_service: str = typer.Option("", help="With --discover k8s: the replicas' (headless) Service."),
    k8s_namespace: str = typer.Option("", help="With --discover k8s: its namespace (default: the pod's own)."),
    k8s_api: str = typer.Option("", help="With --discover k8s: the API server URL (default: in-cluster)."),
    backend: str = typer.Option("local", help="Where replicas run: 'local' (processes on this machine) or "
                                              "'ray' (one Ray actor per replica, placed on a Ray cluster)."),
    policy: str = typer.Option("peak_ewma", help=f"Routing policy: {', '.join(POLICIES)}."),
    host: str = typer.Option("127.0.0.1", help="Address the router binds (loopback by default)."),
    port: int = typer.Option(8000, help="Router HTTP port (KServe V2 + OpenAI, proxied)."),
    grpc_port: int = typer.Option(8001, help="Router gRPC port (inference.GRPCInferenceService); -1 = off."),
    model_repository: Path = typer.Option(Path("models"), help="Directory of <model>/config.yaml + <version>/ "
                                                               "(with --backend ray: the same path on every node)."),
    model: list[str] = typer.Option([], "--model", help="Serve only this model directory (repeatable)."),
    replica_capacity: int = typer.Option(8, help="Concurrent requests one replica serves within its SLO; the "
                                                 "router sheds (503 + Retry-After) as the fleet nears this."),
    hedging: bool = typer.Option(False, help="Send a budgeted backup request after the p95 latency."),
    tied: bool = typer.Option(False, help="Tail at Scale's tied requests: a second copy ~2 ms later to another "
                              "replica; the copy that starts executing first has its twin cancelled (budget: "
                              "router.yaml's hedge_budget)."),
    shedding: bool = typer.Option(True, help="Coordinated load shedding at the router."),
    autoscale: bool = typer.Option(False, help="Scale replicas on utilisation (up > 75%, down < 25%)."),
    min_replicas: int = typer.Option(1, help="Autoscaling floor."),
    max_replicas: int = typer.Option(4, help="Autoscaling ceiling (local: mind this machine's cores; Ray: the "
                                             "cluster's CPUs / --actor-num-cpus)."),
    warm_pool: int = typer.Option(0, help="Started-but-idle replicas kept ready when autoscaling."),
    drain_timeout_s: float = typer.Option(30.0, help="How long a replica may finish in-flight work on SIGTERM."),
    ray_address: str = typer.Option("", help="Ray: an existing cluster ('auto', HOST:6379 or ray://HOST:10001). "
                                             "Empty = start a local one-node cluster on 127.0.0.1 for this run."),
    ray_num_cpus: int = typer.Option(2, min=1, help="Ray: CPUs of the local cluster (ignored with --ray-address)."),
    actor_num_cpus: float = typer.Option(0.5, min=0.0, help="Ray: CPUs each replica actor reserves in Ray's "
                                                            "scheduler (0.5 fits two replicas per core)."),
    actor_resource: list[str] = typer.Option([], "--actor-resource", help="Ray: a custom resource each replica "
                                             "needs, NAME or NAME=AMOUNT (repeatable), to pin replicas to nodes "
                                             "started with `ray start --resources`."),
    placement: str = typer.Option("spread", help="Ray: 'spread' (replicas on as many nodes as possible), 'pack' "
                                                 "(fill the router's node first) or 'default' (Ray's own)."),
    replica_host: str = typer.Option("", help="Ray: address replicas bind and the router dials. Empty = each "
                                              "node's IP as Ray reports it (127.0.0.1 on a local cluster)."),
    trace_spans_file: Path = typer.Option(None, help="Write the router's OpenTelemetry spans here as JSON lines "
                                                     "(a `router` span per request, parent of the replica's)."),
    api_keys_file: Path = typer.Option(None, help="Turn on API-key auth at the router with this keys file "
                                       "(`headroom keys create`); HTTP and gRPC."),
    rate_limit_rps: float = typer.Option(0.0, help="Per-tenant requests per second for the whole fleet "
                                                   "(0 = unlimited); 429 + Retry-After beyond."),
    rate_limit_burst: float = typer.Option(0.0, help="Per-tenant request burst (0 = one second's worth)."),
    llm_tokens_per_s: float = typer.Option(0.0, help="Per-tenant LLM tokens per second (0 = unlimited; charged "
                                                     "prompt + max_tokens at the router)."),
    llm_token_burst: float = typer.Option(0.0, help="Per-tenant LLM token burst."),
    headers_timeout_s: float = typer.Option(10.0, min=0.0, help="Request line + headers must arrive within this "
                                                                "(slowloris: 408 + close; 0 = no deadline)."),
    trusted_backends: str = typer.Option("onnxruntime,torch,llm", help="Passed to every replica: the model code "
                                         "it may load (see `headroom serve --help`, docs/SECURITY.md)."),
) -> None:
    """Run a router in front of N replicas (local processes or Ray actors): routing policies, health checks
    and outlier ejection, retries of never-started requests under a budget, optional hedging, load shedding,
    a warm pool and autoscaling."""
    err = Console(stderr=True)
    if backend not in BACKENDS:
        raise _fail(err, f"unknown backend {backend!r}; use 'local' or 'ray'")
    if policy not in POLICIES:
        raise _fail(err, f"unknown policy {policy!r}; use one of {', '.join(POLICIES)}")
    flags = given_flags(ctx)
    defaults = {"min_replicas": min_replicas, "max_replicas": max_replicas, "warm_pool": warm_pool}
    try:
        fleet_cfg = apply_flags(load_fleet_config(config) if config else FleetConfig(), flags, defaults)
    except ConfigError as exc:
        raise _fail(err, str(exc)) from None
    if print_config:
        typer.echo(dump_fleet_config(fleet_cfg), nl=False)
        return
    spec, proxy, scaler = fleet_cfg.fleet, fleet_cfg.router, fleet_cfg.autoscaler
    replicas, backend, replica_capacity = spec.replicas, spec.backend, spec.replica_capacity
    drain_timeout_s, model_repository, model = spec.drain_timeout_s, Path(spec.model_repository), list(spec.models)
    if proxy.policy == "cache_aware" and not proxy.prefix_index.tokenizers_from:  # hash prompts with the fleet's
        proxy = dataclasses.replace(proxy, prefix_index=dataclasses.replace(  # own tokenizers
            proxy.prefix_index, tokenizers_from=str(model_repository)))
    try:
        trust = ["--trusted-backends", ",".join(sorted(parse_trusted(trusted_backends)))]
        ray_cfg = RayReplicaConfig(host=replica_host or None, capacity=replica_capacity,
                                   actor_num_cpus=actor_num_cpus, drain_timeout_s=drain_timeout_s + 5.0,
                                   grpc=grpc_port >= 0, placement=placement,
                                   actor_resources=_parse_resources(actor_resource))
    except ValueError as exc:
        raise _fail(err, str(exc)) from None
    try:
        gateway = gateway_setup(api_keys_file, rate_limit_rps=rate_limit_rps, rate_limit_burst=rate_limit_burst,
                                llm_tokens_per_s=llm_tokens_per_s, llm_token_burst=llm_token_burst,
                                headers_timeout_s=headers_timeout_s)
    except ValueError as exc:
        raise _fail(err, str(exc)) from None
    tracer = file_tracer_provider(trace_spans_file) if trace_spans_file is not None else None
    if discover not in ("none", "k8s"):
        raise _fail(err, f"--discover {discover!r}: use 'none' or 'k8s'")
    if discover == "k8s":
        try:
            found = DiscoveryConfig(service=k8s_service, namespace=k8s_namespace, api_url=k8s_api,
                                    capacity=replica_capacity)
        except ValueError as exc:
            raise _fail(err, str(exc)) from None
        asyncio.run(run_fleet(lambda on_change: K8sEndpointsFleet(found, on_change), replicas, proxy, host, port,
                              None, console=err, grpc_port=grpc_port, tracer_provider=tracer, gateway=gateway))
        return
    if backend == "local":
        manager_cfg = ReplicaManagerConfig(host="127.0.0.1", capacity=replica_capacity,
                                           drain_timeout_s=drain_timeout_s + 5.0)
        def canary_command(spec: RolloutSpec) -> CommandFactory:
            pinned = pinned_repository(model_repository.resolve(), spec.model, spec.version,
                                       Path(tempfile.mkdtemp(prefix=f"headroom-{spec.model}-v{spec.version}-")))
            return serve_command(pinned, model, drain_timeout_s, trust)

        asyncio.run(run_cluster(serve_command(model_repository, model, drain_timeout_s, trust), replicas, proxy,
                                manager_cfg, host, port, scaler, grpc_port=grpc_port, tracer_provider=tracer,
                                gateway=gateway, canary_command=canary_command))
        return
    try:
        with err.status("connecting to Ray..." if ray_address else "starting a local Ray cluster..."):
            connect_ray(RayClusterConfig(address=ray_address or None, num_cpus=ray_num_cpus))
    except (RuntimeError, ConnectionError) as exc:
        raise _fail(err, str(exc), code=1) from None
    command = ray_serve_command(model_repository.resolve(), model, drain_timeout_s, trust)
    try:
        def ray_canary(spec: RolloutSpec, on_change: Callable[[tuple[Upstream, ...]], None]) -> ReplicaFleet:
            # the pinned repository links the original: on a multi-node cluster both paths must exist everywhere
            pinned = pinned_repository(model_repository.resolve(), spec.model, spec.version,
                                       Path(tempfile.mkdtemp(prefix=f"headroom-{spec.model}-v{spec.version}-")))
            cfg = dataclasses.replace(ray_cfg, id_prefix=f"{ray_cfg.id_prefix}-v{spec.version}")
            return RayReplicaManager(ray_serve_command(pinned, model, drain_timeout_s, trust), cfg, on_change)

        asyncio.run(run_fleet(lambda on_change: RayReplicaManager(command, ray_cfg, on_change), replicas, proxy,
                              host, port, scaler, console=err, grpc_port=grpc_port, tracer_provider=tracer,
                              gateway=gateway, make_canary=ray_canary))
    finally:
        shutdown_ray()
