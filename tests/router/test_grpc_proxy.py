"""The router's gRPC side against real grpc.aio V2 servers (headroom.protocol.grpc_service) on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter
from collections.abc import AsyncIterator, Sequence

import grpc
import grpc.aio
import numpy as np

from headroom.core.dataplane import DisconnectWatcher, ModelMetadata, ServerMetadata, TensorMetadata
from headroom.core.types import InferenceRequest, InferenceResponse, Tensor
from headroom.protocol.generated import headroom_inference_pb2 as pb
from headroom.protocol.grpc_service import bind_grpc_server, stop_grpc_server
from headroom.router import health as hp
from headroom.router.grpc_proxy import SERVICE_NAME, GrpcProxy
from headroom.router.proxy import ProxyConfig, Router
from headroom.router.shed import VegasConfig
from headroom.router.upstream import Upstream
from tests.support.waiting import until


class EchoPlane:
    """A data plane that echoes its input and names itself in the model version."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls = 0

    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        return True

    def server_metadata(self) -> ServerMetadata:
        return ServerMetadata("headroom", "test", ())

    def model_metadata(self, name: str, version: str = "") -> ModelMetadata:
        spec = (TensorMetadata("x", "FP32", (-1,)),)
        return ModelMetadata(name, (self.name,), "python", spec, spec)

    def model_ready(self, name: str, version: str = "") -> bool:
        return True

    async def infer(self, request: InferenceRequest,
                    disconnected: DisconnectWatcher | None = None) -> InferenceResponse:
        self.calls += 1
        t = request.inputs[0]
        return InferenceResponse(request.request_id, request.model_name, self.name,
                                 (Tensor("y", t.datatype, t.shape, t.data),))


@contextlib.asynccontextmanager
async def grpc_fleet(n: int, planes: Sequence[EchoPlane] = (), config: ProxyConfig | None = None
                     ) -> AsyncIterator[tuple[Router, list[tuple[EchoPlane, grpc.aio.Server]], str]]:
    planes = list(planes) or [EchoPlane(f"r{i}") for i in range(n)]
    servers = [await bind_grpc_server(p, "127.0.0.1", 0) for p in planes]
    router = Router([Upstream(p.name, "http://127.0.0.1:1", grpc_target=f"127.0.0.1:{port}")
                     for p, (_, port) in zip(planes, servers, strict=True)],
                    config or ProxyConfig(policy="round_robin"), rng=random.Random(0))
    for p in planes:  # readiness as the HTTP checker would report it
        _, router.health = hp.record_check(router.health, p.name, True, 0.0, router.config.health)
    proxy = GrpcProxy(router)
    port = await proxy.start("127.0.0.1", 0)
    try:
        yield router, [(p, s) for p, (s, _) in zip(planes, servers, strict=True)], f"127.0.0.1:{port}"
    finally:
        await proxy.close()
        for s, _ in servers:
            await stop_grpc_server(s, 0.1)


def _infer_request(i: int) -> bytes:
    req = pb.ModelInferRequest(model_name="echo", id=f"q{i}")
    t = req.inputs.add(name="x", datatype="FP32", shape=[3])
    t.contents.fp32_contents.extend([1.0, 2.0, float(i)])
    return bytes(req.SerializeToString())


async def _infer(channel: grpc.aio.Channel, i: int) -> pb.ModelInferResponse:
    call = channel.unary_unary(f"/{SERVICE_NAME}/ModelInfer")
    raw: bytes = await call(_infer_request(i), timeout=5.0)
    answer: pb.ModelInferResponse = pb.ModelInferResponse.FromString(raw)
    return answer


async def test_unary_rpcs_are_balanced_across_replicas_and_answers_pass_through() -> None:
    async with grpc_fleet(2) as (router, _planes, target), grpc.aio.insecure_channel(target) as ch:
        answers = [await _infer(ch, i) for i in range(6)]
        assert Counter(a.model_version for a in answers) == Counter({"r0": 3, "r1": 3})
        out = np.frombuffer(answers[5].raw_output_contents[0], dtype=np.float32)
        assert out.tolist() == [1.0, 2.0, 5.0] and answers[5].id == "q5"
        ready = pb.ServerReadyResponse.FromString(
            await ch.unary_unary(f"/{SERVICE_NAME}/ServerReady")(pb.ServerReadyRequest().SerializeToString()))
        assert ready.ready
        assert all(rt.outstanding == 0 for rt in router.replicas.values())


async def test_a_dead_replica_is_skipped_by_retrying_never_started_calls() -> None:
    async with grpc_fleet(2) as (router, planes, target), grpc.aio.insecure_channel(target) as ch:
        await stop_grpc_server(planes[0][1], 0.0)  # r0 is gone; the router has not noticed
        answers = [await _infer(ch, i) for i in range(6)]
        assert {a.model_version for a in answers} == {"r1"}
        assert router.counters["retries"] >= 1


async def test_errors_from_a_replica_keep_their_status() -> None:
    async with grpc_fleet(1) as (_, _planes, target), grpc.aio.insecure_channel(target) as ch:
        bad = pb.ModelInferRequest(model_name="echo").SerializeToString()  # no inputs
        try:
            await ch.unary_unary(f"/{SERVICE_NAME}/ModelInfer")(bad, timeout=5.0)
        except grpc.aio.AioRpcError as err:
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        else:
            raise AssertionError("an empty ModelInfer must fail")


async def test_stream_calls_are_relayed_to_a_replica() -> None:
    """ModelStreamInfer goes through the proxy both ways: each streamed request gets its replica's answer."""
    async with grpc_fleet(2) as (router, _planes, target), grpc.aio.insecure_channel(target) as ch:
        call = ch.stream_stream(f"/{SERVICE_NAME}/ModelStreamInfer")()
        for i in range(2):
            await call.write(_infer_request(i))
        await call.done_writing()
        answers = [pb.ModelStreamInferResponse.FromString(raw) async for raw in call]
        assert sorted(a.infer_response.id for a in answers) == ["q0", "q1"]
        assert all(not a.error_message for a in answers)
        await until(lambda: all(rt.outstanding == 0 for rt in router.replicas.values()), "outstanding back to 0")


class StuckPlane(EchoPlane):
    """Holds every inference until its server goes away; `holding` is set once one is held."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.holding = asyncio.Event()

    async def infer(self, request: InferenceRequest,
                    disconnected: DisconnectWatcher | None = None) -> InferenceResponse:
        self.holding.set()
        await asyncio.Event().wait()  # cancelled when the server stops
        raise AssertionError("unreachable")


async def test_a_modelinfer_whose_replica_dies_mid_call_is_retried_elsewhere() -> None:
    stuck = StuckPlane("r0")
    async with grpc_fleet(2, [stuck, EchoPlane("r1")]) as (router, planes, target), \
            grpc.aio.insecure_channel(target) as ch:
        call = asyncio.ensure_future(_infer(ch, 7))  # round robin: r0 first
        await asyncio.wait_for(stuck.holding.wait(), 10.0)
        await stop_grpc_server(planes[0][1], 0.0)  # the replica goes away with the call on it
        answer = await asyncio.wait_for(call, 10.0)
        assert answer.model_version == "r1" and answer.id == "q7"
        assert router.counters["retries"] == 1
        assert [(await _infer(ch, i)).model_version for i in range(2)] == ["r1", "r1"]
        assert not any(s.ready for s in router.snapshots() if s.replica_id == "r0")  # refused: no calls there



async def test_the_concurrency_limit_counts_grpc_calls_in_flight() -> None:
    """gRPC calls share the router's in-flight count and adaptive concurrency limit with HTTP requests."""
    stuck = StuckPlane("r0")
    config = ProxyConfig(policy="round_robin", shedding=False, adaptive_concurrency=True,
                         vegas=VegasConfig(probe_concurrency=1))  # probing minRTT: 1 call at a time
    async with grpc_fleet(1, [stuck], config) as (router, _planes, target), grpc.aio.insecure_channel(target) as ch:
        held = asyncio.ensure_future(_infer(ch, 0))
        await asyncio.wait_for(stuck.holding.wait(), 10.0)
        assert router.inflight == 1
        try:
            await _infer(ch, 1)
        except grpc.aio.AioRpcError as err:
            assert err.code() == grpc.StatusCode.UNAVAILABLE and "concurrency limit 1" in (err.details() or "")
            assert dict(err.trailing_metadata() or ())["retry-after"] == "1"
        else:
            raise AssertionError("the second call must be refused while the first is held")
        assert router.counters["limited"] == 1 and router.counters["requests"] == 2
        held.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await held
        await until(lambda: router.inflight == 0 and router.replicas["r0"].outstanding == 0, "the call released")
