"""What a headroom Ray Serve application is told: one frozen contract shared by the builder, both deployments
and `headroom deploy ray` (the edge, `headroom.ray_serve.app.AppArgs`, validates and converts into it)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from headroom.models.trust import DEFAULT_TRUSTED, parse_trusted
from headroom.router.policies import POLICIES

#: Serve's own request router (power of two choices on the replicas' queue lengths) instead of headroom's.
SERVE_DEFAULT_ROUTER = "serve"
ROUTERS = (*POLICIES, SERVE_DEFAULT_ROUTER)
#: The import path of headroom's request router (`RequestRouterConfig.request_router_class`); a string, so that
#: rendering a Serve config does not import Ray.
ROUTER_CLASS_PATH = "headroom.ray_serve.router.HeadroomRequestRouter"


@dataclass(frozen=True, slots=True)
class ServeAppSpec:
    """A headroom application on Ray Serve: an HTTP ingress in front of model replicas (one DataPlane each)."""

    model_repository: str  # <model>/config.yaml + versions; the same path on every Ray node
    models: tuple[str, ...] = ()  # model directories it serves (empty = every tensor model in the repository)
    trusted_backends: tuple[str, ...] = tuple(sorted(DEFAULT_TRUSTED))  # model code replicas may load
    replicas: int = 1  # model replicas (the initial count when autoscaling)
    replica_capacity: int = 8  # requests one replica serves at once (Serve's max_ongoing_requests)
    multiplex: bool = True  # load models on demand per replica (Serve multiplexing); False: every replica loads all
    max_models_per_replica: int = 3  # multiplexing: models resident per replica, least recently used evicted
    router: str = "peak_ewma"  # headroom routing policy for the handle, or "serve" (Serve's default router)
    affinity_header: str = "x-session-id"  # the session key of the affinity policy (as `headroom route`)
    replica_num_cpus: float = 0.5  # CPUs each model replica reserves in Ray's scheduler
    ingress_num_cpus: float = 0.25  # CPUs each ingress replica reserves
    ingress_replicas: int = 1  # HTTP ingress replicas
    max_attempts: int = 3  # tries per request when a model replica dies under it (inference is idempotent)
    retry_backoff_s: float = 0.05  # wait before the 2nd try (doubles per try)
    load_allowance_s: float = 120.0  # on top of a request's own timeout: time for its model to load on a replica
    #   (multiplexing loads on demand); past both the ingress answers 504 and cancels the call
    max_body_bytes: int = 64 * 1024 * 1024  # larger request bodies get 413 (as `headroom serve`)
    drain_timeout_s: float = 30.0  # a stopping replica finishes in-flight work this long (Serve's graceful
    #   shutdown timeout)
    llm_replicas: int = 1  # LLM replicas (headroom-llm; deployed when the repository has `backend: llm` models)
    llm_capacity: int = 32  # requests one LLM replica holds at once (its engine batches them continuously)
    llm_num_cpus: float = 1.0  # CPUs each LLM replica reserves
    llm_timeout_s: float = 600.0  # an LLM answer's head, and each streamed chunk after it, must come this soon
    #   (X-Request-Timeout-Ms, when shorter, wins); past it the ingress answers 504 / ends the stream
    api_keys_file: str = ""  # `headroom keys` file (the same path on every node): keys required as by `headroom
    #   serve --api-keys-file` (headroom.ray_serve.auth); empty = none, every request as the anonymous tenant
    llm_min_replicas: int | None = None  # autoscaling bounds of the LLM deployment (None: the autoscaler's own,
    llm_max_replicas: int | None = None  #   as for the model deployment); used only when autoscaling is on
    rate_limit_rps: float = 0.0  # per-tenant requests per second at the ingress (0 = unlimited; 429 beyond), as
    rate_limit_burst: float = 0.0  #   `headroom serve --rate-limit-rps/--rate-limit-burst` (0 burst: 1 s worth)
    llm_tokens_per_s: float = 0.0  # per-tenant LLM tokens per second at the ingress (0 = unlimited)
    llm_token_burst: float = 0.0  # per-tenant LLM token burst (0: one second's worth)
    cors_origins: tuple[str, ...] = ()  # browser origins allowed (CORS; empty = no CORS headers), `--cors-origin`

    def __post_init__(self) -> None:
        if not self.model_repository:
            raise ValueError("model_repository is required")
        parse_trusted(",".join(self.trusted_backends))  # ValueError naming an unknown kind
        if self.router not in ROUTERS:
            raise ValueError(f"unknown router {self.router!r}; use one of {', '.join(ROUTERS)}")
        positive = {"replicas": self.replicas, "replica_capacity": self.replica_capacity,
                    "max_models_per_replica": self.max_models_per_replica, "ingress_replicas": self.ingress_replicas,
                    "max_attempts": self.max_attempts, "max_body_bytes": self.max_body_bytes,
                    "llm_replicas": self.llm_replicas, "llm_capacity": self.llm_capacity}
        bad = [f"{k}={v}" for k, v in positive.items() if v < 1]
        if bad:
            raise ValueError(f"must be >= 1: {', '.join(bad)}")
        if min(self.replica_num_cpus, self.ingress_num_cpus, self.retry_backoff_s, self.drain_timeout_s,
               self.load_allowance_s, self.llm_num_cpus) < 0:
            raise ValueError("replica_num_cpus, ingress_num_cpus, retry_backoff_s, drain_timeout_s, "
                             "load_allowance_s and llm_num_cpus must be >= 0")
        rates = (self.rate_limit_rps, self.rate_limit_burst, self.llm_tokens_per_s, self.llm_token_burst)
        if not all(math.isfinite(r) and r >= 0 for r in rates):
            raise ValueError("rate_limit_rps, rate_limit_burst, llm_tokens_per_s and llm_token_burst must be finite "
                             f"and >= 0 (0 = unlimited), got {rates}")
        if self.llm_timeout_s <= 0:
            raise ValueError("llm_timeout_s must be > 0")
        low, high = self.llm_min_replicas, self.llm_max_replicas
        if (low is not None and low < 0) or (high is not None and high < 1) or (
                low is not None and high is not None and low > high):
            raise ValueError(f"need 0 <= llm_min_replicas <= llm_max_replicas and llm_max_replicas >= 1, got "
                             f"{low} and {high}")
