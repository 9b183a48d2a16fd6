"""Decode a V2 HTTP inference request body (JSON, optionally followed by binary tensor data).

Pure functions: the HTTP app passes the raw body, the `Inference-Header-Content-Length` header and the model
from the URL; nothing here knows about Starlette.

Request parameters understood (everything in `parameters` is also kept verbatim in the request):
- `priority` (int >= 0): 0 = the model's default level, 1 = highest; Triton's convention.
- `timeout` (number >= 0): **microseconds**, as in Triton's schedule-policy extension and tritonclient's
  `timeout=` argument; 0 means "no override". Stored as `timeout_ms` = timeout / 1000.
- `binary_data_output` (bool): default `binary_data` for outputs that do not say.
- `outputs[].parameters.binary_data` (bool) and `.classification` (int > 0, top-k).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from headroom.core.deadline import shorter
from headroom.core.errors import InvalidRequest
from headroom.core.types import V2_TO_NUMPY, InferenceRequest, RequestedOutput, Tensor
from headroom.models.config import ModelConfig
from headroom.protocol.tensor_codec import element_count, json_to_array, raw_to_array
from headroom.protocol.validation import check_input

HEADER_LENGTH = "Inference-Header-Content-Length"


def _mapping(value: object, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidRequest(f"{where} must be a JSON object, got {type(value).__name__}")
    return value


def _str(value: object, where: str, default: str | None = None) -> str:
    if value is None and default is not None:
        return default
    if not isinstance(value, str) or (default is None and not value):
        raise InvalidRequest(f"{where} must be a non-empty string, got {value!r:.60}")
    return value


def _int(value: object, where: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidRequest(f"{where} must be an integer >= {minimum}, got {value!r:.60}")
    return value


def _bool(value: object, where: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidRequest(f"{where} must be true or false, got {value!r:.60}")
    return value


def parse_header_length(value: str | None) -> int | None:
    """The `Inference-Header-Content-Length` header as an int (None when absent)."""
    if value is None:
        return None
    try:
        length = int(value)
    except ValueError:
        raise InvalidRequest(f"{HEADER_LENGTH} must be an integer, got {value!r:.60}") from None
    if length < 0:
        raise InvalidRequest(f"{HEADER_LENGTH} must be >= 0, got {length}")
    return length


def _decode_input(raw: object, index: int, binary: memoryview, offset: int,
                  config: ModelConfig | None) -> tuple[Tensor, int]:
    where = f"inputs[{index}]"
    item = _mapping(raw, where)
    name = _str(item.get("name"), f"{where}.name")
    where = f"input {name!r}"
    datatype = _str(item.get("datatype"), f"{where}: datatype")
    if datatype not in V2_TO_NUMPY:
        raise InvalidRequest(f"{where}: unsupported datatype {datatype!r}; expected one of {', '.join(V2_TO_NUMPY)}")
    shape_raw = item.get("shape")
    if not isinstance(shape_raw, list):
        raise InvalidRequest(f"{where}: shape must be a list of non-negative integers, got {shape_raw!r:.60}")
    element_count(shape_raw, where)
    shape = tuple(shape_raw)
    if config is not None:  # before the data is looked at: nothing is decoded for a shape the model refuses
        check_input(config, name, datatype, shape)
    params = _mapping(item.get("parameters"), f"{where}: parameters")
    if "shared_memory_region" in params:
        raise InvalidRequest(f"{where}: the shared-memory extension is not supported; send the data inline")
    size_raw = params.get("binary_data_size")
    has_data = "data" in item
    if size_raw is None:
        if not has_data:
            raise InvalidRequest(f"{where}: needs either 'data' or parameters.binary_data_size")
        return Tensor(name, datatype, shape, json_to_array(item["data"], datatype, shape, where)), offset
    if has_data:
        raise InvalidRequest(f"{where}: has both 'data' and parameters.binary_data_size; send one")
    size = _int(size_raw, f"{where}: parameters.binary_data_size", 0)
    if offset + size > len(binary):
        raise InvalidRequest(
            f"{where}: binary_data_size {size} runs past the end of the body ({len(binary) - offset} binary "
            f"bytes left after the JSON header and earlier inputs)"
        )
    data = raw_to_array(binary[offset : offset + size], datatype, shape, where)
    return Tensor(name, datatype, shape, data), offset + size


def _decode_output(raw: object, index: int, binary_default: bool) -> RequestedOutput:
    where = f"outputs[{index}]"
    item = _mapping(raw, where)
    name = _str(item.get("name"), f"{where}.name")
    where = f"output {name!r}"
    params = _mapping(item.get("parameters"), f"{where}: parameters")
    if "shared_memory_region" in params:
        raise InvalidRequest(f"{where}: the shared-memory extension is not supported")
    binary = binary_default
    if "binary_data" in params:
        binary = _bool(params["binary_data"], f"{where}: parameters.binary_data")
    class_count = 0
    if "classification" in params:
        class_count = _int(params["classification"], f"{where}: parameters.classification", 1)
    return RequestedOutput(name=name, binary_data=binary, class_count=class_count)


def decode_infer_request(
    body: bytes,
    header_length: int | None,
    model_name: str,
    model_version: str,
    request_id_hint: str,
    config: ModelConfig | None = None,
    *,
    header_timeout_ms: float | None = None,
    received_s: float | None = None,
) -> InferenceRequest:
    """Body of `POST /v2/models/{model_name}[/versions/{model_version}]/infer` -> InferenceRequest.

    `header_length` is the `Inference-Header-Content-Length` header (None: the whole body is JSON);
    `request_id_hint` becomes the id when the body has none; `config`, when given, is the model's: each
    input's name, datatype and shape are checked against it before its data is decoded. Costs O(body): no
    allocation follows from a declared shape alone. Raises InvalidRequest saying what is wrong.
    `header_timeout_ms` (the `X-Request-Timeout-Ms` header) shortens the body's `timeout`; `received_s` is the
    edge's arrival time (both are set here rather than by copying the request afterwards: this runs per request).
    """
    if header_length is None:
        header, binary = body, memoryview(b"")
    else:
        if header_length > len(body):
            raise InvalidRequest(f"{HEADER_LENGTH} is {header_length} but the body has only {len(body)} bytes")
        view = memoryview(body)
        header, binary = bytes(view[:header_length]), view[header_length:]
    try:
        doc = orjson.loads(header)
    except orjson.JSONDecodeError as exc:
        hint = "" if header_length is not None else f"; binary bodies need the {HEADER_LENGTH} header"
        raise InvalidRequest(f"request body is not valid JSON: {exc}{hint}") from None
    top = _mapping(doc, "request body")
    request_id = _str(top.get("id"), "id", default=request_id_hint) or request_id_hint
    params = dict(_mapping(top.get("parameters"), "parameters"))
    priority = _int(params.get("priority", 0), "parameters.priority", 0)
    timeout_ms: float | None = None
    if "timeout" in params:
        timeout_us = params["timeout"]
        if isinstance(timeout_us, bool) or not isinstance(timeout_us, int | float) or timeout_us < 0:
            raise InvalidRequest(f"parameters.timeout must be microseconds >= 0, got {timeout_us!r:.60}")
        timeout_ms = timeout_us / 1000.0 if timeout_us > 0 else None
    binary_default = False
    if "binary_data_output" in params:
        binary_default = _bool(params["binary_data_output"], "parameters.binary_data_output")
    inputs_raw = top.get("inputs")
    if not isinstance(inputs_raw, list) or not inputs_raw:
        raise InvalidRequest("'inputs' must be a non-empty list of {name, datatype, shape, data}")
    inputs: list[Tensor] = []
    offset = 0
    for i, raw in enumerate(inputs_raw):
        tensor, offset = _decode_input(raw, i, binary, offset, config)
        if any(t.name == tensor.name for t in inputs):
            raise InvalidRequest(f"input {tensor.name!r} appears more than once")
        inputs.append(tensor)
    if offset != len(binary):
        raise InvalidRequest(
            f"{len(binary) - offset} bytes after the JSON header are not claimed by any input's binary_data_size"
        )
    outputs_raw = top.get("outputs", [])
    if not isinstance(outputs_raw, list):
        raise InvalidRequest("'outputs' must be a list of {name, parameters}")
    outputs = [_decode_output(raw, i, binary_default) for i, raw in enumerate(outputs_raw)]
    names = [o.name for o in outputs]
    if len(set(names)) != len(names):
        raise InvalidRequest(f"an output is requested more than once: {names}")
    return InferenceRequest(
        request_id=request_id,
        model_name=model_name,
        model_version=model_version,
        inputs=tuple(inputs),
        outputs=tuple(outputs),
        parameters=params,
        priority=priority,
        timeout_ms=shorter(timeout_ms, header_timeout_ms),
        binary_output_default=binary_default,
        received_s=received_s,
    )
