"""Ray replicas on a REAL two-node Ray cluster on this machine (`ray.cluster_utils.Cluster`: a head node with the
custom resource `node_a`, a worker node with `node_b`, one CPU each, all on 127.0.0.1): the autoscaler drives
the Ray replica manager (a load step scales up through the warm pool, the idle period scales back down);
placement spreads replicas across the nodes, packs them, or pins them with a custom resource; traffic flows
through the router; and losing a node is repaired by a replacement on the surviving node.

Replicas are synthetic (`headroom.router.fake_replica`, starts in about a second) so the test exercises the
placement and the lifecycle, not model loading (tests/router/test_ray_replicas.py runs real `headroom serve`).
"""

from __future__ import annotations

import asyncio
import random
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from headroom.autoscaler.controller import AutoscalerController
from headroom.autoscaler.policy import AutoscalerConfig
from headroom.core.clock import MonotonicClock
from headroom.router.fake_replica import serve_asgi
from headroom.router.load_sample import router_sampler
from headroom.router.proxy import ProxyConfig, Router
from headroom.router.ray_cluster import RayClusterConfig, connect_ray, shutdown_ray
from headroom.router.ray_replicas import RayReplicaConfig, RayReplicaManager

INFER = "/v2/models/m/infer"
MiB = 1024 * 1024


def fake_replica(delay_ms: float) -> Callable[[str, int, int], Sequence[str]]:
    """Runs inside the actor on its node: one synthetic replica on 127.0.0.1:port."""
    def command(_host: str, port: int, _grpc_port: int) -> Sequence[str]:
        return [sys.executable, "-m", "headroom.router.fake_replica", "--port", str(port), "--name", f"p{port}",
                "--delay-ms", str(delay_ms), "--concurrency", "4"]
    return command


class TwoNodes:
    """The running cluster and which custom resource each Ray node id carries."""

    def __init__(self, cluster: Any, worker: Any) -> None:
        import ray
        self.cluster = cluster
        self.worker = worker  # the node_b node (removable)
        self.names = {n["NodeID"]: next(k for k in ("node_a", "node_b") if k in n["Resources"])
                      for n in ray.nodes() if n["Alive"]}  # type: ignore[no-untyped-call]

    def node_names(self, manager: RayReplicaManager) -> list[str]:
        return sorted(self.names[node] for node, ids in manager.placement_by_node().items() for _ in ids)


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[TwoNodes]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # keep Ray on 127.0.0.1 (read at Ray's import)
        from ray.cluster_utils import Cluster

        cluster = Cluster(initialize_head=True, connect=False,
                          head_node_args={"num_cpus": 1, "resources": {"node_a": 1}, "include_dashboard": False,
                                          "object_store_memory": 80 * MiB})
        try:
            worker = cluster.add_node(num_cpus=1, resources={"node_b": 1}, object_store_memory=80 * MiB)
            cluster.wait_for_nodes()
            connect_ray(RayClusterConfig(address=cluster.address))
            try:
                yield TwoNodes(cluster, worker)
            finally:
                shutdown_ray()
        finally:
            cluster.shutdown()  # type: ignore[no-untyped-call]


async def _until(predicate: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def _router() -> Router:
    return Router([], ProxyConfig(policy="round_robin", check_interval_s=0.1, shedding=False), rng=random.Random(0))


@pytest.mark.timeout(180)
async def test_autoscaler_drives_ray_replicas_up_through_the_warm_pool_and_back_down(two_nodes: TwoNodes) -> None:
    router = Router([], ProxyConfig(policy="p2c", check_interval_s=0.1, shedding=False), rng=random.Random(0))
    manager = RayReplicaManager(fake_replica(100.0),
                                RayReplicaConfig(host="127.0.0.1", capacity=2, actor_num_cpus=0.25,
                                                 drain_timeout_s=10.0, start_timeout_s=60.0, id_prefix="auto"),
                                on_change=router.set_upstreams)
    # short windows instead of HPA's 15 s / 300 s, so a load step and an idle period take seconds
    config = AutoscalerConfig(window_s=1.0, scale_up_period_s=1.0, scale_down_stabilisation_s=2.0, cooldown_s=1.0,
                              min_replicas=1, max_replicas=3, warm_pool=1)
    registry = CollectorRegistry()
    controller = AutoscalerController(router_sampler(router), manager, config, MonotonicClock(), initial_replicas=1,
                                      sample_interval_s=0.2, sync_interval_s=0.5, registry=registry)
    try:
        await manager.scale_to(1, 1)  # one serving, one started-but-idle
        assert len(manager.serving()) == 1 and len(manager.warm()) == 1
        warm_id = manager.warm()[0]
        async with serve_asgi(router.app, lifespan="on") as url, \
                httpx.AsyncClient(base_url=url, timeout=30.0) as client:
            await _until(lambda: sum(s.ready for s in router.snapshots()) == 1, "the router to see 1 ready")
            run = asyncio.create_task(controller.run())
            statuses: list[int] = []
            loaded = asyncio.Event()

            async def worker() -> None:  # closed loop: 8 in flight against a capacity of 2 per replica
                while not loaded.is_set():
                    statuses.append((await client.post(INFER, content=b"{}")).status_code)

            workers = [asyncio.create_task(worker()) for _ in range(8)]
            await _until(lambda: len(manager.serving()) == 3, "the load step to scale up to 3 replicas")
            loaded.set()
            await asyncio.gather(*workers)
            assert statuses and set(statuses) == {200}
            await _until(lambda: len(manager.serving()) == 1, "the idle period to scale back down to 1")
            run.cancel()  # its cleanup cancels an actuation in progress
            await asyncio.gather(run, return_exceptions=True)
    finally:
        await controller.close()
        await manager.close()
    ups = [e for e in controller.events if e.to_replicas > e.from_replicas]
    downs = [e for e in controller.events if e.to_replicas < e.from_replicas]
    assert ups and downs and ups[0].time_s < downs[-1].time_s and downs[-1].to_replicas == 1
    # the first step up took the warm replica (no cold start), and the pool was refilled
    assert f"promoted warm replica {warm_id} to serving" in manager.events, manager.events
    assert len(manager.cold_starts) >= 4  # 1 + 1 warm at the start, then more serving / warm replicas
    assert registry.get_sample_value("headroom_autoscaler_scaling_events_total", {"direction": "up"}) == len(ups)
    assert registry.get_sample_value("headroom_autoscaler_scaling_events_total", {"direction": "down"}) == len(downs)
    assert (registry.get_sample_value("headroom_replica_cold_start_seconds_count", {"stage": "scheduled"}) or 0) >= 2


@pytest.mark.timeout(180)
async def test_replicas_spread_pack_or_pin_across_nodes_and_a_lost_node_is_repaired(two_nodes: TwoNodes) -> None:
    router = _router()
    spread = RayReplicaManager(fake_replica(2.0),
                               RayReplicaConfig(host="127.0.0.1", actor_num_cpus=0.5, placement="spread",
                                                drain_timeout_s=10.0, start_timeout_s=60.0, watch_interval_s=0.2,
                                                id_prefix="spread"),
                               on_change=router.set_upstreams)
    pack = RayReplicaManager(fake_replica(2.0), RayReplicaConfig(host="127.0.0.1", actor_num_cpus=0.25,
                                                                 placement="pack", id_prefix="pack"))
    pinned = RayReplicaManager(fake_replica(2.0), RayReplicaConfig(host="127.0.0.1", actor_num_cpus=0.0,
                                                                   actor_resources=(("node_b", 0.25),),
                                                                   placement="spread", id_prefix="pinned"))
    try:
        # spread: one replica per node (1 CPU each, 0.5 per replica)
        await spread.scale_to(2, 0)
        assert two_nodes.node_names(spread) == ["node_a", "node_b"]
        assert {cs.node_id for cs in spread.cold_starts} == set(two_nodes.names)
        # pack: both on the router's node (the head, node_a) while it has room
        await pack.scale_to(2, 0)
        assert two_nodes.node_names(pack) == ["node_a", "node_a"]
        # a custom resource pins replicas to the nodes that offer it, whatever the placement says
        await pinned.scale_to(2, 0)
        assert two_nodes.node_names(pinned) == ["node_b", "node_b"]
        await asyncio.gather(pack.close(), pinned.close())

        async with serve_asgi(router.app, lifespan="on") as url, \
                httpx.AsyncClient(base_url=url, timeout=30.0) as client:
            await _until(lambda: sum(s.ready for s in router.snapshots()) == 2, "the router to see 2 ready")
            answers = [await client.post(INFER, content=b"{}") for _ in range(20)]
            assert [r.status_code for r in answers] == [200] * 20
            by_node = {rid: two_nodes.names[spread.node_id_of(rid)] for rid in (u.replica_id for u in spread.serving())}
            assert {by_node[r.headers["x-headroom-replica"]] for r in answers} == {"node_a", "node_b"}

            # lose node_b (its raylet and workers die): the replica there is replaced on node_a
            lost = next(rid for rid, name in by_node.items() if name == "node_b")
            lost_pid = spread.pid(lost)
            two_nodes.cluster.remove_node(two_nodes.worker)
            await _until(lambda: len(spread.serving()) == 2 and lost not in {u.replica_id for u in spread.serving()},
                         "a replacement for the replica on the lost node")
            assert any(e.startswith(f"{lost} lost its actor") for e in spread.events), spread.events
            assert two_nodes.node_names(spread) == ["node_a", "node_a"]
            assert not Path(f"/proc/{lost_pid}").exists() or _zombie(lost_pid)
            await _until(lambda: sum(s.ready for s in router.snapshots()) == 2, "the router to see the new one")
            answers = [await client.post(INFER, content=b"{}") for _ in range(10)]
            assert [r.status_code for r in answers] == [200] * 10
            assert lost not in {r.headers["x-headroom-replica"] for r in answers}
    finally:
        await asyncio.gather(spread.close(), pack.close(), pinned.close())
    assert spread.serving() == ()


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return True
