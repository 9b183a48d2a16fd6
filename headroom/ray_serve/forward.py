"""The ingress's HTTP forwarding to replicas that host headroom's own routes (`LLMReplica.http`,
`ModelReplica.http`): the request goes as an `HttpCall` through a streaming `DeploymentHandle`
(`handle.options(stream=True)`), the answer comes back as its head and body chunks
(`headroom.ray_serve.asgi_call`).

* Until the head arrives nothing has been sent to the client, so a lost replica is retried elsewhere and the wait
  is bounded (`headroom.ray_serve.retries`).
* A server-sent-event answer (`text/event-stream`) is streamed to the client chunk by chunk, each within
  `chunk_timeout_s`; when the client goes away, the call is cancelled, which aborts the generation in the
  replica's engine.
* A stream that breaks after its head (the replica dies or becomes unreachable, raises, or sends nothing for
  `chunk_timeout_s`) cannot be retried (the client has part of the answer) and never ends silently: it ends with
  the route's own error event, as `headroom serve` ends a stream whose generation failed (`stream_error`: OpenAI's
  `data: {"error": {...}}` then `data: [DONE]`, which the openai SDK raises as an APIError; Triton's
  `data: {"error": "..."}` on generate_stream). `stats["streams_broken"]` counts them (timeouts count as
  `timeouts`).
* Any other answer is collected (within the same bound) and sent whole; a replica lost while sending it is a 503,
  one that fails a 500, one too slow a 504 (the route's error shape).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, MutableMapping
from typing import Any

import orjson
from starlette.responses import Response, StreamingResponse

from headroom.core.errors import DeadlineExceeded, HeadroomError, NotReady
from headroom.protocol.openai_errors import exception_body
from headroom.ray_serve.asgi_call import HttpCall, HttpHead
from headroom.ray_serve.retries import first_result, next_item
from headroom.ray_serve.spec import ServeAppSpec

log = logging.getLogger("headroom.ray_serve")

_DROPPED = frozenset({b"content-length", b"transfer-encoding", b"connection"})
#: the last event(s) of a server-sent-event answer that broke after its head
StreamError = Callable[[HeadroomError], bytes]


def openai_stream_error(exc: HeadroomError) -> bytes:
    """OpenAI's routes: the error object as one event, then `[DONE]` (what `headroom serve` sends)."""
    return b"data: " + orjson.dumps(exception_body(exc)) + b"\n\ndata: [DONE]\n\n"


def generate_stream_error(exc: HeadroomError) -> bytes:
    """Triton's generate_stream: `{"error": message}` (`headroom.llm.generate`; no [DONE] on that route)."""
    return b"data: " + orjson.dumps({"error": exc.message}) + b"\n\n"


def _headers(head: HttpHead) -> dict[str, str]:
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in head.headers if k.lower() not in _DROPPED}


async def forward(method: Any, call: HttpCall, spec: ServeAppSpec, stats: MutableMapping[str, int], what: str,
                  timeout_s: float, stream_error: StreamError = openai_stream_error, **kwargs: Any) -> Response:
    """Answer `call` with `method` (a handle's `http` method, e.g. `handle.http`), called with `kwargs` too;
    `stream_error` ends an event stream that broke after its head."""
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
        events = _events(_chunks(stream, timeout_s, stats, what), stream_error, call.path)
        return StreamingResponse(events, status_code=head.status, headers=headers)
    deadline_s = time.monotonic() + timeout_s
    body = []
    try:
        async for chunk in _chunks(stream, timeout_s, stats, what):
            body.append(chunk)
            if time.monotonic() > deadline_s:
                raise TimeoutError
    except TimeoutError:
        stats["timeouts"] += 1
        raise DeadlineExceeded(f"the replica serving '{what}' did not finish its answer within {timeout_s:.1f} s"
                               ) from None
    return Response(b"".join(body), status_code=head.status, headers=headers)


async def _events(chunks: AsyncGenerator[bytes, None], stream_error: StreamError, path: str) -> AsyncIterator[bytes]:
    """An event stream's chunks, ended by `stream_error` when it breaks; closing this closes `chunks` (which
    cancels the call)."""
    async with contextlib.aclosing(chunks):
        try:
            async for chunk in chunks:
                yield chunk
        except HeadroomError as exc:
            log.warning("stream of %s ended by an error event: %s", path, exc.message)
            yield stream_error(exc)


async def _chunks(stream: Any, chunk_timeout_s: float, stats: MutableMapping[str, int],
                  what: str) -> AsyncGenerator[bytes, None]:
    """The body chunks of a streamed answer, each within `chunk_timeout_s`; closing this cancels the call. A
    stream that breaks raises the HeadroomError that says how (504 silent, 503 replica lost, 500 it failed)."""
    from ray.exceptions import RayActorError
    from ray.serve.exceptions import ReplicaUnavailableError

    try:
        while True:
            try:
                chunk = await asyncio.wait_for(next_item(stream), chunk_timeout_s)
            except StopAsyncIteration:
                return
            except TimeoutError:
                stats["timeouts"] += 1
                raise DeadlineExceeded(f"the replica serving '{what}' sent nothing for {chunk_timeout_s:.1f} s; the "
                                       "answer is incomplete") from None
            except (RayActorError, ReplicaUnavailableError) as exc:
                stats["streams_broken"] += 1
                raise NotReady(f"the replica serving '{what}' was lost mid-answer ({type(exc).__name__}); the "
                               "answer is incomplete: send the request again", retry_after_s=1.0) from None
            except Exception as exc:  # the replica raised mid-answer (Ray wraps it in a RayTaskError)
                stats["streams_broken"] += 1
                last_line = (str(exc).strip().splitlines() or [""])[-1][:200]  # a traceback's: the error
                raise HeadroomError(f"the replica serving '{what}' failed mid-answer ({type(exc).__name__}: "
                                    f"{last_line}); the answer is incomplete") from None
            if isinstance(chunk, bytes):
                yield chunk
    finally:
        with contextlib.suppress(Exception):
            stream.cancel()
