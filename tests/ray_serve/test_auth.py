"""API keys on a Serve application (headroom.ray_serve.auth): the real `HttpIngress` on a real uvicorn server on
127.0.0.1, read with the official openai SDK and httpx, in front of a replica stand-in running headroom's own
replica app (`replica_app`, the gateway with the same keys) through `call_asgi`. Without a key: `headroom serve
--api-keys-file`'s 401s; with one: the request reaches the replica, which runs it as the key's tenant. No cluster
needed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp

from headroom.core.clock import MonotonicClock
from headroom.core.errors import RateLimited
from headroom.gateway.auth import create_key
from headroom.gateway.errors import Forbidden, Unauthenticated
from headroom.gateway.ratelimit import RateLimiter
from headroom.ray_serve.asgi_call import replica_app
from headroom.ray_serve.auth import IngressAuth, ingress_gateway, replica_gateway
from headroom.ray_serve.ingress import HttpIngress
from headroom.ray_serve.spec import ServeAppSpec
from headroom.router.fake_replica import serve_asgi
from headroom.server.dataplane import DataPlane
from headroom.server.http_app import HttpApi, HttpLimits
from headroom.server.metrics import ServerMetrics
from tests.support.serve_handles import AsgiHandle

MESSAGES: Any = [{"role": "user", "content": "hi"}]


def _replica(keys_file: str) -> ASGIApp:
    """headroom's replica app (no models) with a chat route that answers with the tenant the gateway set."""

    async def chat(request: Request) -> Response:
        tenant = request.scope["state"]["tenant"]
        return JSONResponse({"id": "c1", "object": "chat.completion", "created": 0, "model": "m", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": tenant}, "finish_reason": "stop"}]})

    registry, clock = CollectorRegistry(), MonotonicClock()
    api = HttpApi(DataPlane(ServerMetrics(registry), clock), registry, HttpLimits(1 << 20))
    return replica_app(api, [Route("/v1/chat/completions", chat, methods=["POST"])], registry, clock,
                       replica_gateway(keys_file))


def _app(keys_file: str, tmp_path: Path, **spec: Any) -> tuple[Starlette, AsgiHandle]:
    """The ingress as Serve's proxy drives it: `__call__(request)`, then the returned Response sent as ASGI."""
    handle = AsgiHandle(lambda: _replica(keys_file))
    ingress = HttpIngress(None, ServeAppSpec(str(tmp_path), api_keys_file=keys_file, **spec), handle)

    async def endpoint(request: Request) -> Response:
        return await ingress(request)

    return Starlette(routes=[Route("/{path:path}", endpoint, methods=["GET", "POST", "OPTIONS"])]), handle


@pytest.fixture
def keys(tmp_path: Path) -> tuple[str, str, str]:
    """(keys file, a user key of tenant acme, an admin key of tenant ops)."""
    path = tmp_path / "keys.json"
    return str(path), create_key(path, "acme"), create_key(path, "ops", role="admin")


async def test_the_ingress_refuses_requests_without_a_valid_key_as_headroom_serve_does(
        keys: tuple[str, str, str], tmp_path: Path) -> None:
    keys_file, acme, _ = keys
    (tmp_path / "repo").mkdir()
    app, handle = _app(keys_file, tmp_path / "repo")
    async with serve_asgi(app) as url, httpx.AsyncClient(base_url=url, timeout=60.0) as http:
        with pytest.raises(openai.AuthenticationError) as err:  # OpenAI's 401 through the official SDK
            client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="hr_bad_key", max_retries=0)
            await client.chat.completions.create(model="m", messages=MESSAGES)
        assert isinstance(err.value.body, dict) and err.value.body["code"] == "invalid_api_key"
        bare = await http.get("/v2/models")  # the ingress's own routes too, in V2's error shape
        assert bare.status_code == 401 and bare.json()["reason"] == "unauthenticated"
        assert bare.headers["www-authenticate"] == 'Bearer realm="headroom"'
        assert (await http.get("/v2/health/ready")).status_code == 200  # probes need no key
        assert not handle.calls  # nothing refused reached a replica
        ok = await http.get("/v2/models", headers={"x-api-key": acme})
        assert ok.status_code == 200 and ok.json() == {"models": []}


async def test_a_forwarded_request_runs_as_its_keys_tenant_in_the_replica(
        keys: tuple[str, str, str], tmp_path: Path) -> None:
    keys_file, acme, admin = keys
    (tmp_path / "repo").mkdir()
    app, handle = _app(keys_file, tmp_path / "repo")
    async with serve_asgi(app) as url:
        for key, tenant in ((acme, "acme"), (admin, "ops")):
            client = openai.AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=60.0)
            done = await client.chat.completions.create(model="m", messages=MESSAGES)
            assert done.choices[0].message.content == tenant  # the replica's gateway authenticated it too
    assert len(handle.calls) == 2


async def test_without_a_keys_file_everything_runs_as_the_anonymous_tenant(tmp_path: Path) -> None:
    (tmp_path / "repo").mkdir()
    app, _ = _app("", tmp_path / "repo")
    async with serve_asgi(app) as url:
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60.0)
        done = await client.chat.completions.create(model="m", messages=MESSAGES)
    assert done.choices[0].message.content == "anonymous"


def test_grpc_calls_need_a_key_in_their_metadata_except_health(keys: tuple[str, str, str], tmp_path: Path) -> None:
    keys_file, acme, admin = keys
    auth = IngressAuth.of(ingress_gateway(ServeAppSpec(str(tmp_path), api_keys_file=keys_file)))
    with pytest.raises(Unauthenticated):
        auth.grpc("ModelInfer", [])
    with pytest.raises(Unauthenticated):
        auth.grpc("ServerMetadata", [("x-api-key", "hr_0000_wrong")])
    auth.grpc("ModelInfer", [("authorization", f"Bearer {acme}")])
    auth.grpc("ServerReady", [])  # health RPCs are exempt, as under `headroom serve`
    with pytest.raises(Forbidden):  # roles as `headroom serve`'s interceptor checks them
        auth.grpc("RepositoryModelLoad", [("x-api-key", acme)])
    auth.grpc("RepositoryModelLoad", [("x-api-key", admin)])
    IngressAuth.of(ingress_gateway(ServeAppSpec(str(tmp_path)))).grpc("ModelInfer", [])  # no keys: no check


def test_grpc_calls_share_the_tenants_request_bucket(keys: tuple[str, str, str], tmp_path: Path) -> None:
    keys_file, acme, admin = keys
    setup = ingress_gateway(ServeAppSpec(str(tmp_path), api_keys_file=keys_file, rate_limit_rps=0.01,
                                         rate_limit_burst=2))
    auth = IngressAuth.of(setup, RateLimiter(setup.config.rate_limits))
    for _ in range(2):
        auth.grpc("ModelInfer", [("x-api-key", acme)])
    with pytest.raises(RateLimited) as err:
        auth.grpc("ModelInfer", [("x-api-key", acme)])
    assert err.value.retry_after_s > 50  # one request per 100 s
    auth.grpc("ModelInfer", [("x-api-key", admin)])  # another tenant has its own bucket
    auth.grpc("ServerLive", [("x-api-key", acme)])  # health is never limited


async def test_the_ingress_rate_limits_each_tenant_as_headroom_serve_does(
        keys: tuple[str, str, str], tmp_path: Path) -> None:
    keys_file, acme, admin = keys
    (tmp_path / "repo").mkdir()
    app, handle = _app(keys_file, tmp_path / "repo", rate_limit_rps=0.01, rate_limit_burst=3)
    async with serve_asgi(app) as url, httpx.AsyncClient(base_url=url, timeout=60.0) as http:
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key=acme, max_retries=0, timeout=60.0)
        for _ in range(3):
            done = await client.chat.completions.create(model="m", messages=MESSAGES)
            assert done.choices[0].message.content == "acme"
        with pytest.raises(openai.RateLimitError) as err:  # OpenAI's 429 through the official SDK
            await client.chat.completions.create(model="m", messages=MESSAGES)
        assert float(err.value.response.headers["retry-after"]) > 50
        v2 = await http.get("/v2/models", headers={"x-api-key": acme})  # one budget for every route
        assert v2.status_code == 429 and v2.json()["reason"] == "rate_limited", v2.text
        other = await http.get("/v2/models", headers={"x-api-key": admin})  # tenants are apart
        assert other.status_code == 200
        assert (await http.get("/v2/health/live")).status_code == 200  # probes are never limited
    assert len(handle.calls) == 3  # refused requests never reached a replica


async def test_the_ingress_answers_cors_as_headroom_serve_does(tmp_path: Path) -> None:
    (tmp_path / "repo").mkdir()
    app, _ = _app("", tmp_path / "repo", cors_origins=("http://dash.local",))
    preflight = {"origin": "http://dash.local", "access-control-request-method": "POST",
                 "access-control-request-headers": "content-type,authorization"}
    async with serve_asgi(app) as url, httpx.AsyncClient(base_url=url, timeout=60.0) as http:
        ok = await http.options("/v1/chat/completions", headers=preflight)
        assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "http://dash.local"
        assert "POST" in ok.headers["access-control-allow-methods"]
        bad = await http.options("/v1/chat/completions", headers={**preflight, "origin": "http://evil.local"})
        assert bad.status_code == 400 and "access-control-allow-origin" not in bad.headers
        simple = await http.get("/v2/models", headers={"origin": "http://dash.local"})
        assert simple.status_code == 200 and simple.headers["access-control-allow-origin"] == "http://dash.local"
        assert "x-request-id" in simple.headers["access-control-expose-headers"]
    app, _ = _app("", tmp_path / "repo")  # no origins: no CORS headers at all
    async with serve_asgi(app) as url, httpx.AsyncClient(base_url=url, timeout=60.0) as http:
        plain = await http.get("/v2/models", headers={"origin": "http://dash.local"})
        assert plain.status_code == 200 and "access-control-allow-origin" not in plain.headers


async def test_a_user_key_on_a_management_path_is_a_403(keys: tuple[str, str, str], tmp_path: Path) -> None:
    keys_file, acme, _ = keys
    (tmp_path / "repo").mkdir()
    app, _ = _app(keys_file, tmp_path / "repo")
    async with serve_asgi(app) as url, httpx.AsyncClient(base_url=url, timeout=60.0) as http:
        refused = await http.post("/v2/repository/models/m/load", headers={"x-api-key": acme})
        assert refused.status_code == 403 and refused.json()["reason"] == "forbidden", refused.text


class _LlmHandle:
    """The LLM deployment's handle: records each `grpc_infer` call and answers with an empty ModelInferResponse."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.grpc_infer = self

    def remote(self, *args: Any) -> Any:
        from headroom.protocol.generated import headroom_inference_pb2 as pb

        self.calls.append(args)

        class Call:
            def cancel(self) -> None:
                pass

            def __await__(self) -> Any:
                async def answer() -> tuple[bytes, None]:
                    return pb.ModelInferResponse(model_name="smollm2").SerializeToString(), None
                return answer().__await__()
        return Call()


class _GrpcContext:
    def __init__(self, metadata: list[tuple[str, str]]) -> None:
        self.metadata, self.code = metadata, None

    def invocation_metadata(self) -> list[tuple[str, str]]:
        return self.metadata

    def set_code(self, code: Any) -> None:
        self.code = code

    def set_details(self, details: str) -> None:
        pass


async def test_an_llm_model_infer_carries_its_keys_tenant_to_the_llm_replica(keys: tuple[str, str, str]) -> None:
    """The LLM replica runs a gRPC ModelInfer as the tenant the ingress authenticated (its prefix-cache scope),
    as `headroom serve` does; without keys, as the anonymous tenant."""
    from headroom.protocol.generated import headroom_inference_pb2 as pb

    keys_file, acme, admin = keys
    repo = str(Path(__file__).resolve().parents[2] / "models")
    message = pb.ModelInferRequest(model_name="smollm2").SerializeToString()
    for keys_path, metadata, tenant in ((keys_file, [("x-api-key", acme)], "acme"),
                                        (keys_file, [("authorization", f"Bearer {admin}")], "ops"),
                                        ("", [], "anonymous")):
        llm = _LlmHandle()
        ingress = HttpIngress(None, ServeAppSpec(repo, models=("smollm2",), api_keys_file=keys_path), llm)
        context = _GrpcContext(metadata)
        await ingress.ModelInfer(message, context)
        assert context.code is None and len(llm.calls) == 1
        assert llm.calls[0][2] == tenant, llm.calls
