"""Serve's `autoscaling_config` derived from headroom's autoscaler policy (headroom.autoscaler.policy). Pure.

Ray Serve scales a deployment on ongoing requests per replica: it aims at `target_ongoing_requests`, averaged
over `look_back_period_s`, and acts only after the decision has held for `upscale_delay_s` /
`downscale_delay_s`. headroom's policy aims at `target_utilisation` of what one replica holds at 100%, averaged
over `window_s`, scales up at once (HPA: no stabilisation) and down only when the highest recommendation of the
last `scale_down_stabilisation_s` (and the `cooldown_s` after any scale event) allows it. The mapping:

* ``target_ongoing_requests`` = target_utilisation x the ongoing requests of one full replica:
  ``utilisation``: the replica's capacity (headroom's `--replica-capacity`, Serve's `max_ongoing_requests`);
  ``queue_depth``: `per_replica_full` (queued + in flight is what Serve counts as ongoing);
  ``requests_per_replica``: `per_replica_full` req/s x the mean request latency (Little's law: in flight =
  rate x time), so that one needs the latency (the planner's or a measured one).
* ``look_back_period_s`` = window_s, at least `MIN_LOOK_BACK_S` (Serve's replicas and handles push their ongoing
  requests every 10 s by default, and Serve warns, later refuses, a look-back not longer than that interval);
  ``upscale_delay_s`` = 0 (headroom scales up at the first sample over the
  band); ``downscale_delay_s`` = max(scale_down_stabilisation_s, cooldown_s).
* ``min_replicas`` / ``max_replicas`` as given; ``initial_replicas`` = the starting count, clamped.

The LLM deployment (`headroom-llm`) gets the same policy with its own capacity (`llm_capacity`: one replica's
engine batches that many requests, Serve's `max_ongoing_requests`) and bounds (`with_bounds`: `llm_min_replicas`
/ `llm_max_replicas`, else the policy's).

Not carried over (Serve has no equivalent; docs/ray.md says so): the hysteresis band (Serve rescales whenever
the ratio to the target moves; the delays damp it), the scale-up rate limit max(2x, +4) per period, and the warm
pool (Serve keeps no started-but-idle replicas; raise `min_replicas` instead).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from headroom.autoscaler.policy import AutoscalerConfig

#: Serve's default autoscaling metric push interval (`RAY_SERVE_*_AUTOSCALING_METRIC_PUSH_INTERVAL_S`) plus 1 s: the
#: shortest look-back Serve accepts without its FutureWarning (a window_s under it is raised to it).
MIN_LOOK_BACK_S = 11.0


@dataclass(frozen=True, slots=True)
class ServeAutoscaling:
    """The fields of `ray.serve.config.AutoscalingConfig` that headroom sets (see `as_dict`)."""

    min_replicas: int
    max_replicas: int
    initial_replicas: int
    target_ongoing_requests: float
    look_back_period_s: float
    upscale_delay_s: float
    downscale_delay_s: float

    def as_dict(self) -> dict[str, float | int]:
        """The `autoscaling_config` of a Serve deployment (a Serve config file or `serve.deployment(...)`)."""
        return {"min_replicas": self.min_replicas, "max_replicas": self.max_replicas,
                "initial_replicas": self.initial_replicas, "target_ongoing_requests": self.target_ongoing_requests,
                "look_back_period_s": self.look_back_period_s, "upscale_delay_s": self.upscale_delay_s,
                "downscale_delay_s": self.downscale_delay_s}


def serve_autoscaling(cfg: AutoscalerConfig, replica_capacity: int, initial_replicas: int,
                      request_latency_s: float | None = None) -> ServeAutoscaling:
    """Serve's autoscaling for a deployment whose replicas each serve `replica_capacity` requests at once.

    `request_latency_s` (the mean latency of one request) is needed only for the ``requests_per_replica``
    metric. Raises ValueError for inputs that give no valid Serve config.
    """
    if replica_capacity < 1:
        raise ValueError(f"replica_capacity must be >= 1, got {replica_capacity}")
    if cfg.max_replicas < 1:
        raise ValueError("Serve needs max_replicas >= 1")
    if cfg.metric == "utilisation":
        full = float(replica_capacity)
    elif cfg.metric == "queue_depth":
        full = cfg.per_replica_full
    else:
        if request_latency_s is None or not request_latency_s > 0:
            raise ValueError("the requests_per_replica metric needs the mean request latency (request_latency_s "
                             "> 0) to turn a rate into ongoing requests (Little's law)")
        full = cfg.per_replica_full * request_latency_s
    target = round(cfg.target_utilisation * full, 6)
    if not target > 0:
        raise ValueError(f"the derived target_ongoing_requests must be > 0, got {target}")
    return ServeAutoscaling(
        min_replicas=cfg.min_replicas, max_replicas=cfg.max_replicas,
        initial_replicas=min(cfg.max_replicas, max(cfg.min_replicas, initial_replicas)),
        target_ongoing_requests=target, look_back_period_s=max(cfg.window_s, MIN_LOOK_BACK_S), upscale_delay_s=0.0,
        downscale_delay_s=max(cfg.scale_down_stabilisation_s, cfg.cooldown_s))


def with_bounds(cfg: AutoscalerConfig, min_replicas: int | None, max_replicas: int | None) -> AutoscalerConfig:
    """`cfg` with other replica bounds (None keeps cfg's): the LLM deployment follows the same policy as the
    model deployment, between its own bounds. ValueError for bounds the policy refuses."""
    low = cfg.min_replicas if min_replicas is None else min_replicas
    high = cfg.max_replicas if max_replicas is None else max_replicas
    return replace(cfg, min_replicas=low, max_replicas=high)
