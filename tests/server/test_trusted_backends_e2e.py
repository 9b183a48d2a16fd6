"""`headroom serve --trusted-backends`: by default a python-backend model from the repository is refused, at
start and when loaded later through the repository API, with a message saying how to allow it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import httpx

from tests.support.server import run_server

BENCH_MODELS = Path(__file__).resolve().parents[2] / "benchmarks" / "models"
HOW = "--trusted-backends onnxruntime,torch,llm,python"


def test_a_python_model_is_refused_at_start_by_default(test_repo: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "headroom.cli.main", "serve", "--model-repository", str(test_repo),
                           "--model", "echo", "--http-port", "0", "--grpc-port", "-1"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    err = " ".join(proc.stderr.split())  # rich may wrap
    assert "'echo' imports and runs a model.py from the model repository" in err and HOW in err


def test_loading_a_python_model_later_is_refused_too_and_allowed_when_listed(test_repo: Path,
                                                                            tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(BENCH_MODELS / "noop", repo / "noop")  # headroom's own class: served by default
    args = ["--grpc-port", "-1", "--model-control-mode", "explicit"]
    with run_server(repo, tmp_path, args) as srv:
        shutil.copytree(test_repo / "echo", repo / "echo")  # a python model added later, then loaded
        refused = httpx.post(srv.url + "/v2/repository/models/echo/load", timeout=60.0)
        assert refused.status_code == 400 and HOW in refused.json()["error"]
        body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 2], "data": [1.0, 2.0]}]}
        assert httpx.post(srv.url + "/v2/models/noop/infer", json=body).json()["outputs"][0]["data"] == [1.0, 2.0]
    with run_server(repo, tmp_path, ["--grpc-port", "-1", "--trusted-backends", "onnxruntime,python"]) as srv:
        body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1.0, 2.0]}]}
        r = httpx.post(srv.url + "/v2/models/echo/infer", json=body)
        assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [2.0, 4.0]
