"""Knob sweep: one server process per value, a run against each, the Pareto frontier of the results."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

from headroom.loadgen.arrivals import ArrivalSpec
from headroom.loadgen.clients import ClientConfig
from headroom.loadgen.knob import KnobSweepConfig, run_knob_sweep
from headroom.loadgen.runner import BenchConfig
from headroom.loadgen.workloads import WorkloadSpec

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_knob_sweep_restarts_the_server_per_value_and_marks_the_frontier() -> None:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    base = BenchConfig(
        client=ClientConfig(url=url, model="m"),
        arrival=ArrivalSpec(kind="constant", rate_per_s=20.0, duration_s=0.5),
        workload=WorkloadSpec(kind="digits", num_samples=4),
        metrics_url="none",
        warmup_queries=1,
    )
    knob = KnobSweepConfig(
        knob="service_s",
        values=("0.002", "0.2"),
        server_cmd=f"{sys.executable} -m tests.loadgen.fake_server --port {port} --service-s {{value}}",
        ready_url=url + "/metrics",
        ready_timeout_s=60.0,
        cwd=str(ROOT),  # the server command imports tests.loadgen.fake_server from the repository root
    )
    points, results = await run_knob_sweep(base, knob)
    by_label = {p.label: p for p in points}
    assert set(by_label) == {"service_s=0.002", "service_s=0.2"}
    # The fast server has lower p99 and (here, same offered load) about the same throughput.
    assert by_label["service_s=0.002"].p99_ms < by_label["service_s=0.2"].p99_ms
    assert by_label["service_s=0.002"].on_frontier
    assert [r["knob"]["value"] for r in results] == ["0.002", "0.2"]
    assert results[1]["latency_ms"]["p50_ms"] >= 200.0
