"""Replicas as Ray actors on a REAL local Ray cluster (127.0.0.1), with the router in front: placement, cold-start
stages, traffic over both replicas, a drain that loses nothing, and a kill -9 that the manager repairs;
`run_ray_cluster` end to end; and `headroom route --backend ray` as a real process (its own local cluster)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import orjson
import pytest
import typer
from typer.testing import CliRunner

from headroom.router.fake_replica import serve_asgi
from headroom.router.proxy import ProxyConfig, Router
from headroom.router.ray_cli import route_ray, run_ray_cluster
from headroom.router.ray_cluster import RayClusterConfig, connect_ray, ray_serve_command, shutdown_ray
from headroom.router.ray_replicas import RayReplicaConfig, RayReplicaManager
from headroom.router.replicas import free_port
from tests.server.conftest import build_test_repository
from tests.support.server import TRUST_PYTHON

INFER = "/v2/models/echo/infer"


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    connect_ray(RayClusterConfig(num_cpus=2))  # a local cluster bound to 127.0.0.1, no dashboard
    try:
        yield
    finally:
        shutdown_ray()


def test_ray_serve_command_binds_the_given_host_and_ports() -> None:
    argv = list(ray_serve_command(Path("models"), ["noop"], 5.0)("10.0.0.7", 8123, -1))
    assert argv[1:4] == ["-m", "headroom.cli.main", "serve"]
    assert argv[argv.index("--host") + 1] == "10.0.0.7" and argv[argv.index("--http-port") + 1] == "8123"
    assert argv[argv.index("--grpc-port") + 1] == "-1" and argv[-2:] == ["--model", "noop"]


def _body(i: int) -> bytes:
    return orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [i, i + 1]}]})


def _doubled(r: httpx.Response, i: int) -> bool:
    if r.status_code != 200:
        return False
    y = next(o for o in r.json()["outputs"] if o["name"] == "y")
    return [float(v) for v in y["data"]] == [2.0 * i, 2.0 * (i + 1)]


async def _load(client: httpx.AsyncClient, n: int, concurrency: int) -> list[httpx.Response]:
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> httpx.Response:
        async with sem:
            return await client.post(INFER, content=_body(i), headers={"content-type": "application/json"})

    return list(await asyncio.gather(*(one(i) for i in range(n))))


def _gone(pid: int) -> bool:
    """The process no longer runs (absent, or a zombie nobody reaped: its parent, the actor, is dead)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return True


async def _until(predicate: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


@pytest.mark.timeout(180)
async def test_ray_actor_replicas_behind_the_router(ray_cluster: None, tmp_path: Path) -> None:
    repo = build_test_repository(tmp_path / "repo")
    router = Router([], ProxyConfig(policy="round_robin", check_interval_s=0.1, shedding=False),
                    rng=random.Random(0))
    manager = RayReplicaManager(ray_serve_command(repo, ["echo"], 15.0, TRUST_PYTHON),
                                RayReplicaConfig(host="127.0.0.1", drain_timeout_s=20.0, start_timeout_s=120.0,
                                                 watch_interval_s=0.2),
                                on_change=router.set_upstreams)
    try:
        async with serve_asgi(router.app, lifespan="on") as url, \
                httpx.AsyncClient(base_url=url, timeout=30.0) as client:
            # two actors, each with one `headroom serve` on its node, timed stage by stage
            await manager.scale_to(2, 0)
            serving = manager.serving()
            assert len(serving) == 2 and len(manager.cold_starts) == 2
            import ray  # the cluster's one node: its address as Ray reports it (127.0.0.1 unless Ray was
            node_ips = {n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}  # imported earlier elsewhere)
            for cs in manager.cold_starts:
                assert cs.node_ip in node_ips
                assert 0 <= cs.scheduled_s <= cs.spawn_s <= cs.listening_s <= cs.ready_s
            assert all(u.base_url.startswith("http://127.0.0.1:") for u in serving)
            await _until(lambda: sum(s.ready for s in router.snapshots()) == 2, "the router to see 2 ready")

            # every request succeeds and both replicas serve some
            responses = await _load(client, 40, 4)
            assert all(_doubled(r, i) for i, r in enumerate(responses))
            assert {r.headers["x-headroom-replica"] for r in responses} == {u.replica_id for u in serving}

            # scale to 1 in the middle of a load: the drained replica finishes what it holds, nothing is lost
            load = asyncio.create_task(_load(client, 80, 4))
            await _until(lambda: router.counters["requests"] >= 60, "the load to start")
            await manager.scale_to(1, 0)
            responses = await load
            assert [r.status_code for r in responses] == [200] * 80
            assert all(_doubled(r, i) for i, r in enumerate(responses))
            assert len(manager.serving()) == 1
            assert sum(e.startswith("drained") and "exit code 0" in e for e in manager.events) == 1

            # kill -9 the last replica's process: the watcher notices and places a replacement actor
            survivor = manager.serving()[0].replica_id
            os.kill(manager.pid(survivor), signal.SIGKILL)
            await _until(lambda: [u.replica_id for u in manager.serving()] not in ([], [survivor]),
                         "a replacement replica")
            assert any(e.startswith(f"{survivor} exited unexpectedly") for e in manager.events)
            await _until(lambda: sum(s.ready for s in router.snapshots()) == 1, "the router to see the new one")
            r = await client.post(INFER, content=_body(3), headers={"content-type": "application/json"})
            assert _doubled(r, 3) and r.headers["x-headroom-replica"] != survivor

            # its actor killed (a lost worker or node): the process dies with it and the replica is replaced
            second = manager.serving()[0].replica_id
            pid = manager.pid(second)
            tail = await manager.log_tail(second)
            assert tail != "(no log)" and not tail.startswith("(log unavailable"), tail
            import ray  # only now: imported before connect_ray, Ray would bind the network address, not loopback

            ray.kill(manager.actor_of(second), no_restart=True)
            await _until(lambda: [u.replica_id for u in manager.serving()] not in ([], [second]),
                         "a replacement for the killed actor")
            assert any(e.startswith(f"{second} lost its actor") for e in manager.events)
            assert _gone(pid)
            await _until(lambda: sum(s.ready for s in router.snapshots()) == 1, "the router to see the third")
            r = await client.post(INFER, content=_body(4), headers={"content-type": "application/json"})
            assert _doubled(r, 4)
    finally:
        await manager.close()
    assert manager.serving() == () and len(manager.cold_starts) == 4


def test_deprecated_route_ray_still_explains_its_options_and_points_to_route() -> None:
    app = typer.Typer()
    app.command()(route_ray)
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0
    for word in ("--ray-address", "--actor-num-cpus", "--replica-host", "--replicas", "--policy", "DEPRECATED"):
        assert word in result.output
    bad = CliRunner().invoke(app, ["--policy", "fastest"])
    assert bad.exit_code == 2 and "peak_ewma" in bad.output and "route --backend ray" in bad.output


@pytest.mark.timeout(180)
async def test_headroom_route_backend_ray_serves_and_drains_on_ctrl_c(tmp_path: Path) -> None:
    repo = build_test_repository(tmp_path / "repo")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "headroom.cli.main", "route", "--backend", "ray", "--replicas", "1",
                             "--port", str(port), "--grpc-port", "-1", "--model-repository", str(repo), "--model",
                             "echo", "--ray-num-cpus", "1", "--policy", "p2c", "--drain-timeout-s", "5", *TRUST_PYTHON],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30.0) as client:
            ready = False
            for _ in range(2400):
                if proc.poll() is not None:
                    break
                with contextlib.suppress(httpx.TransportError):
                    ready = (await client.get("/v2/health/ready")).status_code == 200
                if ready:
                    break
                await asyncio.sleep(0.05)
            assert ready, proc.stdout.read().decode() if proc.poll() is not None and proc.stdout else "not ready"
            r = await client.post(INFER, content=_body(6), headers={"content-type": "application/json"})
            assert _doubled(r, 6) and r.headers["x-headroom-replica"] == "ray-replica-1"
            replica_url = (await client.get("/router/stats")).json()["replicas"][0]["url"]
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C: the router stops, drains its replica, stops the Ray cluster
        out, _ = await asyncio.to_thread(proc.communicate, timeout=90)
    text = out.decode()
    assert proc.returncode == 0, text
    assert "ray-replica-1 on node 127.0.0.1" in text and "router ready" in text
    assert "stopped: drained 1 replica(s)" in text, text
    async with httpx.AsyncClient(timeout=5.0) as client:
        with pytest.raises(httpx.ConnectError):  # the replica process is gone with its actor
            await client.get(replica_url + "/v2/health/live")


@pytest.mark.timeout(120)
async def test_run_ray_cluster_serves_and_drains_on_stop(ray_cluster: None, tmp_path: Path) -> None:
    repo = build_test_repository(tmp_path / "repo")
    port = free_port()
    stop = asyncio.Event()
    run = asyncio.create_task(run_ray_cluster(ray_serve_command(repo, ["echo"], 10.0, TRUST_PYTHON), 1,
                                              ProxyConfig(check_interval_s=0.1), RayReplicaConfig(host="127.0.0.1"),
                                              "127.0.0.1", port, stop=stop))
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30.0) as client:
            async def one_ready() -> bool:
                try:
                    stats = (await client.get("/router/stats")).json()
                except httpx.ConnectError:
                    return False
                return bool(sum(r["ready"] for r in stats["replicas"]) == 1)
            for _ in range(1200):
                if run.done() or await one_ready():
                    break
                await asyncio.sleep(0.05)
            r = await client.post(INFER, content=_body(5), headers={"content-type": "application/json"})
            assert _doubled(r, 5) and r.headers["x-headroom-replica"] == "ray-replica-1"
    finally:
        stop.set()
        manager = await asyncio.wait_for(run, 60.0)
    assert manager.serving() == () and any(e.startswith("drained ray-replica-1") for e in manager.events)
