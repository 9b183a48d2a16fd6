"""`headroom rollout start` on `headroom route --backend ray`: the same rollouts as
tests/router/test_rollout_cli_e2e.py, with every replica (the stable one and each new version's) a `headroom serve`
inside a Ray actor on a real local Ray cluster that the router starts. A bad version (3) is rolled back and its
actor torn down; then a good one (2) is promoted and the v1 actor retired."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from headroom.router.replicas import free_port
from tests.router.test_rollout_cli_e2e import _answer, _repository, _rollout


@pytest.fixture
def routed_on_ray(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    cmd = [sys.executable, "-m", "headroom.cli.main", "route", "--backend", "ray", "--ray-num-cpus", "2",
           "--actor-num-cpus", "0.5", "--model-repository", str(_repository(tmp_path / "repo")), "--model", "m",
           "--replicas", "1", "--port", str(port), "--grpc-port", "-1", "--policy", "round_robin",
           "--trusted-backends", "python,onnxruntime,torch,llm", "--drain-timeout-s", "2"]
    log_path = tmp_path / "route.log"
    log = log_path.open("wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:  # bounded poll: the Ray cluster starts, then the actor's replica loads
            try:
                if httpx.get(url + "/v2/health/ready", timeout=2.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the router never became ready: " + log_path.read_text()[-3000:])
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=120)
        log.close()


def _replicas(url: str) -> list[tuple[str, str]]:
    """(id, version) of the router's replicas (Ray-managed ones are named ray-replica-...)."""
    return [(r["id"], r["version"]) for r in httpx.get(url + "/router/stats", timeout=10.0).json()["replicas"]]


@pytest.mark.timeout(600)
def test_rollouts_on_ray_actors_roll_back_a_bad_version_and_promote_a_good_one(routed_on_ray: str) -> None:
    url = routed_on_ray
    assert _answer(url) == 2.0
    assert _replicas(url) == [("ray-replica-1", "")]
    code, output, seen = _rollout(url, "3")
    assert code != 0 and "phase rolled_back" in output, output
    assert seen.get("500", 0) >= 1, seen  # the broken version ran in its actor and was measured
    assert {_answer(url) for _ in range(8)} == {2.0}
    assert _replicas(url) == [("ray-replica-1", "")]  # the v3 actor is gone
    code, output, seen = _rollout(url, "2")
    assert code == 0 and "phase complete" in output, output
    assert seen.get("3.0", 0) >= 10 and seen.get("2.0", 0) > 0, seen
    assert {_answer(url) for _ in range(8)} == {3.0}
    ((rid, version),) = _replicas(url)  # the v1 actor was retired
    assert rid.startswith("ray-replica-v2") and version == "2", rid
