"""End to end over gRPC with the unchanged `tritonclient.grpc` against a real `headroom serve` process."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
from tritonclient.utils import InferenceServerException

from tests.support.server import RunningServer


def test_grpc_health_metadata_and_infer(server: RunningServer) -> None:
    client = triton_grpc.InferenceServerClient(server.grpc_target)
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("echo")
    meta = client.get_model_metadata("echo", as_json=True)
    assert meta["inputs"][0]["name"] == "x" and meta["inputs"][0]["datatype"] == "FP32"
    x = np.array([[1.0, 2.0], [3.0, -4.0], [0.5, 0.25]], dtype=np.float32)
    inp = triton_grpc.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer("echo", [inp], outputs=[triton_grpc.InferRequestedOutput("y")])
    np.testing.assert_array_equal(result.as_numpy("y"), x * 2)


def test_grpc_bytes_round_trip(server: RunningServer) -> None:
    client = triton_grpc.InferenceServerClient(server.grpc_target)
    text = np.array([[b"abc"], [b"\x00\xffz"]], dtype=object)
    inp = triton_grpc.InferInput("text", [2, 1], "BYTES")
    inp.set_data_from_numpy(text)
    out = client.infer("text", [inp]).as_numpy("upper")
    assert [bytes(b) for b in out.reshape(-1)] == [b"ABC", b"\x00\xffZ"]


def test_grpc_errors_map_to_status_codes(server: RunningServer) -> None:
    client = triton_grpc.InferenceServerClient(server.grpc_target)
    x = np.zeros((1, 2), dtype=np.float32)
    inp = triton_grpc.InferInput("x", [1, 2], "FP32")
    inp.set_data_from_numpy(x)
    with pytest.raises(InferenceServerException) as missing:
        client.infer("nope", [inp])
    assert "NOT_FOUND" in str(missing.value.status())
    bad = triton_grpc.InferInput("x", [1, 3], "FP32")
    bad.set_data_from_numpy(np.zeros((1, 3), dtype=np.float32))
    with pytest.raises(InferenceServerException) as invalid:
        client.infer("echo", [bad])
    assert "INVALID_ARGUMENT" in str(invalid.value.status())
    assert client.is_server_ready()
