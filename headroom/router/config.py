"""The router process's configuration (one frozen dataclass; each policy's defaults live with the policy)."""

from __future__ import annotations

from dataclasses import dataclass, field

from headroom.router import health as hp
from headroom.router import tail
from headroom.router.degrade import DegradeConfig
from headroom.router.policies import POLICIES, RoutingConfig
from headroom.router.prefix_index import PrefixIndexConfig
from headroom.router.rollout import CanaryConfig
from headroom.router.shed import ShedConfig, VegasConfig


@dataclass(frozen=True, slots=True)
class ProxyConfig:
    """The router's knobs (policy defaults live with each policy)."""

    policy: str = "peak_ewma"  # routing policy, see headroom.router.policies.POLICIES
    routing: RoutingConfig = field(default_factory=RoutingConfig)  # affinity / prefix / cache_aware knobs
    prefix_index: PrefixIndexConfig = field(default_factory=PrefixIndexConfig)  # cache_aware: tokenizers, TTL
    health: hp.HealthConfig = field(default_factory=hp.HealthConfig)  # outlier ejection
    check_interval_s: float = 1.0  # active readiness check period (K8s default is 10 s; a router wants faster)
    check_timeout_s: float = 1.0  # readiness check timeout (K8s probe default 1 s)
    connect_timeout_s: float = 1.0  # TCP connect timeout to a replica
    request_timeout_s: float = 60.0  # read timeout for a replica's answer (504 after it)
    keepalive_expiry_s: float = 4.0  # below uvicorn's 5 s keep-alive, so a pooled socket is never stale
    max_connections: int = 512  # pooled connections to all replicas together
    max_attempts: int = 3  # first try + retries (Google SRE: at most 3 attempts)
    retry_budget: tail.BudgetConfig = tail.RETRY_BUDGET  # retries <= 20% of requests (Envoy/Finagle)
    hedging: bool = False  # send backup requests after the hedge delay
    hedge: tail.HedgeConfig = field(default_factory=tail.HedgeConfig)  # p95 delay
    hedge_budget: tail.BudgetConfig = tail.HEDGE_BUDGET  # hedges <= 5% of requests (Tail at Scale)
    # Tail at Scale's tied requests: every request also goes to a second replica `tied_delay_s` later (under
    # hedge_budget: raise its budget_fraction to tie them all); the copy whose replica reports first that it
    # started executing has its twin cancelled, which removes the twin from its replica's queue (router.tied)
    tied: bool = False
    tied_delay_s: float = 0.002  # Tail at Scale: a ~1-2 ms delay avoids most double work on idle replicas
    shedding: bool = True  # coordinated load shedding on aggregate load vs capacity
    shed: ShedConfig = field(default_factory=ShedConfig)  # ramp 80% -> 100%
    adaptive_concurrency: bool = False  # Vegas limit on requests in flight through the router
    vegas: VegasConfig = field(default_factory=VegasConfig)  # Netflix Vegas defaults
    degrade: DegradeConfig = field(default_factory=DegradeConfig)  # fallback models when the fleet is busy
    canary_version: str = ""  # replicas serving this version form a canary arm ("" = no rollout)
    canary: CanaryConfig = field(default_factory=CanaryConfig)  # 5% -> 50% -> 100%, rollback thresholds
    affinity_header: str = "x-session-id"  # session key header for the affinity policy (else OpenAI `user`)
    max_body_bytes: int = 64 * 1024 * 1024  # larger request bodies get 413 (Triton's 64 MiB default)

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"unknown routing policy {self.policy!r}; choose one of {', '.join(POLICIES)}")
        if min(self.check_interval_s, self.check_timeout_s, self.connect_timeout_s, self.request_timeout_s) <= 0:
            raise ValueError("check_interval_s and every timeout must be > 0")
        if self.tied and self.hedging:
            raise ValueError("choose tied requests or hedging, not both (both send a second copy)")
        if self.tied_delay_s < 0:
            raise ValueError("tied_delay_s must be >= 0")
        if self.max_attempts < 1 or self.max_connections < 1 or self.max_body_bytes < 0:
            raise ValueError("max_attempts and max_connections must be >= 1, max_body_bytes >= 0")
