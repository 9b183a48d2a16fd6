"""The simulator page's playground as a pure function: controls in, metrics and a coloured histogram out.

Controls (as on the simulator page): an inference server (vLLM, TGI, Triton, Ray Serve: each a cost profile
for the same 8B chatbot workload and a default batching mode), a batching mode (static / dynamic /
continuous), replicas, an autoscale toggle (by QPS: up above 75 %, down below 25 % of what a replica
sustains) and a target QPS. The three suggested experiments are `PRESETS`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from headroom.autoscaler.policy import AutoscalerConfig
from headroom.batching.policy import BatchPolicyConfig
from headroom.loadgen.arrivals import poisson
from headroom.sim.config import SimConfig, SimResult
from headroom.sim.engine import simulate
from headroom.sim.plot import bar_colours
from headroom.sim.profile import LlmProfile, ServiceProfile, resolve_profile, static_batch_times


@dataclass(frozen=True, slots=True)
class ServerPreset:
    """One inference server of the page: how fast its engine steps and how it batches by default."""

    label: str  # shown in the selector
    blurb: str  # one line under the selector
    step_scale: float  # decode-step time relative to the reference engine
    max_num_seqs: int  # continuous-batching slots
    default_batching: str  # the server's default mode
    max_batch_size: int  # static / dynamic cap
    max_queue_delay_ms: float  # dynamic batching window


SERVERS: dict[str, ServerPreset] = {
    "vllm": ServerPreset("vLLM", "PagedAttention + continuous batching", 1.0, 64, "continuous", 16, 20.0),
    "tgi": ServerPreset("TGI", "Hugging Face Text Generation Inference, continuous batching", 1.15, 32,
                        "continuous", 16, 20.0),
    "triton": ServerPreset("Triton", "dynamic batcher (max_queue_delay 20 ms)", 1.0, 64, "dynamic", 16, 20.0),
    "rayserve": ServerPreset("Ray Serve", "@serve.batch dynamic batching (wait 50 ms)", 1.2, 64, "dynamic",
                             8, 50.0),
}

PRESETS: dict[str, dict[str, Any]] = {
    "static_30qps": {"server": "vllm", "batching": "static", "replicas": 2, "autoscale": False, "qps": 30,
                     "note": "Static batching at 30 QPS: P99 explodes from head-of-line blocking."},
    "continuous_30qps": {"server": "vllm", "batching": "continuous", "replicas": 2, "autoscale": False,
                         "qps": 30, "note": "Continuous batching: GPU near 100 % busy, P99 falls."},
    "autoscale_25qps": {"server": "vllm", "batching": "continuous", "replicas": 1, "autoscale": True, "qps": 25,
                        "note": "Autoscale from 1 replica at 25 QPS: grows to 2-3 replicas."},
}

BATCHING = ("static", "dynamic", "continuous")
HISTOGRAM_BINS = 30


@dataclass(frozen=True, slots=True)
class PlaygroundRequest:
    """The page's controls."""

    server: str = "vllm"  # key of SERVERS
    batching: str = "continuous"  # static | dynamic | continuous
    replicas: int = 2  # replicas at the start
    autoscale: bool = False  # scale by QPS between 1 and 8 replicas
    qps: float = 12.0  # target arrival rate
    duration_s: float = 180.0  # simulated seconds of traffic
    seed: int = 0  # arrivals and noise

    def __post_init__(self) -> None:
        if self.server not in SERVERS:
            raise ValueError(f"unknown server {self.server!r}; choose one of {', '.join(SERVERS)}")
        if self.batching not in BATCHING:
            raise ValueError(f"unknown batching {self.batching!r}; choose one of {', '.join(BATCHING)}")
        if not 1 <= self.replicas <= 16:
            raise ValueError(f"replicas must be between 1 and 16, got {self.replicas}")
        if not 0 < self.qps <= 500 or not 1 <= self.duration_s <= 3600:
            raise ValueError("qps must be in (0, 500] and duration_s in [1, 3600]")


def server_profile(key: str) -> ServiceProfile:
    """The reference 8B chatbot profile scaled to `key`'s engine."""
    preset = SERVERS[key]
    base = resolve_profile("llm_8b_gpu")
    if base.llm is None:
        raise ValueError("the llm_8b_gpu profile lost its llm section")
    llm = dataclasses.replace(base.llm, decode_step_s=tuple(t * preset.step_scale for t in base.llm.decode_step_s),
                              max_num_seqs=preset.max_num_seqs)
    sizes, times = static_batch_times(llm)
    return ServiceProfile(sizes, times, distribution=base.distribution, cv=base.cv, name=preset.label, llm=llm)


def replica_capacity_per_s(profile: ServiceProfile, batching: str, max_batch_size: int) -> float:
    """Requests/s one replica sustains: full slots (continuous) or full batches (static / dynamic)."""
    llm: LlmProfile | None = profile.llm
    if batching == "continuous" and llm is not None:
        per_request_s = llm.prompt_tokens * llm.prefill_s_per_token + llm.output_tokens * llm.step_s(llm.max_num_seqs)
        return llm.max_num_seqs / per_request_s
    return max_batch_size / profile.mean_service_s(max_batch_size)


def _histogram(result: SimResult) -> dict[str, Any]:
    ms = result.latencies_s * 1e3
    if ms.size == 0:
        return {"edges_ms": [], "counts": [], "colours": []}
    p90, p99 = (float(v) for v in np.percentile(ms, [90, 99]))
    counts, edges = np.histogram(ms, bins=HISTOGRAM_BINS)
    return {"edges_ms": edges.tolist(), "counts": counts.tolist(), "colours": bar_colours(edges, p90, p99)}


def run_playground(req: PlaygroundRequest) -> dict[str, Any]:
    """Simulate the page's controls; returns the numbers and histogram the page shows."""
    preset = SERVERS[req.server]
    profile = server_profile(req.server)
    policy = BatchPolicyConfig(mode="dynamic", max_batch_size=preset.max_batch_size,
                               max_queue_delay_s=preset.max_queue_delay_ms / 1e3, static_timeout_s=2.0)
    capacity = replica_capacity_per_s(profile, req.batching, preset.max_batch_size)
    scaler = AutoscalerConfig(metric="requests_per_replica", per_replica_full=capacity, min_replicas=1,
                              max_replicas=8, warm_pool=0, target_utilisation=0.6, window_s=5.0,
                              scale_up_period_s=10.0,
                              scale_down_stabilisation_s=60.0, cooldown_s=30.0) if req.autoscale else None
    cfg = SimConfig(replicas=req.replicas, batching=req.batching, policy=policy, router="least_outstanding",
                    autoscale=scaler, autoscale_interval_s=5.0, cold_start_s=20.0, seed=req.seed)
    arrivals = poisson(req.qps, req.duration_s, np.random.default_rng(req.seed))
    result = simulate(cfg, profile, arrivals)
    summary = {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
               for k, v in result.summary().items()}
    replicas_now = result.replica_timeline[-1][1] if result.replica_timeline else req.replicas
    return {"request": dataclasses.asdict(req), "server": {"label": preset.label, "blurb": preset.blurb},
            "metrics": summary, "replicas_at_end": replicas_now,
            "max_replicas": max((n for _, n in result.replica_timeline), default=req.replicas),
            "replica_capacity_per_s": capacity, "histogram": _histogram(result)}
