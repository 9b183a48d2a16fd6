"""The reliability suite's pure parts: the markdown verdicts against the issue's targets, and percentiles."""

from __future__ import annotations

from typing import Any

from benchmarks.reliability.common import percentile_ms
from benchmarks.reliability.report import markdown


def _failover(lost: int, shed: int, requests: int) -> dict[str, Any]:
    return {"rate_per_s": 100.0, "duration_s": 20.0, "requests": requests, "lost": lost, "shed": shed}


def test_each_figure_is_judged_against_its_target() -> None:
    results = {
        "overload": {"offered_per_s": 80.0, "capacity_per_s": 40.0, "duration_s": 30.0, "rejection_p99_ms": 12.0,
                     "accepted_p99_ms": 140.0, "slo_ms": 100.0, "goodput_vs_capacity": 0.95, "connection_errors": 0},
        "failover": {"kill_9": _failover(0, 0, 2000), "sigterm": _failover(0, 3, 2000)},
        "streams": {"streams": 16, "timeout_s": 10.0, "running_zero_after_ms": 40.0, "kv_idle_after_ms": None},
        "fuzz": {"http": {"cases": 10_000, "operations": 21, "responses_5xx": 0},
                 "grpc": {"cases": 10_000, "server_errors": 2, "server_errors_structured": 2,
                          "server_errors_garbage": 0},
                 "rss_growth_mb": 12.0},
    }
    verdicts = {line.split("|")[1].strip(): line.split("|")[4].strip() for line in markdown(results).splitlines()[2:]}
    assert verdicts["overload (80.0/s offered vs 40.0/s capacity, 30 s): rejection p99"] == "yes"
    assert verdicts["overload: accepted p99"] == "**no**"  # 140 ms against the 100 ms SLO
    assert verdicts["overload: goodput vs capacity"] == "yes"
    assert verdicts["replica kill -9 (100/s, 20 s): requests lost"] == "yes"
    assert verdicts["replica SIGTERM (100/s, 20 s): requests lost"] == "**no**"  # shed counts as not served
    assert verdicts["16 abandoned LLM streams: running = 0 after"] == "yes"
    assert verdicts["abandoned streams: KV usage back to idle after"] == "**no**"  # never, within the timeout
    assert verdicts["fuzz gRPC ModelInfer (10000 cases): INTERNAL/UNKNOWN"] == "**no**"
    assert verdicts["fuzz: server RSS growth"] == "yes"


def test_the_grpc_fuzz_line_gives_each_kind_of_case_its_count_and_served_answers() -> None:
    """The line once read "0 (0 well-formed, 0 undecodable bytes)" for 10,000 cases: those were the server
    errors per kind. It now says of how many cases of each kind, and how many a model answered (OK)."""
    grpc = {"cases": 10_000, "server_errors": 1, "server_errors_structured": 0, "server_errors_served": 1,
            "server_errors_garbage": 0, "by_code": {"structured": {"INVALID_ARGUMENT": 4000, "NOT_FOUND": 1000},
                                                    "served": {"OK": 2400, "INVALID_ARGUMENT": 99, "INTERNAL": 1},
                                                    "garbage": {"INVALID_ARGUMENT": 2500}}}
    table = markdown({"fuzz": {"http": {"cases": 10_000, "operations": 30, "responses_5xx": 0}, "grpc": grpc,
                               "rss_growth_mb": 1.0}})
    line = next(row for row in table.splitlines() if "gRPC" in row)
    assert ("| 1 (protobuf: 0 of 5000, 0 OK; valid for a model: 1 of 2500, 2400 OK; undecodable: 0 of 2500, 0 OK) |"
            in line) and line.endswith("| **no** |")


def test_too_short_a_failover_run_does_not_meet_the_target() -> None:
    table = markdown({"failover": {"kill_9": _failover(0, 0, 500), "sigterm": _failover(0, 0, 500)}})
    assert table.count("**no**") == 2


def test_percentile_is_nearest_rank_in_ms() -> None:
    assert percentile_ms([], 0.99) is None
    p99 = percentile_ms([0.001 * i for i in range(1, 101)], 0.99)
    assert p99 is not None and round(p99, 6) == 99.0
