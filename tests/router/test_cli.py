"""`headroom route` (headroom.router.cli): help text, bad input, and a full run over fake replicas."""

from __future__ import annotations

import asyncio

import httpx
import typer
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from headroom.autoscaler.policy import AutoscalerConfig
from headroom.router.cli import route, run_cluster, serve_command
from headroom.router.proxy import ProxyConfig
from headroom.router.replicas import ReplicaManagerConfig, free_port
from tests.router.test_replicas import fake_command


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command()(route)
    return app


def test_help_explains_the_options() -> None:
    result = CliRunner().invoke(_app(), ["--help"])
    assert result.exit_code == 0
    for word in ("--replicas", "--policy", "--autoscale", "--warm-pool", "--hedging"):
        assert word in result.output


def test_unknown_policy_says_which_exist() -> None:
    result = CliRunner().invoke(_app(), ["--policy", "fastest"])
    assert result.exit_code == 2 and "peak_ewma" in result.output


def test_serve_command_builds_a_headroom_serve_argv() -> None:
    from pathlib import Path

    argv = list(serve_command(Path("models"), ["noop"], 5.0)(8123, 8124))
    assert argv[1:5] == ["-m", "headroom.cli.main", "serve", "--http-port"] and "8123" in argv
    assert argv[argv.index("--grpc-port") + 1] == "8124"
    assert argv[-2:] == ["--model", "noop"]
    budget = list(serve_command(Path("models"), ["noop"], 5.0, ["--model-memory-budget-mb", "64"])(8123, -1))
    assert budget[-2:] == ["--model-memory-budget-mb", "64"]  # serve --replicas passes these to every replica


async def test_run_cluster_serves_through_the_router_and_drains_on_stop() -> None:
    port = free_port()
    stop = asyncio.Event()
    policy = AutoscalerConfig(min_replicas=2, max_replicas=2, warm_pool=0)  # on, but nothing to scale
    run = asyncio.create_task(run_cluster(fake_command(5.0), 2, ProxyConfig(check_interval_s=0.1),
                                          ReplicaManagerConfig(), "127.0.0.1", port, autoscale=policy, stop=stop))
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            for _ in range(600):  # both replicas started and seen ready by the router
                try:
                    stats = (await client.get("/router/stats")).json()
                    if sum(r["ready"] for r in stats["replicas"]) == 2:
                        break
                except httpx.ConnectError:
                    pass
                await asyncio.sleep(0.05)
            assert (await client.get("/v2/health/ready")).status_code == 200
            r = await client.post("/v2/models/m/infer", content=b"{}")
            assert r.status_code == 200 and r.headers["x-headroom-replica"].startswith("replica-")
            # the fleet on one page: the router's own series and the autoscaler's, parsed as Prometheus does
            for _ in range(600):
                page = {s.name: s.value for f in text_string_to_metric_families((await client.get("/metrics")).text)
                        for s in f.samples}
                if page.get("headroom_autoscaler_actual_replicas") == 2:  # sampled once both are seen ready
                    break
                await asyncio.sleep(0.05)
            assert page["headroom_autoscaler_desired_replicas"] == page["headroom_autoscaler_actual_replicas"] == 2
            assert page["headroom_router_requests_total"] >= 1
    finally:
        stop.set()
        manager = await run
    assert manager.serving() == () and sum(e.startswith("drained") for e in manager.events) == 2


def test_help_explains_the_backends_and_the_ray_options() -> None:
    result = CliRunner().invoke(_app(), ["--help"])
    assert result.exit_code == 0
    for word in ("--backend", "--ray-address", "--placement", "--actor-resource", "--actor-num-cpus", "spread"):
        assert word in result.output


def test_bad_backend_placement_or_resource_say_how_to_fix_them() -> None:
    bad_backend = CliRunner().invoke(_app(), ["--backend", "k8s"])
    assert bad_backend.exit_code == 2 and "'local' or 'ray'" in bad_backend.output
    bad_placement = CliRunner().invoke(_app(), ["--backend", "ray", "--placement", "scatter"])
    assert bad_placement.exit_code == 2 and "spread, pack, default" in bad_placement.output
    bad_resource = CliRunner().invoke(_app(), ["--backend", "ray", "--actor-resource", "gpu_node=lots"])
    assert bad_resource.exit_code == 2 and "must be a number" in bad_resource.output
    no_name = CliRunner().invoke(_app(), ["--backend", "ray", "--actor-resource", "=1"])
    assert no_name.exit_code == 2 and "NAME=AMOUNT" in no_name.output
