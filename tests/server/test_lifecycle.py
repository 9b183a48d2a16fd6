"""Lifecycle: readiness gates on loading, SIGTERM drains in-flight work, bad repositories fail clearly."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.server.conftest import build_test_repository
from tests.support.server import TRUST_PYTHON, run_server
from tests.support.waiting import until_sync

MODELS = Path(__file__).resolve().parents[2] / "models"


def test_sigterm_reports_not_ready_and_finishes_in_flight_requests(test_repo: Path, tmp_path: Path) -> None:
    with run_server(test_repo, tmp_path, ["--model", "slow", "--grpc-port", "-1", *TRUST_PYTHON]) as srv:
        results: list[httpx.Response] = []
        body = {"inputs": [{"name": "delay_ms", "datatype": "FP32", "shape": [1, 1], "data": [800]},
                           {"name": "tag", "datatype": "INT64", "shape": [1, 1], "data": [900]}]}

        def call() -> None:
            results.append(httpx.post(f"{srv.url}/v2/models/slow/infer", json=body, timeout=30))

        worker = threading.Thread(target=call)
        worker.start()
        until_sync(lambda: _queue_depth(srv.url, "slow") >= 1, timeout_s=60, what="the request is inside the server")
        srv.process.send_signal(signal.SIGTERM)
        until_sync(lambda: httpx.get(srv.url + "/v2/health/ready", timeout=5).status_code == 503, timeout_s=10,
              what="readiness 503 after SIGTERM")  # the request (800 ms) is still in flight
        worker.join(timeout=30)
        assert results and results[0].status_code == 200  # the in-flight request still finished
        assert srv.process.wait(timeout=30) == 0


def _queue_depth(url: str, model: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=5).text.splitlines():
        if line.startswith(f'headroom_queue_depth{{model="{model}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_invalid_model_config_fails_at_start_with_a_message_naming_the_file(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "config.yaml").write_text("backend: tensorflow\ninputs: []\noutputs: []\n")
    proc = subprocess.run([sys.executable, "-m", "headroom.cli.main", "serve", "--model-repository", str(repo),
                           "--http-port", "0", "--grpc-port", "-1"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "config.yaml" in proc.stderr and "backend" in proc.stderr


def test_sigterm_drains_llm_streams_and_tensor_requests_alike(tmp_path: Path) -> None:
    """SIGTERM: readiness 503 at once, new LLM and tensor requests 503 with `x-headroom-draining: 1` (HTTP
    header, gRPC trailing metadata), the LLM stream in flight runs to its end, then the process exits 0."""
    repo = build_test_repository(tmp_path / "repo")
    shutil.copytree(MODELS / "smollm2", repo / "smollm2")
    args = ["--model", "echo", "--model", "smollm2", "--drain-timeout-s", "120", *TRUST_PYTHON]
    with run_server(repo, tmp_path, args) as srv:
        chat = srv.url + "/v1/chat/completions"
        events: list[dict[str, Any]] = []
        first = threading.Event()

        def stream() -> None:
            body = {"messages": [{"role": "user", "content": "Count to a hundred."}], "max_tokens": 100,
                    "ignore_eos": True, "temperature": 0, "stream": True}
            with httpx.stream("POST", chat, json=body, timeout=120) as resp:
                for line in resp.iter_lines():
                    if line.startswith("data: {"):
                        events.append(json.loads(line[len("data: "):]))
                        first.set()

        streamer = threading.Thread(target=stream, daemon=True)
        streamer.start()
        assert first.wait(60), "the stream produced no event"
        srv.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while httpx.get(srv.url + "/v2/health/ready", timeout=5).status_code != 503:
            assert time.monotonic() < deadline, "readiness did not turn 503 after SIGTERM"
            time.sleep(0.01)
        refused_llm = httpx.post(chat, json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        tensor = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}
        refused_tensor = httpx.post(srv.url + "/v2/models/echo/infer", json=tensor)
        for refused in (refused_llm, refused_tensor):
            assert refused.status_code == 503 and refused.headers["x-headroom-draining"] == "1", refused.text
        assert refused_llm.json()["error"]["code"] == "engine_unavailable"
        assert refused_tensor.json()["reason"] == "draining"
        with pytest.raises(InferenceServerException) as grpc_refused:
            grpcclient.InferenceServerClient(srv.grpc_target).infer(
                "echo", [grpcclient.InferInput("x", [1, 2], "FP32").set_data_from_numpy(np.ones((1, 2), np.float32))])
        assert "draining" in str(grpc_refused.value)
        streamer.join(120)
        assert not streamer.is_alive() and "error" not in events[-1]
        assert events[-1]["choices"][0]["finish_reason"] == "length"  # all 100 tokens, not cut
        assert srv.process.wait(timeout=60) == 0
