"""The per-request context (request id, tenant, key id, trace) for logs, plus log filters that use it.

The middleware binds a `RequestContext` in a ContextVar for the life of the request task, so every log line
written while handling it — by headroom or anything it calls in that task — carries `request_id` and `tenant`
(`ContextLogFilter`). The same filter redacts anything shaped like an API key, as a second line of defence.
"""

from __future__ import annotations

import logging
import re
from contextvars import ContextVar, Token
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RequestContext:
    """What logs and traces need to know about the request being handled."""

    request_id: str  # the client's X-Request-Id, or one the gateway made up
    tenant: str  # authenticated tenant; "anonymous" when auth is off
    key_id: str  # id of the API key used ("" when auth is off or the path is exempt) — safe to log
    traceparent: str  # W3C traceparent of the gateway's ingress span ("" when not tracing)


_current: ContextVar[RequestContext | None] = ContextVar("headroom_request_context", default=None)
_KEY_SHAPE = re.compile(r"hr_[0-9a-f]{8}_[A-Za-z0-9_-]+")
REDACTED = "hr_[redacted]"


def current_context() -> RequestContext | None:
    return _current.get()


def bind_context(ctx: RequestContext) -> Token[RequestContext | None]:
    return _current.set(ctx)


def reset_context(token: Token[RequestContext | None]) -> None:
    _current.reset(token)


def redact(text: str) -> str:
    return _KEY_SHAPE.sub(REDACTED, text) if "hr_" in text else text


class ContextLogFilter(logging.Filter):
    """Adds request_id/tenant to `record.fields` (what headroom's JsonFormatter merges) and redacts keys."""

    def filter(self, record: logging.LogRecord) -> bool:
        ctx = _current.get()
        if ctx is not None:
            fields = getattr(record, "fields", None)
            merged = dict(fields) if isinstance(fields, dict) else {}
            if ctx.request_id:  # a gRPC call's context has none (its id is in the message)
                merged.setdefault("request_id", ctx.request_id)
            merged.setdefault("tenant", ctx.tenant)
            record.fields = merged
        message = record.getMessage()
        if "hr_" in message:
            record.msg, record.args = redact(message), ()
        return True


def install_log_context(logger_name: str = "headroom") -> ContextLogFilter:
    """Attach one ContextLogFilter to every handler of `logger_name` (call after configure_logging)."""
    log_filter = ContextLogFilter()
    for handler in logging.getLogger(logger_name).handlers:
        if not any(isinstance(f, ContextLogFilter) for f in handler.filters):
            handler.addFilter(log_filter)
    return log_filter
