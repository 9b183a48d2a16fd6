"""A real `headroom serve`: the model's threads (batch worker, onnxruntime's pool) run below the event loop."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import httpx
import pytest

from tests.support.server import run_server

REPO = Path(__file__).resolve().parents[2] / "models"

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's")


def _threads(pid: int) -> dict[int, tuple[int, int]]:
    """tid -> (nice, user+system CPU ticks) from /proc."""
    out: dict[int, tuple[int, int]] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2:].split()
        out[int(tid)] = (int(fields[16]), int(fields[11]) + int(fields[12]))
    return out


def _busy_after_requests(runtime_override: str, repo_src: Path, tmp: Path) -> tuple[int, dict[int, tuple[int, int]]]:
    repo = tmp / "repo"
    (repo / "minilm").mkdir(parents=True)
    (repo / "minilm" / "1").symlink_to((repo_src / "minilm" / "1").resolve())
    config = (repo_src / "minilm" / "config.yaml").read_text()
    (repo / "minilm" / "config.yaml").write_text(config + runtime_override)
    with run_server(repo, tmp, ["--model", "minilm", "--grpc-port", "-1"]) as srv:
        with httpx.Client(timeout=30.0) as client:
            for i in range(150):
                body = {"model": "minilm", "input": [f"sentence number {i} about priorities"] * 8}
                client.post(srv.url + "/v1/embeddings", json=body).raise_for_status()
        return srv.process.pid, _threads(srv.process.pid)


def test_model_threads_run_at_the_configured_nice_and_the_loop_does_not(tmp_path: Path) -> None:
    pid, threads = _busy_after_requests("", REPO, tmp_path)
    loop_nice, _ = threads[pid]  # the main thread runs the event loop
    assert loop_nice == 0
    workers = sorted(((ticks, nice) for tid, (nice, ticks) in threads.items() if tid != pid), reverse=True)
    # the two busiest threads besides the loop are the batch worker and onnxruntime's intra-op thread
    assert [nice for _, nice in workers[:2]] == [10, 10], workers


def test_compute_nice_zero_keeps_every_thread_at_the_loops_priority(tmp_path: Path) -> None:
    _, threads = _busy_after_requests("runtime: {compute_nice: 0}\n", REPO, tmp_path)
    assert {nice for nice, _ in threads.values()} == {0}
