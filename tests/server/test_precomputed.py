"""`headroom batch` predictions served by `headroom serve --precomputed`: hits equal online results."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np

from tests.server.test_http_e2e import metric
from tests.support.server import TRUST_PYTHON, run_server


def test_precomputed_hits_equal_online_results_and_misses_fall_back(test_repo: Path, tmp_path: Path) -> None:
    x = np.arange(20, dtype=np.float32).reshape(10, 2)
    dataset = tmp_path / "x.npz"
    np.savez(dataset, x=x)
    store = tmp_path / "pred.sqlite"
    subprocess.run([sys.executable, "-m", "headroom.cli.main", "batch", "echo", "--dataset", str(dataset),
                    "--output", str(store), "--model-repository", str(test_repo)], check=True,
                   capture_output=True)
    args = ["--model", "echo", "--grpc-port", "-1", "--precomputed", str(store), *TRUST_PYTHON]
    with run_server(test_repo, tmp_path, args) as srv:
        def infer(rows: np.ndarray) -> list[float]:
            body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": list(rows.shape),
                                "data": rows.ravel().tolist()}], "outputs": [{"name": "y"}]}
            r = httpx.post(f"{srv.url}/v2/models/echo/infer", json=body)
            assert r.status_code == 200, r.text
            return list(r.json()["outputs"][0]["data"])

        assert infer(x[2:4]) == (x[2:4] * 2).ravel().tolist()  # stored rows: answered from the store
        assert infer(np.array([[100.0, 200.0]], dtype=np.float32)) == [200.0, 400.0]  # not stored: the model
        text = httpx.get(srv.url + "/metrics").text
    assert metric(text, "headroom_precomputed_lookups_total", model="echo", result="hit") == 1
    assert metric(text, "headroom_precomputed_lookups_total", model="echo", result="miss") == 1
