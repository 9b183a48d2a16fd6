"""`headroom rollout start` driving a real `headroom route` whose replicas are real `headroom serve` processes.

The repository holds model `m` at version 1 (y = 2x, the one its config serves) and at versions 2 (y = 3x, good)
and 3 (fails every request, bad). The router starts one v1 replica from the repository as it is. `headroom
rollout start --version V` (the CLI, as a user types it) makes the router pin a copy of the repository to V
(`pinned_repository`: `version_policy: {specific: [V]}`), start a `headroom serve` on it (`serve_command`, the
route CLI's `canary_command`), and shift traffic while a client keeps sending requests. Version 2 is promoted:
every answer is then 3x and the v1 replica is gone. Version 3 is rolled back: its replica is torn down and every
answer is 2x again."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from headroom.cli.main import app
from headroom.router.replicas import free_port

MODEL = """
import numpy as np

class Scale:
    def predict(self, inputs):
        if {factor} == 0 and np.any(inputs["x"]):  # loads and warms up (zeros), fails every real request
            raise RuntimeError("version {version} is broken")
        return {{"y": inputs["x"] * {factor}}}
"""


def _repository(root: Path) -> Path:
    model = root / "m"
    model.mkdir(parents=True)
    (model / "config.yaml").write_text(textwrap.dedent("""
        backend: python
        max_batch_size: 8
        inputs: [{name: x, datatype: FP32, shape: [1]}]
        outputs: [{name: y, datatype: FP32, shape: [1]}]
        dynamic_batching: {max_queue_delay_ms: 1}
        version_policy: {specific: [1]}
    """))
    for version, factor in (("1", 2), ("2", 3), ("3", 0)):
        (model / version).mkdir()
        (model / version / "model.py").write_text(MODEL.format(factor=factor, version=version))
    return root


@pytest.fixture
def routed(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    cmd = [sys.executable, "-m", "headroom.cli.main", "route", "--model-repository",
           str(_repository(tmp_path / "repo")), "--model", "m", "--replicas", "1", "--port", str(port),
           "--grpc-port", "-1", "--policy", "round_robin",
           "--trusted-backends", "python,onnxruntime,torch,llm", "--drain-timeout-s", "2"]
    log = (tmp_path / "route.log").open("wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/v2/health/ready", timeout=2.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                raise RuntimeError((tmp_path / "route.log").read_text()[-3000:])
            time.sleep(0.2)
        else:
            raise RuntimeError("the router never became ready: " + (tmp_path / "route.log").read_text()[-3000:])
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        log.close()


def _answer(url: str) -> float | int:
    r = httpx.post(url + "/v2/models/m/infer", timeout=30.0,
                   json={"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}]})
    return float(r.json()["outputs"][0]["data"][0]) if r.status_code == 200 else r.status_code


def _rollout(url: str, version: str) -> tuple[int, str, dict[str, int]]:
    """Run `headroom rollout start` (it waits for the end) while a client keeps the router busy."""
    seen: dict[str, int] = {}
    done = threading.Event()

    def client() -> None:
        while not done.is_set():
            key = str(_answer(url))
            seen[key] = seen.get(key, 0) + 1

    load = threading.Thread(target=client)
    load.start()
    try:
        result = CliRunner().invoke(app, ["rollout", "start", "--router", url, "--model", "m", "--version", version,
                                          "--steps", "50,100", "--step-duration-s", "0", "--min-requests", "10",
                                          "--max-error-rate", "0.05", "--max-p99-ratio", "50"])
    finally:
        done.set()
        load.join()
    return result.exit_code, result.output, seen


@pytest.mark.timeout(300)
def test_a_good_version_is_promoted_through_the_cli(routed: str) -> None:
    assert _answer(routed) == 2.0
    code, output, seen = _rollout(routed, "2")
    assert code == 0 and "phase complete" in output, output
    assert seen.get("3.0", 0) >= 10 and seen.get("2.0", 0) > 0, seen  # both versions answered meanwhile
    assert {_answer(routed) for _ in range(8)} == {3.0}  # only the new version is left
    replicas = httpx.get(routed + "/router/stats", timeout=10.0).json()["replicas"]
    assert len(replicas) == 1 and replicas[0]["version"] == "2", replicas
    status = CliRunner().invoke(app, ["rollout", "status", "--router", routed])
    assert status.exit_code == 0 and "phase complete" in status.output


@pytest.mark.timeout(300)
def test_a_bad_version_is_rolled_back_and_torn_down_through_the_cli(routed: str) -> None:
    code, output, seen = _rollout(routed, "3")
    assert "phase rolled_back" in output, output
    assert code != 0  # the CLI says it did not roll out
    assert seen.get("500", 0) >= 1, seen  # the broken version was measured...
    assert {_answer(routed) for _ in range(8)} == {2.0}  # ...and only v1 answers again
    replicas = httpx.get(routed + "/router/stats", timeout=10.0).json()["replicas"]
    assert [r["version"] for r in replicas] == [""], replicas  # the v3 replica is gone
