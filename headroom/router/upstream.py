"""Per-replica bookkeeping for the proxy and one upstream attempt (mechanism, not policy).

`ReplicaRuntime` keeps what the policies need (outstanding requests, peak-EWMA latency) and turns it into a
`ReplicaSnapshot`. `Attempt` is one request on one replica, whatever the transport: it holds the replica's
outstanding slot and, via `finish`, releases it exactly once. `HttpAttempt` sends it over HTTP and classifies
the outcome the way the tail policies expect ("ok", "connect_error", "not_ready", "draining", "overloaded",
"timeout", "connection_lost", "http_5xx"); the gRPC proxy names its own (`headroom.router.grpc_proxy`).
Nothing of an answer reaches the client before `run` returns: small bodies are read whole, streamed ones up to
their first chunk, so a connection lost inside `run` is one the router may still retry.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import orjson

from headroom.core.clock import Clock
from headroom.router.snapshot import ReplicaSnapshot, peak_ewma_update
from headroom.router.tail import counts_as_failure

#: Hop-by-hop headers (RFC 9110 section 7.6.1) never forwarded in either direction.
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
                        "trailer", "transfer-encoding", "upgrade", "host", "content-length"})
#: Responses up to this size are read whole before answering, so a replica dying mid-body is a clear 502;
#: larger or unsized (chunked, SSE) bodies are streamed through.
BUFFER_LIMIT_BYTES = 8 * 1024 * 1024
#: A replica shutting down answers 503 with this header set to "1": the request never started there.
DRAINING_HEADER = "x-headroom-draining"


@dataclass(frozen=True, slots=True)
class Upstream:
    """One replica the proxy may route to."""

    replica_id: str  # stable id (also the affinity-hashing key)
    base_url: str  # e.g. "http://127.0.0.1:8011"
    capacity: int = 8  # concurrent requests it serves within the SLO (shedding/overload threshold)
    version: str = ""  # model version it serves (canary rollouts)
    grpc_target: str = ""  # "host:port" of its inference.GRPCInferenceService ("" = no gRPC)


class ReplicaRuntime:
    """Mutable per-replica counters owned by the proxy's event loop."""

    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self.outstanding = 0
        self.ewma_latency_s = 0.0
        self.ewma_updated_s = 0.0
        self.requests = 0
        self.failures = 0
        self.retried_away = 0  # requests sent again elsewhere after failing here
        self.hedges = 0  # backup (hedged or tied) copies sent here
        self.ejections = 0  # times passive outlier detection ejected it

    def observe_latency(self, latency_s: float, now_s: float) -> None:
        self.ewma_latency_s = peak_ewma_update(self.ewma_latency_s, latency_s,
                                               max(0.0, now_s - self.ewma_updated_s))
        self.ewma_updated_s = now_s

    def snapshot(self) -> ReplicaSnapshot:
        u = self.upstream
        return ReplicaSnapshot(replica_id=u.replica_id, outstanding=self.outstanding,
                               ewma_latency_s=self.ewma_latency_s, capacity=u.capacity, version=u.version)


def _reason(body: bytes) -> str:
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return ""
    return str(parsed.get("reason", "")) if isinstance(parsed, dict) else ""


def _classify(resp: httpx.Response, body: bytes | None) -> str:
    """The outcome of an answered attempt. Draining is read from the header, whatever the body's shape."""
    if resp.status_code == 503:
        if resp.headers.get(DRAINING_HEADER, "").strip() == "1":
            return "draining"
        return "not_ready" if _reason(body or b"") == "not_ready" else "overloaded"
    if resp.status_code >= 500:
        return f"http_{resp.status_code}"
    return "ok"


class Attempt:
    """One request on one replica, whatever the transport: holds an outstanding slot from construction until
    `finish`, which releases it exactly once. `outcome` is the router's name for how it ended (see
    `headroom.router.tail.counts_as_failure`); `headroom.router.pipeline.Pipeline.finish` folds it in."""

    def __init__(self, replica: ReplicaRuntime, clock: Clock, hedge: bool = False, arm: str = "") -> None:
        self.replica = replica
        self.arm = arm  # canary rollout arm ("canary" / "baseline"), "" without a rollout
        self.clock = clock
        self.hedge = hedge
        self.started_s = clock.now_s()
        self.outcome = "pending"
        self._finished = False
        self.recorded = False  # its outcome was folded into health (the pipeline does it once)
        replica.outstanding += 1
        replica.requests += 1

    @property
    def failed(self) -> bool:
        """Counts against the replica for outlier ejection (503 sheds and not-ready do not)."""
        return counts_as_failure(self.outcome)

    def finish(self, failed: bool | None = None, record_latency: bool = True) -> float:
        """Release the outstanding slot (once); returns the attempt's latency in seconds."""
        now = self.clock.now_s()
        latency_s = now - self.started_s
        if self._finished:
            return latency_s
        self._finished = True
        self.replica.outstanding -= 1
        if failed if failed is not None else self.failed:
            self.replica.failures += 1
        if record_latency:
            self.replica.observe_latency(latency_s, now)
        return latency_s


class HttpAttempt(Attempt):
    """An attempt over HTTP. `outcome` is set once `run` returns."""

    def __init__(self, replica: ReplicaRuntime, clock: Clock, hedge: bool = False, arm: str = "") -> None:
        super().__init__(replica, clock, hedge, arm)
        self.response: httpx.Response | None = None
        self.body: bytes | None = None  # the whole body when it was buffered
        self.first_chunk = b""  # a streamed body's first chunk, read before the answer is committed
        self.rest: AsyncIterator[bytes] | None = None  # the rest of a streamed body

    async def run(self, client: httpx.AsyncClient, request: httpx.Request) -> HttpAttempt:
        """Send and wait for the response head (and the body when it is small); classify the outcome."""
        try:
            resp = await client.send(request, stream=True)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout):
            self.outcome = "connect_error"
            return self
        except httpx.TimeoutException:
            self.outcome = "timeout"
            return self
        except httpx.TransportError:
            self.outcome = "connection_lost"
            return self
        self.response = resp
        try:
            size = int(resp.headers.get("content-length", "-1"))
            if resp.status_code == 503 or 0 <= size <= BUFFER_LIMIT_BYTES:
                self.body = await resp.aread()
            else:
                self.rest = resp.aiter_raw()
                self.first_chunk = await anext(self.rest, b"")
        except httpx.TimeoutException:
            self.outcome = "timeout"
            await resp.aclose()
            return self
        except httpx.TransportError:
            self.outcome = "connection_lost"
            await resp.aclose()
            return self
        self.outcome = _classify(resp, self.body)
        return self

    async def discard(self) -> None:
        """This attempt lost a hedge race or was abandoned: close its stream and release the slot."""
        if self.response is not None:
            await self.response.aclose()
        self.finish(failed=False)
