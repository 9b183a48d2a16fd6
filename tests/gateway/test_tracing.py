"""Spans from StageTimings on an injected TracerProvider (in-memory exporter); W3C traceparent parsing."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from headroom.core.types import StageTimings
from headroom.gateway.tracing import (
    IngressSpan,
    TraceParent,
    format_traceparent,
    parse_traceparent,
    record_llm_spans,
    record_request_spans,
    span_plan_from_server_timing,
    timings_from_server_timing,
)

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> TracerProvider:
    p = TracerProvider()
    p.add_span_processor(SimpleSpanProcessor(exporter))
    return p


def test_parse_valid_traceparent() -> None:
    assert parse_traceparent(f"00-{TRACE}-{PARENT}-01") == TraceParent(int(TRACE, 16), int(PARENT, 16), True)
    assert parse_traceparent(f" 00-{TRACE}-{PARENT}-00 ") == TraceParent(
        int(TRACE, 16), int(PARENT, 16), False
    )
    assert parse_traceparent(f"01-{TRACE}-{PARENT}-01-future") is not None  # newer versions: first 4 fields


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "garbage",
        f"ff-{TRACE}-{PARENT}-01",
        f"00-{'0' * 32}-{PARENT}-01",
        f"00-{TRACE}-{'0' * 16}-01",
        f"00-{TRACE.upper()}-{PARENT}-01",
        f"00-{TRACE}-{PARENT}-01-extra",
        f"00-{TRACE[:-1]}-{PARENT}-01",
    ],
)
def test_parse_invalid_traceparent(header: str | None) -> None:
    assert parse_traceparent(header) is None


def test_format_round_trips() -> None:
    header = format_traceparent(int(TRACE, 16), int(PARENT, 16), True)
    assert header == f"00-{TRACE}-{PARENT}-01" and parse_traceparent(header) is not None


def test_request_spans_continue_the_callers_trace(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    timings = StageTimings(
        queue_ms=2.0, batch_wait_ms=3.0, preprocess_ms=1.0, compute_ms=10.0, postprocess_ms=0.5, total_ms=20.0
    )
    end_ns = 1_000_000_000_000
    out = record_request_spans(provider, "r1", "acme", f"00-{TRACE}-{PARENT}-01", timings, end_ns=end_ns)
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"ingress", "preprocess", "queue", "batch", "compute", "postprocess"}
    ingress = spans["ingress"]
    assert ingress.context is not None and ingress.parent is not None
    assert ingress.context.trace_id == int(TRACE, 16) and ingress.parent.span_id == int(PARENT, 16)
    assert out == format_traceparent(int(TRACE, 16), ingress.context.span_id, True)
    assert ingress.attributes == {"headroom.request_id": "r1", "headroom.tenant": "acme"}
    assert ingress.start_time == end_ns - 20_000_000 and ingress.end_time == end_ns
    durations_ms = {
        n: ((s.end_time or 0) - (s.start_time or 0)) / 1e6
        for n, s in spans.items()
        if n != "ingress"
    }
    assert durations_ms == pytest.approx(
        {"preprocess": 1.0, "queue": 2.0, "batch": 3.0, "compute": 10.0, "postprocess": 0.5}
    )
    order = sorted((s for n, s in spans.items() if n != "ingress"), key=lambda s: s.start_time or 0)
    assert [s.name for s in order] == ["preprocess", "queue", "batch", "compute", "postprocess"]
    assert all(s.parent is not None and s.parent.span_id == ingress.context.span_id for s in order)


def test_without_traceparent_a_new_trace_starts(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    out = record_request_spans(provider, "r2", "t", "not-a-header", StageTimings(total_ms=1.0))
    ingress = next(s for s in exporter.get_finished_spans() if s.name == "ingress")
    assert ingress.parent is None and parse_traceparent(out) is not None


def test_unsampled_parent_records_nothing(provider: TracerProvider, exporter: InMemorySpanExporter) -> None:
    record_request_spans(provider, "r3", "t", f"00-{TRACE}-{PARENT}-00", StageTimings(total_ms=1.0))
    assert exporter.get_finished_spans() == ()


def test_llm_spans(provider: TracerProvider, exporter: InMemorySpanExporter) -> None:
    record_llm_spans(provider, "r4", "t", None, queue_ms=3.0, prefill_ms=7.0, decode_ms=40.0, end_ns=10**12)
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"ingress", "llm.queue", "llm.prefill", "llm.decode"}
    assert spans["ingress"].start_time == 10**12 - 50_000_000


def test_timings_from_server_timing() -> None:
    assert timings_from_server_timing({"queue": 1.0}) is None
    t = timings_from_server_timing({"queue": 1.0, "batch_wait": 2.0, "compute": 3.0, "total": 7.0})
    assert t == StageTimings(queue_ms=1.0, batch_wait_ms=2.0, compute_ms=3.0, total_ms=7.0)


def test_stage_spans_stay_inside_the_ingress_span(provider: TracerProvider, exporter: InMemorySpanExporter) -> None:
    """A server-reported total longer than the gateway saw (clock skew) squeezes the stages, never leaks out."""
    ingress = IngressSpan(provider, "ingress", None, "r5", "t", start_ns=1_000_000_000)
    ingress.finish([("", 1.0), ("llm.queue", 2.0), ("llm.prefill", 3.0), ("llm.decode", 4.0)],
                   end_ns=1_005_000_000, total_ms=12.0, stage_attributes={"llm.decode": {"n": 1}})
    ingress.finish([], end_ns=2_000_000_000)  # a second finish is ignored
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"ingress", "llm.queue", "llm.prefill", "llm.decode"}  # the unnamed gap is no span
    assert spans["ingress"].end_time == 1_005_000_000
    bounds = [(spans[n].start_time, spans[n].end_time) for n in ("llm.queue", "llm.prefill", "llm.decode")]
    assert bounds == [(1_001_000_000, 1_003_000_000), (1_003_000_000, 1_005_000_000), (1_005_000_000, 1_005_000_000)]
    assert spans["llm.decode"].attributes == {"n": 1}


def test_span_plan_from_llm_server_timing() -> None:
    plan = span_plan_from_server_timing({"preprocess": 1.0, "queue": 2.0, "prefill": 3.0, "decode": 4.0, "total": 11.0})
    assert plan is not None and plan.total_ms == 11.0
    assert plan.stages == (("", 1.0), ("llm.queue", 2.0), ("llm.prefill", 3.0), ("llm.decode", 4.0))
    tensor = span_plan_from_server_timing({"queue": 1.0, "compute": 2.0, "total": 4.0})
    assert tensor is not None and [name for name, _ in tensor.stages][-2:] == ["compute", "postprocess"]
    assert span_plan_from_server_timing({"queue": 1.0}) is None
