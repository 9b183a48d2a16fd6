"""W3C trace context through the router: a real router (in-process uvicorn) in front of a real replica
(`headroom serve` with `--trace-spans-file`); the replica's spans join the client's trace."""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from headroom.router.fake_replica import serve_asgi
from headroom.router.proxy import ProxyConfig, Router
from headroom.router.upstream import Upstream
from tests.server.conftest import build_test_repository
from tests.support.server import TRUST_PYTHON, RunningServer, run_server

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
ECHO = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1.0, 2.0]}]}


@pytest.fixture(scope="module")
def replica(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, Path]]:
    tmp = tmp_path_factory.mktemp("traced-replica")
    spans = tmp / "spans.jsonl"
    repo = build_test_repository(tmp / "repo")
    args = ["--model", "echo", "--grpc-port", "-1", "--trace-spans-file", str(spans), *TRUST_PYTHON]
    with run_server(repo, tmp, args) as server:
        yield server, spans


def replica_spans(path: Path, trace_hex: str) -> list[dict[str, Any]]:
    lines = path.read_text().splitlines() if path.exists() else []
    return [s for s in map(json.loads, lines) if s["trace_id"] == trace_hex]


@contextlib.asynccontextmanager
async def router_client(url: str, provider: TracerProvider | None) -> AsyncIterator[httpx.AsyncClient]:
    router = Router([Upstream("r0", url)], ProxyConfig(policy="round_robin"), rng=random.Random(0),
                    tracer_provider=provider)
    async with serve_asgi(router.app, lifespan="on") as router_url:
        await router.check_once()  # the replica is ready before the first request
        async with httpx.AsyncClient(base_url=router_url, timeout=30.0) as client:
            yield client


async def test_a_tracing_router_puts_its_span_between_client_and_replica(
    replica: tuple[RunningServer, Path],
) -> None:
    server, spans_file = replica
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    async with router_client(server.url, provider) as client:
        r = await client.post("/v2/models/echo/infer", json=ECHO,
                              headers={"traceparent": f"00-{TRACE}-{CLIENT_SPAN}-01", "tracestate": "acme=1"})
        assert r.status_code == 200, r.text
    (router_span,) = exporter.get_finished_spans()
    assert router_span.name == "router" and router_span.context is not None and router_span.parent is not None
    assert router_span.context.trace_id == int(TRACE, 16) and router_span.parent.span_id == int(CLIENT_SPAN, 16)
    assert router_span.attributes is not None and router_span.attributes["headroom.replica"] == "r0"
    assert router_span.attributes["http.response.status_code"] == 200
    router_span_hex = f"{router_span.context.span_id:016x}"
    spans = replica_spans(spans_file, TRACE)
    ingress = [s for s in spans if s["name"] == "ingress"]
    assert len(ingress) == 1 and ingress[0]["parent_id"] == router_span_hex  # the replica joined the trace
    stages = {s["name"] for s in spans if s["parent_id"] == ingress[0]["span_id"]}
    assert stages == {"preprocess", "queue", "batch", "compute", "postprocess"}
    assert (router_span.start_time or 0) <= ingress[0]["start_ns"] <= ingress[0]["end_ns"] <= (
        router_span.end_time or 0
    )


async def test_a_router_without_tracing_forwards_the_clients_traceparent(
    replica: tuple[RunningServer, Path],
) -> None:
    server, spans_file = replica
    trace = "0af7651916cd43dd8448eb211c80319c"
    async with router_client(server.url, None) as client:
        r = await client.post("/v2/models/echo/infer", json=ECHO,
                              headers={"traceparent": f"00-{trace}-{CLIENT_SPAN}-01"})
        assert r.status_code == 200, r.text
    ingress = [s for s in replica_spans(spans_file, trace) if s["name"] == "ingress"]
    assert len(ingress) == 1 and ingress[0]["parent_id"] == CLIENT_SPAN


async def test_the_router_span_records_a_refusal() -> None:
    """No replica: the router answers 503 itself, and its span says so."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    router = Router([], ProxyConfig(), rng=random.Random(0), tracer_provider=provider)
    async with serve_asgi(router.app, lifespan="on") as url, httpx.AsyncClient(base_url=url) as client:
        r = await client.post("/v2/models/echo/infer", json=ECHO,
                              headers={"traceparent": f"00-{TRACE}-{CLIENT_SPAN}-01"})
    assert r.status_code == 503
    (span,) = exporter.get_finished_spans()
    assert span.attributes is not None and span.attributes["http.response.status_code"] == 503
    assert span.context is not None and span.context.trace_id == int(TRACE, 16)
