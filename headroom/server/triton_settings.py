"""Triton's server-settings extensions shared by HTTP and gRPC: shared memory, trace and log settings, and the
parameters of a repository load.

- Shared memory (system and CUDA): headroom takes tensors in the request body only. Status lists no regions;
  a registration is refused with `Unsupported` (400 / UNIMPLEMENTED) saying what to do instead.
- Trace settings report how tracing was configured at start (`serve --trace-spans-file`: OpenTelemetry spans
  as JSON lines); an update that changes them is refused (they are fixed for the process).
- Log settings map onto the `headroom` logger: `log_info`/`log_warning`/`log_error`/`log_verbose_level`
  are applied; `log_file` and `log_format` are fixed (JSON lines on stderr) and an update changing them is
  refused.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

import orjson

from headroom.core.errors import InvalidRequest, Unsupported
from headroom.core.json_object import json_object as parse_json_object

SHM_KINDS = ("system", "cuda")
LOG_KEYS = ("log_file", "log_info", "log_warning", "log_error", "log_verbose_level", "log_format")


def load_parameters(params: object) -> Mapping[str, object] | None:
    """The `config` override from a repository load's parameters (JSON text), or None; refuses file
    overrides and unknown parameters by name."""
    if params is None:
        return None
    if not isinstance(params, Mapping):
        raise InvalidRequest("load parameters must be an object")
    for key in params:
        if key.startswith("file:"):
            raise InvalidRequest(f"load parameter '{key}': file overrides are not supported by headroom; put "
                                 "the files in the model repository's version directory")
        if key != "config":
            raise InvalidRequest(f"load parameter '{key}' is not known (known: config)")
    raw = params.get("config")
    if raw is None:
        return None
    what = "load parameter 'config' (Triton's model-config schema)"
    return json_object(raw, what) if isinstance(raw, bytes | str) else json_object(orjson.dumps(raw), what)


def json_object(raw: bytes | str, what: str) -> dict[str, object]:
    """Parse `raw` as one JSON object (empty = {}); InvalidRequest naming `what` otherwise."""
    return parse_json_object(raw, what, InvalidRequest) if raw.strip() else {}


class TritonSettings:
    """The settings one server reports; owns nothing but the `headroom` logger's level."""

    def __init__(self, trace_spans_file: Path | None = None, logger_name: str = "headroom") -> None:
        self._trace_file = trace_spans_file
        self._logger = logging.getLogger(logger_name)

    # --- shared memory ---------------------------------------------------------------------------------
    def shm_status(self, kind: str, region: str = "") -> list[dict[str, object]]:
        self._check_kind(kind)
        if region:
            raise InvalidRequest(f"Unable to find {kind} shared memory region: '{region}'")
        return []

    def shm_register(self, kind: str, region: str) -> None:
        self._check_kind(kind)
        raise Unsupported(f"{kind} shared memory is not supported by headroom (region '{region}' not "
                          "registered): send the tensors in the request (binary_tensor_data or raw contents)")

    @staticmethod
    def _check_kind(kind: str) -> None:
        if kind not in SHM_KINDS:
            raise InvalidRequest(f"unknown shared memory kind {kind!r}; expected one of {', '.join(SHM_KINDS)}")

    # --- trace -----------------------------------------------------------------------------------------
    def trace(self, model: str = "") -> dict[str, object]:
        on = self._trace_file is not None
        return {"trace_level": ["TIMESTAMPS"] if on else ["OFF"], "trace_rate": "1", "trace_count": "-1",
                "log_frequency": "0", "trace_file": str(self._trace_file or ""), "trace_mode": "opentelemetry"}

    def update_trace(self, settings: Mapping[str, object], model: str = "") -> dict[str, object]:
        current = self.trace(model)
        for key, value in settings.items():
            if value is None:
                continue  # Triton: null resets to the global setting, which is the current one here
            wanted = [str(v) for v in value] if isinstance(value, list) else [str(value)]
            now = current.get(key)
            if key not in current or wanted != (now if isinstance(now, list) else [now]):
                raise InvalidRequest(f"trace setting '{key}' cannot be changed while running: tracing is fixed "
                                     "at start (serve --trace-spans-file FILE writes OpenTelemetry spans)")
        return current

    # --- log -------------------------------------------------------------------------------------------
    def log(self) -> dict[str, object]:
        level = self._logger.getEffectiveLevel()
        return {"log_file": "", "log_info": level <= logging.INFO, "log_warning": level <= logging.WARNING,
                "log_error": level <= logging.ERROR, "log_verbose_level": 1 if level <= logging.DEBUG else 0,
                "log_format": "default"}

    def update_log(self, settings: Mapping[str, object]) -> dict[str, object]:
        current = self.log()
        merged = dict(current)
        for key, value in settings.items():
            if key not in LOG_KEYS:
                raise InvalidRequest(f"unknown log setting '{key}' (known: {', '.join(LOG_KEYS)})")
            if key in ("log_file", "log_format"):
                if value != current[key]:
                    raise InvalidRequest(f"log setting '{key}' is fixed: headroom logs JSON lines to stderr")
            elif key == "log_verbose_level":
                if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                    raise InvalidRequest(f"log_verbose_level must be an integer >= 0, got {value!r}")
                merged[key] = value
            elif not isinstance(value, bool):
                raise InvalidRequest(f"log setting '{key}' must be true or false, got {value!r}")
            else:
                merged[key] = value
        level = (logging.DEBUG if merged["log_verbose_level"] else logging.INFO if merged["log_info"]
                 else logging.WARNING if merged["log_warning"] else logging.ERROR if merged["log_error"]
                 else logging.CRITICAL)
        self._logger.setLevel(level)
        return self.log()


__all__ = ["SHM_KINDS", "TritonSettings", "json_object", "load_parameters"]
