"""Start a real `headroom serve` process on 127.0.0.1 for end-to-end tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from benchmarks.reliability.common import stop as stop_process  # SIGTERM, then SIGKILL after grace_s

#: `headroom serve` flags for a repository of python-backend test models (refused under the default allowlist).
TRUST_PYTHON = ("--trusted-backends", "onnxruntime,torch,llm,python")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RunningServer:
    process: subprocess.Popen[bytes]
    http_port: int
    grpc_port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def http_target(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.process.poll() is None


@contextmanager
def run_server(repo: Path, tmp: Path, args: Sequence[str] = (), ready_timeout_s: float = 240.0,
               wait_ready: bool = True, module: str = "headroom.cli.main") -> Iterator[RunningServer]:
    """Run `headroom serve` on free ports until the block exits; fails with the server log on trouble.
    `module`: what `python -m` runs (tests.support.faulty_serve adds test-only fault hooks)."""
    http_port, grpc_port = free_port(), free_port()
    log_path = tmp / f"server-{http_port}.log"
    cmd = [sys.executable, "-m", module, "serve", "--model-repository", str(repo),
           "--http-port", str(http_port), "--grpc-port", str(grpc_port), *args]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    server = RunningServer(proc, http_port, grpc_port, log_path)
    try:
        deadline = time.monotonic() + ready_timeout_s
        path = "/v2/health/ready" if wait_ready else "/v2/health/live"
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}:\n{server.log()}")
            try:
                if httpx.get(server.url + path, timeout=1.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"server not ready after {ready_timeout_s}s:\n{server.log()}")
            time.sleep(0.1)
        yield server
    finally:
        stop_process(proc, grace_s=20.0)
