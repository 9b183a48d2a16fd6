"""Transport-neutral request and response types for tensor models (the KServe V2 / Open Inference Protocol).

HTTP/JSON, the binary tensor extension and gRPC all decode into these and encode from them; the data plane
never sees a transport. Tensors hold numpy arrays; BYTES tensors hold `dtype=object` arrays of `bytes`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from headroom.core.errors import InvalidRequest

#: V2 datatype name -> numpy dtype. BYTES is an object array of `bytes`.
V2_TO_NUMPY: Mapping[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(object),
}
NUMPY_TO_V2: Mapping[np.dtype[Any], str] = {v: k for k, v in V2_TO_NUMPY.items()}


def numpy_dtype(datatype: str) -> np.dtype[Any]:
    """The numpy dtype for a V2 datatype name; raises InvalidRequest for unknown names."""
    try:
        return V2_TO_NUMPY[datatype]
    except KeyError:
        raise InvalidRequest(
            f"unsupported datatype {datatype!r}; expected one of {', '.join(V2_TO_NUMPY)}"
        ) from None


def v2_datatype(array: np.ndarray) -> str:
    """The V2 datatype name of a numpy array (str/bytes object arrays are BYTES)."""
    if array.dtype.kind in ("O", "S", "U"):
        return "BYTES"
    try:
        return NUMPY_TO_V2[array.dtype]
    except KeyError:
        raise InvalidRequest(f"numpy dtype {array.dtype} has no V2 datatype") from None


@dataclass(frozen=True, slots=True)
class Tensor:
    """One named tensor of a request or response."""

    name: str  # the input/output name from the model config
    datatype: str  # V2 datatype name ("FP32", "BYTES", ...)
    shape: tuple[int, ...]  # full shape including the batch dimension when the model batches
    data: np.ndarray  # values, already reshaped to `shape`; BYTES -> object array of bytes


@dataclass(frozen=True, slots=True)
class RequestedOutput:
    """An output the client asked for, with how it wants it encoded."""

    name: str  # output name
    binary_data: bool = False  # HTTP binary extension: send raw bytes after the JSON header
    class_count: int = 0  # V2 classification extension: >0 returns the top-k "score:index:label" strings


@dataclass(frozen=True, slots=True)
class InferenceRequest:
    """A decoded inference request, identical whatever transport it came from."""

    request_id: str  # client id if given, else server-generated; echoed back
    model_name: str  # target model
    model_version: str  # "" means the model's default (latest ready) version
    inputs: tuple[Tensor, ...]  # input tensors, in request order
    outputs: tuple[RequestedOutput, ...] = ()  # empty means every output, JSON-encoded
    parameters: Mapping[str, object] = field(default_factory=dict)  # V2 request parameters
    priority: int = 0  # 0 = default level; 1 is the highest priority, larger numbers lower
    timeout_ms: float | None = None  # client-requested timeout; may shorten, never lengthen the model's
    binary_output_default: bool = False  # HTTP `binary_data_output` request parameter
    received_s: float | None = None  # the server clock's time at the HTTP edge (None: when the data plane got it)


@dataclass(frozen=True, slots=True)
class StageTimings:
    """Where a request's time went, in milliseconds (also sent as `Server-Timing`). The stages are disjoint
    and sum to `total_ms`: `other_ms` is what none of the named stages covers."""

    queue_ms: float = 0.0  # in the model's queue, from the end of its preprocessing until a batch took it
    batch_wait_ms: float = 0.0  # in its batch but neither computing nor being postprocessed: the executor
    #   hop, collate, split, and the postprocessing of the requests ahead of it in the batch
    preprocess_ms: float = 0.0  # decode/tokenize/transform of this request's inputs (with its thread hop)
    compute_ms: float = 0.0  # the batched model call this request rode in
    postprocess_ms: float = 0.0  # pool, softmax, top-k for this request
    total_ms: float = 0.0  # the data plane's entry to response ready
    other_ms: float = 0.0  # total minus the stages: validation, routing, handing results back to the loop

    def as_dict(self) -> dict[str, float]:
        return {
            "queue": self.queue_ms,
            "batch_wait": self.batch_wait_ms,
            "preprocess": self.preprocess_ms,
            "compute": self.compute_ms,
            "postprocess": self.postprocess_ms,
            "other": self.other_ms,
            "total": self.total_ms,
        }


@dataclass(frozen=True, slots=True)
class InferenceResponse:
    """A successful result, identical whatever transport returns it."""

    request_id: str  # echoes the request id
    model_name: str  # the model that answered
    model_version: str  # the version that answered
    outputs: tuple[Tensor, ...]  # output tensors in requested (or config) order
    requested: tuple[RequestedOutput, ...] = ()  # encoding wishes carried from the request
    parameters: Mapping[str, object] = field(default_factory=dict)  # response params (missing streams, ...)
    timings: StageTimings = field(default_factory=StageTimings)  # per-stage breakdown
    batch_size: int = 1  # how many requests shared the compute call
