"""Shared pieces of the reliability suite: real servers as subprocesses, outcomes, percentiles, RSS (the load
generator is `lean_client`).

Everything runs on 127.0.0.1, every loop is bounded by a deadline, and every process started here is
stopped (SIGTERM, then SIGKILL) when its block exits.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "models"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True, slots=True)
class Proc:
    """A started headroom process."""

    process: subprocess.Popen[bytes]
    url: str  # http://127.0.0.1:PORT
    grpc_target: str  # 127.0.0.1:PORT ("" without gRPC)
    log_path: Path


@contextlib.contextmanager
def headroom(command: str, args: Sequence[str], log_dir: Path, ready_timeout_s: float = 300.0,
             grpc: bool = False, code: Path = ROOT) -> Iterator[Proc]:
    """Run `headroom <command> --http-port/--port P [args]` until ready; SIGTERM (then SIGKILL) on exit.
    `code`: the checkout whose `headroom` package runs (an A/B of two revisions: a `git worktree` of the other)."""
    port, grpc_port = free_port(), free_port() if grpc else -1
    port_flag = "--http-port" if command == "serve" else "--port"
    cmd = [sys.executable, "-m", "headroom.cli.main", command, port_flag, str(port), "--grpc-port", str(grpc_port),
           *args]
    log_path = log_dir / f"{command}-{port}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=code,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    running = Proc(proc, f"http://127.0.0.1:{port}", f"127.0.0.1:{grpc_port}" if grpc else "", log_path)
    try:
        wait_ready(running, ready_timeout_s)
        yield running
    finally:
        stop(proc)


def wait_ready(p: Proc, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if p.process.poll() is not None:
            raise RuntimeError(f"{p.log_path.name} exited with {p.process.returncode}: "
                               f"{p.log_path.read_text(errors='replace')[-3000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(p.url + "/v2/health/ready", timeout=1.0).status_code == 200:
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{p.log_path.name} not ready after {timeout_s} s")
        time.sleep(0.1)


def stop(proc: subprocess.Popen[bytes], grace_s: float = 40.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def rss_mb(pid: int) -> float:
    """Resident set size of a process from /proc (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def children(pid: int) -> list[int]:
    """Direct child processes of `pid` (Linux /proc)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found.extend(int(c) for c in text)
    return found


def cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_text().split("\0")


def percentile_ms(samples_s: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile in milliseconds (None without samples)."""
    if not samples_s:
        return None
    ordered = sorted(samples_s)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1] * 1e3


@dataclass(frozen=True, slots=True)
class Outcome:
    """One request of an open-loop run."""

    intended_s: float  # scheduled send time, seconds from the run's start
    latency_s: float  # from the intended send time (no coordinated omission) to the answer
    status: int  # HTTP status, 0 for a connection error
    error: str = ""  # the exception's type for a connection error, the body's start for another non-200
    lag_s: float = 0.0  # the client's own delay: when it wrote the request, minus the intended send time
    server_timing: str = ""  # the answer's Server-Timing header, where the client kept it
