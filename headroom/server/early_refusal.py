"""Refusal before routing: an overloaded model's 503 answered from the raw request, in front of Starlette.

Under overload a refusal is the commonest answer the server gives, and it used to take the whole route: Starlette's
routing, its exception middleware and error handler, a `Request`, a JSON `Response` (py-spy at 2,538 refusals/s:
~0.33 ms of the event loop each, most of it in those layers). Admission only needs the model's name, the client's
timeout header and when the request arrived (`DataPlane.admit_early`), and the gateway has already read the body.
So this pure-ASGI layer, between the gateway and the HTTP app, asks the route's own early admission
(`HttpApi.refuse_early`: `POST /v1/embeddings` with the model peeked from the body, `POST /v2/models/{m}[/versions
/{v}]/infer`) and answers an `Overloaded` itself: the same status, `Retry-After`, JSON body (OpenAI's shape on
/v1) and `Server-Timing` as the route would, after the refusal's hold when it has one
(`headroom.batching.refusal_pacing`). Anything else, errors included, goes on to the route, which decides as before.
The data plane counts and logs the refusal either way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from headroom.core.errors import HeadroomError, Overloaded
from headroom.gateway.asgi import ASGIApp, Receive, Scope, Send, error_body
from headroom.gateway.limits import BODY_SCOPE_KEY

#: (path, the X-Request-Timeout-Ms header or None, body, received_s or None, request id): raises Overloaded to refuse
EarlyCheck = Callable[[str, str | None, bytes, float | None, str], None]

_TIMEOUT = b"x-request-timeout-ms"


class EarlyRefusalMiddleware:
    """Answers a POST that admission refuses before the app behind sees it; passes everything else on."""

    def __init__(self, app: ASGIApp, check: EarlyCheck, now_s: Callable[[], float]) -> None:
        self.app = app
        self.check = check
        self.now_s = now_s  # the server's clock (the gateway stamps `received_s` on it)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = scope.get(BODY_SCOPE_KEY) if scope["type"] == "http" and scope["method"] == "POST" else None
        if not isinstance(body, bytes):
            await self.app(scope, receive, send)
            return
        entered_s = self.now_s()
        state = scope.get("state", {})
        received = state.get("received_s")
        received_s = float(received) if isinstance(received, int | float) else None
        request_id = str(state.get("request_id", ""))
        timeout = next((v.decode("latin-1") for k, v in scope["headers"] if k == _TIMEOUT), None)
        try:
            self.check(scope["path"], timeout, body, received_s, request_id)
        except Overloaded as exc:
            await self._refuse(send, exc, scope["path"], entered_s if received_s is None else received_s)
            return
        except HeadroomError:
            pass  # a bad header or the like: the route answers it as it always has
        await self.app(scope, receive, send)

    async def _refuse(self, send: Send, exc: Overloaded, path: str, start_s: float) -> None:
        if exc.hold_s > 0.0:
            await asyncio.sleep(exc.hold_s)
        payload = error_body(exc, path)
        ms = max(0.0, self.now_s() - start_s) * 1e3
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(payload)).encode()),
            (b"server-timing", f"other;dur={ms:.3f}, total;dur={ms:.3f}".encode()),
        ]
        if exc.retry_after_s is not None:
            headers.append((b"retry-after", str(max(1, int(-(-exc.retry_after_s // 1)))).encode()))
        await send({"type": "http.response.start", "status": exc.http_status, "headers": headers})
        await send({"type": "http.response.body", "body": payload, "more_body": False})
