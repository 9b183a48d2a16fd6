"""`headroom route`: a router in front of N local `headroom serve` replicas (optionally autoscaled).

Not wired into `headroom.cli.main` by this module (that file belongs to the CLI owner); wire it with
``app.command("route")(headroom.router.cli.route)``, or call `run_cluster` from `headroom serve --replicas N`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path

import typer
import uvicorn
from prometheus_client import CollectorRegistry
from rich.console import Console

from headroom.autoscaler.controller import AutoscalerController, router_sampler
from headroom.autoscaler.policy import AutoscalerConfig
from headroom.core.clock import MonotonicClock
from headroom.router.grpc_proxy import GrpcProxy
from headroom.router.policies import POLICIES
from headroom.router.proxy import ProxyConfig, Router
from headroom.router.replicas import CommandFactory, LocalReplicaManager, ReplicaManagerConfig


def serve_command(model_repository: Path, models: Sequence[str], drain_timeout_s: float) -> CommandFactory:
    """argv for one `headroom serve` replica on the given HTTP and gRPC ports (gRPC -1 = off)."""
    def command(port: int, grpc_port: int) -> Sequence[str]:
        argv = [sys.executable, "-m", "headroom.cli.main", "serve", "--http-port", str(port), "--grpc-port",
                str(grpc_port),
                "--model-repository", str(model_repository), "--drain-timeout-s", str(drain_timeout_s),
                "--no-access-log"]
        for m in models:
            argv += ["--model", m]
        return argv
    return command


async def run_cluster(command: CommandFactory, replicas: int, proxy: ProxyConfig,
                      manager_cfg: ReplicaManagerConfig,
                      host: str, port: int, autoscale: AutoscalerConfig | None = None,
                      console: Console | None = None, stop: asyncio.Event | None = None,
                      grpc_port: int = -1) -> LocalReplicaManager:
    """Serve the router on host:port (and gRPC on `grpc_port` unless -1) until SIGINT/SIGTERM or `stop`,
    then drain every replica."""
    console = console or Console(stderr=True)
    router = Router([], proxy)
    manager_cfg = dataclasses.replace(manager_cfg, grpc=grpc_port >= 0)
    manager = LocalReplicaManager(command, manager_cfg, on_change=router.set_upstreams)
    grpc_proxy = GrpcProxy(router) if grpc_port >= 0 else None
    server = uvicorn.Server(uvicorn.Config(router.app, host=host, port=port, log_level="warning", lifespan="on"))
    tasks: list[asyncio.Task[None]] = []

    async def bring_up() -> None:
        with console.status(f"starting {replicas} replica(s) (each loads and warms its models)..."):
            await manager.scale_to(replicas, autoscale.warm_pool if autoscale else 0)
        for cs in manager.cold_starts:
            console.print(f"  {cs.replica_id}: process {cs.spawn_s:.2f} s, listening {cs.listening_s:.2f} s, "
                          f"ready {cs.ready_s:.2f} s")
        console.print(f"[bold green]router ready[/] on http://{host}:{port} — {len(manager.serving())} "
                      f"replica(s), policy {proxy.policy}; stats at /router/stats")
        if autoscale is not None:
            ctl = AutoscalerController(router_sampler(router), manager, autoscale, MonotonicClock(),
                                       initial_replicas=replicas, registry=CollectorRegistry())
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
            await manager.close()
    return manager


def route(
    replicas: int = typer.Option(2, min=1, help="Replica processes to start (each a full `headroom serve`)."),
    policy: str = typer.Option("peak_ewma", help=f"Routing policy: {', '.join(POLICIES)}."),
    host: str = typer.Option("127.0.0.1", help="Address the router binds (loopback by default)."),
    port: int = typer.Option(8000, help="Router HTTP port (KServe V2 + OpenAI, proxied)."),
    grpc_port: int = typer.Option(8001, help="Router gRPC port (inference.GRPCInferenceService); -1 = off."),
    model_repository: Path = typer.Option(Path("models"), help="Directory of <model>/config.yaml + <version>/."),
    model: list[str] = typer.Option([], "--model", help="Serve only this model directory (repeatable)."),
    replica_capacity: int = typer.Option(8, help="Concurrent requests one replica serves within its SLO; the "
                                                 "router sheds (503 + Retry-After) as the fleet nears this."),
    hedging: bool = typer.Option(False, help="Send a budgeted backup request after the p95 latency."),
    shedding: bool = typer.Option(True, help="Coordinated load shedding at the router."),
    autoscale: bool = typer.Option(False, help="Scale replicas on utilisation (up > 75%, down < 25%)."),
    min_replicas: int = typer.Option(1, help="Autoscaling floor."),
    max_replicas: int = typer.Option(4, help="Autoscaling ceiling (this machine has few cores: keep it small)."),
    warm_pool: int = typer.Option(0, help="Started-but-idle replicas kept ready when autoscaling."),
    drain_timeout_s: float = typer.Option(30.0, help="How long a replica may finish in-flight work on SIGTERM."),
) -> None:
    """Run a router in front of N replica processes: routing policies, health checks and outlier ejection,
    retries of never-started requests under a budget, optional hedging, load shedding and autoscaling."""
    if policy not in POLICIES:
        Console(stderr=True).print(f"[bold red]error:[/] unknown policy {policy!r}; use one of {', '.join(POLICIES)}")
        raise typer.Exit(code=2)
    try:
        scaler = AutoscalerConfig(min_replicas=min_replicas, max_replicas=max_replicas,
                                  warm_pool=warm_pool) if autoscale else None
    except ValueError as exc:
        Console(stderr=True).print(f"[bold red]error:[/] {exc}")
        raise typer.Exit(code=2) from None
    proxy = ProxyConfig(policy=policy, hedging=hedging, shedding=shedding)
    manager_cfg = ReplicaManagerConfig(host="127.0.0.1", capacity=replica_capacity,
                                       drain_timeout_s=drain_timeout_s + 5.0)
    asyncio.run(run_cluster(serve_command(model_repository, model, drain_timeout_s), replicas, proxy, manager_cfg,
                            host, port, scaler, grpc_port=grpc_port))
