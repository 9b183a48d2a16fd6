"""The V2 HTTP codec in one import for the HTTP app (re-exports; see the modules named below).

- request decoding: `headroom.protocol.http_request`
- response, metadata and error encoding: `headroom.protocol.http_response`
- validation against a model's config: `headroom.protocol.validation`
"""

from __future__ import annotations

from headroom.protocol.http_request import HEADER_LENGTH, decode_infer_request, parse_header_length
from headroom.protocol.http_response import (
    BINARY_CONTENT_TYPE,
    JSON_CONTENT_TYPE,
    encode_infer_response,
    error_response,
    model_metadata_json,
    server_metadata_json,
    server_timing,
)
from headroom.protocol.validation import batch_size_of, validate_against

__all__ = [
    "BINARY_CONTENT_TYPE",
    "HEADER_LENGTH",
    "JSON_CONTENT_TYPE",
    "batch_size_of",
    "decode_infer_request",
    "encode_infer_response",
    "error_response",
    "model_metadata_json",
    "parse_header_length",
    "server_metadata_json",
    "server_timing",
    "validate_against",
]
