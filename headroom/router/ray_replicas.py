"""Replicas as Ray actors: the `Actuator` the autoscaler drives, placing `headroom serve` processes on a Ray cluster.

Each replica is one small Ray actor (`ReplicaProcess`, `actor_num_cpus` 0.5 by default so two fit on a 2-core
node) that picks free ports on ITS node, starts one `headroom serve` process there and reports
`(host, port)`. The manager (on the router's event loop) waits for `GET /v2/health/ready`, then hands the
replica to the router through `on_change` (same callback shape as `LocalReplicaManager`). A start is timed
stage by stage (`RayColdStart`: actor scheduled, process spawned, listening, ready). Draining removes the
replica from the router first, sends SIGTERM through the actor (the replica reports not-ready, finishes what
it holds, exits), SIGKILLs it after `drain_timeout_s`, then kills the actor. A watcher polls every replica;
one whose process exits or whose actor dies (node lost) is replaced.

Ray is imported lazily (only inside functions), so headroom works without it; install the `dev` extra.
The replica process dies with its actor (Linux `PR_SET_PDEATHSIG`), so `ray.kill` never leaves it orphaned.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from headroom.router.ray_cluster import RayCommandFactory, ReplicaProcess
from headroom.router.replicas import ReplicaStartError, ScalingFleet, wait_ready
from headroom.router.upstream import Upstream

log = logging.getLogger("headroom.ray_replicas")

#: How replica actors are placed on the cluster's nodes (`RayReplicaConfig.placement`).
PLACEMENTS = ("spread", "pack", "default")


@dataclass(frozen=True, slots=True)
class RayReplicaConfig:
    """Placement and process-management knobs for Ray-actor replicas."""

    host: str | None = None  # address replicas bind and the router dials; None = their node's IP per Ray
    capacity: int = 8  # per-replica capacity reported to the router (shedding / overload threshold)
    actor_num_cpus: float = 0.5  # CPUs each replica actor reserves (its process uses what the OS gives it)
    start_timeout_s: float = 300.0  # scheduling + model load; a replica not ready by then is killed, reported
    drain_timeout_s: float = 30.0  # SIGTERM grace before SIGKILL (Kubernetes terminationGracePeriodSeconds 30)
    poll_interval_s: float = 0.05  # readiness polling period while starting
    watch_interval_s: float = 0.5  # how often each replica's process / actor is checked for an exit
    restart_on_exit: bool = True  # replace a replica whose process exits or whose actor dies unasked
    grpc: bool = False  # give each replica a gRPC port too (the router's gRPC side forwards to it)
    id_prefix: str = "ray-replica"  # replica ids are f"{id_prefix}-{n}" (unique per manager)
    # spread: Ray's SPREAD strategy, replicas on as many nodes as possible (a node loss takes few of them);
    # pack: on the node that already hosts most of this manager's replicas while it has room (fewer nodes
    # busy, cheap local traffic); default: Ray's hybrid policy (packs a node up to 50% use, then spreads)
    placement: str = "spread"
    # extra custom resources each actor needs, e.g. (("llm_node", 0.01),) to run replicas only on nodes
    # started with `ray start --resources '{"llm_node": 1}'`
    actor_resources: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        if self.placement not in PLACEMENTS:
            raise ValueError(f"unknown placement {self.placement!r}; use one of {', '.join(PLACEMENTS)}")
        if self.actor_num_cpus < 0 or any(amount <= 0 for _, amount in self.actor_resources):
            raise ValueError("actor_num_cpus must be >= 0 and every actor resource amount > 0")


@dataclass(frozen=True, slots=True)
class RayColdStart:
    """How long one Ray replica took to become useful, stage by stage (seconds from the actor's creation)."""

    replica_id: str  # which replica
    node_ip: str  # the Ray node it was placed on
    scheduled_s: float  # until the actor ran its first method (placement + worker start)
    spawn_s: float  # until the `headroom serve` process existed on that node
    listening_s: float  # until /v2/health/live answered (imports done, port bound)
    ready_s: float  # until /v2/health/ready answered 200 (models loaded and warmed)
    node_id: str = ""  # the Ray node id (hex); several nodes on one machine share an IP but not an id


class _RayReplica:
    def __init__(self, replica_id: str, actor: Any, role: str) -> None:
        self.replica_id = replica_id
        self.actor = actor  # ray.actor.ActorHandle of ReplicaProcess
        self.node_ip = ""
        self.node_id = ""
        self.host = ""
        self.port = -1
        self.grpc_port = -1
        self.pid = -1
        self.role = role  # starting | warm | serving | draining
        self.target_role = role  # what it becomes once ready


class RayReplicaManager(ScalingFleet[_RayReplica]):
    """Replicas as Ray actors (call `connect_ray` first). Methods must run on one event loop; `close()` drains
    every replica and kills its actor (the Ray cluster itself is left to `shutdown_ray`)."""

    def __init__(self, command: RayCommandFactory, config: RayReplicaConfig | None = None,
                 on_change: Callable[[tuple[Upstream, ...]], None] | None = None) -> None:
        import ray
        if not ray.is_initialized():
            raise RuntimeError("Ray is not connected: call headroom.router.ray_cluster.connect_ray() first")
        self.command = command
        self.config = config or RayReplicaConfig()
        self.on_change = on_change
        self.cold_starts: list[RayColdStart] = []
        self.events: list[str] = []
        self._actor_cls: Any = ray.remote(ReplicaProcess)
        self._replicas: dict[str, _RayReplica] = {}
        self._seq = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False
        self._lock = asyncio.Lock()

    # ---------------------------------------------------------------------------------------- queries

    def serving(self) -> tuple[Upstream, ...]:
        return tuple(Upstream(r.replica_id, f"http://{r.host}:{r.port}", self.config.capacity,
                              grpc_target=f"{r.host}:{r.grpc_port}" if r.grpc_port >= 0 else "")
                     for r in self._replicas.values() if r.role == "serving")

    def pid(self, replica_id: str) -> int:
        """The replica process's pid on its node."""
        return self._replicas[replica_id].pid

    def node_of(self, replica_id: str) -> str:
        """The IP of the node the replica runs on."""
        return self._replicas[replica_id].node_ip

    def node_id_of(self, replica_id: str) -> str:
        """The Ray node id (hex) of the node the replica runs on."""
        return self._replicas[replica_id].node_id

    def placement_by_node(self) -> dict[str, list[str]]:
        """Ray node id -> ids of this manager's placed replicas (starting, warm or serving) on it."""
        nodes: dict[str, list[str]] = {}
        for r in self._replicas.values():
            if r.role != "draining" and r.node_id:
                nodes.setdefault(r.node_id, []).append(r.replica_id)
        return nodes

    def actor_of(self, replica_id: str) -> Any:
        """The replica's Ray actor handle (a `ReplicaProcess`), e.g. for `ray.kill` in failure drills."""
        return self._replicas[replica_id].actor

    async def log_tail(self, replica_id: str) -> str:
        """The last lines of the replica's stdout/stderr, read on its node through its actor."""
        return await self._log_tail(self._replicas[replica_id])

    # -------------------------------------------------------------------------------------- lifecycle

    async def start_replica(self, role: str = "serving") -> str:
        """Create an actor, start its process, wait until ready, then give it `role` ("serving" or "warm")."""
        cfg = self.config
        self._seq += 1
        rid = f"{cfg.id_prefix}-{self._seq}"
        t0 = time.monotonic()
        r = _RayReplica(rid, self._actor_cls.options(**self._actor_options()).remote(), "starting")
        r.target_role = role
        self._replicas[rid] = r
        try:
            async with asyncio.timeout(cfg.start_timeout_s):
                r.node_ip, r.node_id = await r.actor.node.remote()
                scheduled_s = time.monotonic() - t0
                r.host, r.port, r.grpc_port, r.pid = await r.actor.spawn.remote(self.command, cfg.host, cfg.grpc)
                spawn_s = time.monotonic() - t0
                listening_s, ready_s = await self._wait_ready(r, t0)
        except BaseException as exc:
            tail = await self._log_tail(r)
            await self._kill(r)
            self._replicas.pop(rid, None)
            if isinstance(exc, TimeoutError):
                raise ReplicaStartError(f"{rid} was not ready within {cfg.start_timeout_s} s (no room on the "
                                        f"cluster for {cfg.actor_num_cpus} CPU, or a slow model load: raise "
                                        f"start_timeout_s); log tail:\n{tail}") from None
            raise
        self.cold_starts.append(RayColdStart(rid, r.node_ip, scheduled_s, spawn_s, listening_s, ready_s, r.node_id))
        r.role = r.target_role
        self._event(f"started {rid} on {r.host}:{r.port} (node {r.node_ip}) as {r.role} "
                    f"(scheduled after {scheduled_s:.2f} s, ready after {ready_s:.2f} s)")
        self._spawn_task(self._watch(r))
        if r.role == "serving":
            self._changed()
        return rid

    def _actor_options(self) -> dict[str, Any]:
        """Ray `.options()` for the next replica actor: CPUs, custom resources, placement strategy."""
        cfg = self.config
        options: dict[str, Any] = {"num_cpus": cfg.actor_num_cpus, "max_restarts": 0}
        if cfg.actor_resources:
            options["resources"] = dict(cfg.actor_resources)
        if cfg.placement == "spread":
            options["scheduling_strategy"] = "SPREAD"
        elif cfg.placement == "pack":
            import ray
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
            nodes = self.placement_by_node()
            # the fullest node first (the router's own node when there is none yet); soft + spill: another
            # node once that one has no room left
            target = max(sorted(nodes), key=lambda n: len(nodes[n])) if nodes else \
                str(ray.get_runtime_context().get_node_id())
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(target, soft=True,
                                                                            _spill_on_unavailable=True)
        return options

    async def _wait_ready(self, r: _RayReplica, t0: float) -> tuple[float, float]:
        async def check() -> None:
            code = await r.actor.poll.remote()
            if code is not None:
                raise ReplicaStartError(f"{r.replica_id} exited with code {code} before it was ready; its "
                                        f"log on node {r.node_ip} ends with:\n{await self._log_tail(r)}")

        return await wait_ready(f"http://{r.host}:{r.port}", t0, self.config.poll_interval_s, check)

    async def _log_tail(self, r: _RayReplica) -> str:
        try:
            return str(await asyncio.wait_for(r.actor.log_tail.remote(), 5.0))
        except Exception:  # the actor may be gone with its node; the tail is only a courtesy
            return "(log unavailable: the replica's actor is gone)"

    async def drain(self, replica_id: str) -> None:
        """Stop routing to it, SIGTERM through its actor (it finishes in-flight work), SIGKILL after
        drain_timeout_s, then kill the actor."""
        r = self._begin_drain(replica_id)
        if r is None:
            return
        code: int | None = None
        with contextlib.suppress(Exception):  # an actor lost with its node has nothing left to drain
            await r.actor.send_signal.remote(signal.SIGTERM)
            deadline = time.monotonic() + self.config.drain_timeout_s
            while (code := await r.actor.poll.remote()) is None and time.monotonic() < deadline:
                await asyncio.sleep(self.config.poll_interval_s)
            if code is None:
                self._event(f"{replica_id} did not exit within {self.config.drain_timeout_s} s; killing it")
        await self._kill(r)
        self._replicas.pop(replica_id, None)
        self._event(f"drained {replica_id} (exit code {code})")

    async def _kill(self, r: _RayReplica) -> None:
        import ray
        with contextlib.suppress(Exception):
            await asyncio.wait_for(r.actor.send_signal.remote(signal.SIGKILL), 5.0)
        with contextlib.suppress(Exception):
            ray.kill(r.actor, no_restart=True)  # its process, if still there, dies with it (PDEATHSIG)

    async def _watch(self, r: _RayReplica) -> None:
        from ray.exceptions import RayActorError
        while True:
            await asyncio.sleep(self.config.watch_interval_s)
            if r.role == "draining" or self._closing or r.replica_id not in self._replicas:
                return
            try:
                code = await r.actor.poll.remote()
                why = f"exited unexpectedly (code {code})"
            except RayActorError as exc:
                code, why = -1, f"lost its actor ({type(exc).__name__})"
            if code is None:
                continue
            if r.role == "draining" or self._closing or r.replica_id not in self._replicas:
                return
            role = self._forget_exited(r, why)
            await self._kill(r)
            if self.config.restart_on_exit:
                try:
                    await self.start_replica(role)
                except ReplicaStartError as exc:
                    self._event(f"replacement for {r.replica_id} failed: {exc}")
            return
