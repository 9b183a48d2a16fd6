"""Wire protocols: KServe V2 / Open Inference Protocol over HTTP (JSON + binary extension) and gRPC.

Pure translation between bytes/protobufs and `headroom.core.types`; the HTTP app and the gRPC servicer
(`headroom.protocol.grpc_service`) are thin shells around these. See docs/protocol.md.
"""

from __future__ import annotations

from headroom.protocol.classification import classify
from headroom.protocol.http_request import HEADER_LENGTH, decode_infer_request, parse_header_length
from headroom.protocol.http_response import (
    encode_infer_response,
    error_response,
    model_metadata_json,
    server_metadata_json,
    server_timing,
)
from headroom.protocol.validation import batch_size_of, validate_against

__all__ = [
    "HEADER_LENGTH",
    "batch_size_of",
    "classify",
    "decode_infer_request",
    "encode_infer_response",
    "error_response",
    "model_metadata_json",
    "parse_header_length",
    "server_metadata_json",
    "server_timing",
    "validate_against",
]
