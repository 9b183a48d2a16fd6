"""Structured JSON logs: one object per line on stderr, with any `extra={"fields": {...}}` merged in."""

from __future__ import annotations

import logging
import sys
import time

import orjson


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            payload.update(fields)
        if record.exc_info:
            payload["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(payload).decode()


def configure_logging(level: str = "info", access_log: bool = True) -> None:
    """Send headroom's loggers to stderr as JSON lines (idempotent)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger("headroom")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
    logging.getLogger("headroom.access").setLevel(logging.INFO if access_log else logging.WARNING)
    # These JSON lines carry no source location, thread or process: do not compute them for every record (the
    # access lines are per request). The logging HOWTO's "Optimization" section names these switches.
    logging._srcfile = None  # no stack walk (findCaller) per record
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
