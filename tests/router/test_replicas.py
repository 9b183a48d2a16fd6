"""The local-process replica manager with the router in front: cold starts, kill -9, drain, warm pool."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import sys
from collections.abc import AsyncIterator, Sequence

import httpx
import orjson
import pytest

from headroom.router.fake_replica import serve_asgi
from headroom.router.proxy import ProxyConfig, Router
from headroom.router.replicas import CommandFactory, LocalReplicaManager, ReplicaManagerConfig, ReplicaStartError
from tests.support.waiting import until

INFER = "/v2/models/m/infer"


def fake_command(delay_ms: float, ready_after_s: float = 0.0) -> CommandFactory:
    def command(port: int, grpc_port: int) -> Sequence[str]:  # the fake replica has no gRPC
        return [sys.executable, "-m", "headroom.router.fake_replica", "--port", str(port), "--delay-ms",
                str(delay_ms), "--ready-after-s", str(ready_after_s)]
    return command


@contextlib.asynccontextmanager
async def cluster(delay_ms: float, ready_after_s: float = 0.0, policy: str = "p2c",
                  ) -> AsyncIterator[tuple[LocalReplicaManager, Router, httpx.AsyncClient]]:
    router = Router([], ProxyConfig(policy=policy, check_interval_s=0.1, shedding=False), rng=random.Random(0))
    manager = LocalReplicaManager(fake_command(delay_ms, ready_after_s),
                                  ReplicaManagerConfig(drain_timeout_s=10.0, start_timeout_s=60.0),
                                  on_change=router.set_upstreams)
    try:
        async with serve_asgi(router.app, lifespan="on") as url, httpx.AsyncClient(base_url=url,
                                                                                   timeout=10.0) as client:
            yield manager, router, client
    finally:
        await manager.close()


async def wait_ready(router: Router, n: int) -> None:
    for _ in range(300):
        if sum(s.ready for s in router.snapshots()) == n:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"router never saw {n} ready replicas: {router.snapshots()}")


def _clear(r: httpx.Response) -> bool:
    """A result, or an error that says what happened (JSON with a reason)."""
    if r.status_code == 200:
        return True
    return isinstance(r.json().get("reason"), str)


async def test_cold_start_is_timed_by_stage_and_replicas_join_when_ready() -> None:
    async with cluster(delay_ms=5.0, ready_after_s=0.3) as (manager, router, client):
        await manager.scale_to(2, 0)
        assert len(manager.serving()) == 2 and len(manager.cold_starts) == 2
        for cs in manager.cold_starts:
            assert 0 <= cs.spawn_s <= cs.listening_s <= cs.ready_s and cs.ready_s >= 0.3
        await wait_ready(router, 2)
        r = await client.post(INFER, content=b"{}")
        assert r.status_code == 200


async def test_kill_9_under_load_loses_no_accepted_request() -> None:
    async with cluster(delay_ms=30.0) as (manager, router, client):
        await manager.scale_to(3, 0)
        await wait_ready(router, 3)
        victim = manager.serving()[0].replica_id
        pid = manager.pid(victim)
        sem = asyncio.Semaphore(6)
        done = 0

        async def one(i: int) -> httpx.Response:
            nonlocal done
            async with sem:
                r = await client.post(INFER, content=orjson.dumps({"i": i}))
                done += 1
                if done == 40:
                    os.kill(pid, signal.SIGKILL)
                return r

        responses = await asyncio.gather(*(one(i) for i in range(160)))
        assert all(_clear(r) for r in responses)
        ok = sum(r.status_code == 200 for r in responses)
        assert ok >= 160 - 6  # at most the requests in flight on the victim fail (502, "may have run")
        assert all(r.headers["x-headroom-replica"] != victim for r in responses[100:] if r.status_code == 200)
        for _ in range(300):  # the manager replaces the dead replica
            if len(manager.serving()) == 3:
                break
            await asyncio.sleep(0.05)
        assert len(manager.serving()) == 3 and victim not in {u.replica_id for u in manager.serving()}
        assert any("exited unexpectedly" in e for e in manager.events)


async def test_scaling_down_drains_without_losing_requests() -> None:
    async with cluster(delay_ms=40.0) as (manager, router, client):
        await manager.scale_to(2, 0)
        await wait_ready(router, 2)
        sem = asyncio.Semaphore(4)

        answered: list[int] = []

        async def one(i: int) -> httpx.Response:
            async with sem:
                r = await client.post(INFER, content=orjson.dumps({"i": i}))
                answered.append(r.status_code)
                return r

        load = asyncio.gather(*(one(i) for i in range(80)))
        await until(lambda: len(answered) >= 10, "the load to be under way")
        await manager.scale_to(1, 0)  # SIGTERM one replica mid-load
        responses = await load
        assert [r.status_code for r in responses] == [200] * 80
        assert any(e.startswith("drained") and "exit code 0" in e for e in manager.events)


async def test_warm_pool_replicas_are_promoted_first() -> None:
    async with cluster(delay_ms=5.0) as (manager, router, client):
        await manager.scale_to(1, 1)
        warm = manager.warm()
        assert len(manager.serving()) == 1 and len(warm) == 1
        await wait_ready(router, 1)
        await manager.scale_to(2, 1)
        assert warm[0] in {u.replica_id for u in manager.serving()}
        assert len(manager.warm()) == 1 and manager.warm() != warm
        assert any(e.startswith(f"promoted warm replica {warm[0]}") for e in manager.events)
        await wait_ready(router, 2)
        served_by = {(await client.post(INFER, content=b"{}")).headers["x-headroom-replica"] for _ in range(10)}
        assert warm[0] in served_by


async def test_a_replica_that_exits_while_starting_is_reported_with_its_log() -> None:
    def command(port: int, grpc_port: int) -> Sequence[str]:
        return [sys.executable, "-c", "import sys; print('no model here'); sys.exit(3)"]

    manager = LocalReplicaManager(command, ReplicaManagerConfig(start_timeout_s=60.0))
    try:
        with pytest.raises(ReplicaStartError, match=r"exited with code 3 before it was ready") as caught:
            await manager.start_replica()
        assert "no model here" in str(caught.value)
        assert manager.serving() == ()
    finally:
        await manager.close()


async def test_a_replica_not_ready_in_time_is_killed_and_reported() -> None:
    manager = LocalReplicaManager(fake_command(0.0, ready_after_s=60.0), ReplicaManagerConfig(start_timeout_s=0.5))
    try:
        with pytest.raises(ReplicaStartError, match=r"was not ready within 0\.5 s"):
            await manager.start_replica()
        assert manager.serving() == () and manager.warm() == ()
    finally:
        await manager.close()
