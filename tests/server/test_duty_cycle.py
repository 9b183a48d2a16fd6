"""headroom_duty_cycle is the busy share of a sliding window, evaluated at scrape time on an injected clock:
it follows the load and decays to 0 when the model goes idle (it used to be an average since load)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from headroom.core.clock import FakeClock
from headroom.server.duty_cycle import DutyCycleWindow
from headroom.server.metrics import ModelObserver, ServerMetrics


def test_busy_intervals_are_clipped_to_the_window() -> None:
    w = DutyCycleWindow(instances=2, window_s=10.0)
    w.add_busy(end_s=4.0, busy_s=4.0)  # [0, 4]
    assert w.duty_cycle(4.0) == pytest.approx(4.0 / 20)
    w.add_busy(end_s=12.0, busy_s=6.0)  # [6, 12]
    assert w.duty_cycle(12.0) == pytest.approx((2.0 + 6.0) / 20)  # window (2, 12]: [0, 4] counts 2 s
    assert w.duty_cycle(21.0) == pytest.approx(1.0 / 20)  # window (11, 21]: 1 s of the second
    assert w.duty_cycle(30.0) == 0.0


def test_an_idle_model_decays_to_zero_and_full_load_reads_one() -> None:
    w = DutyCycleWindow(instances=1, window_s=60.0)
    for i in range(60):
        w.add_busy(end_s=float(i + 1), busy_s=1.0)  # busy the whole first minute
    assert w.duty_cycle(60.0) == pytest.approx(1.0)
    assert w.duty_cycle(90.0) == pytest.approx(0.5)
    assert w.duty_cycle(120.0) == 0.0


def test_invalid_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="instances"):
        DutyCycleWindow(instances=0)
    with pytest.raises(ValueError, match="window_s"):
        DutyCycleWindow(window_s=0.0)
    with pytest.raises(ValueError, match="busy_s"):
        DutyCycleWindow().add_busy(1.0, -0.5)


def test_the_gauge_is_read_at_scrape_time_and_goes_to_zero_when_idle() -> None:
    registry = CollectorRegistry()
    clock = FakeClock(1000.0)
    observer = ModelObserver(ServerMetrics(registry), "m", instances=1, clock=clock)

    def scraped() -> float | None:
        return registry.get_sample_value("headroom_duty_cycle", {"model": "m"})

    assert scraped() == 0.0
    for _ in range(30):  # 30 s, half of it busy
        clock.advance(1.0)
        observer.on_busy(0.5)
    assert scraped() == pytest.approx(15.0 / 60)
    assert registry.get_sample_value("headroom_busy_seconds_total", {"model": "m"}) == pytest.approx(15.0)
    clock.advance(61.0)  # idle for a window: no event at all, the scrape alone sees it
    assert scraped() == 0.0
