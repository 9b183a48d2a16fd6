"""OpenTelemetry spans for a request, derived after the fact from `StageTimings`; W3C `traceparent` in/out.

    ingress (SERVER span: the whole HTTP exchange, child of the client's traceparent when one came)
    ├── preprocess   ├── queue   ├── batch   ├── compute   └── postprocess      (tensor models)
    └── llm.queue    └── llm.prefill (prompt tokens)   └── llm.decode (output tokens)   (LLM requests)

Stage spans are laid end to end from when the server's `total` starts (an LLM request's stages after its
preprocessing), so a trace viewer shows where the time went. Spans go to an injected `TracerProvider` (an
in-memory exporter in tests, OTLP in production); nothing here touches OpenTelemetry's global provider.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, Span, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from headroom.core.types import StageTimings
from headroom.gateway.usage import LLMUsage

_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")
TRACER_NAME = "headroom.gateway"


@dataclass(frozen=True, slots=True)
class TraceParent:
    """A parsed W3C `traceparent` header."""

    trace_id: int  # 128-bit trace id, never 0
    span_id: int  # 64-bit id of the caller's span, never 0
    sampled: bool  # the `sampled` trace flag


def parse_traceparent(header: str | None) -> TraceParent | None:
    """W3C Trace Context, level 1: `00-<32 hex>-<16 hex>-<2 hex>`; None for absent or invalid headers.

    Version `ff` and all-zero ids are invalid; versions above 00 are read by their first four fields.
    """
    if not header:
        return None
    match = _TRACEPARENT.match(header.strip())
    if match is None:
        return None
    version, trace_hex, span_hex, flags_hex, rest = match.groups()
    if version == "ff" or (version == "00" and rest is not None):
        return None
    trace_id, span_id = int(trace_hex, 16), int(span_hex, 16)
    if trace_id == 0 or span_id == 0:
        return None
    return TraceParent(trace_id, span_id, bool(int(flags_hex, 16) & 0x01))


def format_traceparent(trace_id: int, span_id: int, sampled: bool) -> str:
    return f"00-{trace_id:032x}-{span_id:016x}-{'01' if sampled else '00'}"


def stage_durations(timings: StageTimings) -> list[tuple[str, float]]:
    """(span name, milliseconds) of a tensor request's stages, in order."""
    return [
        ("preprocess", timings.preprocess_ms),
        ("queue", timings.queue_ms),
        ("batch", timings.batch_wait_ms),
        ("compute", timings.compute_ms),
        ("postprocess", timings.postprocess_ms),
    ]


def llm_stage_durations(queue_ms: float, prefill_ms: float, decode_ms: float) -> list[tuple[str, float]]:
    """(span name, milliseconds) of an LLM request's stages."""
    return [("llm.queue", queue_ms), ("llm.prefill", prefill_ms), ("llm.decode", decode_ms)]


Attributes = Mapping[str, str | int | float]


@dataclass(frozen=True, slots=True)
class SpanPlan:
    """The child spans of one finished request, ready for `IngressSpan.finish`."""

    stages: tuple[tuple[str, float], ...]  # (span name, ms) end to end; an empty name is a gap, not a span
    total_ms: float | None  # the server's whole time (stages start this long before the end); None: their sum
    stage_attributes: Mapping[str, Attributes]  # extra attributes by span name
    attributes: Attributes  # extra attributes for the ingress span


def llm_span_plan(usage: LLMUsage) -> SpanPlan:
    """llm.queue → llm.prefill → llm.decode after the route's preprocessing, with token counts."""
    prompt = {"gen_ai.usage.input_tokens": usage.prompt_tokens, "headroom.llm.cached_tokens": usage.cached_tokens}
    output = {"gen_ai.usage.output_tokens": usage.completion_tokens}
    return SpanPlan(
        stages=(("", usage.preprocess_ms), *llm_stage_durations(usage.queue_ms, usage.prefill_ms, usage.decode_ms)),
        total_ms=usage.total_ms,
        stage_attributes={"llm.prefill": prompt, "llm.decode": output},
        attributes={**prompt, **output, "headroom.llm.finish_reason": usage.finish_reason},
    )


def span_plan_from_server_timing(values: Mapping[str, float]) -> SpanPlan | None:
    """Child spans from a parsed `Server-Timing` header: LLM stages when it has `prefill`, else tensor ones."""
    if "total" not in values:
        return None
    if "prefill" in values or "decode" in values:
        stages = llm_stage_durations(values.get("queue", 0.0), values.get("prefill", 0.0), values.get("decode", 0.0))
        return SpanPlan((("", values.get("preprocess", 0.0)), *stages), values["total"], {}, {})
    timings = timings_from_server_timing(values)
    if timings is None:
        return None
    return SpanPlan(tuple(stage_durations(timings)), timings.total_ms, {}, {})


class IngressSpan:
    """The SERVER span of one request, open while it runs; `traceparent` is what to send downstream."""

    def __init__(
        self,
        provider: trace.TracerProvider,
        name: str,
        parent: TraceParent | None,
        request_id: str,
        tenant: str,
        start_ns: int,
        attributes: Mapping[str, str | int | float] | None = None,
    ) -> None:
        self._tracer = provider.get_tracer(TRACER_NAME)
        context = None
        if parent is not None:
            flags = TraceFlags(TraceFlags.SAMPLED if parent.sampled else TraceFlags.DEFAULT)
            remote = SpanContext(parent.trace_id, parent.span_id, is_remote=True, trace_flags=flags)
            context = trace.set_span_in_context(NonRecordingSpan(remote))
        attrs: dict[str, str | int | float] = {"headroom.request_id": request_id, "headroom.tenant": tenant}
        attrs.update(attributes or {})
        self.span: Span = self._tracer.start_span(
            name, context=context, kind=SpanKind.SERVER, attributes=attrs, start_time=start_ns
        )
        ctx = self.span.get_span_context()
        self.traceparent = format_traceparent(ctx.trace_id, ctx.span_id, ctx.trace_flags.sampled)
        self.finished = False  # finish() ran (it runs once)
        self.start_ns = start_ns  # wall-clock start; stage spans never begin before it

    def finish(
        self,
        stages: Sequence[tuple[str, float]],
        end_ns: int,
        total_ms: float | None = None,
        status_code: int | None = None,
        stage_attributes: Mapping[str, Attributes] | None = None,
        attributes: Attributes | None = None,
    ) -> None:
        """Record `stages` as children, laid end to end from `total_ms` before `end_ns` (default: their
        sum; a stage with an empty name only moves the start of the next), then end the span. Children stay
        inside this span (a server clock that ran ahead of the gateway's shortens the last ones)."""
        if self.finished:
            return
        self.finished = True
        ctx = trace.set_span_in_context(self.span)
        durations_ns = [max(0, int(ms * 1e6)) for _, ms in stages]
        span_total_ns = int(total_ms * 1e6) if total_ms is not None else sum(durations_ns)
        cursor = max(self.start_ns, end_ns - max(span_total_ns, sum(durations_ns)))
        for (name, _), dur_ns in zip(stages, durations_ns, strict=True):
            stage_end = min(end_ns, cursor + dur_ns)
            if name:
                attrs = (stage_attributes or {}).get(name)
                child = self._tracer.start_span(name, context=ctx, start_time=cursor, attributes=attrs)
                child.end(end_time=stage_end)
            cursor = stage_end
        if attributes:
            self.span.set_attributes(attributes)
        if status_code is not None:
            self.span.set_attribute("http.response.status_code", status_code)
            if status_code >= 500:
                self.span.set_status(Status(StatusCode.ERROR))
        self.span.end(end_time=end_ns)


def record_request_spans(
    provider: trace.TracerProvider,
    request_id: str,
    tenant: str,
    traceparent: str | None,
    timings: StageTimings,
    end_ns: int | None = None,
    name: str = "ingress",
) -> str:
    """One call after a tensor request finished: ingress + stage spans. Returns the ingress `traceparent`."""
    end = end_ns if end_ns is not None else time.time_ns()
    ingress = IngressSpan(
        provider, name, parse_traceparent(traceparent), request_id, tenant, end - int(timings.total_ms * 1e6)
    )
    ingress.finish(stage_durations(timings), end, timings.total_ms)
    return ingress.traceparent


def record_llm_spans(
    provider: trace.TracerProvider,
    request_id: str,
    tenant: str,
    traceparent: str | None,
    queue_ms: float,
    prefill_ms: float,
    decode_ms: float,
    end_ns: int | None = None,
) -> str:
    """Like `record_request_spans` for an LLM request (queue → prefill → decode)."""
    end = end_ns if end_ns is not None else time.time_ns()
    stages = llm_stage_durations(queue_ms, prefill_ms, decode_ms)
    total_ms = sum(ms for _, ms in stages)
    ingress = IngressSpan(
        provider, "ingress", parse_traceparent(traceparent), request_id, tenant, end - int(total_ms * 1e6)
    )
    ingress.finish(stages, end, total_ms)
    return ingress.traceparent


def timings_from_server_timing(values: Mapping[str, float]) -> StageTimings | None:
    """StageTimings from a parsed `Server-Timing` header (None when it has no `total`)."""
    if "total" not in values:
        return None
    return StageTimings(
        queue_ms=values.get("queue", 0.0),
        batch_wait_ms=values.get("batch_wait", 0.0),
        preprocess_ms=values.get("preprocess", 0.0),
        compute_ms=values.get("compute", 0.0),
        postprocess_ms=values.get("postprocess", 0.0),
        total_ms=values["total"],
        other_ms=values.get("other", 0.0),
    )
