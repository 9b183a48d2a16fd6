"""Tail at Scale's tied requests end to end: a real `headroom route --config router.yaml` (API keys on, policy
round_robin, `tied: true`) in front of two real `headroom serve` replicas of a slow model. The replicas tell the
router when a copy starts executing (headroom.server.tied), and the router cancels its twin at once:

* a copy that starts on an idle replica within the tie delay: its twin is never sent (`tied_unsent`);
* a copy stuck in a busy replica's queue: the twin on the idle replica starts, the queued copy is withdrawn
  (`tied_withdrawn`) and leaves its queue, so it never runs there even after that replica frees up.

Every request runs exactly once (the model logs each tag with its process id), and the start notices reach
the router without an API key (their single-use tag is the credential)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from benchmarks.reliability.common import stop as stop_process
from tests.gateway.test_prefix_isolation_e2e import _create_key
from tests.router.test_tenant_forwarding_e2e import _metric
from tests.support.server import TRUST_PYTHON, free_port
from tests.support.waiting import until, until_async, until_sync

SLOW = """
import os
import time
import numpy as np

class Slow:
    def load(self, context):
        self.seen = context.version_dir / "seen.txt"

    def predict(self, inputs):
        with open(self.seen, "a") as f:
            f.write("".join(f"{int(t)} {os.getpid()}\\n" for t in inputs["tag"].reshape(-1)))
        time.sleep(float(inputs["delay_ms"].max()) / 1000.0)
        return {"tag_out": inputs["tag"]}
"""


def _repo(root: Path) -> Path:
    (root / "slowtied" / "1").mkdir(parents=True)
    (root / "slowtied" / "config.yaml").write_text(textwrap.dedent("""
        backend: python
        max_batch_size: 1
        inputs: [{name: delay_ms, datatype: FP32, shape: [1]}, {name: tag, datatype: INT64, shape: [1]}]
        outputs: [{name: tag_out, datatype: INT64, shape: [1]}]
        dynamic_batching: {max_queue_delay_ms: 0, max_queue_size: 32, default_timeout_ms: 300000}
        warmup: {batch_sizes: []}
    """))
    (root / "slowtied" / "1" / "model.py").write_text(textwrap.dedent(SLOW))
    return root


def _runs(repo: Path) -> list[tuple[int, int]]:
    """(tag, pid) of every execution so far (tag 0: each replica's warmup, not a request)."""
    path = repo / "slowtied" / "1" / "seen.txt"
    lines = path.read_text().splitlines() if path.exists() else []
    return [(int(t), int(p)) for t, p in (line.split() for line in lines) if int(t) != 0]


@pytest.fixture(scope="module")
def tied_router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Path]]:
    tmp = tmp_path_factory.mktemp("tied")
    repo = _repo(tmp / "repo")
    keys_file = tmp / "keys.yaml"
    key = _create_key(keys_file, "tenant-a")
    config = tmp / "router.yaml"
    config.write_text(yaml.safe_dump({
        "fleet": {"replicas": 2, "model_repository": str(repo), "models": ["slowtied"], "drain_timeout_s": 5},
        # a tie delay long enough that an idle replica's notice always beats it on a busy CI machine
        "router": {"policy": "round_robin", "tied": True, "tied_delay_s": 0.3,
                   "hedge_budget": {"budget_fraction": 1.0, "max_tokens": 10, "initial_tokens": 10}},
    }))
    port = free_port()
    log_path = tmp / "route.log"
    cmd = [sys.executable, "-m", "headroom.cli.main", "route", "--config", str(config), "--port", str(port),
           "--grpc-port", "-1", "--api-keys-file", str(keys_file), *TRUST_PYTHON]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        def ready() -> bool:
            assert proc.poll() is None, f"router exited:\n{log_path.read_text(errors='replace')}"
            try:
                return _metric(url, "headroom_router_replicas", state="ready") == 2
            except httpx.HTTPError:
                return False

        until_sync(ready, "both replicas ready behind the router", timeout_s=240.0)
        yield url, key, repo
    finally:
        stop_process(proc, grace_s=30.0)


def _body(delay_ms: float, tag: int) -> dict[str, object]:
    return {"inputs": [{"name": "delay_ms", "datatype": "FP32", "shape": [1, 1], "data": [delay_ms]},
                       {"name": "tag", "datatype": "INT64", "shape": [1, 1], "data": [tag]}]}


async def _counters(client: httpx.AsyncClient) -> dict[str, int]:
    r = await client.get("/router/stats")
    assert r.status_code == 200, r.text
    return dict(r.json()["counters"])


async def test_a_started_copy_cancels_its_twin_and_every_request_runs_once(
        tied_router: tuple[str, str, Path]) -> None:
    url, key, repo = tied_router
    auth = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=url, headers=auth, timeout=60.0) as client:
        before = await _counters(client)
        # 1: runs 3 s on replica A, which starts it at once: its twin is never sent
        long_req = asyncio.create_task(client.post("/v2/models/slowtied/infer", json=_body(3000.0, 1)))
        await until(lambda: any(t == 1 for t, _ in _runs(repo)), "request 1 to start")
        busy_pid = next(p for t, p in _runs(repo) if t == 1)
        # 2: round robin's next replica, B, idle: starts at once, twin never sent
        r2 = await client.post("/v2/models/slowtied/infer", json=_body(10.0, 2))
        assert r2.status_code == 200, r2.text
        # 3: round robin's next is A again, busy with 1: the copy queues there; the twin on B starts after the
        # tie delay, and A's queued copy is withdrawn (long before request 1 frees A)
        t0 = time.monotonic()
        r3 = await client.post("/v2/models/slowtied/infer", json=_body(10.0, 3))
        took_s = time.monotonic() - t0
        assert r3.status_code == 200, r3.text
        assert r3.headers["x-headroom-replica"] == r2.headers["x-headroom-replica"]
        assert took_s < 2.0, took_s
        r1 = await long_req
        assert r1.status_code == 200, r1.text
        assert r1.headers["x-headroom-replica"] != r3.headers["x-headroom-replica"]
        after = await _counters(client)
        # A is free now: had its copy of 3 stayed queued, it would have run by the time 1 was answered
        runs = _runs(repo)
        assert sorted(t for t, _ in runs) == [1, 2, 3], runs
        assert all(p != busy_pid for t, p in runs if t in (2, 3)), runs
        delta = {k: after[k] - before.get(k, 0) for k in ("tied", "tied_unsent", "tied_withdrawn", "requests")}
        assert delta == {"tied": 1, "tied_unsent": 2, "tied_withdrawn": 1, "requests": 3}, delta
    assert _metric(url, "headroom_router_events_total", event="tied_withdrawn") >= 1


async def test_tied_requests_under_concurrent_load_each_get_their_own_answer(
        tied_router: tuple[str, str, Path]) -> None:
    url, key, repo = tied_router
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60.0) as c:
        tags = list(range(100, 116))
        answers = await asyncio.gather(*(c.post("/v2/models/slowtied/infer", json=_body(30.0, t)) for t in tags))
        for tag, r in zip(tags, answers, strict=True):
            assert r.status_code == 200, r.text
            assert r.json()["outputs"][0]["data"] == [tag]

        async def settled() -> bool:  # no copy of these left running anywhere
            return (await c.get("/router/stats")).json()["inflight"] == 0

        await until_async(settled, "the router to have nothing in flight")
    ran = [t for t, _ in _runs(repo) if t >= 100]
    assert set(ran) == set(tags)  # every request ran (at least once; a twin that started too may also have)
