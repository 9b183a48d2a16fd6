"""The router's gRPC side: `inference.GRPCInferenceService` proxied, as raw bytes, to the replicas' gRPC ports.

Every RPC of the service descriptor is forwarded without decoding: unary calls go to a replica chosen by the
same `Router` (policy, health, shedding, peak-EWMA bookkeeping) as HTTP; the bidirectional
`ModelStreamInfer` stream is pinned to one replica for its lifetime. Under the router's retry budget a call
is retried on another replica when it never started there (connection refused, or UNAVAILABLE with trailing
metadata `x-headroom-draining: 1`) and, for idempotent methods (ModelInfer and the read-only ones), when the
connection was reset or closed before the answer; every other status passes through unchanged. Shedding
answers UNAVAILABLE with `retry-after` trailing metadata (seconds).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import grpc
import grpc.aio

from headroom.protocol.generated import headroom_inference_pb2 as pb
from headroom.router import tail
from headroom.router.proxy import Router
from headroom.router.upstream import DRAINING_HEADER, ReplicaRuntime

SERVICE_NAME = "inference.GRPCInferenceService"
_NOT_FORWARDED = frozenset({"grpc-timeout", "content-type", "user-agent", "te"})
#: Statuses that count against a replica for outlier ejection (UNAVAILABLE from a shed does not).
_FAILURES = frozenset({grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.DEADLINE_EXCEEDED,
                       grpc.StatusCode.DATA_LOSS})


#: Unary methods that change server state; the rest may be resent after a lost connection.
_NOT_REPLAYABLE = frozenset({"RepositoryModelLoad", "RepositoryModelUnload", "SystemSharedMemoryRegister",
                             "SystemSharedMemoryUnregister", "CudaSharedMemoryRegister",
                             "CudaSharedMemoryUnregister", "TraceSetting", "LogSettings"})
#: How gRPC describes a connection closed under a call (the replica died or closed a pooled channel).
_LOST = ("reset", "socket closed", "broken pipe", "goaway", "cancelling all calls", "connection closed",
         "stream removed", "eof")


def _outcome(err: grpc.aio.AioRpcError) -> str:
    """The router's name for a failed call: never started, lost before an answer, or the replica's status."""
    if err.code() != grpc.StatusCode.UNAVAILABLE:
        return "answered"
    trailing = {k: v for k, v in (err.trailing_metadata() or ())}
    if trailing.get(DRAINING_HEADER) == "1":
        return "draining"
    details = (err.details() or "").lower()
    if "connect" in details or "refused" in details:
        return "connect_error"
    return "connection_lost" if any(word in details for word in _LOST) else "answered"


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

    def _pick(self, tried: set[str]) -> ReplicaRuntime | None:
        while True:
            rt = self.router.pick(None, tried)
            if rt is None or rt.upstream.grpc_target:
                return rt
            tried.add(rt.upstream.replica_id)  # a replica without gRPC cannot take this call

    @staticmethod
    def _metadata(context: grpc.aio.ServicerContext) -> tuple[tuple[str, str | bytes], ...]:
        return tuple((k, v) for k, v in (context.invocation_metadata() or ()) if k not in _NOT_FORWARDED)

    async def _admit(self, context: grpc.aio.ServicerContext) -> None:
        d = self.router.admit()
        if d.reject:
            context.set_trailing_metadata((("retry-after", str(max(1, round(d.retry_after_s)))),))
            await context.abort(grpc.StatusCode.UNAVAILABLE,
                                f"all replicas are {d.utilisation:.0%} busy; shedding, retry later")

    def _unary(self, path: str, replayable: bool) -> Callable[[bytes, grpc.aio.ServicerContext], Awaitable[bytes]]:
        async def call(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            await self._admit(context)
            router, tried = self.router, set[str]()
            for attempt_no in range(router.config.max_attempts):
                rt = self._pick(tried)
                if rt is None:
                    break
                if attempt_no > 0 and not router.allow_retry():
                    break
                tried.add(rt.upstream.replica_id)
                rt.outstanding += 1
                rt.requests += 1
                t0 = time.monotonic()
                try:
                    stub = self._channel(rt).unary_unary(path)
                    answer: bytes = await stub(request, metadata=self._metadata(context),
                                               timeout=context.time_remaining())
                except grpc.aio.AioRpcError as err:
                    rt.outstanding -= 1
                    outcome = _outcome(err)
                    router.observe(rt, err.code() in _FAILURES or outcome in ("connect_error", "connection_lost"),
                                   time.monotonic() - t0)
                    if outcome in ("connect_error", "draining"):
                        router.mark_unready(rt.upstream.replica_id)
                    if tail.retryable(outcome, replayable):
                        continue
                    await context.abort(err.code(), err.details() or "")
                rt.outstanding -= 1
                router.observe(rt, False, time.monotonic() - t0)
                return answer
            router.counters["no_replica"] += 1
            await context.abort(grpc.StatusCode.UNAVAILABLE, "no replica is ready (loading, warming, draining "
                                                             "or ejected); retry later")
            raise RuntimeError("context.abort returned")  # it always raises

        return call

    def _stream(self, path: str) -> Callable[[AsyncIterator[bytes], grpc.aio.ServicerContext],
                                              AsyncIterator[bytes]]:
        async def call(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
            await self._admit(context)
            rt = self._pick(set())
            if rt is None:
                await context.abort(grpc.StatusCode.UNAVAILABLE, "no replica is ready; retry later")
                return
            rt.outstanding += 1
            rt.requests += 1
            t0, failed = time.monotonic(), False
            upstream = self._channel(rt).stream_stream(path)(metadata=self._metadata(context))

            async def pump() -> None:
                async for message in requests:
                    await upstream.write(message)
                await upstream.done_writing()

            pumping = asyncio.create_task(pump())
            try:
                async for answer in upstream:
                    yield answer
            except grpc.aio.AioRpcError as err:  # pass the replica's status through (abort is not for streams)
                failed = err.code() in _FAILURES
                context.set_code(err.code())
                context.set_details(err.details() or "")
            finally:
                pumping.cancel()
                with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                    await pumping
                upstream.cancel()
                rt.outstanding -= 1
                self.router.observe(rt, failed, time.monotonic() - t0)

        return call

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
