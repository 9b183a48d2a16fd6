"""`inference.GRPCInferenceService` on grpc.aio, a thin shell over an InferenceDataPlane.

Implemented here: ServerLive, ServerReady, ModelReady, ServerMetadata, ModelMetadata, ModelInfer and
ModelStreamInfer (protocol/grpc_stream.py), which hand LLM requests to `generative` (llm/grpc_generate.py);
the composition root adds Triton's admin RPCs (model config, statistics, repository, shared memory, trace and
log settings: server/grpc_admin.py) as `admin` servicers. An RPC no servicer implements answers UNIMPLEMENTED
naming the RPC. Errors map through `HeadroomError.grpc_code`; bytes that are not a valid request message get
INVALID_ARGUMENT; an unexpected exception is logged and answered
INTERNAL. When the client cancels (or its deadline passes) the data plane's `disconnected` watcher resolves
(the data plane runs in its own task, shielded from grpc's cancellation of the handler), so a queued request
is dropped; `cancel_grace_s` later it is cancelled outright. The stage breakdown goes back as trailing
metadata `server-timing` (same format as HTTP).

Composition root usage::

    server = await start_grpc_server(dataplane, "127.0.0.1", 8001)
    ...
    await stop_grpc_server(server)
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import grpc
from google.protobuf import message_factory
from google.protobuf.message import DecodeError

from headroom.core.dataplane import InferenceDataPlane
from headroom.core.errors import DRAINING_HEADER, Draining, HeadroomError, InvalidRequest
from headroom.core.types import InferenceRequest, InferenceResponse
from headroom.models.config import ModelConfig
from headroom.protocol.generated import headroom_inference_pb2 as pb
from headroom.protocol.grpc_codec import decode_model_infer, encode_model_infer, encode_model_metadata
from headroom.protocol.grpc_stream import stream_infer
from headroom.protocol.http_response import Labels, server_timing

SERVICE_NAME = "inference.GRPCInferenceService"
DEFAULT_STOP_GRACE_S = 5.0
DEFAULT_CANCEL_GRACE_S = 1.0
log = logging.getLogger(__name__)

#: (model name, model version) -> classification labels per output name, or None.
LabelLookup = Callable[[str, str], Labels | None]
#: (model name, model version) -> the model's config (inputs are checked against it while decoding), or None.
ConfigLookup = Callable[[str, str], ModelConfig | None]


class GenerativeInfer(Protocol):
    """The LLMs on ModelInfer / ModelStreamInfer (headroom.llm.grpc_generate.GrpcGenerate)."""

    def serves(self, name: str) -> bool: ...

    async def infer(self, message: pb.ModelInferRequest, request_id: str) -> pb.ModelInferResponse: ...

    def stream(self, message: pb.ModelInferRequest, request_id: str) -> AsyncIterator[pb.ModelInferResponse]: ...


@dataclass(frozen=True, slots=True)
class GrpcServerConfig:
    """Settings of the gRPC front end."""

    max_message_bytes: int = 64 * 1024 * 1024  # largest request or response message (gRPC default is 4 MiB)
    cancel_grace_s: float = DEFAULT_CANCEL_GRACE_S  # after a client cancels, time infer() gets to wind down


def _new_request_id() -> str:
    return uuid.uuid4().hex


class _Disconnect:
    """The RPC's `disconnected` watcher: resolves when the client cancels or its deadline passes."""

    def __init__(self, context: Any) -> None:
        self._loop = asyncio.get_running_loop()
        self._gone: asyncio.Future[None] = self._loop.create_future()
        context.add_done_callback(self._on_done)

    def _on_done(self, ctx: Any) -> None:
        if ctx.cancelled():
            self._loop.call_soon_threadsafe(self.signal)

    def signal(self) -> None:
        if not self._gone.done():
            self._gone.set_result(None)

    async def wait(self) -> None:
        await asyncio.shield(self._gone)


async def _infer_until_disconnect(
    dataplane: InferenceDataPlane, request: InferenceRequest, context: Any, cancel_grace_s: float
) -> InferenceResponse:
    """Run `dataplane.infer` in its own task so a client cancellation arrives as the documented watcher.

    grpc.aio cancels the handler task when the client goes away; instead of injecting CancelledError into
    the data plane, the watcher resolves and the data plane gets `cancel_grace_s` to drop the request and
    raise Cancelled; only then is its task cancelled outright. The handler re-raises its own cancellation.
    """
    disconnect = _Disconnect(context)
    task = asyncio.ensure_future(dataplane.infer(request, disconnect.wait))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        disconnect.signal()
        try:
            if not task.done():
                await asyncio.wait({task}, timeout=cancel_grace_s)
        finally:  # also when this wait is itself cancelled (server stop): the task never outlives the RPC
            if not task.done():
                task.cancel()
            task.add_done_callback(lambda t: t.cancelled() or t.exception())  # consume the Cancelled error
        raise


class InferenceServicer:
    """The six required V2 RPCs; each is `async (request message, context) -> response message`."""

    def __init__(
        self,
        dataplane: InferenceDataPlane,
        labels: LabelLookup | None = None,
        new_request_id: Callable[[], str] = _new_request_id,
        cancel_grace_s: float = DEFAULT_CANCEL_GRACE_S,
        configs: ConfigLookup | None = None,
        generative: GenerativeInfer | None = None,
    ) -> None:
        self._generative = generative  # the LLMs: Triton's text_input / text_output convention
        self._dataplane = dataplane
        self._configs = configs
        self._cancel_grace_s = cancel_grace_s
        self._labels = labels
        self._new_request_id = new_request_id

    async def ServerLive(self, request: pb.ServerLiveRequest, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self._dataplane.live())

    async def ServerReady(self, request: pb.ServerReadyRequest, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self._dataplane.ready())

    async def ModelReady(self, request: pb.ModelReadyRequest, context: Any) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(ready=self._dataplane.model_ready(request.name, request.version))

    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: Any) -> pb.ServerMetadataResponse:
        meta = self._dataplane.server_metadata()
        return pb.ServerMetadataResponse(name=meta.name, version=meta.version, extensions=list(meta.extensions))

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Any) -> pb.ModelMetadataResponse:
        return encode_model_metadata(self._dataplane.model_metadata(request.name, request.version))

    def _llm(self, request: pb.ModelInferRequest) -> GenerativeInfer | None:
        llm = self._generative
        return llm if llm is not None and llm.serves(request.model_name) else None

    async def ModelInfer(self, request: pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse:
        if (llm := self._llm(request)) is not None:
            return await llm.infer(request, self._new_request_id())
        message, timings = await self._infer(request, context)
        context.set_trailing_metadata((("server-timing", timings),))
        return message

    async def _infer(self, request: pb.ModelInferRequest, context: Any) -> tuple[pb.ModelInferResponse, str]:
        check_decoded(request)  # a message of ModelStreamInfer
        config = self._configs(request.model_name, request.model_version) if self._configs else None
        decoded = decode_model_infer(request, self._new_request_id(), config)
        response = await _infer_until_disconnect(self._dataplane, decoded, context, self._cancel_grace_s)
        labels = self._labels(response.model_name, response.model_version) if self._labels else None
        return encode_model_infer(response, labels), server_timing(response.timings)

    async def _infer_message(self, request: pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse:
        return (await self._infer(request, context))[0]

    async def ModelStreamInfer(self, requests: AsyncIterator[pb.ModelInferRequest],
                               context: Any) -> AsyncIterator[pb.ModelStreamInferResponse]:
        def many(request: pb.ModelInferRequest, ctx: Any) -> AsyncIterator[pb.ModelInferResponse] | None:
            llm = self._llm(request)
            return None if llm is None else llm.stream(request, self._new_request_id())

        async for message in stream_infer(self._infer_message, requests, context, many=many):  # an async gen
            yield message


Handler = Callable[[Any, Any], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Undecodable:
    """What the deserializer hands on for bytes that are not a valid request message: the handler answers it
    INVALID_ARGUMENT (grpc.aio would answer a deserializer's exception UNKNOWN, a server error)."""

    message: str


def lenient_parser(message_cls: Any) -> Callable[[bytes], Any]:
    """`message_cls.FromString` that returns an Undecodable instead of raising DecodeError."""

    def parse(data: bytes) -> Any:
        try:
            return message_cls.FromString(data)
        except DecodeError as exc:
            return Undecodable(f"the request is not a valid {message_cls.DESCRIPTOR.full_name} protobuf ({exc})")

    return parse


def check_decoded(request: Any) -> None:
    """Raise InvalidRequest for a message the deserializer could not parse."""
    if isinstance(request, Undecodable):
        raise InvalidRequest(request.message)


def _guarded(name: str, method: Handler) -> Handler:
    """Translate exceptions into gRPC statuses (abort raises, so it sits outside the try)."""

    async def handle(request: Any, context: Any) -> Any:
        try:
            check_decoded(request)
            return await method(request, context)
        except HeadroomError as exc:
            code, message = grpc.StatusCode[exc.grpc_code], exc.message
            if isinstance(exc, Draining):  # as the HTTP header: the router retries it on another replica
                context.set_trailing_metadata(((DRAINING_HEADER, "1"),))
            if exc.hold_s > 0.0:  # a refusal paced during a retry storm (headroom.batching.refusal_pacing)
                await asyncio.sleep(exc.hold_s)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("gRPC %s failed", name)
            code, message = (
                grpc.StatusCode.INTERNAL,
                f"internal error ({type(exc).__name__}); see the server log",
            )
        await context.abort(code, message)

    return handle


def _unimplemented(name: str) -> Handler:
    async def handle(request: Any, context: Any) -> Any:
        await context.abort(
            grpc.StatusCode.UNIMPLEMENTED,
            f"{SERVICE_NAME}/{name} is not implemented by this server",
        )

    return handle


def service_handler(servicer: InferenceServicer, admin: Sequence[object] = ()) -> Any:
    """A generic handler for every RPC in the service descriptor: each from the first of `servicer`, *`admin`
    that has a method of its name (none: UNIMPLEMENTED). The streaming RPC answers errors in-stream."""
    service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    handlers: dict[str, Any] = {}
    for method in service.methods:
        request_cls = message_factory.GetMessageClass(method.input_type)
        response_cls = message_factory.GetMessageClass(method.output_type)
        impl = next((m for s in (servicer, *admin) if (m := getattr(s, method.name, None)) is not None), None)
        if impl is None:
            func = _unimplemented(method.name)
        else:
            func = impl if method.client_streaming else _guarded(method.name, impl)
        make = grpc.stream_stream_rpc_method_handler if method.client_streaming else grpc.unary_unary_rpc_method_handler
        handlers[method.name] = make(
            func,
            request_deserializer=lenient_parser(request_cls),
            response_serializer=response_cls.SerializeToString,
        )
    return grpc.method_handlers_generic_handler(SERVICE_NAME, handlers)


async def bind_grpc_server(
    dataplane: InferenceDataPlane,
    host: str,
    port: int,
    *,
    config: GrpcServerConfig | None = None,
    labels: LabelLookup | None = None,
    interceptors: Sequence[Any] = (),
    credentials: Any = None,
    admin: Sequence[object] = (),
    configs: ConfigLookup | None = None,
    generative: GenerativeInfer | None = None,
) -> tuple[grpc.aio.Server, int]:
    """Create, bind and start the server; returns it with the bound port (useful with `port=0`).

    `interceptors` (e.g. the gateway's auth/rate-limit interceptor) run before every RPC; `credentials`
    (grpc.ssl_server_credentials) turn on TLS; `admin` servicers add RPCs (server/grpc_admin.py); `configs` lets
    ModelInfer check inputs while decoding; `generative` serves the LLMs on ModelInfer / ModelStreamInfer.
    """
    cfg = config or GrpcServerConfig()
    options = [
        ("grpc.max_receive_message_length", cfg.max_message_bytes),
        ("grpc.max_send_message_length", cfg.max_message_bytes),
        ("grpc.so_reuseport", 0),  # a taken port is an error, not a silently shared socket
    ]
    server = grpc.aio.server(options=options, interceptors=list(interceptors))
    server.add_generic_rpc_handlers(
        (service_handler(InferenceServicer(dataplane, labels, cancel_grace_s=cfg.cancel_grace_s, configs=configs,
                                           generative=generative), admin),)
    )
    address = f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"
    try:
        bound = (server.add_secure_port(address, credentials) if credentials is not None
                 else server.add_insecure_port(address))
    except RuntimeError as exc:
        raise OSError(
            f"gRPC cannot listen on {address} ({exc}); is the port in use? pick another --grpc-port"
        ) from None
    await server.start()
    return server, bound


async def start_grpc_server(
    dataplane: InferenceDataPlane,
    host: str,
    port: int,
    *,
    config: GrpcServerConfig | None = None,
    labels: LabelLookup | None = None,
) -> grpc.aio.Server:
    """Serve `inference.GRPCInferenceService` for `dataplane` on host:port; stop with `stop_grpc_server`."""
    server, _ = await bind_grpc_server(dataplane, host, port, config=config, labels=labels)
    return server


async def stop_grpc_server(server: grpc.aio.Server, grace_s: float = DEFAULT_STOP_GRACE_S) -> None:
    """Stop accepting RPCs, give in-flight ones `grace_s`, then cancel the rest."""
    await server.stop(grace_s)
