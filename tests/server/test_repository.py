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
    with run_server(repo, tmp_path, ["--grpc-port", "-1", "--model", "echo", "--model", "text", *TRUST_PYTHON]) as srv:
        client = triton_http.InferenceServerClient(srv.http_target)
        index = {row["name"]: row for row in client.get_model_repository_index()}
        assert index["echo"]["state"] == "READY" and index["slow"]["state"] == "UNAVAILABLE"

        client.unload_model("text")
        with pytest.raises(InferenceServerException):
            client.get_model_metadata("text")
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

