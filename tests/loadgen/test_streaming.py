from __future__ import annotations

import pytest

from headroom.core.clock import FakeClock
from headroom.loadgen.collector import Collector
from headroom.loadgen.dispatcher import DispatchConfig, DispatchTarget, run_closed_loop
from headroom.loadgen.records import ClientReply, Slo
from headroom.loadgen.streaming import stream_latencies
from headroom.loadgen.workloads import Sample


def test_scripted_stream_gives_exact_vllm_metrics() -> None:
    # Sent at 10.0; chunks at 10.2, 10.25, 10.35, 10.40; stream ends at 10.45; usage says 5 tokens.
    lat = stream_latencies(10.0, (10.2, 10.25, 10.35, 10.40), 10.45, output_tokens=5)
    assert lat.ttft_s == pytest.approx(0.2)
    assert lat.itl_s == pytest.approx((0.05, 0.10, 0.05))
    assert lat.e2e_s == pytest.approx(0.45)
    # TPOT = (E2EL - TTFT) / (output_tokens - 1) = 0.25 / 4
    assert lat.tpot_s == pytest.approx(0.0625)


def test_single_token_has_no_tpot_and_no_chunks_has_no_ttft() -> None:
    one = stream_latencies(0.0, (0.3,), 0.3, output_tokens=1)
    assert one.ttft_s == pytest.approx(0.3)
    assert one.tpot_s is None and one.itl_s == ()
    none = stream_latencies(0.0, (), 0.5, output_tokens=0)
    assert none.ttft_s is None and none.e2e_s == pytest.approx(0.5)


def test_out_of_order_times_are_rejected() -> None:
    with pytest.raises(ValueError, match="non-decreasing"):
        stream_latencies(0.0, (0.3, 0.2), 0.5, output_tokens=2)
    with pytest.raises(ValueError, match="before it started"):
        stream_latencies(1.0, (), 0.5, output_tokens=0)


class _ScriptedStream:
    """A protocol client that 'receives' a scripted stream on a fake clock (no network, exact times)."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock

    async def send(self, sample: Sample) -> ClientReply:
        sent_s = self.clock.now_s()
        chunks = tuple(sent_s + dt for dt in (0.2, 0.25, 0.35, 0.40))
        self.clock.set(sent_s + 0.45)
        return ClientReply(
            ok=True, status="200", sent_s=sent_s, end_s=sent_s + 0.45, chunk_times_s=chunks, output_tokens=5
        )

    async def aclose(self) -> None:
        return None


async def test_dispatcher_records_exact_stream_metrics_from_a_scripted_stream() -> None:
    clock = FakeClock(start_s=100.0)
    col = Collector(Slo(ttft_ms=250.0, tpot_ms=60.0))
    stats = await run_closed_loop(
        DispatchTarget([Sample(text="q")], _ScriptedStream(clock), clock, col.add),
        DispatchConfig(mode="closed", max_queries=3, duration_s=60.0),
    )
    assert stats.queries_sent == 3 and col.completed == 3
    for record in col.records:
        assert record.ttft_s == pytest.approx(0.2)
        assert record.tpot_s == pytest.approx(0.0625)
        assert record.itl_s == pytest.approx((0.05, 0.10, 0.05))
        assert record.latency_s == pytest.approx(0.45)
    assert col.ttft.percentile_ms(50) == pytest.approx(200.0, rel=1e-3)
    assert col.itl.count == 9
    assert col.good == 0  # TPOT 62.5 ms misses the 60 ms bound: goodput counts every SLO
