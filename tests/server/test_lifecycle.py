"""Lifecycle: readiness gates on loading, SIGTERM drains in-flight work, bad repositories fail clearly."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from tests.support.server import TRUST_PYTHON, run_server


def test_sigterm_reports_not_ready_and_finishes_in_flight_requests(test_repo: Path, tmp_path: Path) -> None:
    with run_server(test_repo, tmp_path, ["--model", "slow", "--grpc-port", "-1", *TRUST_PYTHON]) as srv:
        results: list[httpx.Response] = []
        body = {"inputs": [{"name": "delay_ms", "datatype": "FP32", "shape": [1, 1], "data": [800]},
                           {"name": "tag", "datatype": "INT64", "shape": [1, 1], "data": [900]}]}

        def call() -> None:
            results.append(httpx.post(f"{srv.url}/v2/models/slow/infer", json=body, timeout=30))

        worker = threading.Thread(target=call)
        worker.start()
        time.sleep(0.3)
        srv.process.send_signal(signal.SIGTERM)
        time.sleep(0.1)
        ready = httpx.get(srv.url + "/v2/health/ready", timeout=5)
        assert ready.status_code == 503  # not ready at once
        worker.join(timeout=30)
        assert results and results[0].status_code == 200  # the in-flight request still finished
        assert srv.process.wait(timeout=30) == 0


def test_invalid_model_config_fails_at_start_with_a_message_naming_the_file(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "config.yaml").write_text("backend: tensorflow\ninputs: []\noutputs: []\n")
    proc = subprocess.run([sys.executable, "-m", "headroom.cli.main", "serve", "--model-repository", str(repo),
                           "--http-port", "0", "--grpc-port", "-1"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "config.yaml" in proc.stderr and "backend" in proc.stderr
