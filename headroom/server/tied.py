"""Replica side of Tail at Scale's tied requests: tell the router when a tied copy starts executing.

`headroom route --tied` sends each request to two replicas, tagged as `headroom.core.tied_wire` describes.
`TiedStartMiddleware` binds a start hook (`headroom.core.start_signal`) for such a request. When its batch
starts (or the LLM engine produces its first output) the hook has `TiedNotifier` send
`POST /router/tied/<tag>` to the router, and the router cancels the twin, which then leaves the other
replica's queue before it runs.

The notice goes to the connection's peer address (the router, as this replica sees it) on the port the
header names, never to a host a header names: a client talking to the replica directly can only make it
connect back to the client's own host. A notice that is lost (a proxy in between, TLS on the router, a
timeout) costs only the saving: the router still takes the first answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from starlette.types import ASGIApp, Receive, Scope, Send

from headroom.core import start_signal
from headroom.core.tied_wire import CALLBACK_PREFIX, TIED_HEADER, TIED_PORT_HEADER, parse_port, parse_tag

log = logging.getLogger(__name__)
_TAG = TIED_HEADER.encode("latin-1")
_PORT = TIED_PORT_HEADER.encode("latin-1")


class TiedNotifier:
    """Sends start notices; owns their tasks (closed with the server)."""

    def __init__(self, timeout_s: float = 1.0) -> None:
        self.timeout_s = timeout_s
        self.sent = 0  # notices the router acknowledged with a status line
        self.failed = 0  # notices that could not be delivered
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    def notify(self, host: str, port: int, tag: str) -> None:
        """Send the notice in the background (called on the event loop by the executor that started it)."""
        if self._closed:
            return
        task = asyncio.get_running_loop().create_task(self._send(host, port, tag), name="tied-start-notice")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, host: str, port: int, tag: str) -> None:
        authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        head = (f"POST {CALLBACK_PREFIX}{tag} HTTP/1.1\r\nHost: {authority}\r\nContent-Length: 0\r\n"
                "Connection: close\r\n\r\n").encode("ascii")
        try:
            async with asyncio.timeout(self.timeout_s):
                reader, writer = await asyncio.open_connection(host, port)
                try:
                    writer.write(head)
                    await writer.drain()
                    status_line = await reader.readline()
                finally:
                    writer.close()
                    with contextlib.suppress(OSError):
                        await writer.wait_closed()
        except (OSError, TimeoutError) as exc:
            self.failed += 1
            log.debug("tied start notice to %s failed: %s", authority, exc)
            return
        if status_line.startswith(b"HTTP/"):
            self.sent += 1
        else:
            self.failed += 1

    async def close(self) -> None:
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task


class TiedStartMiddleware:
    """Binds a tied copy's start hook for the request's task (other requests pass straight through)."""

    def __init__(self, app: ASGIApp, notifier: TiedNotifier) -> None:
        self.app = app
        self.notifier = notifier

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        hook = self._hook(scope) if scope["type"] == "http" else None
        if hook is None:
            await self.app(scope, receive, send)
            return
        token = start_signal.bind(hook)
        try:
            await self.app(scope, receive, send)
        finally:
            start_signal.reset(token)

    def _hook(self, scope: Scope) -> start_signal.StartHook | None:
        raw_tag = raw_port = None
        for name, value in scope["headers"]:
            if name == _TAG:
                raw_tag = value
            elif name == _PORT:
                raw_port = value
        client = scope.get("client")
        if raw_tag is None or raw_port is None or not client:
            return None
        tag_text = raw_tag.decode("latin-1")
        port = parse_port(raw_port.decode("latin-1"))
        if parse_tag(tag_text) is None or port is None:
            return None
        host, notifier = str(client[0]), self.notifier
        return lambda: notifier.notify(host, port, tag_text)
