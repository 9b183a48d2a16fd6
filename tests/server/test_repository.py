"""The V2 model-repository extension through tritonclient: index, unload, load, reload, failed reload."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from tests.server.conftest import build_test_repository
from tests.support.server import TRUST_PYTHON, run_server


def _infer_echo(client: triton_http.InferenceServerClient, version: str = "") -> np.ndarray:
    inp = triton_http.InferInput("x", [1, 2], "FP32")
    inp.set_data_from_numpy(np.array([[1.0, 2.0]], dtype=np.float32))
    return np.asarray(client.infer("echo", [inp], model_version=version).as_numpy("y"))


def test_load_unload_reload_and_a_failed_reload_keeps_the_old_version(tmp_path: Path) -> None:
    repo = build_test_repository(tmp_path / "repo")
    args = ["--grpc-port", "-1", "--model", "echo", "--model", "text", "--model-control-mode", "explicit",
            *TRUST_PYTHON]
    with run_server(repo, tmp_path, args) as srv:
        client = triton_http.InferenceServerClient(srv.http_target)
        index = {row["name"]: row for row in client.get_model_repository_index()}
        assert set(index) == {"echo", "text"}  # only what this server serves (--model), as Triton
        assert index["echo"]["state"] == "READY"

        client.unload_model("text")
        with pytest.raises(InferenceServerException):
            client.get_model_metadata("text")
        rows = client.get_model_repository_index()
        assert {r["name"]: r["state"] for r in rows}["text"] == "UNAVAILABLE"
        client.load_model("text")
        assert client.is_model_ready("text")

        # A new version 2 that cannot load: the reload fails and version 1 keeps serving.
        (repo / "echo" / "2").mkdir()
        (repo / "echo" / "2" / "model.py").write_text("raise RuntimeError('broken on purpose')\n")
        with pytest.raises(InferenceServerException) as failed:
            client.load_model("echo")
        assert "previous version keeps serving" in str(failed.value)
        np.testing.assert_array_equal(_infer_echo(client), [[2.0, 4.0]])
        assert client.get_model_metadata("echo")["versions"] == ["1"]

        # Fix version 2: the reload swaps it in.
        (repo / "echo" / "2" / "model.py").write_text((repo / "echo" / "1" / "model.py").read_text())
        client.load_model("echo")
        assert client.get_model_metadata("echo")["versions"] == ["2"]
        np.testing.assert_array_equal(_infer_echo(client, "2"), [[2.0, 4.0]])
        assert srv.alive()



def test_explicit_mode_loads_only_load_model_at_start(tmp_path: Path) -> None:
    repo = build_test_repository(tmp_path / "repo")
    args = ["--grpc-port", "-1", "--model-control-mode", "explicit", "--load-model", "echo", *TRUST_PYTHON]
    with run_server(repo, tmp_path, args) as srv:
        client = triton_http.InferenceServerClient(srv.http_target)
        states = {row["name"]: row["state"] for row in client.get_model_repository_index()}
        assert states == {"echo": "READY", "slow": "UNAVAILABLE", "text": "UNAVAILABLE", "cams": "UNAVAILABLE"}
        assert not client.is_model_ready("text")
        client.load_model("text")
        assert client.is_model_ready("text")
        config = repo / "text" / "config.yaml"
        config.write_text(config.read_text().replace("max_batch_size:", "max_batch_sise:"))
        with pytest.raises(InferenceServerException) as typo:
            client.load_model("text")
        assert "unknown key 'max_batch_sise'; did you mean 'max_batch_size'?" in str(typo.value)
        assert client.is_model_ready("text")  # the loaded version keeps serving
        client.unload_model("echo")  # a model loaded at start, unloaded on purpose: the server stays ready
        assert not client.is_model_ready("echo") and client.is_server_ready()
        client.load_model("echo")
        assert client.is_model_ready("echo") and client.is_server_ready()


def test_load_model_needs_explicit_mode_and_a_known_name(tmp_path: Path) -> None:
    import subprocess
    import sys

    repo = build_test_repository(tmp_path / "repo")
    base = [sys.executable, "-m", "headroom.cli.main", "serve", "--model-repository", str(repo), "--http-port", "0",
            "--grpc-port", "-1", *TRUST_PYTHON]
    done = subprocess.run([*base, "--load-model", "echo"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--load-model needs --model-control-mode explicit" in done.stderr
    done = subprocess.run([*base, "--model-control-mode", "explicit", "--load-model", "ecko"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and "no model directory named ['ecko']" in done.stderr
    done = subprocess.run([*base, "--model-control-mode", "sometimes"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "none, explicit or poll" in done.stderr
