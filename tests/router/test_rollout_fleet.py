"""Rollouts that deploy: a good and a bad new version driven to completion through a real router, with the new
version's replicas started (and torn down) by the local replica manager as separate processes."""

from __future__ import annotations

import asyncio
import contextlib
import random
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

import httpx
import pytest
import yaml
from typer.testing import CliRunner

from headroom.cli.main import app
from headroom.router.fake_replica import serve_asgi
from headroom.router.proxy import ProxyConfig, Router
from headroom.router.replicas import LocalReplicaManager, ReplicaFleet, ReplicaManagerConfig
from headroom.router.rollout_api import rollout_routes
from headroom.router.rollout_fleet import RolloutFleet, RolloutSpec, pinned_repository
from headroom.router.upstream import Upstream

OnChange = Callable[[tuple[Upstream, ...]], None]


def _fake(name: str, *extra: str) -> Callable[[int, int], Sequence[str]]:
    return lambda port, _grpc: [sys.executable, "-m", "headroom.router.fake_replica", "--port", str(port),
                                "--name", name, "--delay-ms", "2", *extra]


@contextlib.asynccontextmanager
async def rollout_router(bad: bool, tmp: Path) -> AsyncIterator[tuple[RolloutFleet, httpx.AsyncClient, str]]:
    router = Router([], ProxyConfig(policy="round_robin", check_interval_s=0.05, shedding=False),
                    rng=random.Random(0))
    cfg = ReplicaManagerConfig(log_dir=tmp, drain_timeout_s=5.0, start_timeout_s=60.0)

    def make_canary(spec: RolloutSpec, on_change: OnChange) -> ReplicaFleet:
        extra = ("--fail-status", "500") if bad else ()
        return LocalReplicaManager(_fake(f"v{spec.version}", *extra), ReplicaManagerConfig(
            log_dir=tmp, drain_timeout_s=5.0, id_prefix=f"v{spec.version}"), on_change)

    fleet = RolloutFleet(lambda on_change: LocalReplicaManager(_fake("v1"), cfg, on_change), router, make_canary,
                         poll_s=0.05)
    router.app.router.routes[0:0] = rollout_routes(fleet)
    async with contextlib.AsyncExitStack() as stack:
        url = await stack.enter_async_context(serve_asgi(router.app, lifespan="on"))
        await fleet.scale_to(2, 0)
        stack.push_async_callback(fleet.close)
        client = await stack.enter_async_context(httpx.AsyncClient(base_url=url, timeout=10.0))
        yield fleet, client, url


async def _drive(client: httpx.AsyncClient, until: Callable[[], bool], limit: int = 4000) -> dict[str, int]:
    """Send inferences until `until()` holds (bounded); count answers by replica name / status."""
    seen: dict[str, int] = {}
    for _ in range(limit):
        if until():
            return seen
        r = await client.post("/v2/models/m/infer", content=b"{}")
        key = r.json().get("replica", "?") if r.status_code == 200 else str(r.status_code)
        seen[key] = seen.get(key, 0) + 1
    raise AssertionError(f"rollout did not finish after {limit} requests: {seen}")


ROLLOUT = {"model": "m", "version": "2", "replicas": 1, "steps": [25, 50, 100], "step_duration_s": 0,
           "min_requests": 10, "max_error_rate": 0.05, "max_p99_ratio": 50}


@pytest.mark.timeout(180)
async def test_a_good_version_is_promoted_and_the_old_replicas_drain(tmp_path: Path) -> None:
    async with rollout_router(bad=False, tmp=tmp_path) as (fleet, client, url):
        old_ids = {u.replica_id for u in fleet.serving()}
        assert (await client.post("/router/rollout", json=ROLLOUT)).status_code == 202
        again = await client.post("/router/rollout", json=ROLLOUT)
        assert again.status_code == 409  # one rollout at a time
        seen = await _drive(client, lambda: fleet.status()["phase"] in ("complete", "rolled_back", "failed"))
        doc = (await client.get("/router/rollout")).json()
        assert doc["phase"] == "complete", doc
        assert seen.get("v2", 0) >= 10 and seen.get("v1", 0) > 0  # both versions served during the rollout
        assert {u.version for u in fleet.serving()} == {"2"} and not old_ids & {u.replica_id for u in
                                                                                 fleet.serving()}
        assert fleet.router.canary is None
        for _ in range(6):
            assert (await client.post("/v2/models/m/infer", content=b"{}")).json()["replica"] == "v2"
        assert any("rollout_promoted" in e for e in fleet.events)
        status = await asyncio.to_thread(CliRunner().invoke, app, ["rollout", "status", "--router", url])
        assert status.exit_code == 0 and "phase complete" in status.output


@pytest.mark.timeout(180)
async def test_a_bad_version_is_rolled_back_and_torn_down(tmp_path: Path) -> None:
    async with rollout_router(bad=True, tmp=tmp_path) as (fleet, client, _):
        old_ids = {u.replica_id for u in fleet.serving()}
        assert (await client.post("/router/rollout", json=ROLLOUT)).status_code == 202
        seen = await _drive(client, lambda: fleet.status()["phase"] in ("complete", "rolled_back", "failed"))
        doc = fleet.status()
        assert doc["phase"] == "rolled_back" and "error" in doc["detail"], doc
        # the canary's failures were measured (min_requests, or the 5 in a row that eject it)...
        assert seen.get("500", 0) >= 5
        assert {u.replica_id for u in fleet.serving()} == old_ids  # ...and its replicas are gone
        for _ in range(6):
            assert (await client.post("/v2/models/m/infer", content=b"{}")).json()["replica"] == "v1"
        assert any("rollout_rolled_back" in e for e in fleet.events)


async def test_bad_rollout_requests_are_refused(tmp_path: Path) -> None:
    router = Router([], ProxyConfig())
    fleet = RolloutFleet(lambda on_change: LocalReplicaManager(_fake("v1"), ReplicaManagerConfig(log_dir=tmp_path),
                                                               on_change), router, make_canary=None)
    router.app.router.routes[0:0] = rollout_routes(fleet)
    async with serve_asgi(router.app) as url, httpx.AsyncClient(base_url=url) as client:
        assert (await client.post("/router/rollout", json={**ROLLOUT, "verison": "2"})).status_code == 400
        assert (await client.post("/router/rollout", json={**ROLLOUT, "steps": [50, 25]})).status_code == 400
        assert (await client.post("/router/rollout", json={**ROLLOUT, "version": "two"})).status_code == 400
        assert (await client.post("/router/rollout", json=ROLLOUT)).status_code == 409  # no replica manager
        assert (await client.get("/router/rollout")).json()["phase"] == "idle"


def test_pinned_repository_serves_one_model_at_the_new_version(tmp_path: Path) -> None:
    src = tmp_path / "models"
    for model, versions in (("a", ("1", "2")), ("b", ("1",))):
        for v in versions:
            (src / model / v).mkdir(parents=True)
        (src / model / "config.yaml").write_text("backend: python\nmax_batch_size: 4\n")
    out = pinned_repository(src, "a", "2", tmp_path / "pinned")
    assert yaml.safe_load((out / "a" / "config.yaml").read_text())["version_policy"] == {"specific": [2]}
    assert (out / "b").resolve() == (src / "b").resolve() and (out / "a" / "1").is_dir()
    with pytest.raises(ValueError, match="does not exist"):
        pinned_repository(src, "b", "7", tmp_path / "other")


def test_pinned_repository_of_the_real_minilm_parses_and_serves_only_that_version(tmp_path: Path) -> None:
    from headroom.models.config import load_model_config

    root = Path(__file__).resolve().parents[2] / "models"
    out = pinned_repository(root, "minilm", "1", tmp_path / "pinned")
    cfg = load_model_config(out / "minilm")
    assert cfg.version_policy.select((1, 2, 3)) == (1,)
