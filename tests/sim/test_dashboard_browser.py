"""The dashboard in a real headless Chromium: load a preset deep link, let the page press Simulate, read
the numbers from the rendered DOM and take a screenshot. Needs a Chromium binary (Debian:
`apt-get install chromium-headless-shell`, which `make test` does); without one the test fails and says so."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from starlette.applications import Starlette

from headroom.dashboard.routes import dashboard_routes

CHROMIUM = next((p for p in (shutil.which(n) for n in ("chromium-headless-shell", "chromium", "chromium-browser",
                                                        "google-chrome")) if p), None)


@pytest.fixture(scope="module", autouse=True)
def _chromium_present() -> None:
    if CHROMIUM is None:
        pytest.fail("no Chromium binary on PATH: run `apt-get install chromium-headless-shell` (make test does)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(Starlette(routes=dashboard_routes()), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


def _chromium(*args: str) -> str:
    assert CHROMIUM is not None
    out = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                          "--virtual-time-budget=30000", *args], capture_output=True, text=True, timeout=120,
                         check=True)
    return out.stdout


def _metric(dom: str, element_id: str) -> str:
    m = re.search(rf'id="{element_id}"[^>]*>([^<]*)<', dom)
    assert m is not None, element_id
    return m.group(1)


def test_presets_run_in_chromium(base_url: str, tmp_path: Path) -> None:
    static = _chromium("--dump-dom", f"{base_url}/dashboard?preset=static_30qps")
    cont = _chromium("--dump-dom", f"{base_url}/dashboard?preset=continuous_30qps")
    for dom in (static, cont):
        assert 'data-state="done"' in dom
        assert dom.count("<rect") >= 10  # the histogram was drawn
    p99_static, p99_cont = _metric(static, "m-p99"), _metric(cont, "m-p99")

    def seconds(text: str) -> float:
        value, unit = text.split()
        return float(value) / (1000 if unit == "ms" else 1)

    assert seconds(p99_cont) < seconds(p99_static)
    assert int(_metric(cont, "m-done").replace(",", "")) > 4000
    # Continuous batching reports per-token latencies (p50 / p90 / p99); static batching of whole requests not.
    ttft = [seconds(v) for v in _metric(cont, "m-ttft").split(" / ")]
    tpot = [seconds(v) for v in _metric(cont, "m-tpot").split(" / ")]
    assert len(ttft) == 3 and 0 < ttft[0] <= ttft[1] <= ttft[2] and 0 < tpot[0] <= tpot[2] < ttft[2]
    assert _metric(static, "m-ttft") == "–"
    # Served without a registry (no `headroom serve` behind it), the live section stays hidden.
    assert re.search(r'<section id="live"[^>]*hidden', static)
    shot = tmp_path / "dashboard.png"
    _chromium(f"--screenshot={shot}", "--window-size=1280,900", f"{base_url}/dashboard?preset=autoscale_25qps")
    assert shot.stat().st_size > 10_000
