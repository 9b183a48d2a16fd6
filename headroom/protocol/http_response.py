"""Encode V2 HTTP responses: inference results (JSON or binary extension), metadata, errors.

An output is sent in binary when the request asked for it (`binary_data`, or `binary_data_output` for outputs
it did not name) and also when JSON cannot carry it faithfully: BYTES that are not valid UTF-8 and floats that
are NaN or infinite. Binary outputs follow the JSON header in output order, each announced by
`parameters.binary_data_size`; the header length goes in `Inference-Header-Content-Length`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import orjson

from headroom.core.dataplane import ModelMetadata, ServerMetadata, TensorMetadata
from headroom.core.errors import HeadroomError
from headroom.core.types import InferenceResponse, RequestedOutput, StageTimings, Tensor
from headroom.protocol.classification import classify
from headroom.protocol.http_request import HEADER_LENGTH
from headroom.protocol.tensor_codec import array_to_json, array_to_raw, json_representable

JSON_CONTENT_TYPE = "application/json"
BINARY_CONTENT_TYPE = "application/octet-stream"
#: Per-output classification labels, by output name (e.g. the digits model's class names).
Labels = Mapping[str, Sequence[str]]


def _json_default(value: object) -> object:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, tuple | set | frozenset):
        return list(value)
    return str(value)


def dumps(doc: object) -> bytes:
    """JSON bytes for a response document (numpy arrays and scalars allowed)."""
    return orjson.dumps(doc, default=_json_default, option=orjson.OPT_SERIALIZE_NUMPY)


def select_outputs(
    response: InferenceResponse, binary_default: bool, labels: Labels | None
) -> list[tuple[Tensor, bool]]:
    """The outputs to send, in response order, each with whether it was asked for in binary.

    With no requested outputs every output is sent (binary when `binary_default`); otherwise only the
    requested ones, with the classification extension applied where `class_count > 0`.
    """
    wanted: dict[str, RequestedOutput] = {r.name: r for r in response.requested}
    chosen: list[tuple[Tensor, bool]] = []
    for tensor in response.outputs:
        if not wanted:
            chosen.append((tensor, binary_default))
            continue
        request = wanted.get(tensor.name)
        if request is None:
            continue
        if request.class_count > 0:
            tensor = classify(tensor, request.class_count, (labels or {}).get(tensor.name))
        chosen.append((tensor, request.binary_data))
    return chosen


def server_timing(timings: StageTimings) -> str:
    """`Server-Timing` header value: `queue;dur=0.12, batch_wait;dur=..., ..., total;dur=...` (ms)."""
    return ", ".join(f"{name};dur={value:.3f}" for name, value in timings.as_dict().items())


def encode_infer_response(
    response: InferenceResponse, *, binary_default: bool = False, labels: Labels | None = None
) -> tuple[bytes, dict[str, str]]:
    """InferenceResponse -> (body, headers) for `POST .../infer`.

    `binary_default` is the request's `binary_data_output` (needed when it named no outputs); `labels`
    supplies class names for the classification extension. Headers carry Content-Type, Server-Timing and,
    when any output is binary, Inference-Header-Content-Length.
    """
    outputs_json: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for tensor, want_binary in select_outputs(response, binary_default, labels):
        data = np.asarray(tensor.data)
        entry: dict[str, Any] = {
            "name": tensor.name,
            "datatype": tensor.datatype,
            "shape": list(tensor.shape),
        }
        if want_binary or not json_representable(data, tensor.datatype):
            raw = array_to_raw(data, tensor.datatype)
            entry["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        else:
            entry["data"] = array_to_json(data, tensor.datatype)
        outputs_json.append(entry)
    doc: dict[str, Any] = {"model_name": response.model_name, "model_version": response.model_version}
    if response.request_id:
        doc["id"] = response.request_id
    if response.parameters:
        doc["parameters"] = dict(response.parameters)
    doc["outputs"] = outputs_json
    header = dumps(doc)
    headers = {"Server-Timing": server_timing(response.timings)}
    if not blobs:
        headers["Content-Type"] = JSON_CONTENT_TYPE
        return header, headers
    headers["Content-Type"] = BINARY_CONTENT_TYPE
    headers[HEADER_LENGTH] = str(len(header))
    return b"".join([header, *blobs]), headers


def _tensor_metadata(t: TensorMetadata) -> dict[str, Any]:
    return {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}


def server_metadata_json(meta: ServerMetadata) -> dict[str, Any]:
    """`GET /v2` body."""
    return {"name": meta.name, "version": meta.version, "extensions": list(meta.extensions)}


def model_metadata_json(meta: ModelMetadata) -> dict[str, Any]:
    """`GET /v2/models/{m}[/versions/{v}]` body."""
    return {
        "name": meta.name,
        "versions": list(meta.versions),
        "platform": meta.platform,
        "inputs": [_tensor_metadata(t) for t in meta.inputs],
        "outputs": [_tensor_metadata(t) for t in meta.outputs],
    }


def error_response(error: BaseException) -> tuple[int, bytes, dict[str, str]]:
    """Any exception -> (HTTP status, `{"error": ..., "reason": ...}` body, headers).

    HeadroomError subclasses keep their status and message (plus `Retry-After` when they carry one);
    anything else is a 500 that does not leak internals beyond the exception type.
    """
    if isinstance(error, HeadroomError):
        status, body = error.http_status, error.to_json()
        headers = {"Content-Type": JSON_CONTENT_TYPE}
        if error.retry_after_s is not None:
            headers["Retry-After"] = str(max(1, math.ceil(error.retry_after_s)))
        return status, dumps(body), headers
    body = {"error": f"internal error ({type(error).__name__}); see the server log", "reason": "internal"}
    return 500, dumps(body), {"Content-Type": JSON_CONTENT_TYPE}
