"""What a model's config means for scheduling: the batch policy's knobs (seconds) and a request's latency
budget (the admission rule in `headroom.batching.admission` compares against it). Used by the server's data
plane and by the simulator's validation, so both read a config the same way."""

from __future__ import annotations

from headroom.batching.policy import BatchPolicyConfig
from headroom.models.config import ModelConfig

#: The adaptive window's latency objective when the model's config sets no `slo_p99_ms`.
ADAPTIVE_SLO_MS = 100.0


def policy_config(config: ModelConfig) -> BatchPolicyConfig:
    """Translate a model's config (milliseconds, YAML names) into the pure policy's config (seconds)."""
    b = config.batching
    return BatchPolicyConfig(
        mode=b.mode,
        max_batch_size=max(1, config.max_batch_size),
        max_queue_delay_s=b.max_queue_delay_ms / 1e3,
        preferred_batch_sizes=b.preferred_batch_sizes,
        static_timeout_s=b.static_timeout_ms / 1e3,
        slo_s=(b.slo_p99_ms if b.slo_p99_ms is not None else ADAPTIVE_SLO_MS) / 1e3,
        target_batch_size=max(1, config.max_batch_size // 2),
        sync_deadline_s=b.sync_deadline_ms / 1e3,
        expected_streams=b.expected_streams,
    )


def latency_budget_ms(cfg: ModelConfig, client_timeout_ms: float | None) -> float:
    """A request's latency budget at the server: the model's SLO (its default timeout when it sets none) or the
    client's timeout, whichever is shorter, less the `slo_reserve_fraction` kept for the time the client sees
    and the server cannot (the network hop, the response's write, the client's read)."""
    b = cfg.batching
    model_ms = b.slo_p99_ms if b.slo_p99_ms is not None else b.default_timeout_ms
    budget_ms = model_ms if client_timeout_ms is None else min(model_ms, client_timeout_ms)
    return budget_ms * (1.0 - b.slo_reserve_fraction)
