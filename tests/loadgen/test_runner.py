"""run_bench per scenario against the fake server: how queries are sent and how the verdict is reached."""

from __future__ import annotations

from headroom.loadgen.arrivals import ArrivalSpec
from headroom.loadgen.clients import ClientConfig
from headroom.loadgen.records import Slo
from headroom.loadgen.runner import BenchConfig, run_bench
from headroom.loadgen.workloads import WorkloadSpec
from tests.loadgen.fake_server import FakeServerConfig, running_server


def _config(url: str, scenario: str, **kw: object) -> BenchConfig:
    return BenchConfig(
        client=ClientConfig(url=url, model="m", max_connections=8),
        scenario=scenario,
        workload=WorkloadSpec(kind="digits", num_samples=16),
        metrics_url="none",
        **kw,  # type: ignore[arg-type]
    )


async def test_scenarios_send_as_mlperf_says() -> None:
    with running_server(FakeServerConfig(service_s=0.005)) as (url, fake):
        offline = await run_bench(_config(url, "offline", arrival=ArrivalSpec(rate_per_s=40, duration_s=1)))
        sent_offline = fake.requests
        single = await run_bench(_config(url, "single-stream", num_queries=50, duration_s=30))
        multi = await run_bench(_config(url, "multi-stream", num_queries=6, duration_s=30))
        seen = [0]
        progress = await run_bench(
            _config(url, "server", arrival=ArrivalSpec(rate_per_s=50, duration_s=0.6), slo=Slo(p99_ms=5000.0)),
            on_progress=lambda snap, t: seen.__setitem__(0, snap.completed),
            progress_interval_s=0.1,
        )
    r = offline.result
    assert sent_offline == 40 and r["counts"]["ok"] == 40
    assert r["load"]["label"].startswith("offline") and r["scenario"]["metric"] == "throughput"
    assert r["scenario"]["valid"] and r["scenario"]["value"] > 0
    assert not r["generator"]["fell_behind"]  # offline queues on purpose; that is not lateness
    s = single.result
    assert s["load"]["mode"] == "closed" and s["counts"]["completed"] == 50
    assert s["scenario"]["metric"] == "p90_ms" and s["scenario"]["valid"]  # >= 44 queries, none failed
    m = multi.result
    assert m["scenario"]["samples_per_query"] == 8 and m["counts"]["completed"] == 6
    assert not m["scenario"]["valid"]  # 6 queries cannot support a p99 claim
    assert seen[0] == progress.result["counts"]["completed"]
    assert not progress.result["scenario"]["valid"]  # ~30 queries < 459
