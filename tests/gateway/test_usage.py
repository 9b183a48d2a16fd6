"""The LLM usage report: what is refunded, Server-Timing and log fields."""

from __future__ import annotations

import pytest

from headroom.core.server_timing import parse_server_timing
from headroom.gateway.usage import LLMUsage, report_usage, reported_usage, unused_tokens

USAGE = LLMUsage(prompt_tokens=9, completion_tokens=10, cached_tokens=4, preprocess_ms=0.5, queue_ms=1.25,
                 prefill_ms=7.0, decode_ms=30.0, total_ms=40.0, finish_reason="stop")


@pytest.mark.parametrize(
    ("usage", "status", "refund"),
    [
        (USAGE, 200, 502),  # asked for 512, got 10
        (USAGE, 0, 502),  # the client left mid-stream after 10 tokens: the report still counts
        (LLMUsage(9, 600, 0, 0, 0, 0, 0, 0, "length"), 200, -88),  # generated more than reserved: charge it
        (None, 404, 512),  # refused before generating
        (None, 0, 512),  # the client left before any answer
        (None, 500, 512),  # the app failed
        (None, 200, 0),  # a 2xx from an app that does not report: keep the charge
    ],
)
def test_unused_tokens(usage: LLMUsage | None, status: int, refund: int) -> None:
    assert unused_tokens(512, usage, status) == refund


def test_report_round_trip_server_timing_and_log_fields() -> None:
    state: dict[str, object] = {}
    assert reported_usage(state) is None
    report_usage(state, USAGE)
    assert reported_usage(state) is USAGE
    assert parse_server_timing(USAGE.server_timing()) == {
        "preprocess": 0.5, "queue": 1.25, "prefill": 7.0, "decode": 30.0, "other": 1.25, "total": 40.0
    }
    assert USAGE.log_fields()["completion_tokens"] == 10 and USAGE.log_fields()["finish_reason"] == "stop"
    with pytest.raises(ValueError):
        LLMUsage(-1, 0, 0, 0, 0, 0, 0, 0, "stop")
