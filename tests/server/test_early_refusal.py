"""The refusal in front of Starlette (`headroom.server.early_refusal`): an Overloaded from the routes' early admission
is answered there, with the route's status, headers and body shape, after its hold; everything else reaches the app.
(The real path, gateway and data plane included, is covered by tests/server/test_embeddings_admission.py and the
queue-full tests in test_http_e2e.py / test_access_log_e2e.py.)"""

from __future__ import annotations

import time
from typing import Any

import orjson
import pytest

from headroom.core.errors import HeadroomError, InvalidRequest, Overloaded
from headroom.gateway.limits import BODY_SCOPE_KEY
from headroom.server.early_refusal import EarlyRefusalMiddleware


class Downstream:
    """The app behind: records that it was called and answers 200."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.calls += 1
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}", "more_body": False})


Sent = list[dict[str, Any]]


async def _run(error: HeadroomError | None, path: str = "/v1/embeddings", method: str = "POST",
               body: bytes | None = b'{"model": "m"}') -> tuple[Downstream, Sent, list[tuple[Any, ...]]]:
    seen: list[tuple[Any, ...]] = []

    def check(path: str, timeout: str | None, body: bytes, received_s: float | None, request_id: str) -> None:
        seen.append((path, timeout, body, received_s, request_id))
        if error is not None:
            raise error

    app, sent = Downstream(), []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    scope: dict[str, Any] = {"type": "http", "method": method, "path": path,
                             "headers": [(b"x-request-timeout-ms", b"250")],
                             "state": {"received_s": time.monotonic(), "request_id": "r-1"}}
    if body is not None:
        scope[BODY_SCOPE_KEY] = body
    await EarlyRefusalMiddleware(app, check, time.monotonic)(scope, receive, send)
    return app, sent, seen


@pytest.mark.parametrize(("path", "openai"), [("/v1/embeddings", True), ("/v2/models/m/infer", False)])
async def test_an_overloaded_refusal_is_answered_in_front_of_the_app(path: str, openai: bool) -> None:
    app, sent, seen = await _run(Overloaded("model 'm' is overloaded", retry_after_s=0.2), path)
    assert app.calls == 0 and seen[0][:3] == (path, "250", b'{"model": "m"}') and seen[0][4] == "r-1"
    start, body = sent
    headers = dict(start["headers"])
    assert start["status"] == 503 and headers[b"retry-after"] == b"1"
    assert headers[b"server-timing"].startswith(b"other;dur=") and b"total;dur=" in headers[b"server-timing"]
    answer = orjson.loads(body["body"])
    assert int(headers[b"content-length"]) == len(body["body"])
    if openai:
        assert answer["error"]["message"] == "model 'm' is overloaded" and answer["reason"] == "overloaded"
    else:
        assert answer == {"error": "model 'm' is overloaded", "reason": "overloaded"}


async def test_a_paced_refusal_waits_its_hold_first() -> None:
    start_s = time.monotonic()
    app, sent, _ = await _run(Overloaded("busy", retry_after_s=1.0, hold_s=0.05))
    assert time.monotonic() - start_s >= 0.05 and app.calls == 0 and sent[0]["status"] == 503


@pytest.mark.parametrize(("error", "method", "body"), [
    (None, "POST", b"{}"),  # admitted: the route runs
    (InvalidRequest("bad X-Request-Timeout-Ms"), "POST", b"{}"),  # another error: the route answers it
    (Overloaded("never asked"), "GET", b"{}"),  # not a POST
    (Overloaded("never asked"), "POST", None),  # no body read by the gateway
])
async def test_everything_else_reaches_the_app(error: HeadroomError | None, method: str, body: bytes | None) -> None:
    app, sent, seen = await _run(error, method=method, body=body)
    assert app.calls == 1 and sent[0]["status"] == 200
    assert len(seen) == (1 if method == "POST" and body is not None else 0)
