"""`headroom deploy ray`: headroom's models as a Ray Serve application.

Without `--run` it prints (or writes) a Serve config file for `serve deploy FILE` / `serve run FILE`; with
`--run` it deploys the application itself, on a local cluster (127.0.0.1) or the one `--ray-address` names, and
serves until Ctrl-C / SIGTERM. `--config router.yaml` reads the file `headroom route --config` and
`headroom deploy k8s --config` read (replicas, capacity, drain time, models, routing policy, the autoscaler
section); flags given on the command line override it.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any

import typer
import yaml

from headroom.gateway.auth import KeyStore
from headroom.models.trust import parse_trusted
from headroom.router.fleet_config import FleetConfig, FleetSpec, apply_flags, given_flags, load_fleet_config
from headroom.router.policies import POLICIES

#: the CLI's defaults of the flags a router.yaml may also set (apply_flags turns `--autoscale` on with them)
_FLEET_DEFAULTS = {"min_replicas": 1, "max_replicas": 4, "warm_pool": 0}
_FLEET = FleetSpec()  # router.yaml's defaults are the flags' defaults


def app_args(fleet: FleetConfig, serve_only: dict[str, Any]) -> dict[str, Any]:
    """The Serve builder's args (headroom.ray_serve.app.AppArgs) for a merged router.yaml + flags."""
    spec = fleet.fleet
    args: dict[str, Any] = {
        "model_repository": str(Path(spec.model_repository).resolve()), "models": list(spec.models),
        "replicas": spec.replicas, "replica_capacity": spec.replica_capacity,
        "drain_timeout_s": spec.drain_timeout_s, "router": fleet.router.policy,
        "affinity_header": fleet.router.affinity_header, **serve_only,
    }
    if fleet.autoscaler is not None:
        from headroom.core.strict_mapping import to_mapping
        args["autoscaler"] = {k: v for k, v in to_mapping(fleet.autoscaler).items() if k != "warm_pool"}
    return args


def deploy_ray(
    ctx: typer.Context,
    config: Path | None = typer.Option(None, "--config", help="router.yaml (the file `headroom route --config` "
                                       "reads): replicas, capacity, drain time, models, routing policy and the "
                                       "autoscaler section come from it; flags given here override it."),
    model_repository: Path = typer.Option(Path("models"), help="Directory of <model>/config.yaml + <version>/; "
                                          "must exist at this (absolute) path on every Ray node."),
    model: list[str] = typer.Option([], "--model", help="Serve only this model directory (repeatable)."),
    replicas: int = typer.Option(_FLEET.replicas, min=1, help="Model replicas (the initial count with "
                                 "--autoscale)."),
    replica_capacity: int = typer.Option(_FLEET.replica_capacity, min=1, help="Requests one replica serves at "
                                         "once (Serve's max_ongoing_requests; the autoscaler's 100%)."),
    drain_timeout_s: float = typer.Option(_FLEET.drain_timeout_s, help="A stopping replica finishes in-flight "
                                          "work this long."),
    policy: str = typer.Option("peak_ewma", help=f"headroom routing policy run as Serve's request router: "
                               f"{', '.join(POLICIES)}."),
    serve_router: bool = typer.Option(False, "--serve-router", help="Use Serve's default router (power of two "
                                      "choices) instead of headroom's policy."),
    autoscale: bool = typer.Option(False, help="Serve autoscaling derived from headroom's autoscaler policy."),
    min_replicas: int = typer.Option(_FLEET_DEFAULTS["min_replicas"], help="Autoscaling floor."),
    max_replicas: int = typer.Option(_FLEET_DEFAULTS["max_replicas"], help="Autoscaling ceiling."),
    multiplex: bool = typer.Option(True, help="Load models on demand per replica (Serve model multiplexing); "
                                   "--no-multiplex: every replica loads every model at start."),
    max_models_per_replica: int = typer.Option(3, min=1, help="Multiplexing: models one replica keeps loaded "
                                               "(least recently used unloaded first)."),
    trusted_backends: str = typer.Option("onnxruntime,torch,llm", help="The model code replicas may load (as "
                                         "`headroom serve --trusted-backends`, docs/SECURITY.md)."),
    replica_num_cpus: float = typer.Option(0.5, min=0.0, help="CPUs each model replica reserves in Ray."),
    ingress_num_cpus: float = typer.Option(0.25, min=0.0, help="CPUs the HTTP ingress replica reserves in Ray."),
    llm_replicas: int = typer.Option(1, min=1, help="LLM replicas (deployed when the models include a "
                                     "`backend: llm` one: the OpenAI and generate routes)."),
    llm_num_cpus: float = typer.Option(1.0, min=0.0, help="CPUs each LLM replica reserves in Ray."),
    api_keys_file: Path | None = typer.Option(None, help="Require API keys as `headroom serve --api-keys-file` "
                                              "(a `headroom keys` file, at this absolute path on every node)."),
    llm_min_replicas: int | None = typer.Option(None, min=0, help="With --autoscale (or the file's autoscaler): "
                                                "the LLM deployment's floor (default: the autoscaler's)."),
    llm_max_replicas: int | None = typer.Option(None, min=1, help="With --autoscale (or the file's autoscaler): "
                                                "the LLM deployment's ceiling (default: the autoscaler's)."),
    rate_limit_rps: float = typer.Option(0.0, min=0.0, help="Per-tenant requests per second at the ingress "
                                         "(0 = unlimited); 429 beyond, as `headroom serve`."),
    rate_limit_burst: float = typer.Option(0.0, min=0.0, help="Per-tenant request burst (0 = one second's worth)."),
    llm_tokens_per_s: float = typer.Option(0.0, min=0.0, help="Per-tenant LLM tokens per second at the ingress "
                                           "(0 = unlimited)."),
    llm_token_burst: float = typer.Option(0.0, min=0.0, help="Per-tenant LLM token burst."),
    cors_origin: list[str] = typer.Option([], "--cors-origin", help="Allow this browser origin (repeatable)."),
    host: str = typer.Option("0.0.0.0", help="Address Serve's HTTP proxy binds (127.0.0.1 with --run and no "
                             "--ray-address unless given)."),
    port: int = typer.Option(8000, help="Serve's HTTP port."),
    grpc_port: int = typer.Option(-1, help="Serve's gRPC proxy port, serving KServe V2 gRPC (ModelInfer, "
                                  "health); -1 = no gRPC proxy."),
    name: str = typer.Option("headroom", help="Serve application name."),
    output: Path | None = typer.Option(None, help="Write the Serve config file here instead of stdout."),
    run: bool = typer.Option(False, "--run", help="Deploy it now and serve until Ctrl-C instead of printing a "
                             "config file."),
    ray_address: str = typer.Option("", help="With --run: existing Ray cluster ('auto', HOST:6379). Empty = a "
                                    "local cluster on 127.0.0.1 for this run."),
    ray_num_cpus: int = typer.Option(2, min=1, help="With --run: CPUs of the local cluster."),
) -> None:
    """Run headroom's models as Ray Serve deployments: an HTTP ingress (KServe V2, OpenAI) calling model replicas
    (one headroom data plane each) and LLM replicas (headroom's engine and routes) through DeploymentHandles,
    with headroom's routing policy as Serve's request router, model multiplexing and Serve autoscaling derived
    from headroom's autoscaler policy. Prints a Serve config file (serve deploy FILE) unless --run."""
    from headroom.ray_serve.app import AppArgs, serve_config

    given = given_flags(ctx)
    try:
        fleet = apply_flags(load_fleet_config(config) if config is not None else FleetConfig(), given,
                            _FLEET_DEFAULTS)
        serve_only: dict[str, Any] = {"multiplex": multiplex, "max_models_per_replica": max_models_per_replica,
                                      "replica_num_cpus": replica_num_cpus, "ingress_num_cpus": ingress_num_cpus,
                                      "trusted_backends": sorted(parse_trusted(trusted_backends)),
                                      "llm_replicas": llm_replicas, "llm_num_cpus": llm_num_cpus,
                                      "llm_min_replicas": llm_min_replicas, "llm_max_replicas": llm_max_replicas,
                                      "api_keys_file": str(api_keys_file.resolve()) if api_keys_file else "",
                                      "rate_limit_rps": rate_limit_rps, "rate_limit_burst": rate_limit_burst,
                                      "llm_tokens_per_s": llm_tokens_per_s, "llm_token_burst": llm_token_burst,
                                      "cors_origins": list(cors_origin)}
        args = AppArgs.model_validate(app_args(fleet, serve_only))
        if serve_router:
            args = args.model_copy(update={"router": "serve"})
        rendered = serve_config(args, host, port, name, grpc_port)  # every value checked before anything starts
    except ValueError as exc:  # pydantic's ValidationError and ConfigError are ValueErrors
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from None
    if run:
        try:
            if api_keys_file is not None:  # here, where --run starts the cluster: a missing file fails now
                KeyStore.from_file(api_keys_file)
        except ValueError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(code=2) from None
        try:
            import ray.serve  # noqa: F401  # Serve's extra dependencies are imported with it
        except ModuleNotFoundError as exc:
            typer.echo(f"error: --run needs Ray Serve ({exc.name} is missing): pip install 'headroom[ray]' "
                       "(make serve / make test install it)", err=True)
            raise typer.Exit(code=2) from None
        bind = host if "host" in given or ray_address else "127.0.0.1"
        _run(args, bind, port, grpc_port, name, ray_address, ray_num_cpus)
        return
    text = str(yaml.safe_dump(rendered, sort_keys=False))
    if output is None:
        typer.echo(text, nl=False)
    else:
        output.write_text(text)
        typer.echo(f"wrote a Serve config to {output}; deploy with: serve deploy {output}", err=True)


def _run(args: Any, host: str, port: int, grpc_port: int, name: str, ray_address: str, ray_num_cpus: int) -> None:
    from ray import serve

    from headroom.ray_serve.app import build_app, grpc_options
    from headroom.router.ray_cluster import RayClusterConfig, connect_ray, shutdown_ray

    connect_ray(RayClusterConfig(address=ray_address or None, num_cpus=ray_num_cpus))
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        serve.start(http_options={"host": host, "port": port}, grpc_options=grpc_options(grpc_port))
        serve.run(build_app(args), name=name, route_prefix="/")
        typer.echo(f"headroom on Ray Serve: http://{host}:{port}/v2/models/<model>/infer (Ctrl-C stops)", err=True)
        stop.wait()
    finally:
        serve.delete(name)
        if not ray_address:
            serve.shutdown()  # type: ignore[no-untyped-call]  # untyped in Ray
        shutdown_ray()
