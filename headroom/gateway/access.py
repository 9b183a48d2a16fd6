"""The access line of a request that the gateway answers itself, in the data plane's format.

`headroom serve` writes one `headroom.access` line per request from its data plane (`request`: request_id, model,
version, status, reason, duration_ms; the log context adds the tenant). A request that the gateway refuses (401,
403, 408, 413, 429, ...) or whose client leaves mid-body never reaches the data plane, so the gateway writes that
line for it, with the model and version taken from a V2 path ("" elsewhere: the body was not parsed).
"""

from __future__ import annotations

import logging
import re

access_log = logging.getLogger("headroom.access")  # the data plane's logger: `--no-access-log` silences both
_V2_MODEL = re.compile(r"^/v2/(?:repository/)?models/([^/]{1,256})(?:/versions/([^/]{1,64}))?(?:/|$)")


def log_refusal(path: str, status: int, reason: str, duration_ms: float) -> None:
    """One access line for a request the gateway answered (its request id comes from the log context)."""
    if not access_log.isEnabledFor(logging.INFO):
        return
    match = _V2_MODEL.match(path)
    model, version = (match.group(1), match.group(2) or "") if match else ("", "")
    access_log.info("request", extra={"fields": {
        "model": model, "version": version, "status": status, "reason": reason, "duration_ms": round(duration_ms, 3),
    }})
