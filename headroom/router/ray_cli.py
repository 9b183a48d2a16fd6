"""`headroom route-ray`: the router in front of N replicas placed as Ray actors (a Ray cluster or a local one).

Not wired into `headroom.cli.main` by this module (that file belongs to the CLI owner); wire it with
``app.command("route-ray")(headroom.router.ray_cli.route_ray)``. Ray is imported only when it runs.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import typer
import uvicorn
from prometheus_client import CollectorRegistry
from rich.console import Console

from headroom.autoscaler.controller import AutoscalerController, router_sampler
from headroom.autoscaler.policy import AutoscalerConfig
from headroom.core.clock import MonotonicClock
from headroom.router.policies import POLICIES
from headroom.router.proxy import ProxyConfig, Router
from headroom.router.ray_replicas import (
    RayClusterConfig,
    RayCommandFactory,
    RayReplicaConfig,
    RayReplicaManager,
    connect_ray,
    ray_serve_command,
    shutdown_ray,
)


async def run_ray_cluster(command: RayCommandFactory, replicas: int, proxy: ProxyConfig,
                          manager_cfg: RayReplicaConfig, host: str, port: int,
                          autoscale: AutoscalerConfig | None = None, console: Console | None = None,
                          stop: asyncio.Event | None = None) -> RayReplicaManager:
    """Serve the router on host:port until SIGINT/SIGTERM or `stop`, then drain every replica. Ray must be
    connected (`connect_ray`) before the event loop starts."""
    console = console or Console(stderr=True)
    router = Router([], proxy)
    manager = RayReplicaManager(command, manager_cfg, on_change=router.set_upstreams)
    server = uvicorn.Server(uvicorn.Config(router.app, host=host, port=port, log_level="warning", lifespan="on"))
    tasks: list[asyncio.Task[None]] = []

    async def bring_up() -> None:
        with console.status(f"placing {replicas} replica actor(s) (each loads and warms its models)..."):
            await manager.scale_to(replicas, autoscale.warm_pool if autoscale else 0)
        for cs in manager.cold_starts:
            console.print(f"  {cs.replica_id} on node {cs.node_ip}: actor {cs.scheduled_s:.2f} s, process "
                          f"{cs.spawn_s:.2f} s, listening {cs.listening_s:.2f} s, ready {cs.ready_s:.2f} s")
        console.print(f"[bold green]router ready[/] on http://{host}:{port} — {len(manager.serving())} Ray "
                      f"replica(s), policy {proxy.policy}; stats at /router/stats")
        if autoscale is not None:
            ctl = AutoscalerController(router_sampler(router), manager, autoscale, MonotonicClock(),
                                       initial_replicas=replicas, registry=CollectorRegistry())
            tasks.append(asyncio.create_task(ctl.run(), name="autoscaler"))

    async def stop_when_told(event: asyncio.Event) -> None:
        await event.wait()
        server.should_exit = True

    tasks.append(asyncio.create_task(bring_up(), name="ray-replica-bring-up"))
    if stop is not None:
        tasks.append(asyncio.create_task(stop_when_told(stop), name="stop-watcher"))
    try:
        await server.serve()
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        with console.status("draining replicas..."):
            await manager.close()
    return manager


def route_ray(
    replicas: int = typer.Option(2, min=1, help="Replica actors to place (each runs one `headroom serve`)."),
    ray_address: str = typer.Option("", help="Existing Ray cluster: 'auto', HOST:6379 or ray://HOST:10001. "
                                             "Empty = start a local cluster on 127.0.0.1 for this run."),
    ray_num_cpus: int = typer.Option(2, min=1, help="CPUs of the local cluster (ignored with --ray-address)."),
    actor_num_cpus: float = typer.Option(0.5, min=0.0, help="CPUs each replica actor reserves in Ray's "
                                                            "scheduler (0.5 fits two replicas per 1 core)."),
    replica_host: str = typer.Option("", help="Address replicas bind and the router dials. Empty = each "
                                              "node's IP as Ray reports it (127.0.0.1 on a local cluster)."),
    policy: str = typer.Option("peak_ewma", help=f"Routing policy: {', '.join(POLICIES)}."),
    host: str = typer.Option("127.0.0.1", help="Address the router binds (loopback by default)."),
    port: int = typer.Option(8000, help="Router HTTP port (KServe V2 + OpenAI, proxied)."),
    model_repository: Path = typer.Option(Path("models"), help="Directory of <model>/config.yaml + <version>/; "
                                                               "must exist at this path on every Ray node."),
    model: list[str] = typer.Option([], "--model", help="Serve only this model directory (repeatable)."),
    replica_capacity: int = typer.Option(8, help="Concurrent requests one replica serves within its SLO."),
    autoscale: bool = typer.Option(False, help="Scale replicas on utilisation (up > 75%, down < 25%)."),
    min_replicas: int = typer.Option(1, help="Autoscaling floor."),
    max_replicas: int = typer.Option(4, help="Autoscaling ceiling (bounded by the cluster's CPUs / actor CPUs)."),
    drain_timeout_s: float = typer.Option(30.0, help="How long a replica may finish in-flight work on SIGTERM."),
) -> None:
    """Run the router in front of replicas placed as Ray actors: each actor starts one `headroom serve` on its
    node; the router routes, health-checks, retries and sheds as with local replicas."""
    err = Console(stderr=True)
    if policy not in POLICIES:
        err.print(f"[bold red]error:[/] unknown policy {policy!r}; use one of {', '.join(POLICIES)}")
        raise typer.Exit(code=2)
    try:
        scaler = AutoscalerConfig(min_replicas=min_replicas, max_replicas=max_replicas) if autoscale else None
    except ValueError as exc:
        err.print(f"[bold red]error:[/] {exc}")
        raise typer.Exit(code=2) from None
    try:
        with err.status("connecting to Ray..." if ray_address else "starting a local Ray cluster..."):
            connect_ray(RayClusterConfig(address=ray_address or None, num_cpus=ray_num_cpus))
    except (RuntimeError, ConnectionError) as exc:
        err.print(f"[bold red]error:[/] {exc}")
        raise typer.Exit(code=1) from None
    manager_cfg = RayReplicaConfig(host=replica_host or None, capacity=replica_capacity,
                                   actor_num_cpus=actor_num_cpus, drain_timeout_s=drain_timeout_s + 5.0)
    try:
        asyncio.run(run_ray_cluster(ray_serve_command(model_repository.resolve(), model, drain_timeout_s),
                                    replicas, ProxyConfig(policy=policy), manager_cfg, host, port, scaler))
    finally:
        shutdown_ray()
