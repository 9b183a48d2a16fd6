"""KServe V2 gRPC (`inference.GRPCInferenceService`) through Ray Serve's gRPC proxy.

Serve's gRPC proxy (Ray >= 2.9; 2.60 here) serves any gRPC service whose `add_..._to_server` function is named in
`grpc_options.grpc_servicer_functions`: it registers the service's method handlers (keeping their request
deserializers), and calls the application's ingress deployment method named after the RPC with the decoded
request message and a `grpc_context` (one application: no `application` metadata needed; several: the client
sends it). `add_inference_service` registers headroom's service description (the same generated protobuf
classes and the lenient deserializer `headroom serve` uses), and `GrpcIngress` gives `HttpIngress` the RPCs:

* `ModelInfer` on a tensor model: decoded and checked against the model's config at the ingress
  (`headroom.protocol.grpc_codec`), then the same handle call as HTTP (`ModelReplica.infer`: retries on a lost
  replica, bounded), encoded back; on an LLM: the LLM replica's own gRPC generate path (`GrpcGenerate.infer`:
  `text_input` -> `text_output`, settings as parameters);
* `ServerLive`, `ServerReady`, `ModelReady`, `ServerMetadata` (Serve routes here only once deployed);
* errors as `headroom serve` reports them: the headroom error's gRPC code and message;
* with the application's API keys, `ModelInfer` and `ServerMetadata` need one in the metadata
  (`authorization: Bearer <key>` or `x-api-key`), as `headroom serve`'s gRPC interceptor requires.

Not carried (not registered, so the proxy answers UNIMPLEMENTED): `ModelStreamInfer` (Serve 2.60's proxy has
bidirectional streaming, through its own input-stream protocol to the replica; not wired here), `ModelMetadata`,
`ModelConfig`, statistics and the repository RPCs. Use `headroom serve` / `headroom route` for those.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import grpc
from google.protobuf import message_factory

from headroom.core.errors import HeadroomError, InvalidRequest, ModelNotFound
from headroom.protocol.generated import headroom_inference_pb2 as pb
from headroom.protocol.grpc_codec import decode_model_infer, encode_model_infer, encode_model_metadata
from headroom.protocol.grpc_service import SERVICE_NAME, check_decoded, lenient_parser
from headroom.protocol.triton_config import triton_model_config_proto
from headroom.ray_serve.auth import IngressAuth
from headroom.ray_serve.model_info import ServedModels
from headroom.ray_serve.replica import RemoteError
from headroom.ray_serve.retries import awaited, first_result

#: the RPCs `GrpcIngress` answers (the only ones registered: the others answer UNIMPLEMENTED)
SERVED_RPCS = ("ModelInfer", "ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata",
               "ModelConfig")


def _raw(data: bytes) -> bytes:
    """The proxy hands the ingress the request's bytes: the generated message classes do not pickle (their module
    is registered under its file name), so each RPC parses them itself (`lenient_parser`)."""
    return bytes(data)


_parse_infer = lenient_parser(pb.ModelInferRequest)
_parse_model_ready = lenient_parser(pb.ModelReadyRequest)
_parse_metadata = lenient_parser(pb.ModelMetadataRequest)
_parse_config = lenient_parser(pb.ModelConfigRequest)
_Response = TypeVar("_Response")


async def _never(request: Any, context: Any) -> Any:  # Serve replaces every behaviour with its proxy's
    raise RuntimeError("called outside Ray Serve's gRPC proxy")


def add_inference_service(servicer: Any, server: Any) -> None:
    """Serve's `grpc_servicer_functions` hook: register `inference.GRPCInferenceService`'s methods (their
    request deserializers matter; Serve routes each call to the ingress method of the RPC's name)."""
    service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    handlers = {}
    for method in service.methods:
        if method.name not in SERVED_RPCS:
            continue  # no handler: grpc itself answers UNIMPLEMENTED
        response_cls = message_factory.GetMessageClass(method.output_type)
        handlers[method.name] = grpc.unary_unary_rpc_method_handler(_never, _raw, response_cls.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))


def _fail(grpc_context: Any, exc: HeadroomError) -> None:
    """Serve's proxy answers the call with this status (and drops the empty message returned with it)."""
    grpc_context.set_code(grpc.StatusCode[exc.grpc_code])
    grpc_context.set_details(exc.message)


class GrpcIngress:
    """The RPCs, mixed into `HttpIngress` (its `configs`, `llm_names`, `llm`, `spec`, `stats`, `call_replica`)."""

    configs: dict[str, Any]
    served: ServedModels
    llm_names: frozenset[str]
    llm: Any
    spec: Any
    stats: dict[str, int]
    auth: IngressAuth

    def _request_id(self) -> str:
        raise NotImplementedError

    async def call_replica(self, request: Any, key: str | None, timeout_s: float) -> Any:
        raise NotImplementedError

    async def ModelInfer(self, raw: bytes, grpc_context: Any) -> pb.ModelInferResponse:
        try:
            tenant = self.auth.grpc("ModelInfer", grpc_context.invocation_metadata())
            request = _parse_infer(raw)
            check_decoded(request)
            if request.model_name in self.llm_names and self.llm is not None:
                return await self._llm_infer(request, tenant)
            config = self.configs.get(request.model_name)
            if config is None:
                raise ModelNotFound(f"Request for unknown model: '{request.model_name}' is not found (served "
                                    f"models: {', '.join(sorted({*self.configs, *self.llm_names})) or 'none'})")
            decoded = decode_model_infer(request, self._request_id(), config)
            timeout_s = (decoded.timeout_ms or config.batching.default_timeout_ms) / 1e3 + self.spec.load_allowance_s
            answer = await self.call_replica(decoded, None, timeout_s)
            if answer.error is not None:
                raise answer.error.rebuild()
            return encode_model_infer(answer.response, answer.labels)
        except HeadroomError as exc:
            _fail(grpc_context, exc)
            return pb.ModelInferResponse()

    async def _llm_infer(self, request: pb.ModelInferRequest, tenant: str) -> pb.ModelInferResponse:
        request_id = self._request_id()

        def send() -> tuple[Any, Any]:
            call = self.llm.grpc_infer.remote(request.SerializeToString(), request_id, tenant)
            return call, awaited(call)

        (response, error), _ = await first_result(send, self.spec, self.stats, request.model_name, request_id,
                                                  self.spec.llm_timeout_s)
        if isinstance(error, RemoteError):
            raise error.rebuild()
        if not isinstance(response, bytes):
            raise InvalidRequest(f"the LLM replica answered {type(response).__name__}")
        message: pb.ModelInferResponse = pb.ModelInferResponse.FromString(response)
        return message

    async def ServerLive(self, request: Any, grpc_context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)  # Serve's proxy routes here only once the application runs

    async def ServerReady(self, request: Any, grpc_context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=True)

    async def ModelReady(self, raw: bytes, grpc_context: Any) -> pb.ModelReadyResponse:
        request = _parse_model_ready(raw)
        if isinstance(request, pb.ModelReadyRequest) and request.name in {*self.configs, *self.llm_names}:
            return pb.ModelReadyResponse(ready=not request.version or request.name in self.configs)
        return pb.ModelReadyResponse(ready=False)

    async def ServerMetadata(self, request: Any, grpc_context: Any) -> pb.ServerMetadataResponse:
        try:
            self.auth.grpc("ServerMetadata", grpc_context.invocation_metadata())
        except HeadroomError as exc:
            _fail(grpc_context, exc)
            return pb.ServerMetadataResponse()
        return pb.ServerMetadataResponse(name="headroom", version="ray-serve", extensions=[])

    def _model_rpc(self, rpc: str, raw: bytes, parse: Any, message_type: Any, grpc_context: Any,
                   respond: Callable[[Any], _Response], empty: Callable[[], _Response]) -> _Response:
        """`respond` to the request once the caller is checked (`IngressAuth.grpc`) and the request parsed as
        `message_type` (400 otherwise); a headroom error becomes the call's status, with `empty()` returned."""
        try:
            self.auth.grpc(rpc, grpc_context.invocation_metadata())
            request = parse(raw)
            if not isinstance(request, message_type):
                raise InvalidRequest(f"not a {message_type.__name__}")
            return respond(request)
        except HeadroomError as exc:
            _fail(grpc_context, exc)
            return empty()

    async def ModelMetadata(self, raw: bytes, grpc_context: Any) -> pb.ModelMetadataResponse:
        """From the repository, as `headroom serve` answers it (`headroom.ray_serve.model_info`)."""

        def respond(request: pb.ModelMetadataRequest) -> pb.ModelMetadataResponse:
            return encode_model_metadata(self.served.metadata(request.name, request.version))

        return self._model_rpc("ModelMetadata", raw, _parse_metadata, pb.ModelMetadataRequest, grpc_context,
                               respond, pb.ModelMetadataResponse)

    async def ModelConfig(self, raw: bytes, grpc_context: Any) -> pb.ModelConfigResponse:
        """Triton's model configuration, from the repository's config.yaml."""

        def respond(request: pb.ModelConfigRequest) -> pb.ModelConfigResponse:
            return pb.ModelConfigResponse(config=triton_model_config_proto(self.served.config(request.name,
                                                                                              request.version)))

        return self._model_rpc("ModelConfig", raw, _parse_config, pb.ModelConfigRequest, grpc_context, respond,
                               pb.ModelConfigResponse)
