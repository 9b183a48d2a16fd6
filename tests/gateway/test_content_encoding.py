"""Compressed request bodies: the decoder on its own, then through the gateway (ASGI driven directly).

`Content-Encoding: gzip | x-gzip | deflate` is inflated as the body arrives, bounded by `max_body_bytes`
(413 for a bomb, with memory bound by the limit), corrupt streams are 400, other codings 400 `unsupported`;
the app behind sees the decoded body without Content-Encoding and with the decoded Content-Length.
"""

from __future__ import annotations

import gzip
import json
import resource
import tracemalloc
import zlib
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import pytest

from headroom.core.errors import InvalidRequest, PayloadTooLarge, Unsupported
from headroom.gateway.content_encoding import (
    INLINE_OUTPUT_BYTES,
    body_sink,
    content_codings,
    decode_body,
    decoded_headers,
)
from headroom.gateway.limits import BODY_SCOPE_KEY, InputLimits
from headroom.gateway.middleware import GatewayConfig, GatewayMiddleware

Message = MutableMapping[str, Any]
DOC = b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1.5, -2.0]}]}'
MiB = 1024 * 1024


def bomb(zeros_mb: int = 200) -> bytes:
    """`zeros_mb` MB of zeros as gzip, compressed 1 MiB at a time (so making it needs no 200 MB)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + 15)
    block = bytes(MiB)
    return b"".join(packer.compress(block) for _ in range(zeros_mb)) + packer.flush()


@pytest.fixture(scope="module")
def zip_bomb() -> bytes:
    return bomb()


# --- the decoder --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("encoding", "pack"),
    [("gzip", gzip.compress), ("x-gzip", gzip.compress), ("deflate", zlib.compress), ("GZip", gzip.compress),
     ("deflate", gzip.compress), ("gzip", zlib.compress)],  # zlib detects the wrapper, as Triton's decoder does
    ids=["gzip", "x-gzip", "deflate", "case-insensitive", "gzip-labelled-deflate", "zlib-labelled-gzip"],
)
def test_gzip_and_deflate_decode(encoding: str, pack: Any) -> None:
    assert decode_body(encoding, pack(DOC), 1024) == DOC
    assert decode_body(encoding, b"", 1024) == b""  # nothing sent, nothing to decode


def test_identity_and_no_header_keep_the_body_as_sent() -> None:
    for headers in ([], [(b"content-encoding", b"identity")], [(b"content-encoding", b" Identity ")]):
        sink = body_sink(headers, 10)
        sink.add(b"as is")
        assert not sink.decoded and sink.body() == b"as is"
    assert content_codings([(b"content-encoding", b"identity, GZIP")]) == ["gzip"]


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (gzip.compress(DOC)[:-6], "truncated"),
        (b"this is not gzip", "incorrect header check"),
        (zlib.compress(DOC)[2:-4], "incorrect header check"),  # raw deflate: refused, as Triton refuses it
        (gzip.compress(DOC) + b"junk", "4 bytes follow the end"),
        (gzip.compress(DOC) * 2, "follow the end"),  # one stream per body (tritonclient sends one)
    ],
    ids=["truncated", "not-compressed", "raw-deflate", "trailing-junk", "two-gzip-members"],
)
def test_a_corrupt_stream_is_400_naming_the_encoding(body: bytes, why: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        decode_body("gzip", body, 1024)
    assert "Content-Encoding: gzip" in info.value.message and why in info.value.message


@pytest.mark.parametrize("value", [b"br", b"zstd", b"compress", b"gzip, gzip", b"deflate, br"])
def test_other_codings_are_400_unsupported_listing_the_supported_ones(value: bytes) -> None:
    with pytest.raises(Unsupported) as info:
        body_sink([(b"content-encoding", value)], 1024)
    assert info.value.http_status == 400 and info.value.reason == "unsupported"
    assert "gzip, deflate" in info.value.message


def test_the_limit_counts_decoded_bytes_exactly() -> None:
    data = b"x" * 5000
    assert decode_body("gzip", gzip.compress(data), 5000) == data
    with pytest.raises(PayloadTooLarge) as info:
        decode_body("gzip", gzip.compress(data), 4999)
    assert "decompresses to more than the limit of 4999 bytes" in info.value.message
    assert decode_body("gzip", gzip.compress(data), 0) == data  # 0: no limit


def test_chunk_boundaries_anywhere_give_the_same_body() -> None:
    data = json.dumps({"data": list(range(20000))}).encode()
    packed = gzip.compress(data)
    for size in (1, 7, 4096, len(packed)):
        sink = body_sink([(b"content-encoding", b"gzip")], 10 * MiB)
        for i in range(0, len(packed), size):
            sink.add(packed[i:i + size])
        assert sink.body() == data


def test_decoded_headers_drop_the_encoding_and_give_the_decoded_length() -> None:
    headers = [(b"content-encoding", b"gzip"), (b"content-length", b"31"), (b"transfer-encoding", b"chunked"),
               (b"inference-header-content-length", b"88")]
    assert decoded_headers(headers, 88) == [(b"inference-header-content-length", b"88"), (b"content-length", b"88")]


def _status_bytes(field: str) -> int:
    """A `/proc/self/status` memory field (VmRSS, VmHWM) in bytes; getrusage's peak where there is none."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _rss_baseline() -> int:
    """Reset the peak RSS (Linux `clear_refs` 5) and return the RSS now, so the next peak is this test's."""
    try:
        Path("/proc/self/clear_refs").write_bytes(b"5")
    except OSError:
        return _status_bytes("VmHWM")  # cannot reset: compare with the old peak (a weaker check)
    return _status_bytes("VmRSS")


def test_a_zip_bomb_is_413_with_memory_bound_by_the_limit(zip_bomb: bytes) -> None:
    assert len(zip_bomb) < 300_000  # 200 MB of zeros
    limit = 8 * MiB
    baseline = _rss_baseline()
    tracemalloc.start()
    try:
        with pytest.raises(PayloadTooLarge):
            decode_body("gzip", zip_bomb, limit)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < limit + 2 * MiB, peak  # the limit, one 64 KiB chunk, zlib's state
    growth = _status_bytes("VmHWM") - baseline
    print(f"zip bomb {len(zip_bomb)} B -> 413 at {limit} B: tracemalloc peak {peak} B, peak RSS growth {growth} B")
    assert growth < 50 * MiB


# --- through the gateway ------------------------------------------------------------------------------------
async def seen_app(sc: Any, receive: Any, send: Any) -> None:
    """Answers with the body it received (via `receive`), the scope's body, and its headers."""
    message = await receive()
    out = json.dumps({"body": message["body"].decode("latin-1"), "scope_body": sc[BODY_SCOPE_KEY].decode("latin-1"),
                      "headers": {k.decode(): v.decode() for k, v in sc["headers"]}}).encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": out})


async def call(app: Any, path: str, headers: list[tuple[bytes, bytes]], chunks: list[bytes]
               ) -> tuple[int, dict[bytes, bytes], bytes]:
    inbox: list[Message] = [
        {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)
    ]
    sent: list[Message] = []

    async def receive() -> Message:
        return inbox.pop(0) if inbox else {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path, "raw_path": path.encode(), "headers": headers,
             "query_string": b""}
    await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    return start["status"], dict(start["headers"]), b"".join(m.get("body", b"") for m in sent[1:])


def _split(data: bytes, size: int) -> list[bytes]:
    return [data[i:i + size] for i in range(0, len(data), size)] or [b""]


@pytest.mark.parametrize(("encoding", "pack"), [(b"gzip", gzip.compress), (b"deflate", zlib.compress)],
                         ids=["gzip", "deflate"])
async def test_the_app_sees_the_decoded_body_and_headers(encoding: bytes, pack: Any) -> None:
    body = DOC + b"\x00\x01\x02\x03"  # a JSON header and 4 binary bytes, like tritonclient's binary extension
    packed = pack(body)
    headers = [(b"content-type", b"application/octet-stream"), (b"content-encoding", encoding),
               (b"content-length", str(len(packed)).encode()),
               (b"inference-header-content-length", str(len(DOC)).encode())]
    status, _, payload = await call(GatewayMiddleware(seen_app, GatewayConfig()), "/v2/models/echo/infer",
                                    headers, _split(packed, 16))
    assert status == 200, payload
    seen = json.loads(payload)
    assert seen["body"].encode("latin-1") == body == seen["scope_body"].encode("latin-1")
    assert "content-encoding" not in seen["headers"]
    assert seen["headers"]["content-length"] == str(len(body))
    assert seen["headers"]["inference-header-content-length"] == str(len(DOC))


async def test_json_checks_run_on_the_decoded_body() -> None:
    app = GatewayMiddleware(seen_app, GatewayConfig(limits=InputLimits(max_json_depth=3)))
    deep = gzip.compress(b"[" * 10 + b"]" * 10)
    status, _, payload = await call(app, "/v2/models/echo/infer", [(b"content-encoding", b"gzip")], [deep])
    assert status == 400 and "nesting depth 10" in json.loads(payload)["error"]
    gen = gzip.compress(json.dumps({"model": "m", "prompt": "hi", "max_tokens": 10**6}).encode())
    status, _, payload = await call(app, "/v1/completions", [(b"content-encoding", b"gzip")], [gen])
    assert status == 400 and "max_tokens=1000000" in json.loads(payload)["error"]["message"]


async def test_identity_bodies_pass_through_untouched() -> None:
    headers = [(b"content-encoding", b"identity"), (b"content-length", str(len(DOC)).encode())]
    status, _, payload = await call(GatewayMiddleware(seen_app, GatewayConfig()), "/v2/models/echo/infer",
                                    headers, [DOC])
    assert status == 200 and json.loads(payload)["headers"]["content-encoding"] == "identity"


async def test_refusals_are_json_with_the_right_status() -> None:
    app = GatewayMiddleware(seen_app, GatewayConfig(limits=InputLimits(max_body_bytes=4096)))
    status, headers, payload = await call(app, "/v2/models/echo/infer", [(b"content-encoding", b"br")], [DOC])
    assert status == 400 and json.loads(payload)["reason"] == "unsupported"
    assert "gzip, deflate" in json.loads(payload)["error"]
    status, _, payload = await call(app, "/v1/embeddings", [(b"content-encoding", b"gzip")], [b"not gzip"])
    error = json.loads(payload)["error"]
    assert status == 400 and "Content-Encoding: gzip" in error["message"] and error["type"] == "invalid_request_error"
    status, headers, payload = await call(app, "/v2/models/echo/infer", [(b"content-encoding", b"gzip")],
                                          [gzip.compress(b" " * 5000)])
    assert status == 413 and headers[b"connection"] == b"close"
    assert json.loads(payload) == {
        "error": "the request body (Content-Encoding: gzip) decompresses to more than the limit of 4096 bytes; "
                 "send less, or raise the server's body limit (--max-body-mb)",
        "reason": "payload_too_large"}


async def test_a_zip_bomb_through_the_gateway_is_413_bound_by_the_limit(zip_bomb: bytes) -> None:
    limit = 16 * MiB
    app = GatewayMiddleware(seen_app, GatewayConfig(limits=InputLimits(max_body_bytes=limit)))
    tracemalloc.start()
    try:
        status, headers, payload = await call(app, "/v2/models/echo/infer", [(b"content-encoding", b"gzip")],
                                              _split(zip_bomb, 64 * 1024))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert status == 413 and json.loads(payload)["reason"] == "payload_too_large"
    assert headers[b"connection"] == b"close"  # the rest of the body is never read
    assert peak < limit + 2 * MiB, peak


async def test_large_bodies_inflate_off_the_event_loop_and_arrive_whole() -> None:
    data = json.dumps({"data": [i % 977 for i in range(800_000)]}).encode()
    assert len(data) > 2 * INLINE_OUTPUT_BYTES
    packed = gzip.compress(data)
    status, _, payload = await call(GatewayMiddleware(seen_app, GatewayConfig()), "/v2/models/echo/infer",
                                    [(b"content-encoding", b"gzip")], _split(packed, 64 * 1024))
    assert status == 200 and json.loads(payload)["body"].encode("latin-1") == data
