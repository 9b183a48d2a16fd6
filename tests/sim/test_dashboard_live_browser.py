"""The live dashboard in a real headless Chromium against a real `headroom serve` (cheap Python-backend
models): send requests, open /dashboard, let the page poll /dashboard/api/live, read the rendered rate and
charts from the DOM, take a screenshot. Needs a Chromium binary (`apt-get install chromium-headless-shell`,
which `make test` does); without one the test fails and says so."""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import build_test_repository
from tests.support.server import TRUST_PYTHON, RunningServer, run_server

CHROMIUM = next((p for p in (shutil.which(n) for n in ("chromium-headless-shell", "chromium", "chromium-browser",
                                                        "google-chrome")) if p), None)
ECHO_REQUEST = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1.0, 2.0]}]}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    if CHROMIUM is None:
        pytest.fail("no Chromium binary on PATH: run `apt-get install chromium-headless-shell` (make test does)")
    repo = build_test_repository(tmp_path_factory.mktemp("repo"))
    with run_server(repo, tmp_path_factory.mktemp("logs"), ["--grpc-port", "-1", *TRUST_PYTHON]) as running:
        yield running


@pytest.fixture
def traffic(server: RunningServer) -> Iterator[list[int]]:
    """Requests to `echo` from a thread for as long as the test runs; yields the status codes seen."""
    stop = threading.Event()
    statuses: list[int] = []

    def send() -> None:
        with httpx.Client(base_url=server.url, timeout=10.0) as client:
            while not stop.is_set():
                statuses.append(client.post("/v2/models/echo/infer", json=ECHO_REQUEST).status_code)
                stop.wait(0.05)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    while not statuses:  # at least one request served before the page opens
        stop.wait(0.05)
    yield statuses
    stop.set()
    thread.join(timeout=15)


def _chromium(*args: str) -> str:
    assert CHROMIUM is not None
    out = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                          "--virtual-time-budget=6000", *args], capture_output=True, text=True, timeout=120,
                         check=True)
    return out.stdout


def test_live_charts_show_the_servers_traffic(server: RunningServer, traffic: list[int], tmp_path: Path) -> None:
    dom = _chromium("--dump-dom", f"{server.url}/dashboard")
    assert 'data-live="on"' in dom, dom[-2000:]
    rate = re.search(r'id="live-rate"[^>]*>([^<]*)<', dom)
    assert rate is not None
    assert float(rate.group(1)) > 0
    assert '<section id="live" aria-label="live server">' in dom  # shown (not hidden) on a real server
    assert '<section id="fleet" aria-label="fleet" hidden' in dom  # no router in front: no fleet view
    for series in ("echo", "echo p99"):  # the rate and latency charts drew a line for the model
        assert f'data-series="{series}"' in dom
    assert re.search(r"<td>echo</td><td>tensor</td><td>[0-9.]+</td>", dom)
    assert set(traffic) == {200}
    shot = tmp_path / "live.png"
    _chromium(f"--screenshot={shot}", "--window-size=1280,1100", f"{server.url}/dashboard")
    assert shot.stat().st_size > 10_000
