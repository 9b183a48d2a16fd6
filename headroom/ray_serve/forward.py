"""The ingress's HTTP forwarding to replicas that host headroom's own routes (`LLMReplica.http`,
`ModelReplica.http`): the request goes as an `HttpCall` through a streaming `DeploymentHandle`
(`handle.options(stream=True)`), the answer comes back as its head and body chunks
(`headroom.ray_serve.asgi_call`).

* Until the head arrives nothing has been sent to the client, so a lost replica is retried elsewhere and the wait
  is bounded (`headroom.ray_serve.retries`).
* A server-sent-event answer (`text/event-stream`) is streamed to the client chunk by chunk, each within
  `chunk_timeout_s` (a replica that stops sending ends the stream); when the client goes away, the call is
  cancelled, which aborts the generation in the replica's engine.
* Any other answer is collected (within the same bound) and sent whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, MutableMapping
from typing import Any

from starlette.responses import Response, StreamingResponse

from headroom.core.errors import DeadlineExceeded
from headroom.ray_serve.asgi_call import HttpCall, HttpHead
from headroom.ray_serve.retries import first_result, next_item
from headroom.ray_serve.spec import ServeAppSpec

_DROPPED = frozenset({b"content-length", b"transfer-encoding", b"connection"})


def _headers(head: HttpHead) -> dict[str, str]:
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in head.headers if k.lower() not in _DROPPED}


async def forward(method: Any, call: HttpCall, spec: ServeAppSpec, stats: MutableMapping[str, int], what: str,
                  timeout_s: float, **kwargs: Any) -> Response:
    """Answer `call` with `method` (a handle's `http` method, e.g. `handle.http`), called with `kwargs` too."""
    streaming = method.options(stream=True)
    request_id = dict(call.headers).get(b"x-request-id", b"").decode("latin-1") or call.path

    def send() -> tuple[Any, Any]:
        stream = streaming.remote(call, **kwargs)
        return stream, next_item(stream)

    head, stream = await first_result(send, spec, stats, what, request_id, timeout_s)
    if not isinstance(head, HttpHead):
        stream.cancel()
        raise RuntimeError(f"a replica answered {type(head).__name__} before its head")
    headers = _headers(head)
    if (head.header("content-type") or "").startswith("text/event-stream"):
        return StreamingResponse(_chunks(stream, timeout_s), status_code=head.status, headers=headers)
    deadline_s = time.monotonic() + timeout_s
    body = []
    try:
        async for chunk in _chunks(stream, timeout_s):
            body.append(chunk)
            if time.monotonic() > deadline_s:
                raise TimeoutError
    except TimeoutError:
        stats["timeouts"] += 1
        raise DeadlineExceeded(f"the replica serving '{what}' did not finish its answer within {timeout_s:.1f} s"
                               ) from None
    return Response(b"".join(body), status_code=head.status, headers=headers)


async def _chunks(stream: Any, chunk_timeout_s: float) -> AsyncIterator[bytes]:
    """The body chunks of a streamed answer, each within `chunk_timeout_s`; closing this cancels the call."""
    try:
        while True:
            try:
                chunk = await asyncio.wait_for(next_item(stream), chunk_timeout_s)
            except StopAsyncIteration:
                return
            if isinstance(chunk, bytes):
                yield chunk
    finally:
        with contextlib.suppress(Exception):
            stream.cancel()
