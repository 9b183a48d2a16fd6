"""Compressed request bodies (`Content-Encoding: gzip | deflate`), decoded as they arrive, never past the body limit.

tritonclient's HTTP clients send them with `request_compression_algorithm="gzip" | "deflate"`; Triton decodes
them before it reads the body, and `Inference-Header-Content-Length` counts the *decoded* bytes. The gateway
does the same: `body_sink(headers, max_body_bytes)` picks how the body is collected (`BodySink` keeps it as
sent, `InflatingSink` inflates each received chunk at once), and the handlers behind only ever see the decoded
body, with `content-encoding` gone and `content-length` set to its size (`decoded_headers`).

- `gzip` (also `x-gzip`) and `deflate` (a zlib stream, RFC 9110) both go through zlib's header detection, as in
  Triton (`inflateInit2(15 | 32)`), so either wrapper is accepted under either name. Raw deflate without the
  zlib header is refused, as Triton refuses it. `identity` (or no header) leaves the body as sent.
- The output is bounded: zlib is asked for at most 64 KiB at a time and never for more than one byte past
  `max_body_bytes`, so a bomb (200 MB of zeros in 200 KB of gzip) allocates at most the limit plus one chunk
  before its 413 (`PayloadTooLarge`, the connection closed like every oversized body). The first MiB of output
  per received chunk is inflated on the event loop; more (a large body, or a bomb up to the limit: ~0.2 s of
  CPU for 64 MiB) on one gateway thread, as zlib releases the GIL, so other requests are not held up.
- A corrupt or truncated stream, or bytes after its end, is a 400 (`InvalidRequest`) naming the encoding.
- Any other coding (`br`, `zstd`, `compress`, or more than one coding) is a 400 (`Unsupported`, reason
  `unsupported`) that lists the supported ones: Triton answers 400 too, and headroom's error tree has no 415.
"""

from __future__ import annotations

import asyncio
import functools
import zlib
from concurrent.futures import ThreadPoolExecutor

from headroom.core.errors import InvalidRequest, PayloadTooLarge, Unsupported

SUPPORTED_ENCODINGS = ("gzip", "deflate")  # and `x-gzip` (= gzip) and `identity` (= none)
_ALIASES = {"gzip": "gzip", "x-gzip": "gzip", "deflate": "deflate"}
_AUTO_WBITS = 15 | 32  # zlib detects a gzip or a zlib header itself (what Triton's decoder does)
OUTPUT_CHUNK_BYTES = 64 * 1024  # the most zlib is asked to produce at once
INLINE_OUTPUT_BYTES = 1024 * 1024  # output inflated on the event loop per received chunk; the rest on a thread


@functools.cache
def _inflate_thread() -> ThreadPoolExecutor:
    """One thread for large inflations (made on first use): they queue there, off the event loop and off the
    default executor the data plane uses."""
    return ThreadPoolExecutor(1, thread_name_prefix="headroom-inflate")


class BodySink:
    """Collects a request body as sent (no Content-Encoding, or `identity`)."""

    decoded = False  # True when the body was decompressed (the headers then need `decoded_headers`)

    def __init__(self) -> None:
        self._chunks: list[bytes] = []

    def add(self, chunk: bytes) -> None:
        if chunk:
            self._chunks.append(chunk)

    async def feed(self, chunk: bytes) -> None:
        """`add` from the event loop (the gateway's reader calls this)."""
        self.add(chunk)

    def body(self) -> bytes:
        """The whole body once the last chunk arrived."""
        return b"".join(self._chunks)


class InflatingSink(BodySink):
    """Inflates each received chunk into the body at once, at most `max_body_bytes` of output (0: no limit)."""

    decoded = True

    def __init__(self, encoding: str, max_body_bytes: int) -> None:
        super().__init__()
        self.encoding = encoding
        self.max_body_bytes = max_body_bytes
        self.size = 0  # decoded bytes so far
        self._inflater = zlib.decompressobj(_AUTO_WBITS)
        self._received = 0  # compressed bytes so far
        self._data = b""  # input not inflated yet

    def add(self, chunk: bytes) -> None:
        self._received += len(chunk)
        self._data = chunk
        self._inflate(budget=0)

    async def feed(self, chunk: bytes) -> None:
        """`add` that keeps the event loop free: `INLINE_OUTPUT_BYTES` of output in line, the rest on the
        inflating thread."""
        self._received += len(chunk)
        self._data = chunk
        if not self._inflate(budget=INLINE_OUTPUT_BYTES):
            await asyncio.get_running_loop().run_in_executor(_inflate_thread(), self._inflate, 0)

    def _inflate(self, budget: int) -> bool:
        """Inflate the pending input; False when `budget` bytes of output (0: none) were made before the end."""
        produced = 0
        while True:
            want = OUTPUT_CHUNK_BYTES
            if self.max_body_bytes:
                want = min(want, self.max_body_bytes - self.size + 1)  # one byte past the limit proves it
            if self._inflater.eof:
                if self._data:
                    raise self._corrupt(f"{len(self._data)} bytes follow the end of the compressed stream")
                return True
            try:
                out = self._inflater.decompress(self._data, want)
            except zlib.error as exc:
                raise self._corrupt(str(exc)) from None
            self.size += len(out)
            if self.max_body_bytes and self.size > self.max_body_bytes:
                raise PayloadTooLarge(
                    f"the request body (Content-Encoding: {self.encoding}) decompresses to more than the limit "
                    f"of {self.max_body_bytes} bytes; send less, or raise the server's body limit (--max-body-mb)"
                )
            if out:
                self._chunks.append(out)
            self._data = self._inflater.unused_data if self._inflater.eof else self._inflater.unconsumed_tail
            if not self._data and len(out) < want:  # all input used and zlib holds no more output for now
                return True
            produced += len(out)
            if budget and produced >= budget:
                return False

    def body(self) -> bytes:
        if self._received and not self._inflater.eof:  # an empty body stays empty: nothing was encoded
            raise self._corrupt("the compressed stream ends early (truncated)")
        return super().body()

    def _corrupt(self, why: str) -> InvalidRequest:
        return InvalidRequest(
            f"the request body is not valid {self.encoding} data (Content-Encoding: {self.encoding}): {why}; "
            "send the body compressed with that encoding, or drop the Content-Encoding header"
        )


def content_codings(headers: list[tuple[bytes, bytes]]) -> list[str]:
    """The codings a request's Content-Encoding header(s) name, in order, lower case, without `identity`."""
    names: list[str] = []
    for key, value in headers:
        if key == b"content-encoding":
            names.extend(part.strip().lower() for part in value.decode("latin-1").split(","))
    return [n for n in names if n and n != "identity"]


def body_sink(headers: list[tuple[bytes, bytes]], max_body_bytes: int) -> BodySink:
    """How to collect this request's body; 400 (`Unsupported`) for a coding headroom cannot decode."""
    codings = content_codings(headers)
    if not codings:
        return BodySink()
    if len(codings) == 1 and codings[0] in _ALIASES:
        return InflatingSink(_ALIASES[codings[0]], max_body_bytes)
    raise Unsupported(
        f"Content-Encoding {', '.join(codings)!r} is not supported; send the body as is, or compressed with "
        f"one of: {', '.join(SUPPORTED_ENCODINGS)} (x-gzip is gzip; identity means none)"
    )


def decoded_headers(headers: list[tuple[bytes, bytes]], body_length: int) -> list[tuple[bytes, bytes]]:
    """The headers the app behind sees for a decoded body: no Content-Encoding or Transfer-Encoding, and
    Content-Length set to the decoded size."""
    dropped = (b"content-encoding", b"content-length", b"transfer-encoding")
    kept = [(k, v) for k, v in headers if k not in dropped]
    kept.append((b"content-length", str(body_length).encode()))
    return kept


def decode_body(encoding: str, body: bytes, max_body_bytes: int) -> bytes:
    """A whole compressed body decoded at once (same rules and bounds as the gateway's streaming sink)."""
    sink = body_sink([(b"content-encoding", encoding.encode("latin-1"))], max_body_bytes)
    sink.add(body)
    return sink.body()
