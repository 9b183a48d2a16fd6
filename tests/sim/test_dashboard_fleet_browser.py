"""The fleet view in a real headless Chromium against a real router in front of two replicas: traffic flows,
the page polls /dashboard/api/fleet and renders one row and one chart line per replica."""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import subprocess

import httpx
import pytest

from headroom.router.fake_replica import ReplicaBehaviour, make_app, serve_asgi
from headroom.router.proxy import ProxyConfig, Router
from headroom.router.upstream import Upstream
from tests.sim.test_dashboard_live_browser import CHROMIUM


def _dom(url: str) -> str:
    if CHROMIUM is None:
        pytest.fail("no Chromium binary on PATH: run `apt-get install chromium-headless-shell` (make test does)")
    out = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                          "--virtual-time-budget=6000", "--dump-dom", url], capture_output=True, text=True,
                         timeout=120, check=True)
    return out.stdout


async def test_the_fleet_view_shows_each_replica() -> None:
    reps = [ReplicaBehaviour(name="r1"), ReplicaBehaviour(name="r2", delay_ms=20.0)]
    async with serve_asgi(make_app(reps[0])) as u1, serve_asgi(make_app(reps[1])) as u2:
        router = Router([Upstream("r1", u1), Upstream("r2", u2)], ProxyConfig(policy="round_robin"),
                        rng=random.Random(0))
        async with serve_asgi(router.app, lifespan="on") as url, httpx.AsyncClient(base_url=url) as client:
            async def traffic() -> None:
                while True:
                    await client.post("/v2/models/m/infer", content=b"{}")
                    await asyncio.sleep(0.02)

            task = asyncio.create_task(traffic())
            try:
                dom = await asyncio.to_thread(_dom, f"{url}/dashboard")
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
    assert 'data-fleet="on"' in dom, dom[-2000:]
    assert '<section id="fleet" aria-label="fleet">' in dom  # shown, not hidden, behind a router
    for name in ("r1", "r2"):
        assert re.search(rf"<td>{name}</td><td>ready</td><td>[0-9.]+</td>", dom), dom[-3000:]
        assert f'data-series="{name}"' in dom and f'data-series="{name} p99"' in dom
    assert "2 of 2 replica(s) ready" in dom
