"""Rollouts that deploy: start the new version's replicas, shift traffic step by step, promote or tear down.

`RolloutFleet` is the `ReplicaFleet` behind `headroom route`: the stable replicas (the local or Ray replica
manager as before) plus, during a rollout, a second manager running the new version. A rollout:

1. `start(spec)` builds the new version's replicas through the same replica manager (`make_canary`: local
   processes or Ray actors serving a repository in which `spec.model` is pinned to `spec.version`, see
   `pinned_repository`) and waits until they are ready;
2. the router's `CanaryTracker` splits traffic by version (`Upstream.version`), and its health-check loop
   applies the pure `rollout.evaluate` on the measured error rate and p99 of each arm, step after step;
3. `complete`: the new replicas become the stable fleet and the old ones drain; `rolled_back`: the new
   replicas drain and are torn down. Either way the tracker is removed and the fleet serves one version.

Every step, promotion and rollback is one `key=value` log line (`event=rollout_...`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from headroom.autoscaler.actuator import ColdStartTiming
from headroom.core.tasks import cancel_and_wait
from headroom.router.canary import CanaryTracker
from headroom.router.proxy import Router
from headroom.router.replicas import ReplicaFleet
from headroom.router.rollout import CanaryConfig
from headroom.router.upstream import Upstream

log = logging.getLogger("headroom.router.rollout")

OnChange = Callable[[tuple[Upstream, ...]], None]


@dataclass(frozen=True, slots=True)
class RolloutSpec:
    """What to roll out, and how carefully."""

    model: str  # the model directory whose version changes
    version: str  # the numeric version directory the new replicas serve
    replicas: int = 1  # new-version replicas to start
    canary: CanaryConfig = field(default_factory=CanaryConfig)  # steps and rollback thresholds

    def __post_init__(self) -> None:
        if not self.model or not self.version.isdigit():
            raise ValueError("a rollout needs --model and a numeric --version (a version directory)")
        if self.replicas < 1:
            raise ValueError("replicas must be >= 1")


CanaryFactory = Callable[[RolloutSpec, OnChange], ReplicaFleet]


class RolloutError(RuntimeError):
    """A rollout cannot start (one is running, or this fleet cannot start new versions)."""


def pinned_repository(source: Path, model: str, version: str, dest: Path) -> Path:
    """A model repository at `dest` that serves every model of `source` as it is, and `model` at exactly
    `version` (Triton's `version_policy: {specific: [V]}`); links, not copies, so it costs nothing."""
    src_model = source / model
    if not (src_model / version).is_dir():
        raise ValueError(f"{src_model / version} does not exist: put the new version there first")
    dest.mkdir(parents=True, exist_ok=True)
    for entry in source.iterdir():
        if entry.is_dir() and entry.name != model and not (dest / entry.name).exists():
            (dest / entry.name).symlink_to(entry.resolve())
    pinned = dest / model
    pinned.mkdir(exist_ok=True)
    for entry in src_model.iterdir():
        if entry.name != "config.yaml" and not (pinned / entry.name).exists():
            (pinned / entry.name).symlink_to(entry.resolve())
    cfg = yaml.safe_load((src_model / "config.yaml").read_text()) or {}
    cfg["version_policy"] = {"specific": [int(version)]}
    (pinned / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return dest


class RolloutFleet:
    """The stable replicas, and during a rollout the new version's; the router sees both, tagged by version."""

    def __init__(self, make_stable: Callable[[OnChange], ReplicaFleet], router: Router,
                 make_canary: CanaryFactory | None = None, poll_s: float = 0.2) -> None:
        self.router = router
        self._make_canary = make_canary
        self._poll_s = poll_s
        self._stable = make_stable(lambda _: self._publish())
        self._stable_version = ""
        self._canary: ReplicaFleet | None = None
        self._spec: RolloutSpec | None = None
        self._phase = "idle"  # idle | starting | progressing | complete | rolled_back | failed
        self._detail = ""
        self._retired: list[ReplicaFleet] = []
        self._events: list[str] = []
        self._task: asyncio.Task[None] | None = None

    # -------------------------------------------------------------------------- ReplicaFleet contract

    def serving(self) -> tuple[Upstream, ...]:
        out = [dataclasses.replace(u, version=self._stable_version) for u in self._stable.serving()]
        if self._canary is not None and self._spec is not None:
            out += [dataclasses.replace(u, version=self._spec.version) for u in self._canary.serving()]
        return tuple(out)

    async def scale_to(self, replicas: int, warm_pool: int) -> None:
        await self._stable.scale_to(replicas, warm_pool)

    @property
    def cold_starts(self) -> Sequence[ColdStartTiming]:
        fleets = [self._stable, *([self._canary] if self._canary else []), *self._retired]
        return [cs for f in fleets for cs in f.cold_starts]

    @property
    def events(self) -> list[str]:
        return [*self._events, *self._stable.events, *(self._canary.events if self._canary else [])]

    async def close(self) -> None:
        await cancel_and_wait(self._task)
        if self._canary is not None:
            await self._canary.close()
        await self._stable.close()

    # ------------------------------------------------------------------------------------ rollouts

    def status(self) -> dict[str, Any]:
        tracker = self.router.canary
        doc: dict[str, Any] = {"phase": self._phase, "detail": self._detail, "stable_version": self._stable_version,
                               "stable_replicas": [u.replica_id for u in self._stable.serving()]}
        if self._spec is not None:
            doc |= {"model": self._spec.model, "version": self._spec.version,
                    "steps": list(self._spec.canary.steps)}
        if self._canary is not None:
            doc["new_replicas"] = [u.replica_id for u in self._canary.serving()]
        if tracker is not None:
            doc |= {"weight": tracker.weight, "step": tracker.state.step,
                    "arms": {arm: dataclasses.asdict(s.stats()) for arm, s in tracker.arms.items()},
                    "history": [dataclasses.asdict(d) for d in tracker.history]}
        return doc

    def start(self, spec: RolloutSpec) -> None:
        """Begin a rollout in the background (its replicas take a while to start); RolloutError if not now."""
        if self._make_canary is None:
            raise RolloutError("this router cannot start replicas of a new version (no replica manager)")
        if self._task is not None and not self._task.done():
            raise RolloutError(f"a rollout of {self._spec.model if self._spec else '?'} is {self._phase}")
        self._spec, self._phase, self._detail = spec, "starting", ""
        self._task = asyncio.create_task(self._run(spec), name=f"rollout-{spec.model}-v{spec.version}")

    async def _run(self, spec: RolloutSpec) -> None:
        make = self._make_canary
        if make is None:
            return
        self._event(f"event=rollout_start model={spec.model} version={spec.version} replicas={spec.replicas}")
        try:
            self._canary = make(spec, lambda _: self._publish())
            await self._canary.scale_to(spec.replicas, 0)
        except Exception as exc:  # a replica that cannot start fails the rollout, never the router
            self._phase, self._detail = "failed", f"new replicas did not start: {exc}"
            self._event(f"event=rollout_failed version={spec.version} reason={str(exc)[:200]!r}")
            await self._tear_down_canary()
            return
        self.router.canary = CanaryTracker(spec.version, spec.canary, self.router.clock.now_s())
        self._phase = "progressing"
        self._publish()
        while self.router.canary is not None and self.router.canary.state.phase == "progressing":
            await asyncio.sleep(self._poll_s)  # the router's health-check loop applies rollout.evaluate
        tracker = self.router.canary
        final = tracker.history[-1] if tracker is not None and tracker.history else None
        self._detail = final.reason if final is not None else ""
        if tracker is not None and tracker.state.phase == "complete":
            await self._promote(spec)
        else:
            self._phase = "rolled_back"
            self.router.canary = None
            self._event(f"event=rollout_rolled_back version={spec.version} reason={self._detail!r}")
            await self._tear_down_canary()

    async def _promote(self, spec: RolloutSpec) -> None:
        old, self._stable = self._stable, self._canary if self._canary is not None else self._stable
        self._canary, self._stable_version = None, spec.version
        self.router.canary = None
        self._publish()
        self._event(f"event=rollout_promoted version={spec.version} draining={len(old.serving())}")
        await old.close()
        self._retired.append(old)
        self._phase = "complete"

    async def _tear_down_canary(self) -> None:
        canary, self._canary = self._canary, None
        self._publish()
        if canary is not None:
            await canary.close()
            self._retired.append(canary)

    def _publish(self) -> None:
        self.router.set_upstreams(self.serving())

    def _event(self, text: str) -> None:
        log.warning(text)
        self._events.append(text)
