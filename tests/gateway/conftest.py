"""Fixtures: a temp model repository, API keys, and a real server behind the gateway in a subprocess."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from headroom.gateway.auth import create_key
from tests.server.conftest import build_test_repository
from tests.support.server import free_port


@dataclass
class GatewayServer:
    """A running gateway server subprocess."""

    process: subprocess.Popen[bytes]
    port: int
    log_path: Path
    spans_path: Path
    keys: dict[str, str]  # role/tenant label -> plaintext key
    scheme: str = "http"

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def spans(self) -> list[dict[str, Any]]:
        if not self.spans_path.exists():
            return []
        return [json.loads(line) for line in self.spans_path.read_text().splitlines() if line]

    def auth(self, who: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[who]}"}


def start_gateway_server(
    tmp: Path, cfg: dict[str, Any], keys: dict[str, str], verify: Any = True, scheme: str = "http"
) -> GatewayServer:
    port = free_port()
    log_path, spans_path = tmp / f"gateway-{port}.log", tmp / f"spans-{port}.jsonl"
    cfg = {**cfg, "port": port, "spans_file": str(spans_path)}
    cfg_path = tmp / f"gateway-{port}.json"
    cfg_path.write_text(json.dumps(cfg))
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.gateway.gateway_server", str(cfg_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    server = GatewayServer(proc, port, log_path, spans_path, keys, scheme)
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"gateway server exited with {proc.returncode}:\n{server.log()}")
        try:
            if httpx.get(server.url + "/v2/health/ready", timeout=1.0, verify=verify).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            stop(server)
            raise RuntimeError(f"gateway server not ready after 120 s:\n{server.log()}")
        time.sleep(0.1)


def stop(server: GatewayServer) -> None:
    if server.process.poll() is None:
        server.process.send_signal(signal.SIGTERM)
        try:
            server.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait()


@pytest.fixture(scope="package")
def gateway_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_test_repository(tmp_path_factory.mktemp("gw-repo"))


@pytest.fixture(scope="package")
def keyed_server(gateway_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayServer]:
    """Auth on; tenants `noisy` and `quiet` get 1 request/s with a burst of 5; `main` is unlimited."""
    tmp = tmp_path_factory.mktemp("gw")
    keys_file = tmp / "keys.yaml"
    keys = {
        "admin": create_key(keys_file, "main", "admin", "ops"),
        "user": create_key(keys_file, "main", "user", "app"),
        "noisy": create_key(keys_file, "noisy", "user"),
        "quiet": create_key(keys_file, "quiet", "user"),
    }
    cfg = {
        "repo": str(gateway_repo),
        "keys_file": str(keys_file),
        "rate": {"requests_per_s": 1.0, "request_burst": 5.0},
        "tenant_rates": {"main": {}},
        "limits": {
            "body_timeout_s": 5.0,
            "body_grace_s": 1.0,
            "min_body_rate_bytes_per_s": 100.0,
            "max_json_depth": 16,
        },
        "cors_origins": ["http://dashboard.example"],
    }
    server = start_gateway_server(tmp, cfg, keys)
    try:
        yield server
    finally:
        stop(server)
