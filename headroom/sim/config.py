"""The simulator's inputs and outputs as frozen dataclasses."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from headroom.autoscaler.policy import AutoscalerConfig
from headroom.batching.policy import BatchPolicyConfig
from headroom.sim.router import ROUTERS

BATCHING_MODES = ("none", "static", "dynamic", "adaptive", "continuous")


@dataclass(frozen=True, slots=True)
class SimConfig:
    """One simulated deployment."""

    replicas: int = 1  # replicas serving at t = 0
    batching: str = "dynamic"  # none | static | dynamic | adaptive | continuous
    policy: BatchPolicyConfig = field(default_factory=BatchPolicyConfig)  # the server's batching knobs
    shared_queue: bool = False  # one FIFO for all replicas (M/M/c, Triton instance groups); else a router
    router: str = "round_robin"  # round_robin | least_outstanding | random | power_of_two
    max_queue: int = 0  # admission control: reject arrivals when a queue holds this many (0 = unbounded)
    timeout_s: float = math.inf  # shedding: drop requests still queued this long after arrival (504)
    latency_budget_s: float = math.inf  # the server's deadline-aware admission (batching.admission, the model's
    #   SLO or default timeout): refuse (503) an arrival whose predicted delay overruns it; inf = off
    autoscale: AutoscalerConfig | None = None  # None: fixed replica count
    autoscale_interval_s: float = 5.0  # how often metrics are sampled and the autoscaler is asked
    cold_start_s: float = 30.0  # from "start a replica" to serving (image pull, load, warm-up)
    warmup_s: float = 0.0  # requests arriving before this are served but left out of the metrics
    host_cpu_per_request_s: float = 0.0  # model seconds lost per arrival to the server's host work on the
    #   model's cores (HTTP, JSON, preprocessing); stretches batches event by event (headroom.sim.cpu_share)
    host_cpu_per_batch_s: float = 0.0  # host work on the model's cores each time a batch completes (event-loop
    #   wake-up, resolving the batch's futures, the batcher's turn): queued with the arrivals' host work, it
    #   preempts the next batch (headroom.sim.cpu_share); seconds per batch
    service_time_scale: float = 1.0  # multiplier (dimensionless ratio) on every batch's service time from the
    #   profile: the in-service slowdown measured on the real server under open-loop load against the isolated
    #   profile (`headroom sim --validate`, calibration pass); applied before the host-CPU stretch
    seed: int = 0  # seeds arrivals, service-time noise, routing and LLM output lengths

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {self.replicas}")
        if self.batching not in BATCHING_MODES:
            raise ValueError(f"unknown batching {self.batching!r}; choose one of {', '.join(BATCHING_MODES)}")
        if self.router not in ROUTERS:
            raise ValueError(f"unknown router {self.router!r}; choose one of {', '.join(ROUTERS)}")
        if self.max_queue < 0:
            raise ValueError(f"max_queue must be >= 0 (0 = unbounded), got {self.max_queue}")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        if not self.latency_budget_s > 0:
            raise ValueError(f"latency_budget_s must be > 0 (inf = no admission by predicted delay), "
                             f"got {self.latency_budget_s}")
        if self.latency_budget_s < math.inf and self.batching == "continuous":
            raise ValueError("latency_budget_s models the tensor batcher's admission; continuous batching does not "
                             "use it: leave it at inf")
        if not 0 <= self.host_cpu_per_request_s < math.inf:
            raise ValueError(f"host_cpu_per_request_s must be >= 0 and finite, got {self.host_cpu_per_request_s}")
        if not 0 <= self.host_cpu_per_batch_s < math.inf:
            raise ValueError(f"host_cpu_per_batch_s must be >= 0 and finite, got {self.host_cpu_per_batch_s}")
        if self.host_cpu_per_batch_s > 0 and self.batching == "continuous":
            raise ValueError("host_cpu_per_batch_s is charged per whole batch; continuous batching is not modelled "
                             "with it: set it to 0")
        if not 0 < self.service_time_scale < math.inf:
            raise ValueError(f"service_time_scale must be > 0 and finite (1 = the profile as measured), "
                             f"got {self.service_time_scale}")
        if self.service_time_scale != 1.0 and self.batching == "continuous":
            raise ValueError("service_time_scale scales whole batches; continuous batching's iterations use the "
                             "profile's llm section: set it to 1")
        if self.host_cpu_per_request_s > 0 and self.batching == "continuous":
            raise ValueError("host_cpu_per_request_s stretches whole batches; continuous batching's iterations are "
                             "not modelled with it: use none/static/dynamic/adaptive or set it to 0")
        if self.autoscale_interval_s <= 0 or self.cold_start_s < 0 or self.warmup_s < 0:
            raise ValueError("autoscale_interval_s must be > 0; cold_start_s and warmup_s >= 0")

    def batch_policy(self) -> BatchPolicyConfig:
        """The server's batching-policy knobs for this deployment's `batching` mode."""
        p = self.policy
        if self.batching == "none":
            return BatchPolicyConfig(mode="dynamic", max_batch_size=1, max_queue_delay_s=0.0)
        if self.batching == "continuous":
            return p
        return BatchPolicyConfig(mode=self.batching, max_batch_size=p.max_batch_size,
                                 max_queue_delay_s=p.max_queue_delay_s, preferred_batch_sizes=p.preferred_batch_sizes,
                                 static_timeout_s=p.static_timeout_s, slo_s=p.slo_s,
                                 fixed_overhead_s=p.fixed_overhead_s, target_batch_size=p.target_batch_size)


@dataclass(frozen=True, slots=True)
class SimResult:
    """What a run measured: the bench's metrics plus the simulator's internals."""

    offered: int  # arrivals after warm-up
    completed: int  # served to the end (after warm-up)
    rejected: int  # refused at admission (queue full, or predicted delay over latency_budget_s)
    expired: int  # shed after waiting longer than timeout_s
    duration_s: float  # first arrival to last completion
    throughput_per_s: float  # completed / duration (the measured QPS)
    mean_latency_s: float  # arrival to completion
    p50_latency_s: float  # median latency
    p95_latency_s: float  # 95th percentile
    p99_latency_s: float  # 99th percentile
    max_latency_s: float  # worst request
    mean_wait_s: float  # arrival to start of service (queue + batch formation)
    mean_ttft_s: float  # continuous batching: arrival to end of the first iteration (nan otherwise)
    ttft_p50_s: float  # continuous batching: median time to first token (nan otherwise)
    ttft_p90_s: float  # 90th percentile TTFT
    ttft_p99_s: float  # 99th percentile TTFT
    mean_tpot_s: float  # continuous batching: mean time per output token after the first (per request)
    tpot_p50_s: float  # median TPOT over requests with more than one output token
    tpot_p90_s: float  # 90th percentile TPOT
    tpot_p99_s: float  # 99th percentile TPOT
    mean_itl_s: float  # continuous batching: mean inter-token latency (over tokens)
    itl_p50_s: float  # median gap between consecutive tokens of a request
    itl_p90_s: float  # 90th percentile ITL
    itl_p99_s: float  # 99th percentile ITL
    utilisation: float  # busy replica-seconds / ready replica-seconds
    busy_s: float  # busy replica-seconds (total service time of every batch)
    mean_batch_size: float  # items per batch (running sequences per iteration for continuous)
    max_queue_depth: int  # deepest total queue seen
    queue_at_end: int  # requests still waiting when the last arrival came in
    replica_timeline: tuple[tuple[float, int], ...]  # (time, ready replicas) at each change
    wall_s: float  # real seconds the simulation took
    latencies_s: npt.NDArray[np.float64] = field(repr=False)  # every measured latency, arrival order of completion

    def summary(self) -> dict[str, float | int | None]:
        """The scalar metrics as a JSON-ready dict (seconds and requests per second)."""
        out: dict[str, float | int | None] = {}
        for name in ("offered", "completed", "rejected", "expired", "duration_s", "throughput_per_s",
                     "mean_latency_s", "p50_latency_s", "p95_latency_s", "p99_latency_s", "max_latency_s",
                     "mean_wait_s", "mean_ttft_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "mean_tpot_s",
                     "tpot_p50_s", "tpot_p90_s", "tpot_p99_s", "mean_itl_s", "itl_p50_s", "itl_p90_s", "itl_p99_s",
                     "utilisation", "busy_s", "mean_batch_size", "max_queue_depth",
                     "queue_at_end", "wall_s"):
            v = getattr(self, name)
            out[name] = v if not (isinstance(v, float) and math.isnan(v)) else None
        return out
