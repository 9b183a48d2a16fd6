"""decode_infer_request, fed by tritonclient.http's own request encoder (byte compatibility, no server)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tritonclient.http as httpclient
from hypothesis import given, settings
from hypothesis import strategies as st

from headroom.core.errors import InvalidRequest
from headroom.protocol.http_request import decode_infer_request, parse_header_length

from .strategies import MIB, VARIABLE, hostile_shapes, same, traced_peak_bytes, typed_tensors


def _triton_body(inputs: list[httpclient.InferInput], **kwargs: object) -> tuple[bytes, int | None]:
    body, header_length = httpclient.InferenceServerClient.generate_request_body(inputs, **kwargs)
    return body, header_length


def _input(name: str, array: np.ndarray, datatype: str, binary: bool) -> httpclient.InferInput:
    item = httpclient.InferInput(name, list(array.shape), datatype)
    item.set_data_from_numpy(array, binary_data=binary)
    return item


@settings(max_examples=120, deadline=None, derandomize=True, database=None)
@given(st.lists(typed_tensors(json_safe=True), min_size=1, max_size=3), st.lists(st.booleans(), min_size=3))
def test_tritonclient_request_round_trip(items: list[tuple[str, np.ndarray]], binary: list[bool]) -> None:
    inputs = [_input(f"in{i}", a, d, binary[i]) for i, (d, a) in enumerate(items)]
    body, header_length = _triton_body(inputs, request_id="r-1")
    request = decode_infer_request(body, header_length, "m", "2", "hint")
    assert (request.request_id, request.model_name, request.model_version) == ("r-1", "m", "2")
    assert [t.name for t in request.inputs] == [f"in{i}" for i in range(len(items))]
    for tensor, (datatype, array) in zip(request.inputs, items, strict=True):
        assert tensor.datatype == datatype
        assert tensor.shape == array.shape
        assert same(tensor.data, array)


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(typed_tensors())
def test_binary_round_trip_with_arbitrary_bytes_and_non_finite_floats(item: tuple[str, np.ndarray]) -> None:
    datatype, array = item
    body, header_length = _triton_body([_input("x", array, datatype, True)])
    assert header_length is not None
    assert same(decode_infer_request(body, header_length, "m", "", "").inputs[0].data, array)


def test_request_parameters_and_outputs() -> None:
    a = np.zeros((1, 4), np.float32)
    outputs = [
        httpclient.InferRequestedOutput("probs", binary_data=False, class_count=3),
        httpclient.InferRequestedOutput("emb", binary_data=True),
    ]
    body, header_length = _triton_body(
        [_input("x", a, "FP32", True)], outputs=outputs, priority=2, timeout=250_000, parameters={"echo": "hi"}
    )
    request = decode_infer_request(body, header_length, "m", "", "server-id")
    assert request.request_id == "server-id"  # no id in the body: the hint is used
    assert request.priority == 2
    assert request.timeout_ms == 250.0  # Triton's `timeout` is in microseconds
    assert request.parameters["echo"] == "hi"
    assert [(o.name, o.binary_data, o.class_count) for o in request.outputs] == [
        ("probs", False, 3),
        ("emb", True, 0),
    ]
    assert not request.binary_output_default


def test_binary_data_output_is_the_default_for_unnamed_preferences() -> None:
    # tritonclient sets binary_data_output when it names no outputs.
    body, header_length = _triton_body([_input("x", np.zeros(2, np.int32), "INT32", False)])
    assert header_length is None
    request = decode_infer_request(body, header_length, "m", "", "")
    assert request.binary_output_default and request.outputs == ()
    doc = {
        "inputs": [{"name": "x", "datatype": "INT32", "shape": [1], "data": [1]}],
        "outputs": [{"name": "y"}, {"name": "z", "parameters": {"binary_data": False}}],
        "parameters": {"binary_data_output": True},
    }
    request = decode_infer_request(json.dumps(doc).encode(), None, "m", "", "")
    assert [o.binary_data for o in request.outputs] == [True, False]


def test_timeout_zero_means_no_override() -> None:
    doc = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}], "parameters": {"timeout": 0}}
    assert decode_infer_request(json.dumps(doc).encode(), None, "m", "", "").timeout_ms is None


def _json(doc: object) -> bytes:
    return json.dumps(doc).encode()


def _one(**fields: object) -> bytes:
    tensor: dict[str, object] = {"name": "x", "datatype": "FP32", "shape": [2], "data": [1.0, 2.0]}
    tensor.update(fields)
    return _json({"inputs": [tensor]})


_BINARY_HEADER = _json(
    {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "parameters": {"binary_data_size": 8}}]}
)


@pytest.mark.parametrize(
    ("body", "header_length", "message"),
    [
        (b"{not json", None, "request body is not valid JSON"),
        (b"\x00\x01binary", None, "binary bodies need the Inference-Header-Content-Length header"),
        (b"[1, 2]", None, "request body must be a JSON object"),
        (_json({"inputs": []}), None, "'inputs' must be a non-empty list"),
        (_json({"id": 5, "inputs": []}), None, "id must be a non-empty string"),
        (_one(datatype="FP8"), None, "input 'x': unsupported datatype 'FP8'"),
        (_one(shape=[3]), None, r"input 'x': 2 values for shape \[3\]"),
        (_one(shape="2"), None, "shape must be a list"),
        (_one(shape=[-2]), None, "non-negative integers"),
        (_one(data=["a", "b"]), None, r"must be JSON numbers \(found strings\)"),
        (_one(data=[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1.0]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]), None, "nested deeper"),
        (_one(name=""), None, r"inputs\[0\].name must be a non-empty string"),
        (_json({"inputs": [{"name": "x", "datatype": "FP32", "shape": [2]}]}), None, "needs either 'data' or"),
        (
            _one(parameters={"binary_data_size": 8}) + b"\x00" * 8,
            len(_one(parameters={"binary_data_size": 8})),
            "has both 'data' and parameters.binary_data_size",
        ),
        (_BINARY_HEADER + b"\x00" * 4, len(_BINARY_HEADER), "binary_data_size 8 runs past the end of the body"),
        (_BINARY_HEADER + b"\x00" * 12, len(_BINARY_HEADER), "4 bytes after the JSON header are not claimed"),
        (_BINARY_HEADER, len(_BINARY_HEADER) + 1, "Inference-Header-Content-Length is .* but the body has only"),
        (
            _json({"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "parameters": {"binary_data_size": 8}}]}),
            None,
            "runs past the end of the body",
        ),
        (
            _json({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}] * 2}),
            None,
            "appears more than once",
        ),
        (
            _json(
                {
                    "inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}],
                    "parameters": {"priority": -1},
                }
            ),
            None,
            "parameters.priority must be an integer >= 0",
        ),
        (
            _json(
                {
                    "inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}],
                    "parameters": {"timeout": "soon"},
                }
            ),
            None,
            "parameters.timeout must be microseconds",
        ),
        (
            _json(
                {
                    "inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}],
                    "outputs": [{"name": "y", "parameters": {"classification": 0}}],
                }
            ),
            None,
            "classification must be an integer >= 1",
        ),
        (
            _json(
                {
                    "inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}],
                    "outputs": [{"name": "y"}, {"name": "y"}],
                }
            ),
            None,
            "requested more than once",
        ),
        (
            _json(
                {
                    "inputs": [
                        {"name": "x", "datatype": "FP32", "shape": [1], "parameters": {"shared_memory_region": "r"}}
                    ]
                }
            ),
            None,
            "shared-memory extension",
        ),
    ],
)
def test_malformed_requests_say_what_is_wrong(body: bytes, header_length: int | None, message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        decode_infer_request(body, header_length, "m", "", "")


def test_header_length_parsing() -> None:
    assert parse_header_length(None) is None
    assert parse_header_length("12") == 12
    with pytest.raises(InvalidRequest, match="must be an integer"):
        parse_header_length("twelve")
    with pytest.raises(InvalidRequest, match=">= 0"):
        parse_header_length("-1")


def _hostile_body(shape: list[int], datatype: str, payload: bytes, binary: bool) -> tuple[bytes, int | None]:
    item: dict[str, object] = {"name": "x", "datatype": datatype, "shape": shape}
    if binary:
        item["parameters"] = {"binary_data_size": len(payload)}
    else:
        item["data"] = [chr(65 + b % 26) for b in payload] if datatype == "BYTES" else list(payload)
    header = json.dumps({"inputs": [item]}).encode()
    return (header + payload, len(header)) if binary else (header, None)


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(shape=hostile_shapes(), datatype=st.sampled_from(["BYTES", "FP32", "BOOL", "UINT8", "INT64"]),
       payload=st.binary(max_size=24), binary=st.booleans(), checked=st.booleans())
def test_declared_shapes_cost_at_most_the_body(shape: list[int], datatype: str, payload: bytes, binary: bool,
                                               checked: bool) -> None:
    """Any declared shape (negative, near 2^62/2^63/2^64, products that overflow int64, rank up to 40),
    with or without the model's config: InvalidRequest or a decoded tensor, and never more allocated than a
    small multiple of the body."""
    body, header_length = _hostile_body(shape, datatype, payload, binary)
    config = VARIABLE if checked else None
    peak = traced_peak_bytes(lambda: decode_infer_request(body, header_length, "m", "", "", config))
    assert peak < MIB


def test_the_issue_17_request_is_refused_without_allocating() -> None:
    """114 bytes declaring 5e7 BYTES elements with binary_data_size 0: refused, naming the input."""
    body, header_length = _hostile_body([1, 50_000_000], "BYTES", b"", True)
    with pytest.raises(InvalidRequest, match="input 'x': 50000000 BYTES elements need at least 200000000 bytes"):
        decode_infer_request(body, header_length, "m", "", "", VARIABLE)
    assert traced_peak_bytes(lambda: decode_infer_request(body, header_length, "m", "", "", VARIABLE)) < MIB


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ([1, 2**62], r"describes more than 2\^40 elements"),
        ([0, 2**63 - 1, 8], r"describes more than 2\^40 elements"),
        ([2**32, 2**32], r"describes more than 2\^40 elements"),
        ([1, -1], "non-negative integers"),
        ([1] * 33, "at most 32 are supported"),
        ([9, 1], "batch dimension 9 must be between 1 and max_batch_size 8"),
        ([1, 2, 3], r"shape \[1, 2, 3\] but the model expects \[batch, -1\]"),
    ],
)
def test_overflowing_or_misfit_shapes_say_what_is_wrong(shape: list[int], message: str) -> None:
    body, header_length = _hostile_body(shape, "BYTES", b"", True)
    with pytest.raises(InvalidRequest, match=message):
        decode_infer_request(body, header_length, "m", "", "", VARIABLE)


def test_the_config_is_checked_before_the_data() -> None:
    """A datatype the model does not take is refused before its (malformed) data is looked at."""
    body, header_length = _hostile_body([1, 1], "FP32", b"\x00", True)
    with pytest.raises(InvalidRequest, match="datatype FP32 but the model expects BYTES"):
        decode_infer_request(body, header_length, "m", "", "", VARIABLE)
