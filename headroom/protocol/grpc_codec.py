"""ModelInferRequest/Response protobufs <-> headroom.core.types (pure; no grpc server here).

Inputs come either all from `raw_input_contents` (one little-endian blob per input, in input order; BYTES
length-prefixed) or each from its typed `contents`, never mixed. Outputs always go back as
`raw_output_contents`, which is what tritonclient reads. Request parameters `priority` (int) and `timeout`
(**microseconds**, tritonclient's `timeout=`; 0 = no override) are read as in the HTTP codec.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from headroom.core.dataplane import ModelMetadata
from headroom.core.errors import InvalidRequest
from headroom.core.types import V2_TO_NUMPY, InferenceRequest, InferenceResponse, RequestedOutput, Tensor
from headroom.models.config import ModelConfig
from headroom.protocol.generated import headroom_inference_pb2 as pb
from headroom.protocol.http_response import Labels, select_outputs
from headroom.protocol.tensor_codec import array_to_raw, element_count, raw_to_array
from headroom.protocol.validation import check_input

#: V2 datatype -> the InferTensorContents field that carries it (FP16 has none: send it raw).
CONTENTS_FIELD: Mapping[str, str] = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def parameter_value(param: pb.InferParameter) -> object:
    """The Python value of an InferParameter oneof (None when unset)."""
    which = param.WhichOneof("parameter_choice")
    return None if which is None else getattr(param, which)


def set_parameter(param: pb.InferParameter, value: object) -> None:
    """Store a Python value in an InferParameter (bool, int, float, str; anything else as its str())."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool):
        param.bool_param = value
    elif isinstance(value, int):
        if value >= 2**63:
            param.uint64_param = value
        else:
            param.int64_param = value
    elif isinstance(value, float):
        param.double_param = value
    else:
        param.string_param = value if isinstance(value, str) else str(value)


def _typed_contents(tensor: Any, datatype: str, shape: tuple[int, ...], where: str) -> np.ndarray:
    field = CONTENTS_FIELD.get(datatype)
    if field is None:
        raise InvalidRequest(f"{where}: {datatype} has no typed contents field; send it in raw_input_contents")
    values = getattr(tensor.contents, field)
    count = element_count(shape, where)
    if len(values) != count:
        raise InvalidRequest(f"{where}: {len(values)} values in {field} for shape {list(shape)} ({count})")
    if datatype == "BYTES":
        out = np.empty(count, dtype=object)
        out[:] = [bytes(v) for v in values]
        return out.reshape(shape)
    dtype = V2_TO_NUMPY[datatype]
    if dtype.kind in "iu" and count:
        info = np.iinfo(dtype)
        if min(values) < info.min or max(values) > info.max:
            raise InvalidRequest(f"{where}: value out of range for {datatype} [{info.min}, {info.max}]")
    return np.asarray(list(values), dtype=dtype).reshape(shape)


def decode_model_infer(message: pb.ModelInferRequest, request_id_hint: str = "",
                       config: ModelConfig | None = None) -> InferenceRequest:
    """ModelInferRequest -> InferenceRequest; raises InvalidRequest saying what is wrong.

    `config`, when given, is the model's: each input is checked against it before its data is decoded.
    Costs O(message): element counts are checked against the values or bytes present before allocating.
    """
    if not message.model_name:
        raise InvalidRequest("model_name is required")
    if not message.inputs:
        raise InvalidRequest("at least one input is required")
    raw = list(message.raw_input_contents)
    if raw and len(raw) != len(message.inputs):
        raise InvalidRequest(
            f"{len(raw)} raw_input_contents for {len(message.inputs)} inputs; send one raw blob per input, "
            "or use typed contents for all of them"
        )
    inputs: list[Tensor] = []
    for i, item in enumerate(message.inputs):
        where = f"input {item.name!r}" if item.name else f"inputs[{i}]"
        if not item.name:
            raise InvalidRequest(f"{where}: name is required")
        if item.datatype not in V2_TO_NUMPY:
            raise InvalidRequest(
                f"{where}: unsupported datatype {item.datatype!r}; expected one of {', '.join(V2_TO_NUMPY)}"
            )
        shape = tuple(int(d) for d in item.shape)
        element_count(shape, where)
        if config is not None:
            check_input(config, item.name, item.datatype, shape)
        if raw:
            if item.HasField("contents"):
                raise InvalidRequest(f"{where}: has typed contents while raw_input_contents is used")
            data = raw_to_array(raw[i], item.datatype, shape, where)
        else:
            data = _typed_contents(item, item.datatype, shape, where)
        if any(t.name == item.name for t in inputs):
            raise InvalidRequest(f"input {item.name!r} appears more than once")
        inputs.append(Tensor(item.name, item.datatype, shape, data))
    params = {key: parameter_value(value) for key, value in message.parameters.items()}
    priority = params.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int) or priority < 0:
        raise InvalidRequest(f"parameters.priority must be an integer >= 0, got {priority!r}")
    timeout_us = params.get("timeout", 0)
    if isinstance(timeout_us, bool) or not isinstance(timeout_us, int | float) or timeout_us < 0:
        raise InvalidRequest(f"parameters.timeout must be microseconds >= 0, got {timeout_us!r}")
    outputs: list[RequestedOutput] = []
    for item in message.outputs:
        count = parameter_value(item.parameters["classification"]) if "classification" in item.parameters else 0
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise InvalidRequest(f"output {item.name!r}: parameters.classification must be an integer >= 1")
        outputs.append(RequestedOutput(name=item.name, binary_data=True, class_count=count))
    return InferenceRequest(
        request_id=message.id or request_id_hint,
        model_name=message.model_name,
        model_version=message.model_version,
        inputs=tuple(inputs),
        outputs=tuple(outputs),
        parameters=params,
        priority=priority,
        timeout_ms=timeout_us / 1000.0 if timeout_us > 0 else None,
        binary_output_default=True,
    )


def encode_model_infer(response: InferenceResponse, labels: Labels | None = None) -> pb.ModelInferResponse:
    """InferenceResponse -> ModelInferResponse with every output in raw_output_contents."""
    message = pb.ModelInferResponse(
        model_name=response.model_name, model_version=response.model_version, id=response.request_id
    )
    for key, value in response.parameters.items():
        set_parameter(message.parameters[key], value)
    for tensor, _ in select_outputs(response, True, labels):
        message.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=list(tensor.shape))
        message.raw_output_contents.append(array_to_raw(np.asarray(tensor.data), tensor.datatype))
    return message


def encode_model_metadata(meta: ModelMetadata) -> pb.ModelMetadataResponse:
    """ModelMetadata's answer (`headroom serve`'s servicer and the Ray Serve ingress)."""
    tensor = pb.ModelMetadataResponse.TensorMetadata
    return pb.ModelMetadataResponse(
        name=meta.name, versions=list(meta.versions), platform=meta.platform,
        inputs=[tensor(name=t.name, datatype=t.datatype, shape=list(t.shape)) for t in meta.inputs],
        outputs=[tensor(name=t.name, datatype=t.datatype, shape=list(t.shape)) for t in meta.outputs])
