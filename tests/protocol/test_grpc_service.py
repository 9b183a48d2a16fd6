"""The gRPC service end to end: tritonclient.grpc against a server in a subprocess, plus in-process checks."""

from __future__ import annotations

import asyncio
import select
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from headroom.core.errors import Draining
from headroom.protocol.generated import headroom_inference_pb2 as pb
from headroom.protocol.grpc_service import GrpcServerConfig, bind_grpc_server, stop_grpc_server

from .fake_dataplane import FakeDataPlane

TESTS_DIR = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def client() -> Iterator[grpcclient.InferenceServerClient]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "protocol.grpc_fake_server"],
        cwd=TESTS_DIR,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        assert ready, "the gRPC test server did not start within 60 s"
        line = proc.stdout.readline()
        assert line.startswith("PORT "), f"unexpected server output {line!r}"
        with grpcclient.InferenceServerClient(f"127.0.0.1:{int(line.split()[1])}") as triton:
            yield triton
    finally:
        if proc.stdin is not None:
            proc.stdin.close()  # the server stops when its stdin closes
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _fp32(name: str, array: np.ndarray) -> grpcclient.InferInput:
    item = grpcclient.InferInput(name, list(array.shape), "FP32")
    item.set_data_from_numpy(array)
    return item


def test_health_and_metadata(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("add")
    server = client.get_server_metadata(as_json=True)
    assert server["name"] == "headroom" and "binary_tensor_data" in server["extensions"]
    meta = client.get_model_metadata("add", as_json=True)
    assert meta["versions"] == ["1"]
    assert [(t["name"], t["datatype"], t["shape"]) for t in meta["inputs"]] == [
        ("INPUT0", "FP32", ["-1", "4"]),
        ("INPUT1", "FP32", ["-1", "4"]),
    ]


def test_infer_fp32(client: grpcclient.InferenceServerClient) -> None:
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    b = np.full((2, 4), 0.5, np.float32)
    result = client.infer("add", [_fp32("INPUT0", a), _fp32("INPUT1", b)], request_id="req-7")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert result.get_response().id == "req-7"
    assert result.get_response().model_version == "1"


def test_infer_requested_output_with_classification(client: grpcclient.InferenceServerClient) -> None:
    a = np.array([[0.0, 3.0, 1.0, 2.0]], np.float32)
    outputs = [grpcclient.InferRequestedOutput("OUTPUT0", class_count=2)]
    result = client.infer("add", [_fp32("INPUT0", a), _fp32("INPUT1", np.zeros_like(a))], outputs=outputs)
    assert result.as_numpy("OUTPUT0").tolist() == [[b"3.000000:1", b"2.000000:3"]]
    assert result.as_numpy("OUTPUT1") is None  # not requested, not sent


def test_infer_bytes_with_arbitrary_bytes(client: grpcclient.InferenceServerClient) -> None:
    data = np.array([b"hello", b"\xff\x00\xfe", "čau".encode(), b""], dtype=object)
    item = grpcclient.InferInput("INPUT0", [4], "BYTES")
    item.set_data_from_numpy(data)
    assert client.infer("echo_bytes", [item]).as_numpy("OUTPUT0").tolist() == data.tolist()


def _status(call: object) -> tuple[str, str]:
    with pytest.raises(InferenceServerException) as info:
        call()  # type: ignore[operator]
    return str(info.value.status()), str(info.value.message())


def test_errors_map_to_grpc_codes(client: grpcclient.InferenceServerClient) -> None:
    x = _fp32("INPUT0", np.zeros((1, 4), np.float32))
    code, message = _status(lambda: client.infer("nope", [x]))
    assert code == "StatusCode.NOT_FOUND" and "unknown model 'nope'" in message
    code, message = _status(lambda: client.is_model_ready("nope"))
    assert code == "StatusCode.NOT_FOUND"
    bad = _fp32("INPUT0", np.zeros((1, 3), np.float32))
    code, message = _status(lambda: client.infer("add", [bad, _fp32("INPUT1", np.zeros((1, 3), np.float32))]))
    assert code == "StatusCode.INVALID_ARGUMENT"
    assert "shape [1, 3] but the model expects [batch, 4]" in message
    code, message = _status(lambda: client.get_model_config("add"))
    assert code == "StatusCode.UNIMPLEMENTED" and "ModelConfig is not implemented" in message
    # and the server is still healthy afterwards
    assert client.is_server_live()
    result = client.infer("identity", [_fp32("INPUT0", np.ones((1, 2), np.float32))])
    assert result.as_numpy("OUTPUT0").tolist() == [[1.0, 1.0]]


def _model_infer(channel: grpc.aio.Channel) -> Any:
    """The raw ModelInfer method on a channel (no client library between the test and the status)."""
    return channel.unary_unary(
        "/inference.GRPCInferenceService/ModelInfer",
        request_serializer=pb.ModelInferRequest.SerializeToString,
        response_deserializer=pb.ModelInferResponse.FromString,
    )


def _slow_request(request_id: str) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="slow", id=request_id)
    message.inputs.add(name="INPUT0", datatype="FP32", shape=[1])
    message.raw_input_contents.append(np.zeros(1, np.float32).tobytes())
    return message


async def test_client_cancellation_reaches_the_data_plane() -> None:
    plane = FakeDataPlane()
    server, port = await bind_grpc_server(plane, "127.0.0.1", 0)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            infer = _model_infer(channel)
            call = infer(_slow_request("cancel-me"))
            await asyncio.wait_for(plane.started.wait(), 30)
            call.cancel()
            await asyncio.wait_for(plane.gone.wait(), 30)
            # the data plane heard it through its `disconnected` watcher, not as an injected CancelledError
            assert plane.cancelled == [("cancel-me", "watcher")]
            with pytest.raises(asyncio.CancelledError):
                await call
    finally:
        await stop_grpc_server(server, grace_s=0)


async def test_client_deadline_reaches_the_data_plane() -> None:
    plane = FakeDataPlane()
    server, port = await bind_grpc_server(plane, "127.0.0.1", 0)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            infer = _model_infer(channel)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await infer(_slow_request("too-slow"), timeout=0.5)
            assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            await asyncio.wait_for(plane.gone.wait(), 30)
            assert plane.cancelled == [("too-slow", "watcher")]
    finally:
        await stop_grpc_server(server, grace_s=0)


async def test_a_data_plane_that_ignores_the_watcher_is_cancelled_after_the_grace() -> None:
    plane = FakeDataPlane(ignore_disconnect=True)
    server, port = await bind_grpc_server(plane, "127.0.0.1", 0, config=GrpcServerConfig(cancel_grace_s=0.05))
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            infer = _model_infer(channel)
            call = infer(_slow_request("stubborn"))
            await asyncio.wait_for(plane.started.wait(), 30)
            call.cancel()
            await asyncio.wait_for(plane.gone.wait(), 30)
            assert plane.cancelled == [("stubborn", "task")]
    finally:
        await stop_grpc_server(server, grace_s=0)


async def test_port_in_use_is_a_clear_error() -> None:
    server, port = await bind_grpc_server(FakeDataPlane(), "127.0.0.1", 0)
    try:
        with pytest.raises(OSError, match="pick another --grpc-port"):
            await bind_grpc_server(FakeDataPlane(), "127.0.0.1", port)
    finally:
        await stop_grpc_server(server, grace_s=0)


class _DrainingPlane(FakeDataPlane):
    async def infer(self, request: object, disconnected: object = None) -> Any:
        raise Draining("the server is draining; send requests for 'slow' elsewhere", retry_after_s=1.0)


async def test_a_drain_refusal_carries_the_draining_trailing_metadata() -> None:
    server, port = await bind_grpc_server(_DrainingPlane(), "127.0.0.1", 0)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            infer = _model_infer(channel)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await infer(_slow_request("refused"), timeout=10)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE and "draining" in str(info.value.details())
            assert ("x-headroom-draining", "1") in tuple(info.value.trailing_metadata() or ())
    finally:
        await stop_grpc_server(server, grace_s=0)
