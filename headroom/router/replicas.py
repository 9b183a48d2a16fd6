"""Local-process replicas: start N `headroom serve` processes on free ports, keep a warm pool, drain, restart.

`LocalReplicaManager` implements the `Actuator` protocol the autoscaler controller drives. Each replica is a
subprocess built by a command factory (port -> argv). A start is timed stage by stage (`ColdStart`: spawn,
listening, ready); a replica joins the router (`on_change`) only once `GET /v2/health/ready` answers 200.
Draining removes it from the router first, then sends SIGTERM (the replica reports not-ready, finishes what it
holds and exits) and SIGKILLs it after `drain_timeout_s`. A replica that exits on its own is replaced.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import httpx

from headroom.autoscaler.actuator import Actuator, ColdStartTiming
from headroom.router.upstream import Upstream

log = logging.getLogger("headroom.replicas")

#: (HTTP port, gRPC port or -1 when the manager runs replicas without gRPC) -> argv of one replica process
CommandFactory = Callable[[int, int], Sequence[str]]


class ReplicaFleet(Actuator, Protocol):
    """A replica manager behind `headroom route` (local processes or Ray actors)."""

    def serving(self) -> tuple[Upstream, ...]:
        """The replicas currently receiving traffic."""
        ...

    @property
    def cold_starts(self) -> Sequence[ColdStartTiming]:
        """Every finished start, in order."""
        ...

    @property
    def events(self) -> list[str]:
        """Human-readable lifecycle events (started, promoted, drained, exited unexpectedly, ...)."""
        ...

    async def close(self) -> None:
        """Drain every replica and stop background work."""
        ...


@dataclass(frozen=True, slots=True)
class ScalePlan:
    """What to do to reach a target fleet (shared by the local and the Ray replica managers)."""

    promote: tuple[str, ...]  # warm replicas that start serving (cheapest way up: no cold start)
    start_serving: int  # new replicas to start for serving
    start_warm: int  # new replicas to start for the warm pool
    drain: tuple[str, ...]  # replicas (serving or warm) to drain and stop


def plan_scale(serving: Sequence[str], warm: Sequence[str], replicas: int, warm_pool: int) -> ScalePlan:
    """Promote warm replicas first, start what is still missing, drain the surplus (newest ids last)."""
    promote = tuple(warm[: max(0, replicas - len(serving))])
    now_serving = [*serving, *promote]
    still_warm = list(warm[len(promote):])
    return ScalePlan(
        promote=promote,
        start_serving=max(0, replicas - len(now_serving)),
        start_warm=max(0, warm_pool - len(still_warm)),
        drain=(*now_serving[replicas:], *still_warm[warm_pool:]),
    )


@dataclass(frozen=True, slots=True)
class ColdStart:
    """How long one replica took to become useful, stage by stage (seconds from spawn)."""

    replica_id: str  # which replica
    spawn_s: float  # until the OS process existed
    listening_s: float  # until /v2/health/live answered (imports done, port bound)
    ready_s: float  # until /v2/health/ready answered 200 (models loaded and warmed)


@dataclass(frozen=True, slots=True)
class ReplicaManagerConfig:
    """Process management knobs."""

    host: str = "127.0.0.1"  # replicas bind here (loopback only by default)
    capacity: int = 8  # per-replica capacity reported to the router (shedding / overload threshold)
    start_timeout_s: float = 300.0  # a replica not ready by then is killed and reported
    drain_timeout_s: float = 30.0  # SIGTERM grace before SIGKILL (Kubernetes terminationGracePeriodSeconds 30)
    poll_interval_s: float = 0.05  # readiness polling period while starting
    restart_on_exit: bool = True  # replace a replica that exits without being asked to
    log_dir: Path | None = None  # per-replica stderr/stdout logs (default: a temporary directory)
    id_prefix: str = "replica"  # replica ids are f"{id_prefix}-{n}" (unique per manager: one prefix each)
    grpc: bool = False  # give each replica a gRPC port too (the router's gRPC side forwards to it)


class ReplicaStartError(RuntimeError):
    """A replica exited or timed out before becoming ready; the message carries its log tail."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


async def wait_ready(base: str, t0: float, poll_interval_s: float,
                     check: Callable[[], Awaitable[None]]) -> tuple[float, float]:
    """Poll a starting replica's health at `base` until ready: (seconds from `t0` to listening, to ready).

    `check` runs before each probe and gives up by raising ReplicaStartError (the replica exited, or a deadline
    passed); without that this waits for ever.
    """
    listening_s: float | None = None
    async with httpx.AsyncClient(timeout=1.0) as client:
        while True:
            await check()
            with contextlib.suppress(httpx.HTTPError):
                if listening_s is None:
                    await client.get(base + "/v2/health/live")
                    listening_s = time.monotonic() - t0
                if (await client.get(base + "/v2/health/ready")).status_code == 200:
                    return listening_s, time.monotonic() - t0
            await asyncio.sleep(poll_interval_s)


class _Replica:
    def __init__(self, replica_id: str, port: int, grpc_port: int, proc: asyncio.subprocess.Process,
                 log_path: Path, role: str) -> None:
        self.replica_id = replica_id
        self.port = port
        self.grpc_port = grpc_port
        self.proc = proc
        self.log_path = log_path
        self.role = role  # starting | warm | serving | draining
        self.target_role = role  # what it becomes once ready


class _RoleRecord(Protocol):
    replica_id: str
    role: str  # starting | warm | serving | draining
    target_role: str  # what it becomes once ready


R = TypeVar("R", bound=_RoleRecord)


class ScalingFleet(Generic[R]):
    """What local and Ray replica managers share: the warm pool and scaling mechanics around `plan_scale`.

    Subclasses set `_replicas`, `_lock`, `events` and `on_change` in `__init__` and implement `serving`,
    `start_replica` and `drain`.
    """

    _replicas: dict[str, R]
    _lock: asyncio.Lock
    events: list[str]  # human-readable scaling history (also logged)
    on_change: Callable[[tuple[Upstream, ...]], None] | None  # the router's replica table setter
    _tasks: set[asyncio.Task[None]]  # the watchers this fleet owns
    _closing: bool

    def serving(self) -> tuple[Upstream, ...]:
        raise NotImplementedError

    async def start_replica(self, role: str = "serving") -> str:
        raise NotImplementedError

    async def drain(self, replica_id: str) -> None:
        raise NotImplementedError

    def warm(self) -> tuple[str, ...]:
        return tuple(r.replica_id for r in self._replicas.values() if r.role == "warm")

    def _event(self, text: str) -> None:
        log.info(text)
        self.events.append(text)

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change(self.serving())

    def _begin_drain(self, replica_id: str) -> R | None:
        """Mark the replica draining and stop routing to it; None when it is gone or already draining."""
        r = self._replicas.get(replica_id)
        if r is None or r.role == "draining":
            return None
        was_serving = r.role == "serving"
        r.role = "draining"
        if was_serving:
            self._changed()
        return r

    def _forget_exited(self, r: R, why: str) -> str:
        """Drop replica `r`, which ended by itself (`why`), and stop routing to it; returns the role it had."""
        role = r.role
        self._replicas.pop(r.replica_id, None)
        self._event(f"{r.replica_id} {why} while {role}")
        if role == "serving":
            self._changed()
        return role

    def _spawn_task(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -------------------------------------------------------------------------------------- lifecycle

    async def scale_to(self, replicas: int, warm_pool: int) -> None:
        """Promote warm replicas first, start the rest, drain extras; returns when all of it is done."""
        if replicas < 0 or warm_pool < 0:
            raise ValueError("replicas and warm_pool must be >= 0")
        async with self._lock:
            plan = plan_scale([r.replica_id for r in self._replicas.values() if r.role == "serving"],
                              [r.replica_id for r in self._replicas.values() if r.role == "warm"],
                              replicas, warm_pool)
            for rid in plan.promote:
                r = self._replicas[rid]
                r.role = r.target_role = "serving"
                self._event(f"promoted warm replica {rid} to serving")
            self._changed()
            jobs: list[Coroutine[Any, Any, object]] = [self.start_replica("serving") for _ in range(plan.start_serving)]
            jobs += [self.start_replica("warm") for _ in range(plan.start_warm)]
            jobs += [self.drain(rid) for rid in plan.drain]
            results = await asyncio.gather(*jobs, return_exceptions=True)
        errors = [e for e in results if isinstance(e, BaseException)]
        if errors:
            raise errors[0]

    async def restart(self, replica_id: str) -> str:
        """Start a replacement with the same role, then drain the old one (no capacity dip)."""
        old = self._replicas[replica_id]
        new = await self.start_replica("warm" if old.role == "warm" else "serving")
        await self.drain(replica_id)
        return new

    async def close(self) -> None:
        """Drain every replica (in parallel; each drain ends its process) and stop the watchers."""
        self._closing = True
        await asyncio.gather(*(self.drain(rid) for rid in list(self._replicas)), return_exceptions=True)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


class LocalReplicaManager(ScalingFleet[_Replica]):
    """Replicas as local subprocesses. Methods must run on one event loop; `close()` drains everything."""

    def __init__(self, command: CommandFactory, config: ReplicaManagerConfig | None = None,
                 on_change: Callable[[tuple[Upstream, ...]], None] | None = None) -> None:
        self.command = command
        self.config = config or ReplicaManagerConfig()
        self.on_change = on_change
        self.cold_starts: list[ColdStart] = []
        self.events: list[str] = []
        self._replicas: dict[str, _Replica] = {}
        self._seq = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False
        self._lock = asyncio.Lock()
        self._log_dir = self.config.log_dir or Path(tempfile.mkdtemp(prefix="headroom-replicas-"))

    # ---------------------------------------------------------------------------------------- queries

    def serving(self) -> tuple[Upstream, ...]:
        host = self.config.host
        return tuple(Upstream(r.replica_id, f"http://{host}:{r.port}", self.config.capacity,
                              grpc_target=f"{host}:{r.grpc_port}" if r.grpc_port >= 0 else "")
                     for r in self._replicas.values() if r.role == "serving")

    def pid(self, replica_id: str) -> int:
        return self._replicas[replica_id].proc.pid

    async def start_replica(self, role: str = "serving") -> str:
        """Spawn one replica, wait until it is ready, then give it `role` ("serving" or "warm")."""
        self._seq += 1
        rid = f"{self.config.id_prefix}-{self._seq}"
        port = free_port(self.config.host)
        grpc_port = free_port(self.config.host) if self.config.grpc else -1
        log_path = self._log_dir / f"{rid}.log"
        t0 = time.monotonic()
        with log_path.open("wb") as log_file:
            proc = await asyncio.create_subprocess_exec(*self.command(port, grpc_port), stdout=log_file,
                                                        stderr=log_file, start_new_session=True)
        spawn_s = time.monotonic() - t0
        r = _Replica(rid, port, grpc_port, proc, log_path, "starting")
        r.target_role = role
        self._replicas[rid] = r
        self._spawn_task(self._watch(r))
        try:
            listening_s, ready_s = await self._wait_ready(r, t0)
        except BaseException:
            await self._kill(r)
            self._replicas.pop(rid, None)
            raise
        self.cold_starts.append(ColdStart(rid, spawn_s, listening_s, ready_s))
        r.role = r.target_role
        self._event(f"started {rid} on port {port} as {r.role} (ready after {ready_s:.2f} s)")
        if r.role == "serving":
            self._changed()
        return rid

    async def _wait_ready(self, r: _Replica, t0: float) -> tuple[float, float]:
        async def check() -> None:
            if time.monotonic() - t0 >= self.config.start_timeout_s:
                raise ReplicaStartError(f"{r.replica_id} was not ready within {self.config.start_timeout_s} s "
                                        f"(raise start_timeout_s for slow model loads); log tail:\n{self._tail(r)}")
            if r.proc.returncode is not None:
                raise ReplicaStartError(f"{r.replica_id} exited with code {r.proc.returncode} before it was "
                                        f"ready; its log ({r.log_path}) ends with:\n{self._tail(r)}")

        return await wait_ready(f"http://{self.config.host}:{r.port}", t0, self.config.poll_interval_s, check)

    @staticmethod
    def _tail(r: _Replica, lines: int = 20) -> str:
        try:
            return "\n".join(r.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    async def drain(self, replica_id: str) -> None:
        """Stop routing to it, SIGTERM (it finishes in-flight work), SIGKILL after drain_timeout_s."""
        r = self._begin_drain(replica_id)
        if r is None:
            return
        if r.proc.returncode is None:
            r.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(r.proc.wait(), self.config.drain_timeout_s)
            except TimeoutError:
                self._event(f"{replica_id} did not exit within {self.config.drain_timeout_s} s; killing it")
                await self._kill(r)
        self._replicas.pop(replica_id, None)
        self._event(f"drained {replica_id} (exit code {r.proc.returncode})")

    async def _kill(self, r: _Replica) -> None:
        if r.proc.returncode is None:
            r.proc.kill()
            await r.proc.wait()

    async def _watch(self, r: _Replica) -> None:
        code = await r.proc.wait()
        if r.role in ("draining", "starting") or self._closing or r.replica_id not in self._replicas:
            return
        role = self._forget_exited(r, f"exited unexpectedly (code {code})")
        if self.config.restart_on_exit:
            with contextlib.suppress(ReplicaStartError):
                await self.start_replica(role)
