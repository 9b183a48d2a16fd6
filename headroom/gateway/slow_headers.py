"""A deadline on the request line and headers: slowloris before the body starts.

An ASGI middleware only sees a request once its headers are complete, so the deadline lives in the HTTP
protocol: a subclass of uvicorn's httptools protocol arms a timer when a connection opens and when the next
request on a kept-alive connection begins, disarms it when the headers are complete, and on expiry answers
408 (JSON body, `Connection: close`) and closes the connection. Idle kept-alive connections stay bounded by
uvicorn's own `timeout_keep_alive`; bodies by `InputLimits.body_timeout_s` (the gateway middleware).
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

_BODY = b'{"error": "request headers did not arrive in time (slow client); send the whole request promptly"}'
_RESPONSE = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
    b"content-length: " + str(len(_BODY)).encode() + b"\r\n\r\n" + _BODY
)


class HeaderDeadlineProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a headers deadline of `headers_timeout_s` (set by the factory)."""

    headers_timeout_s: float = 10.0  # request line + headers must arrive within this, else 408 + close
    _header_timer: asyncio.TimerHandle | None = None

    def _arm_header_deadline(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.headers_timeout_s, self._headers_too_slow)

    def _disarm_header_deadline(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            self.transport.write(_RESPONSE)
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_deadline()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm_header_deadline()

    def on_headers_complete(self) -> None:
        self._disarm_header_deadline()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_deadline()
        super().connection_lost(exc)


def header_deadline_protocol(headers_timeout_s: float) -> type[HeaderDeadlineProtocol]:
    """The protocol class to pass as `uvicorn.Config(http=...)`; ValueError unless the timeout is > 0."""
    if headers_timeout_s <= 0:
        raise ValueError("headers_timeout_s must be > 0 (leave the protocol out for no deadline)")
    return type("HeaderDeadlineProtocol", (HeaderDeadlineProtocol,), {"headers_timeout_s": headers_timeout_s})
