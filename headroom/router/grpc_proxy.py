"""The router's gRPC side: `inference.GRPCInferenceService` proxied, as raw bytes, to the replicas' gRPC ports.

Every RPC of the service descriptor is forwarded without decoding, through the same policy pipeline as HTTP
(`headroom.router.pipeline`: admission, canary arm, choice, retry budget, health, latency, metrics): unary
calls go to the chosen replica; the bidirectional `ModelStreamInfer` stream is pinned to one replica for its
lifetime. Under the router's retry budget a call is retried on another replica when it never started there
(connection refused, or UNAVAILABLE with trailing metadata `x-headroom-draining: 1`) and, for idempotent
methods (ModelInfer and the read-only ones), when the connection was reset or closed before the answer; every
other status passes through unchanged. Shedding and the concurrency limit answer UNAVAILABLE with
`retry-after` trailing metadata (seconds). Degradation to a fallback model and hedging are HTTP-only (they
need the request's model name, which this side does not decode, and a cancellable copy).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import grpc
import grpc.aio

from headroom.protocol.generated import headroom_inference_pb2 as pb
from headroom.router import tail
from headroom.router.proxy import Router
from headroom.router.upstream import DRAINING_HEADER, Attempt, ReplicaRuntime

SERVICE_NAME = "inference.GRPCInferenceService"
_NOT_FORWARDED = frozenset({"grpc-timeout", "content-type", "user-agent", "te"})
#: Statuses that count against a replica for outlier ejection, as HTTP's 5xx (UNAVAILABLE from a shed does
#: not; DEADLINE_EXCEEDED is a "timeout").
_FAILURES = frozenset({grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.DATA_LOSS})


#: Unary methods that change server state; the rest may be resent after a lost connection.
_NOT_REPLAYABLE = frozenset({"RepositoryModelLoad", "RepositoryModelUnload", "SystemSharedMemoryRegister",
                             "SystemSharedMemoryUnregister", "CudaSharedMemoryRegister",
                             "CudaSharedMemoryUnregister", "TraceSetting", "LogSettings"})
#: How gRPC describes a connection closed under a call (the replica died or closed a pooled channel).
_LOST = ("reset", "socket closed", "broken pipe", "goaway", "cancelling all calls", "connection closed",
         "stream removed", "eof")


def outcome_of(err: grpc.aio.AioRpcError) -> str:
    """A failed call in the pipeline's vocabulary (`headroom.router.upstream`): never started ("connect_error",
    "draining"), lost before an answer ("connection_lost"), "timeout", a server error ("grpc_internal", ...),
    "overloaded" (any other UNAVAILABLE) or "ok" (the replica answered with a client error, as HTTP's 4xx)."""
    code = err.code()
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return "timeout"
    if code in _FAILURES:
        return f"grpc_{code.name.lower()}"
    if code != grpc.StatusCode.UNAVAILABLE:
        return "ok"
    trailing = {k: v for k, v in (err.trailing_metadata() or ())}
    if trailing.get(DRAINING_HEADER) == "1":
        return "draining"
    details = (err.details() or "").lower()
    if "connect" in details or "refused" in details:
        return "connect_error"
    return "connection_lost" if any(word in details for word in _LOST) else "overloaded"


class GrpcProxy:
    """gRPC front end sharing a `Router`'s replica table and policies; one channel per replica."""

    def __init__(self, router: Router, interceptors: Sequence[grpc.aio.ServerInterceptor] = ()) -> None:
        self.router = router
        self.interceptors = tuple(interceptors)  # e.g. the gateway's keys and buckets, run before proxying
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._server: grpc.aio.Server | None = None

    def _channel(self, rt: ReplicaRuntime) -> grpc.aio.Channel:
        target = rt.upstream.grpc_target
        ch = self._channels.get(target)
        if ch is None:
            ch = grpc.aio.insecure_channel(target)
            self._channels[target] = ch
        return ch

    @staticmethod
    def _metadata(context: grpc.aio.ServicerContext) -> tuple[tuple[str, str | bytes], ...]:
        return tuple((k, v) for k, v in (context.invocation_metadata() or ()) if k not in _NOT_FORWARDED)

    async def _admit(self, context: grpc.aio.ServicerContext) -> int:
        """The pipeline's admission; aborts the call when it is shed or limited, else returns the in-flight
        count it entered at (the caller must `leave`)."""
        pipe = self.router.pipeline
        a = pipe.admit()
        if a.verdict == "shed":
            context.set_trailing_metadata((("retry-after", str(max(1, round(a.shed.retry_after_s)))),))
            await context.abort(grpc.StatusCode.UNAVAILABLE,
                                f"all replicas are {a.shed.utilisation:.0%} busy; shedding, retry later")
        if a.verdict == "limited":
            context.set_trailing_metadata((("retry-after", "1"),))
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"concurrency limit {a.limit} reached; retry later")
        return pipe.enter()

    def _pick(self, tried: set[str], arm: str) -> ReplicaRuntime | None:
        while True:
            rt = self.router.pipeline.pick(None, tried, arm)
            if rt is None or rt.upstream.grpc_target:
                return rt
            tried.add(rt.upstream.replica_id)  # a replica without gRPC cannot take this call

    def _unary(self, path: str, replayable: bool) -> Callable[[bytes, grpc.aio.ServicerContext], Awaitable[bytes]]:
        async def call(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            inflight_at_start = await self._admit(context)
            try:
                return await self._attempts(path, replayable, request, context, inflight_at_start)
            finally:
                self.router.pipeline.leave()

        return call

    async def _attempts(self, path: str, replayable: bool, request: bytes, context: grpc.aio.ServicerContext,
                        inflight_at_start: int) -> bytes:
        pipe, tried = self.router.pipeline, set[str]()
        arm, last = pipe.arm(), None
        for attempt_no in range(self.router.config.max_attempts):
            rt = self._pick(tried, arm)
            if rt is None:
                break
            if attempt_no > 0 and not pipe.allow_retry(*((last[0].outcome, last[0].replica.upstream.replica_id)
                                                          if last is not None else ())):
                break
            tried.add(rt.upstream.replica_id)
            attempt = Attempt(rt, self.router.clock, arm=arm)
            error: grpc.aio.AioRpcError | None = None
            try:
                stub = self._channel(rt).unary_unary(path)
                answer: bytes = await stub(request, metadata=self._metadata(context),
                                           timeout=context.time_remaining())
                attempt.outcome = "ok"
            except grpc.aio.AioRpcError as err:
                attempt.outcome, error = outcome_of(err), err
            except BaseException:  # the caller went away: not the replica's fault
                attempt.outcome = "cancelled"
                pipe.finish(attempt, attempt.finish(record_latency=False))
                raise
            latency_s = attempt.finish()
            pipe.finish(attempt, latency_s)
            if error is None:
                pipe.done(latency_s, inflight_at_start, False)
                return answer
            last = (attempt, error)
            if tail.retryable(attempt.outcome, replayable):
                continue
            pipe.done(latency_s, inflight_at_start, attempt.outcome == "overloaded")
            await context.abort(error.code(), error.details() or "")
        if last is None:
            pipe.counters["no_replica"] += 1
            await context.abort(grpc.StatusCode.UNAVAILABLE, "no replica is ready (loading, warming, draining "
                                                             "or ejected); retry later")
            raise RuntimeError("context.abort returned")  # it always raises
        attempt, error = last  # retries exhausted or denied: as HTTP, refused -> 503, else the replica's status
        if attempt.outcome in ("connect_error", "connection_lost"):
            pipe.counters["upstream_failed"] += 1
        if attempt.outcome == "connect_error":
            await context.abort(grpc.StatusCode.UNAVAILABLE, "could not reach a replica (last tried "
                                                             f"{attempt.replica.upstream.replica_id}); retry later")
        await context.abort(error.code(), error.details() or "")
        raise RuntimeError("context.abort returned")  # it always raises

    def _stream(self, path: str) -> Callable[[AsyncIterator[bytes], grpc.aio.ServicerContext],
                                              AsyncIterator[bytes]]:
        async def call(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
            pipe = self.router.pipeline
            inflight_at_start = await self._admit(context)
            try:
                arm = pipe.arm()
                rt = self._pick(set(), arm)
                if rt is None:
                    pipe.counters["no_replica"] += 1
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "no replica is ready; retry later")
                    return
                async for answer in self._relay(rt, arm, path, requests, context, inflight_at_start):
                    yield answer
            finally:
                pipe.leave()

        return call

    async def _relay(self, rt: ReplicaRuntime, arm: str, path: str, requests: AsyncIterator[bytes],
                     context: grpc.aio.ServicerContext, inflight_at_start: int) -> AsyncIterator[bytes]:
        """One stream pinned to `rt`: requests pumped up, answers relayed down, the outcome folded in at the end."""
        attempt = Attempt(rt, self.router.clock, arm=arm)
        attempt.outcome = "cancelled"  # until the replica's stream ends (the caller may go away first)
        upstream = self._channel(rt).stream_stream(path)(metadata=self._metadata(context))

        async def pump() -> None:
            async for message in requests:
                await upstream.write(message)
            await upstream.done_writing()

        pumping = asyncio.create_task(pump())
        try:
            async for answer in upstream:
                yield answer
            attempt.outcome = "ok"
        except grpc.aio.AioRpcError as err:  # pass the replica's status through (abort is not for streams)
            attempt.outcome = outcome_of(err)
            context.set_code(err.code())
            context.set_details(err.details() or "")
        finally:
            pumping.cancel()
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await pumping
            upstream.cancel()
            latency_s = attempt.finish(record_latency=attempt.outcome != "cancelled")
            self.router.pipeline.finish(attempt, latency_s)
            self.router.pipeline.done(latency_s, inflight_at_start, False)

    def handler(self) -> grpc.GenericRpcHandler:
        handlers: dict[str, Any] = {}
        for method in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods:
            path = f"/{SERVICE_NAME}/{method.name}"
            if method.client_streaming or method.server_streaming:
                handlers[method.name] = grpc.stream_stream_rpc_method_handler(self._stream(path))
            else:
                handlers[method.name] = grpc.unary_unary_rpc_method_handler(
                    self._unary(path, method.name not in _NOT_REPLAYABLE))
        return grpc.method_handlers_generic_handler(SERVICE_NAME, handlers)

    async def start(self, host: str, port: int) -> int:
        """Listen on host:port (0 = any free port); returns the bound port."""
        self._server = grpc.aio.server(interceptors=list(self.interceptors))
        self._server.add_generic_rpc_handlers((self.handler(),))
        bound = self._server.add_insecure_port(f"{host}:{port}")
        await self._server.start()
        return int(bound)

    async def close(self, grace_s: float = 1.0) -> None:
        if self._server is not None:
            await self._server.stop(grace_s)
            self._server = None
        for ch in self._channels.values():
            await ch.close()
        self._channels.clear()
