"""The gRPC interceptor in process: keys in metadata, admin RPCs, health exempt, shared per-tenant buckets."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from headroom.core.clock import FakeClock
from headroom.gateway.auth import KeyStore, create_key
from headroom.gateway.grpc_auth import GatewayInterceptor, metadata_key
from headroom.gateway.ratelimit import RateLimitConfig, RateLimiter

SERVICE = "inference.GRPCInferenceService"


async def _echo(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
    return b"ok:" + request


async def _stream(
    requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[bytes, bytes]
) -> AsyncIterator[bytes]:
    async for r in requests:
        yield b"s:" + r


@pytest.fixture
async def target(tmp_path: Path) -> AsyncIterator[tuple[str, dict[str, str]]]:
    keys_file = tmp_path / "keys.yaml"
    keys = {"user": create_key(keys_file, "acme"), "admin": create_key(keys_file, "ops", "admin")}
    limiter = RateLimiter(RateLimitConfig.of(requests_per_s=1.0, request_burst=3.0))
    interceptor = GatewayInterceptor(KeyStore.from_file(keys_file), limiter, FakeClock())
    unary = {
        m: grpc.unary_unary_rpc_method_handler(_echo)
        for m in ("ServerLive", "ModelInfer", "RepositoryModelLoad")
    }
    handlers = {**unary, "ModelStreamInfer": grpc.stream_stream_rpc_method_handler(_stream)}
    server = grpc.aio.server(interceptors=[interceptor])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}", keys
    finally:
        await server.stop(0)


async def _call(address: str, method: str, metadata: tuple[tuple[str, str], ...] = ()) -> bytes:
    async with grpc.aio.insecure_channel(address) as channel:
        reply: bytes = await channel.unary_unary(f"/{SERVICE}/{method}")(b"x", metadata=metadata, timeout=10)
        return reply


async def _code(address: str, method: str, metadata: tuple[tuple[str, str], ...] = ()) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await _call(address, method, metadata)
    return info.value.code()


async def test_keys_roles_and_exempt_health(target: tuple[str, dict[str, str]]) -> None:
    address, keys = target
    assert await _call(address, "ServerLive") == b"ok:x"
    assert await _code(address, "ModelInfer") == grpc.StatusCode.UNAUTHENTICATED
    assert (
        await _code(address, "ModelInfer", (("authorization", "Bearer hr_00000000_bad"),))
        == grpc.StatusCode.UNAUTHENTICATED
    )
    user = (("authorization", f"Bearer {keys['user']}"),)
    assert await _call(address, "ModelInfer", user) == b"ok:x"
    assert await _code(address, "RepositoryModelLoad", user) == grpc.StatusCode.PERMISSION_DENIED
    assert await _call(address, "RepositoryModelLoad", (("x-api-key", keys["admin"]),)) == b"ok:x"


async def test_rate_limit_is_resource_exhausted_with_retry_after(target: tuple[str, dict[str, str]]) -> None:
    address, keys = target
    user = (("x-api-key", keys["user"]),)
    for _ in range(3):
        await _call(address, "ModelInfer", user)
    async with grpc.aio.insecure_channel(address) as channel:
        call = channel.unary_unary(f"/{SERVICE}/ModelInfer")(b"x", metadata=user, timeout=10)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert dict(info.value.trailing_metadata() or ())["retry-after"] == "1"
    assert await _call(address, "ModelInfer", (("x-api-key", keys["admin"]),)) == b"ok:x"  # other tenant


async def test_streams_are_checked_when_they_open(target: tuple[str, dict[str, str]]) -> None:
    address, keys = target
    async with grpc.aio.insecure_channel(address) as channel:
        stream = channel.stream_stream(f"/{SERVICE}/ModelStreamInfer")
        call = stream(iter([b"a"]), timeout=10)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in call:
                pass
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        replies = [
            r async for r in stream(iter([b"a", b"b"]), metadata=(("x-api-key", keys["user"]),), timeout=10)
        ]
    assert replies == [b"s:a", b"s:b"]


def test_metadata_key() -> None:
    assert metadata_key((("authorization", "Bearer k1"),)) == "k1"
    assert metadata_key((("x-api-key", "k2"), ("other-bin", b"\x00"))) == "k2"
    assert metadata_key(None) is None
