"""What the autoscaler's controller drives and what it reads back: the contracts that replica managers
(`headroom.router.replicas`, Ray, Kubernetes, rollouts) implement, so the autoscaler depends on no fleet."""

from __future__ import annotations

from typing import Protocol


class Actuator(Protocol):
    """What the autoscaler controller drives."""

    async def scale_to(self, replicas: int, warm_pool: int) -> None:
        """Serve with `replicas` replicas and keep `warm_pool` more started but idle."""
        ...


class ColdStartTiming(Protocol):
    """What the autoscaler exports of one replica start (`ColdStart`, `RayColdStart`)."""

    @property
    def replica_id(self) -> str: ...  # which replica

    @property
    def spawn_s(self) -> float: ...  # until the process existed

    @property
    def listening_s(self) -> float: ...  # until /v2/health/live answered

    @property
    def ready_s(self) -> float: ...  # until /v2/health/ready answered 200
