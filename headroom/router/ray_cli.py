"""Deprecated `headroom route-ray`: use `headroom route --backend ray` (same flags, plus `--placement`,
`--actor-resource` and the gRPC port). Kept so existing scripts keep working; it prints a notice and runs
`headroom.router.cli.route` with the Ray backend. `run_ray_cluster` is `run_fleet` with Ray-actor replicas.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import typer
from rich.console import Console

from headroom.autoscaler.policy import AutoscalerConfig
from headroom.router.cli import route, run_fleet
from headroom.router.policies import POLICIES
from headroom.router.proxy import ProxyConfig
from headroom.router.ray_cluster import RayCommandFactory
from headroom.router.ray_replicas import RayReplicaConfig, RayReplicaManager
from headroom.router.replicas import ReplicaFleet
from headroom.router.upstream import Upstream


async def run_ray_cluster(command: RayCommandFactory, replicas: int, proxy: ProxyConfig,
                          manager_cfg: RayReplicaConfig, host: str, port: int,
                          autoscale: AutoscalerConfig | None = None, console: Console | None = None,
                          stop: asyncio.Event | None = None, grpc_port: int = -1) -> RayReplicaManager:
    """`run_fleet` with Ray-actor replicas. Ray must be connected (`connect_ray`) before the loop starts."""
    managers: list[RayReplicaManager] = []

    def make(on_change: Callable[[tuple[Upstream, ...]], None]) -> ReplicaFleet:
        managers.append(RayReplicaManager(command, manager_cfg, on_change=on_change))
        return managers[0]

    await run_fleet(make, replicas, proxy, host, port, autoscale, console, stop, grpc_port)
    return managers[0]


def route_ray(
    ctx: typer.Context,
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
    """DEPRECATED: use `headroom route --backend ray` (same flags). Runs the router in front of replicas
    placed as Ray actors (gRPC off, as before)."""
    Console(stderr=True).print("[yellow]`headroom route-ray` is deprecated: use `headroom route --backend ray` "
                               "(same flags).[/]")
    route(ctx, config=None, print_config=False, replicas=replicas, discover="none", k8s_service="",
          k8s_namespace="", k8s_api="", backend="ray", policy=policy, host=host,
          port=port, grpc_port=-1,
          model_repository=model_repository, model=model, replica_capacity=replica_capacity, hedging=False, tied=False,
          shedding=True, autoscale=autoscale, min_replicas=min_replicas, max_replicas=max_replicas, warm_pool=0,
          drain_timeout_s=drain_timeout_s, ray_address=ray_address, ray_num_cpus=ray_num_cpus,
          actor_num_cpus=actor_num_cpus, actor_resource=[], placement="spread", replica_host=replica_host,
          trusted_backends="onnxruntime,torch,llm")
