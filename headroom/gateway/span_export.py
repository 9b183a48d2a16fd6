"""A dependency-free span sink: finished spans as JSON lines in a file (`--trace-spans-file`).

For production, give `wrap_app` a TracerProvider with an OTLP exporter instead; this one is for local runs
and tests, and for reading traces with `jq` when no collector is around.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import orjson
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult


class JsonLinesSpanExporter(SpanExporter):
    """Appends one JSON object per finished span: name, ids, parent id, start/end (ns), attributes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = []
        for s in spans:
            ctx, parent = s.context, s.parent
            lines.append(
                orjson.dumps(
                    {
                        "name": s.name,
                        "trace_id": f"{ctx.trace_id:032x}" if ctx is not None else "",
                        "span_id": f"{ctx.span_id:016x}" if ctx is not None else "",
                        "parent_id": f"{parent.span_id:016x}" if parent is not None else "",
                        "start_ns": s.start_time,
                        "end_ns": s.end_time,
                        "attributes": dict(s.attributes or {}),
                    }
                )
            )
        with self._lock, self.path.open("ab") as f:
            f.write(b"".join(line + b"\n" for line in lines))
        return SpanExportResult.SUCCESS


def file_tracer_provider(path: Path) -> TracerProvider:
    """A TracerProvider that writes every finished span to `path` (JSON lines)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesSpanExporter(path)))
    return provider
