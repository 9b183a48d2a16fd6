"""encode_infer_response, read back with tritonclient.http's own response parser (no server)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tritonclient.http as httpclient
from hypothesis import given, settings
from hypothesis import strategies as st

from headroom.core.dataplane import ModelMetadata, ServerMetadata, TensorMetadata
from headroom.core.errors import InvalidRequest, Overloaded
from headroom.core.types import InferenceResponse, RequestedOutput, StageTimings, Tensor
from headroom.protocol.http_response import (
    encode_infer_response,
    error_response,
    model_metadata_json,
    server_metadata_json,
    server_timing,
)

from .strategies import same, typed_tensors


def _parse(body: bytes, headers: dict[str, str]) -> httpclient.InferResult:
    length = headers.get("Inference-Header-Content-Length")
    return httpclient.InferenceServerClient.parse_response_body(body, header_length=int(length) if length else None)


def _response(arrays: list[tuple[str, np.ndarray]], requested: tuple[RequestedOutput, ...] = ()) -> InferenceResponse:
    outputs = tuple(Tensor(f"out{i}", d, a.shape, a) for i, (d, a) in enumerate(arrays))
    return InferenceResponse(request_id="r-9", model_name="m", model_version="3", outputs=outputs, requested=requested)


@settings(max_examples=120, deadline=None, derandomize=True, database=None)
@given(st.lists(typed_tensors(), min_size=1, max_size=3), st.lists(st.booleans(), min_size=3))
def test_round_trip_through_tritonclient_parser(items: list[tuple[str, np.ndarray]], binary: list[bool]) -> None:
    requested = tuple(RequestedOutput(f"out{i}", binary_data=binary[i]) for i in range(len(items)))
    body, headers = encode_infer_response(_response(items, requested))
    result = _parse(body, headers)
    assert result.get_response()["id"] == "r-9"
    assert result.get_response()["model_version"] == "3"
    for i, (_, array) in enumerate(items):
        assert same(result.as_numpy(f"out{i}"), array)


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(typed_tensors(json_safe=True))
def test_json_output_is_plain_json(item: tuple[str, np.ndarray]) -> None:
    datatype, array = item
    body, headers = encode_infer_response(_response([item]))
    assert headers["Content-Type"] == "application/json"
    assert "Inference-Header-Content-Length" not in headers
    output = json.loads(body)["outputs"][0]
    assert output["shape"] == list(array.shape)
    assert same(_parse(body, headers).as_numpy("out0"), array)
    assert datatype == output["datatype"]


def test_binary_layout_and_headers() -> None:
    a = np.arange(3, dtype=np.int16)
    response = _response([("INT16", a)], (RequestedOutput("out0", binary_data=True),))
    body, headers = encode_infer_response(response)
    n = int(headers["Inference-Header-Content-Length"])
    assert headers["Content-Type"] == "application/octet-stream"
    assert json.loads(body[:n])["outputs"][0]["parameters"] == {"binary_data_size": 6}
    assert body[n:] == b"\x00\x00\x01\x00\x02\x00"


def test_binary_default_applies_when_no_outputs_named() -> None:
    response = _response([("FP32", np.ones(2, np.float32))])
    assert "Inference-Header-Content-Length" not in encode_infer_response(response)[1]
    assert "Inference-Header-Content-Length" in encode_infer_response(response, binary_default=True)[1]


def test_only_requested_outputs_are_sent() -> None:
    items: list[tuple[str, np.ndarray]] = [("FP32", np.ones(2, np.float32)), ("INT8", np.zeros(1, np.int8))]
    body, _ = encode_infer_response(_response(items, (RequestedOutput("out1"),)))
    assert [o["name"] for o in json.loads(body)["outputs"]] == ["out1"]


def test_values_json_cannot_carry_go_binary() -> None:
    items: list[tuple[str, np.ndarray]] = [
        ("BYTES", np.array([b"\xff\xfe"], dtype=object)),
        ("FP32", np.array([np.nan, np.inf], np.float32)),
    ]
    body, headers = encode_infer_response(_response(items))
    result = _parse(body, headers)
    assert result.as_numpy("out0").tolist() == [b"\xff\xfe"]
    assert np.isnan(result.as_numpy("out1")[0]) and np.isinf(result.as_numpy("out1")[1])


def test_fp32_json_uses_shortest_round_trip_decimals() -> None:
    body, _ = encode_infer_response(_response([("FP32", np.array([0.1, 1 / 3], np.float32))]))
    assert json.loads(body)["outputs"][0]["data"] == [0.1, 0.33333334]


def test_classification_extension_with_labels() -> None:
    scores = np.array([[0.1, 0.7, 0.2], [0.5, 0.3, 0.2]], np.float32)
    response = _response([("FP32", scores)], (RequestedOutput("out0", binary_data=False, class_count=2),))
    body, headers = encode_infer_response(response, labels={"out0": ["cat", "dog", "eel"]})
    output = json.loads(body)["outputs"][0]
    assert output["datatype"] == "BYTES" and output["shape"] == [2, 2]
    assert output["data"] == ["0.700000:1:dog", "0.200000:2:eel", "0.500000:0:cat", "0.300000:1:dog"]
    assert _parse(body, headers).as_numpy("out0")[0, 0] == "0.700000:1:dog"  # tritonclient: JSON BYTES -> str


def test_response_fields_parameters_and_server_timing() -> None:
    timings = StageTimings(queue_ms=1.5, compute_ms=3.25, total_ms=6.0)
    response = InferenceResponse(
        request_id="",
        model_name="m",
        model_version="1",
        outputs=(),
        parameters={"missing_streams": ("cam2",), "inference_time_ms": np.float32(2.5)},
        timings=timings,
    )
    body, headers = encode_infer_response(response)
    doc = json.loads(body)
    assert "id" not in doc
    assert doc["parameters"] == {"missing_streams": ["cam2"], "inference_time_ms": 2.5}
    assert headers["Server-Timing"] == server_timing(timings)
    assert "queue;dur=1.500" in headers["Server-Timing"] and "total;dur=6.000" in headers["Server-Timing"]


def test_error_response() -> None:
    status, body, headers = error_response(Overloaded("queue of model m is full (256)", retry_after_s=0.2))
    assert status == 503 and headers["Retry-After"] == "1"
    assert json.loads(body) == {"error": "queue of model m is full (256)", "reason": "overloaded"}
    status, body, _ = error_response(InvalidRequest("bad"))
    assert status == 400 and json.loads(body)["error"] == "bad"
    status, body, _ = error_response(KeyError("secret"))
    assert status == 500 and "secret" not in body.decode() and "KeyError" in body.decode()


def test_metadata_json() -> None:
    server = server_metadata_json(ServerMetadata("headroom", "0.1.0", ("binary_tensor_data",)))
    assert server == {"name": "headroom", "version": "0.1.0", "extensions": ["binary_tensor_data"]}
    meta = ModelMetadata("m", ("1", "2"), "onnxruntime_onnx", (TensorMetadata("x", "FP32", (-1, 4)),), ())
    assert model_metadata_json(meta) == {
        "name": "m",
        "versions": ["1", "2"],
        "platform": "onnxruntime_onnx",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
        "outputs": [],
    }


def test_classification_of_bytes_is_rejected() -> None:
    response = _response([("BYTES", np.array([b"a"], dtype=object))], (RequestedOutput("out0", class_count=1),))
    with pytest.raises(InvalidRequest, match="classification needs a numeric output"):
        encode_infer_response(response)
