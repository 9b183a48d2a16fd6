"""The gRPC codec against tritonclient.grpc's own request builder and result reader, in one process."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from hypothesis import given, settings
from hypothesis import strategies as st
from tritonclient.grpc import _utils as triton_utils
from tritonclient.grpc import service_pb2

from headroom.core.errors import InvalidRequest
from headroom.core.types import InferenceResponse, RequestedOutput, Tensor
from headroom.protocol.generated import headroom_inference_pb2 as pb
from headroom.protocol.grpc_codec import decode_model_infer, encode_model_infer

from .strategies import MIB, VARIABLE, hostile_shapes, same, traced_peak_bytes, typed_tensors


def _from_triton(inputs: list[grpcclient.InferInput], **kwargs: object) -> pb.ModelInferRequest:
    args: dict[str, object] = dict(
        model_name="m",
        inputs=inputs,
        model_version="",
        request_id="",
        outputs=None,
        sequence_id=0,
        sequence_start=False,
        sequence_end=False,
        priority=0,
        timeout=None,
        parameters=None,
    )
    args.update(kwargs)
    triton_request = triton_utils._get_inference_request(**args)
    message: pb.ModelInferRequest = pb.ModelInferRequest.FromString(triton_request.SerializeToString())
    return message


@settings(max_examples=100, deadline=None, derandomize=True, database=None)
@given(st.lists(typed_tensors(min_side=0), min_size=1, max_size=3))
def test_request_round_trip_raw_contents(items: list[tuple[str, np.ndarray]]) -> None:
    inputs = []
    for i, (datatype, array) in enumerate(items):
        item = grpcclient.InferInput(f"in{i}", list(array.shape), datatype)
        item.set_data_from_numpy(array)
        inputs.append(item)
    request = decode_model_infer(_from_triton(inputs, request_id="abc"), "hint")
    assert request.request_id == "abc"
    for tensor, (datatype, array) in zip(request.inputs, items, strict=True):
        assert (tensor.datatype, tensor.shape) == (datatype, array.shape)
        assert same(tensor.data, array)


@settings(max_examples=100, deadline=None, derandomize=True, database=None)
@given(st.lists(typed_tensors(min_side=0), min_size=1, max_size=3))
def test_response_round_trip_through_tritonclient_result(items: list[tuple[str, np.ndarray]]) -> None:
    outputs = tuple(Tensor(f"out{i}", d, a.shape, a) for i, (d, a) in enumerate(items))
    message = encode_model_infer(InferenceResponse("id", "m", "1", outputs))
    result = grpcclient.InferResult(service_pb2.ModelInferResponse.FromString(message.SerializeToString()))
    for i, (_, array) in enumerate(items):
        assert same(result.as_numpy(f"out{i}"), array)


def test_parameters_priority_timeout_classification() -> None:
    item = grpcclient.InferInput("x", [1], "FP32")
    item.set_data_from_numpy(np.ones(1, np.float32))
    message = _from_triton(
        [item],
        priority=3,
        timeout=2_000,
        parameters={"tag": "a", "n": 2, "f": 0.5, "flag": True},
        outputs=[grpcclient.InferRequestedOutput("y", class_count=2)],
    )
    request = decode_model_infer(message, "hint")
    assert request.request_id == "hint"
    assert (request.priority, request.timeout_ms) == (3, 2.0)  # timeout is in microseconds
    assert {k: request.parameters[k] for k in ("tag", "n", "f", "flag")} == {"tag": "a", "n": 2, "f": 0.5, "flag": True}
    assert request.outputs == (RequestedOutput("y", binary_data=True, class_count=2),)


def test_typed_contents_every_field() -> None:
    message = pb.ModelInferRequest(model_name="m")
    cases = {
        "BOOL": ("bool_contents", [True, False]),
        "INT8": ("int_contents", [-3, 4]),
        "UINT16": ("uint_contents", [1, 65535]),
        "INT64": ("int64_contents", [-(2**40), 7]),
        "UINT64": ("uint64_contents", [2**63, 1]),
        "FP32": ("fp32_contents", [0.5, -1.0]),
        "FP64": ("fp64_contents", [1e300, 2.0]),
        "BYTES": ("bytes_contents", [b"\xff", b"ok"]),
    }
    for datatype, (field, values) in cases.items():
        tensor = message.inputs.add(name=datatype, datatype=datatype, shape=[2])
        getattr(tensor.contents, field).extend(values)
    request = decode_model_infer(message)
    for tensor in request.inputs:
        assert tensor.data.tolist() == cases[tensor.datatype][1]


def test_response_parameters_and_classification_labels() -> None:
    scores = np.array([[0.2, 0.8]], np.float32)
    response = InferenceResponse(
        "id",
        "m",
        "1",
        (Tensor("p", "FP32", (1, 2), scores),),
        requested=(RequestedOutput("p", class_count=1),),
        parameters={"ms": 1.5, "n": 2, "s": "x", "b": False},
    )
    message = encode_model_infer(response, labels={"p": ["no", "yes"]})
    assert message.parameters["ms"].double_param == 1.5 and message.parameters["b"].WhichOneof("parameter_choice")
    result = grpcclient.InferResult(service_pb2.ModelInferResponse.FromString(message.SerializeToString()))
    assert result.as_numpy("p").tolist() == [[b"0.800000:1:yes"]]


def _raw_request(**fields: object) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="m")
    message.inputs.add(name="x", datatype="FP32", shape=[2])
    message.raw_input_contents.append(np.ones(2, np.float32).tobytes())
    for key, value in fields.items():
        message.parameters[key].int64_param = int(value)  # type: ignore[call-overload]
    return message


def test_malformed_grpc_requests() -> None:
    two_raw = _raw_request()
    two_raw.raw_input_contents.append(b"")
    fp16_typed = pb.ModelInferRequest(model_name="m")
    fp16_typed.inputs.add(name="h", datatype="FP16", shape=[1])
    short = _raw_request()
    short.raw_input_contents[0] = b"\x00" * 4
    typed_count = pb.ModelInferRequest(model_name="m")
    typed_count.inputs.add(name="t", datatype="INT32", shape=[3]).contents.int_contents.extend([1, 2])
    out_of_range = pb.ModelInferRequest(model_name="m")
    out_of_range.inputs.add(name="t", datatype="INT8", shape=[1]).contents.int_contents.append(1000)
    cases = [
        (pb.ModelInferRequest(), "model_name is required"),
        (pb.ModelInferRequest(model_name="m"), "at least one input"),
        (two_raw, "2 raw_input_contents for 1 inputs"),
        (fp16_typed, "FP16 has no typed contents field; send it in raw_input_contents"),
        (short, r"4 bytes of FP32 data, but shape \[2\] needs 2 x 4 = 8 bytes"),
        (typed_count, r"2 values in int_contents for shape \[3\]"),
        (out_of_range, "out of range for INT8"),
        (_raw_request(priority=-1), "priority must be an integer >= 0"),
        (_raw_request(timeout=-5), "timeout must be microseconds >= 0"),
    ]
    for message, text in cases:
        with pytest.raises(InvalidRequest, match=text):
            decode_model_infer(message)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(shape=hostile_shapes(high=2**63 - 1), datatype=st.sampled_from(["BYTES", "FP32", "BOOL", "INT64"]),
       payload=st.binary(max_size=24), raw=st.booleans(), checked=st.booleans())
def test_declared_shapes_cost_at_most_the_message(shape: list[int], datatype: str, payload: bytes, raw: bool,
                                                  checked: bool) -> None:
    """raw_input_contents (possibly empty) or typed contents against any int64 shape: InvalidRequest or a
    tensor, and never an allocation sized by the shape."""
    message = pb.ModelInferRequest(model_name="m")
    item = message.inputs.add(name="x", datatype=datatype, shape=shape)
    if raw:
        message.raw_input_contents.append(payload)
    elif datatype == "BYTES":
        item.contents.bytes_contents.extend([payload])
    elif datatype == "FP32":
        item.contents.fp32_contents.extend(float(b) for b in payload)
    config = VARIABLE if checked else None
    assert traced_peak_bytes(lambda: decode_model_infer(message, "", config)) < MIB


def test_empty_raw_contents_for_a_huge_bytes_shape_is_refused() -> None:
    message = pb.ModelInferRequest(model_name="m")
    message.inputs.add(name="x", datatype="BYTES", shape=[1, 50_000_000])
    message.raw_input_contents.append(b"")
    with pytest.raises(InvalidRequest, match="50000000 BYTES elements need at least 200000000 bytes"):
        decode_model_infer(message, "", VARIABLE)
    message.inputs[0].shape[:] = [1, 2**62]
    with pytest.raises(InvalidRequest, match=r"input 'x': shape \[1, 4611686018427387904\] describes more"):
        decode_model_infer(message, "", VARIABLE)
