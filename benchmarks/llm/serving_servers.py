"""The servers that run_llm_serving_bench.py compares: how each is started (command line, port, readiness
path, metrics URL), waited for and stopped, and headroom's model repository with overridden parameters."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml
from rich.console import Console

from headroom.llm.offline import DEFAULT_MODEL
from headroom.llm.weights import resolve_model_path

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
HEADROOM = str(Path(PY).with_name("headroom"))
PEERS = Path.home() / ".cache" / "headroom" / "peers"
SERVERS = ("headroom", "headroom-alt", "hf-one", "hf-static", "llama")
console = Console(stderr=True)


@dataclass(frozen=True, slots=True)
class Server:
    """One server under test."""

    name: str  # headroom | hf-one | hf-static | llama
    cmd: list[str]  # how to start it
    url: str  # base URL
    ready_path: str  # polled until 200
    metrics_url: str  # scraped by headroom bench ("none" = no /metrics)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def find_llama_server(given: str) -> Path | None:
    """--llama-server, $LLAMA_SERVER, or a build under ~/.cache/headroom/peers; adds missing .so.0 symlinks."""
    candidates = [given, os.environ.get("LLAMA_SERVER", ""), str(PEERS / "llama-server")]
    candidates += [str(p) for p in sorted(PEERS.glob("**/bin/llama-server"))]
    for c in candidates:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            binary = Path(c).resolve()
            for lib in binary.parent.glob("*.so"):
                link = lib.with_name(lib.name + ".0")
                if not link.exists():
                    link.symlink_to(lib.name)
            return binary
    return None


def servers(args: argparse.Namespace, llama: Path | None) -> list[Server]:
    out: list[Server] = []
    for name in args.servers.split(","):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        if name in ("headroom", "headroom-alt"):
            cmd = [
                HEADROOM,
                "serve",
                "--model-repository",
                str(args.headroom_repo if name == "headroom" else args.headroom_alt_repo),
                "--model",
                "smollm2",
                "--http-port",
                str(port),
                "--grpc-port",
                "-1",
                "--no-access-log",
                "--log-level",
                "warning",
            ]
            out.append(Server(name, cmd, url, "/v2/health/ready", ""))
        elif name in ("hf-one", "hf-static"):
            cmd = [
                PY,
                str(ROOT / "benchmarks/llm/hf_openai_baseline.py"),
                "--port",
                str(port),
                "--mode",
                name.removeprefix("hf-"),
                "--max-batch",
                "32",
                "--threads",
                str(args.threads),
            ]
            out.append(Server(name, cmd, url, "/health", "none"))
        elif name == "llama":
            if llama is None:
                console.print(
                    "[yellow]llama-server not found: skipped.[/yellow] Build it (see this script's docstring) and "
                    "pass --llama-server PATH."
                )
                continue
            gguf = str(resolve_model_path(DEFAULT_MODEL))
            cmd = [
                str(llama),
                "-m",
                gguf,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--parallel",
                "32",
                "-c",  # 32 slots, each holding the longest prompt of any level plus its answer
                str(32 * (max(args.prompt_tokens, args.long_prompt_tokens) + args.max_tokens + 64)),
                "-t",
                str(args.llama_threads or args.threads),
                "--metrics",
                "--alias",
                "smollm2",
            ]
            out.append(Server(name, cmd, url, "/health", ""))
        else:
            raise SystemExit(f"unknown server {name!r}: choose from {', '.join(SERVERS)}")
    return out


def parse_settings(text: str) -> dict[str, str]:
    """`key=value,key=value` -> dict (values stay strings: the engine's config parser converts them)."""
    pairs = [item.split("=", 1) for item in text.split(",") if item.strip()]
    if any(len(p) != 2 for p in pairs):
        raise SystemExit(f"--headroom-alt-set {text!r}: expected key=value[,key=value...]")
    return {k.strip(): v.strip() for k, v in pairs}


def headroom_repository(
    dest: Path, weight_dtype: str, threads: int, extra: dict[str, str] | None = None
) -> dict[str, str | int]:
    """A model repository at `dest` holding models/smollm2/config.yaml with `weight_dtype` / `num_threads`
    overridden (empty / -1 = keep the file's value) and any `extra` parameters; returns the parameters
    overridden."""
    src = ROOT / "models" / "smollm2" / "config.yaml"
    cfg = yaml.safe_load(src.read_text())
    overrides: dict[str, str | int] = {}
    if weight_dtype:
        overrides["weight_dtype"] = weight_dtype
    if threads >= 0:
        overrides["num_threads"] = threads
    overrides.update(extra or {})
    cfg.setdefault("parameters", {}).update(overrides)
    (dest / "smollm2").mkdir(parents=True, exist_ok=True)
    (dest / "smollm2" / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return overrides


def start(server: Server, log_dir: Path) -> subprocess.Popen[bytes]:
    log = (log_dir / f"{server.name}.log").open("wb")
    return subprocess.Popen(server.cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT)


def wait_ready(server: Server, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{server.name} exited with {proc.returncode}: see its log")
        try:
            if httpx.get(server.url + server.ready_path, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    raise SystemExit(f"{server.name} not ready after {timeout_s:.0f} s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
