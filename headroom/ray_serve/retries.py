"""The ingress's bounded call into a deployment: a replica lost under the request is tried again elsewhere, and
no call outlives its time.

`first_result(send, ...)` calls `send()` (which starts one handle call and returns it with an awaitable of its
first result: the whole answer of a unary call, the head of a streamed one) and waits for that result:

* a replica that dies or becomes unreachable under the request (`RayActorError`, `ReplicaUnavailableError`):
  sent again, up to `max_attempts` tries with a doubling backoff from `retry_backoff_s`; then 503 `not_ready`
  with Retry-After (only idempotent work is sent here: inference, and LLM calls before any byte went out);
* no result within `timeout_s`, all tries together: the call is cancelled, 504 `deadline_exceeded`;
* Serve's handle queue full (`BackPressureError`): 503 `rejected`; a deployment that failed to deploy: 503.

`stats` counts `requests`, `replica_lost_retries`, `retries_exhausted` and `timeouts` (the ingress's
`/ingress/stats`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Protocol, TypeVar

from headroom.core.errors import DeadlineExceeded, NotReady, Overloaded
from headroom.ray_serve.spec import ServeAppSpec

log = logging.getLogger("headroom.ray_serve")
T = TypeVar("T")


class Cancellable(Protocol):
    def cancel(self) -> None: ...


async def first_result(send: Callable[[], tuple[Cancellable, Awaitable[T]]], spec: ServeAppSpec,
                       stats: MutableMapping[str, int], what: str, request_id: str,
                       timeout_s: float) -> tuple[T, Cancellable]:
    """(the first result, the call that gave it); see the module's docstring for the failures."""
    from ray.exceptions import RayActorError
    from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError, ReplicaUnavailableError

    backoff_s = spec.retry_backoff_s
    attempt = 0
    stats["requests"] += 1
    deadline_s = time.monotonic() + timeout_s
    while True:
        attempt += 1
        call, result = send()
        try:
            return await asyncio.wait_for(result, max(0.0, deadline_s - time.monotonic())), call
        except TimeoutError:
            call.cancel()
            stats["timeouts"] += 1
            raise DeadlineExceeded(f"no answer from the replicas of '{what}' within {timeout_s:.1f} s") from None
        except (RayActorError, ReplicaUnavailableError) as exc:
            log.warning("request %s: replica lost (%s), try %d of %d", request_id, type(exc).__name__, attempt,
                        spec.max_attempts)
            if attempt >= spec.max_attempts:
                stats["retries_exhausted"] += 1
                raise NotReady(f"the replicas serving '{what}' failed {attempt} times under this request (last: "
                               f"{type(exc).__name__}); retry later", retry_after_s=1.0) from None
            stats["replica_lost_retries"] += 1
            await asyncio.sleep(backoff_s)
            backoff_s *= 2
        except BackPressureError:
            raise Overloaded(f"the replicas of '{what}' have a full queue", retry_after_s=1.0) from None
        except DeploymentUnavailableError as exc:
            raise NotReady(f"the deployment serving '{what}' is unavailable: {exc.message}") from None


async def awaited(call: Any) -> Any:
    """A DeploymentResponse as a coroutine (so that asyncio.wait_for can bound it)."""
    return await call


async def next_item(stream: Any) -> Any:
    """The next item of a DeploymentResponseGenerator, as a coroutine."""
    return await stream.__anext__()
