"""A headroom application on Ray Serve: `serve run headroom.ray_serve.app:build_app model_repository=models`.

    Serve HTTP proxy ─► headroom-ingress (HttpIngress: V2 decode, 404/413/400 at the edge, retries)
                          └─ DeploymentHandle.options(multiplexed_model_id=<model>).infer.remote(request)
                               └─► headroom-models (ModelReplica: a headroom DataPlane per replica,
                                   models loaded on demand through @serve.multiplexed)

`build_app(args)` is Serve's application builder: `args` (a dict from `serve run k=v ...` or a Serve config
file's `args:`) is validated by `AppArgs` (unknown keys refused) and becomes a `ServeAppSpec`. The model
deployment uses headroom's routing policy as Serve's request router (`router`; "serve" keeps Serve's default)
and a fixed replica count or, with `autoscale`, an `autoscaling_config` derived from headroom's autoscaler
policy (`headroom.ray_serve.autoscaling`); so does the LLM deployment (`llm_replicas`, or the same policy between
`llm_min_replicas` and `llm_max_replicas`). `serve_config(...)` renders the same application as a Serve config
file (`serve deploy` / `serve run config.yaml`), which `headroom deploy ray` prints.
"""

from dataclasses import fields
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from headroom.autoscaler.policy import AutoscalerConfig
from headroom.core.strict_mapping import from_mapping
from headroom.models.repository import ModelRepository
from headroom.models.trust import DEFAULT_TRUSTED
from headroom.ray_serve.autoscaling import serve_autoscaling, with_bounds
from headroom.ray_serve.spec import ROUTER_CLASS_PATH, SERVE_DEFAULT_ROUTER, ServeAppSpec

IMPORT_PATH = "headroom.ray_serve.app:build_app"
INGRESS_DEPLOYMENT = "headroom-ingress"
MODELS_DEPLOYMENT = "headroom-models"
LLM_DEPLOYMENT = "headroom-llm"


class AppArgs(BaseModel):
    """The builder's arguments (the edge: strings from `serve run k=v`, or a config file's `args:`)."""

    model_config = ConfigDict(extra="forbid")

    model_repository: str
    models: list[str] = Field(default_factory=list)  # also "digits,noop"
    trusted_backends: list[str] = Field(default_factory=lambda: sorted(DEFAULT_TRUSTED))
    replicas: int = 1
    replica_capacity: int = 8
    multiplex: bool = True
    max_models_per_replica: int = 3
    router: str = "peak_ewma"
    affinity_header: str = "x-session-id"
    replica_num_cpus: float = 0.5
    ingress_num_cpus: float = 0.25
    ingress_replicas: int = 1
    max_attempts: int = 3
    retry_backoff_s: float = 0.05
    load_allowance_s: float = 120.0
    max_body_bytes: int = 64 * 1024 * 1024
    drain_timeout_s: float = 30.0
    autoscale: bool = False  # derive Serve's autoscaling_config from headroom's autoscaler policy
    min_replicas: int = 1
    max_replicas: int = 4
    # the whole autoscaler section of a router.yaml (headroom.autoscaler.policy.AutoscalerConfig's keys);
    # given, it wins over autoscale / min_replicas / max_replicas
    autoscaler: dict[str, Any] | None = None
    llm_replicas: int = 1
    llm_capacity: int = 32
    llm_num_cpus: float = 1.0
    llm_timeout_s: float = 600.0
    api_keys_file: str = ""  # API keys as `headroom serve --api-keys-file` (headroom.ray_serve.auth)
    llm_min_replicas: int | None = None  # with autoscaling: the LLM deployment's bounds (None: the autoscaler's)
    llm_max_replicas: int | None = None
    rate_limit_rps: float = 0.0  # per-tenant limits at the ingress, as `headroom serve`'s flags (0 = unlimited)
    rate_limit_burst: float = 0.0
    llm_tokens_per_s: float = 0.0
    llm_token_burst: float = 0.0
    cors_origins: list[str] = Field(default_factory=list)  # also "http://a,http://b"

    @field_validator("models", "trusted_backends", "cors_origins", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    def spec(self) -> ServeAppSpec:
        data = self.model_dump()
        kwargs = {f.name: data[f.name] for f in fields(ServeAppSpec)}
        kwargs["models"], kwargs["trusted_backends"] = tuple(self.models), tuple(self.trusted_backends)
        kwargs["cors_origins"] = tuple(self.cors_origins)
        return ServeAppSpec(**kwargs)

    def autoscaler_config(self) -> AutoscalerConfig | None:
        """headroom's autoscaler policy for the model deployment (None: a fixed replica count)."""
        if self.autoscaler is not None:
            return from_mapping(AutoscalerConfig, self.autoscaler, "autoscaler")
        if not self.autoscale:
            return None
        return AutoscalerConfig(min_replicas=self.min_replicas, max_replicas=self.max_replicas, warm_pool=0)


def _replica_options(spec: ServeAppSpec, name: str, capacity: int, num_cpus: float, replicas: int,
                     autoscaler: AutoscalerConfig | None) -> dict[str, Any]:
    """Options both replica deployments share: `replicas` fixed, or autoscaled by `autoscaler` from it."""
    options: dict[str, Any] = {"name": name, "max_ongoing_requests": capacity,
                               "ray_actor_options": {"num_cpus": num_cpus},
                               "graceful_shutdown_timeout_s": spec.drain_timeout_s}
    if autoscaler is None:
        options["num_replicas"] = replicas
    else:
        options["autoscaling_config"] = serve_autoscaling(autoscaler, capacity, replicas).as_dict()
    return options


def models_deployment_options(spec: ServeAppSpec, autoscaler: AutoscalerConfig | None) -> dict[str, Any]:
    """`serve.deployment` options of the model replicas: capacity, CPUs, replicas or autoscaling, router."""
    options = _replica_options(spec, MODELS_DEPLOYMENT, spec.replica_capacity, spec.replica_num_cpus, spec.replicas,
                               autoscaler)
    if spec.router != SERVE_DEFAULT_ROUTER:
        options["request_router_config"] = {"request_router_class": ROUTER_CLASS_PATH,
                                            "request_router_kwargs": {"policy": spec.router}}
    return options


def llm_deployment_options(spec: ServeAppSpec, autoscaler: AutoscalerConfig | None = None) -> dict[str, Any]:
    """`serve.deployment` options of the LLM replicas (headroom's router: `prefix` keeps a prompt's prefix, and
    so its KV blocks, on one replica): `llm_replicas`, or with `autoscaler` (the model deployment's policy) an
    `autoscaling_config` for `llm_capacity` between `llm_min_replicas` and `llm_max_replicas`."""
    policy = None if autoscaler is None else with_bounds(autoscaler, spec.llm_min_replicas, spec.llm_max_replicas)
    options = _replica_options(spec, LLM_DEPLOYMENT, spec.llm_capacity, spec.llm_num_cpus, spec.llm_replicas, policy)
    if spec.router != SERVE_DEFAULT_ROUTER:
        options["request_router_config"] = {"request_router_class": ROUTER_CLASS_PATH,
                                            "request_router_kwargs": {"policy": spec.router}}
    return options


def ingress_deployment_options(spec: ServeAppSpec, autoscaler: AutoscalerConfig | None = None,
                               kinds: tuple[bool, bool] = (True, False)) -> dict[str, Any]:
    """The HTTP ingress only translates and awaits, so it may hold every request the replicas behind it may hold
    at their autoscaling ceiling (4x, for queued and retried calls): tensor and LLM replicas (`kinds`) alike."""
    tensor, llm = kinds
    most = spec.replicas if autoscaler is None else max(spec.replicas, autoscaler.max_replicas)
    llm_bounds = None if autoscaler is None else with_bounds(autoscaler, spec.llm_min_replicas, spec.llm_max_replicas)
    most_llm = spec.llm_replicas if llm_bounds is None else max(spec.llm_replicas, llm_bounds.max_replicas)
    ceiling = tensor * spec.replica_capacity * most + llm * spec.llm_capacity * most_llm
    return {"name": INGRESS_DEPLOYMENT, "num_replicas": spec.ingress_replicas,
            "ray_actor_options": {"num_cpus": spec.ingress_num_cpus},
            "max_ongoing_requests": max(100, 4 * ceiling)}


def build_app(args: AppArgs) -> Any:
    """Serve's application builder: the ingress bound to a handle of the model deployment."""
    from ray import serve

    from headroom.ray_serve.ingress import HttpIngress
    from headroom.ray_serve.llm_replica import LLMReplica
    from headroom.ray_serve.replica import ModelReplica

    spec = args.spec()
    tensor, llm = served_kinds(spec)
    autoscaler = args.autoscaler_config()
    models = (serve.deployment(**models_deployment_options(spec, autoscaler))(ModelReplica).bind(spec)
              if tensor else None)
    llms = serve.deployment(**llm_deployment_options(spec, autoscaler))(LLMReplica).bind(spec) if llm else None
    ingress = serve.deployment(**ingress_deployment_options(spec, autoscaler, (tensor, llm)))(HttpIngress)
    return ingress.bind(models, spec, llms)


def served_kinds(spec: ServeAppSpec) -> tuple[bool, bool]:
    """(any tensor model, any LLM) among the models the application serves: which deployments it needs."""
    index = ModelRepository(Path(spec.model_repository), spec.trusted_backends).scan(spec.models or None)
    if not index.models and not index.llm_models:
        raise ValueError(f"no model to serve in {spec.model_repository} (models: {', '.join(spec.models) or 'all'})")
    return bool(index.models), bool(index.llm_models)


def _rendered_kinds(spec: ServeAppSpec) -> tuple[bool, bool]:
    """`served_kinds` where the repository can be read here; else (tensor models, no LLM), as before LLMs ran on
    Serve (the config file may be rendered away from the cluster's repository path)."""
    try:
        return served_kinds(spec)
    except (OSError, ValueError):
        return True, False


#: `grpc_options.grpc_servicer_functions` entry that serves KServe V2 gRPC (headroom.ray_serve.grpc_ingress)
GRPC_SERVICER_FUNCTION = "headroom.ray_serve.grpc_ingress.add_inference_service"


def grpc_options(grpc_port: int) -> dict[str, Any] | None:
    """Serve's `grpc_options` for KServe V2 gRPC on `grpc_port` (None: no gRPC proxy, when < 0)."""
    return None if grpc_port < 0 else {"port": grpc_port, "grpc_servicer_functions": [GRPC_SERVICER_FUNCTION]}


def serve_config(args: AppArgs, host: str = "0.0.0.0", port: int = 8000, name: str = "headroom",
                 grpc_port: int = -1) -> dict[str, Any]:
    """A Serve config file (`serve deploy FILE` / `serve run FILE`) for the application `args` describe
    (`grpc_port` >= 0: Serve's gRPC proxy there, serving KServe V2 gRPC)."""
    spec = args.spec()  # validates
    tensor, llm = _rendered_kinds(spec)
    autoscaler = args.autoscaler_config()
    chosen = [ingress_deployment_options(spec, autoscaler, (tensor, llm))]
    chosen += [models_deployment_options(spec, autoscaler)] if tensor else []
    chosen += [llm_deployment_options(spec, autoscaler)] if llm else []
    deployments = [{k: v for k, v in options.items() if k != "request_router_config"} for options in chosen]
    grpc = grpc_options(grpc_port)
    return {
        "proxy_location": "EveryNode",
        "http_options": {"host": host, "port": port},
        **({"grpc_options": grpc} if grpc is not None else {}),
        "applications": [{
            "name": name, "route_prefix": "/", "import_path": IMPORT_PATH,
            "args": args.model_dump(exclude_defaults=True),
            "deployments": deployments,
        }],
    }
