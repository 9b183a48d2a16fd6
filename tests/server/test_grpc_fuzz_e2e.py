"""gRPC ModelInfer / ModelStreamInfer against a real `headroom serve`: whatever a well-formed or malformed
message carries (datatypes, shapes, typed or raw contents, parameters of every type, requested outputs), the
answer is OK or a client-error status with a message, never INTERNAL / UNKNOWN / DATA_LOSS, and the server
goes on serving."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from headroom.core.types import V2_TO_NUMPY
from tests.support.server import RunningServer

SERVER_ERRORS = frozenset({grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.DATA_LOSS})
CLIENT_ERRORS = frozenset({grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
                           grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE})
FIELDS = ("bool_contents", "int_contents", "int64_contents", "uint_contents", "uint64_contents", "fp32_contents",
          "fp64_contents", "bytes_contents")
FUZZ = settings(max_examples=80, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])

_dim = st.one_of(st.integers(0, 5), st.sampled_from([0, 2, 16, 17, 50_000_000, 2**31, 2**62, 2**63 - 1]))
_parameter = st.one_of(st.booleans(), st.integers(-(2**63), 2**63 - 1),
                       st.integers(2**63, 2**64 - 1).map(lambda v: ("u", v)), st.floats(allow_nan=True),
                       st.text(max_size=6))
_parameters = st.dictionaries(st.sampled_from(["priority", "timeout", "classification", "binary_data_output",
                                               "sequence_id", "x"]), _parameter, max_size=3)


def _set(params: Any, values: Mapping[str, object]) -> None:
    for key, value in values.items():
        if isinstance(value, tuple):
            params[key].uint64_param = value[1]
        elif isinstance(value, bool):
            params[key].bool_param = value
        elif isinstance(value, int):
            params[key].int64_param = value
        elif isinstance(value, float):
            params[key].double_param = value
        else:
            params[key].string_param = str(value)


def _contents(draw: st.DrawFn, field: str, count: int) -> list[Any]:
    if field == "bytes_contents":
        return draw(st.lists(st.binary(max_size=12), min_size=count, max_size=count))
    if field in ("fp32_contents", "fp64_contents"):
        floats = st.floats(width=32) if field == "fp32_contents" else st.floats()
        return draw(st.lists(floats, min_size=count, max_size=count))
    if field == "bool_contents":
        return draw(st.lists(st.booleans(), min_size=count, max_size=count))
    bits = 64 if "64" in field else 32
    low = 0 if field.startswith("uint") else -(2 ** (bits - 1))
    high = 2**bits - 1 if field.startswith("uint") else 2 ** (bits - 1) - 1
    return draw(st.lists(st.integers(low, high), min_size=count, max_size=count))


@st.composite
def infer_requests(draw: st.DrawFn) -> pb.ModelInferRequest:
    """Mostly aimed at the test repository's `echo` (FP32 [-1, 2]) and `text` (BYTES [-1, 1]) so that many
    requests get past validation, with every field also drawn outside what the model accepts."""
    model = draw(st.sampled_from(["echo", "echo", "text", "text", "nope"]))
    right = ("x", "FP32") if model == "echo" else ("text", "BYTES")
    name = draw(st.sampled_from([right[0]] * 3 + ["y", ""]))
    datatype = draw(st.sampled_from([right[1]] * 4 + [*V2_TO_NUMPY, "x"]))
    shape = draw(st.one_of(st.tuples(st.integers(1, 4), st.sampled_from([1, 2])).map(list),
                           st.lists(_dim, max_size=4)))
    message = pb.ModelInferRequest(model_name=model, model_version=draw(st.sampled_from(["", "1", "7"])))
    tensor = message.inputs.add(name=name, datatype=datatype, shape=shape)
    extent = int(np.prod([min(d, 64) for d in shape], dtype=np.int64)) if shape else 1
    # element counts stay small enough for hypothesis to draw (a large shape then gets a mismatching count)
    count = min(draw(st.sampled_from([extent, extent, 0, extent + 1, max(0, extent - 1)])), 512)
    if draw(st.booleans()):  # raw contents: the right byte count or not, BYTES length-prefixed or not
        itemsize = 4 if datatype not in V2_TO_NUMPY or datatype == "BYTES" else V2_TO_NUMPY[datatype].itemsize
        message.raw_input_contents.append(draw(st.one_of(st.binary(min_size=count * itemsize,
                                                                   max_size=count * itemsize),
                                                         st.binary(max_size=24))))
    else:
        field = draw(st.sampled_from([f for f in FIELDS if datatype.lower().rstrip("0123456789") in f]
                                     + ["fp32_contents", "bytes_contents"]))
        getattr(tensor.contents, field).extend(_contents(draw, field, count))
    _set(message.parameters, draw(_parameters))
    _set(tensor.parameters, draw(_parameters))
    for output in draw(st.lists(st.sampled_from(["y", "batch", "upper", "z"]), max_size=2, unique=True)):
        _set(message.outputs.add(name=output).parameters, draw(_parameters))
    return message


def _answer(server: RunningServer, payload: bytes) -> tuple[grpc.StatusCode, str]:
    with grpc.insecure_channel(server.grpc_target) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        try:
            call(payload, timeout=60)
            return grpc.StatusCode.OK, ""
        except grpc.RpcError as err:
            return err.code(), err.details() or ""


@FUZZ
@given(message=infer_requests())
def test_fuzzed_model_infer_requests_never_get_a_server_error(server: RunningServer,
                                                               message: pb.ModelInferRequest) -> None:
    code, details = _answer(server, message.SerializeToString())
    event(code.name)  # pytest --hypothesis-show-statistics: how many got past validation
    assert code == grpc.StatusCode.OK or (code in CLIENT_ERRORS and details), (code, details, message)


@pytest.mark.parametrize("shape", [[2**63 - 1, 50_000_000, 0], [0, 2**62, 2**62], [2**31, 0, 2**31, 2**31]])
@pytest.mark.parametrize("field", ["fp32_contents", "int64_contents"])
def test_empty_shapes_with_huge_dimensions_are_invalid_argument(server: RunningServer, shape: list[int],
                                                                field: str) -> None:
    # The reliability fuzz's three INTERNALs (ValueError from numpy's reshape of typed contents): zero elements,
    # yet a shape numpy cannot represent.
    message = pb.ModelInferRequest(model_name="echo")
    message.inputs.add(name="x", datatype="FP32" if field == "fp32_contents" else "INT64", shape=shape)
    code, details = _answer(server, message.SerializeToString())
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "input 'x'" in details, (code, details)


def test_bytes_that_are_not_a_model_infer_request_are_invalid_argument(server: RunningServer) -> None:
    code, details = _answer(server, b"\xff\xff\xff")
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
    assert "not a valid inference.ModelInferRequest" in details


@FUZZ
@given(payload=st.binary(max_size=200))
def test_undecodable_bytes_never_get_a_server_error(server: RunningServer, payload: bytes) -> None:
    code, details = _answer(server, payload)
    assert code not in SERVER_ERRORS, (code, details, payload)


def test_an_undecodable_stream_message_gets_an_error_message_and_the_stream_goes_on(server: RunningServer) -> None:
    good = pb.ModelInferRequest(model_name="echo", id="good")
    good.inputs.add(name="x", datatype="FP32", shape=[1, 2]).contents.fp32_contents.extend([1.0, 2.0])
    with grpc.insecure_channel(server.grpc_target) as channel:
        call = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer",
                                     response_deserializer=pb.ModelStreamInferResponse.FromString)
        replies = list(call(iter([b"\xff\xff\xff", good.SerializeToString()]), timeout=60))
    errors = [r.error_message for r in replies if r.error_message]
    assert len(replies) == 2 and len(errors) == 1, replies
    assert "not a valid inference.ModelInferRequest" in errors[0]
    ok = next(r.infer_response for r in replies if not r.error_message)
    assert ok.id == "good" and np.frombuffer(ok.raw_output_contents[0], np.float32).tolist() == [2.0, 4.0]


def test_the_server_still_serves_after_the_fuzz(server: RunningServer) -> None:
    stub = pb_grpc.GRPCInferenceServiceStub
    with grpc.insecure_channel(server.grpc_target) as channel:
        assert stub(channel).ServerLive(pb.ServerLiveRequest(), timeout=30).live
        assert stub(channel).ServerReady(pb.ServerReadyRequest(), timeout=30).ready
    assert "gRPC ModelInfer failed" not in server.log()
