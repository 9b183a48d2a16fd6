"""`headroom.server.gc_monitor`: collections are timed into /metrics, and the start-up heap can be frozen."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from headroom.server.gc_monitor import GcMonitor


def _count(registry: CollectorRegistry, generation: str) -> float:
    value = registry.get_sample_value("headroom_gc_pause_seconds_count", {"generation": generation})
    return value or 0.0


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def monitor(registry: CollectorRegistry) -> Iterator[GcMonitor]:
    m = GcMonitor(registry)
    yield m
    m.uninstall()


def test_each_full_collection_is_timed_while_installed(monitor: GcMonitor, registry: CollectorRegistry) -> None:
    monitor.install()
    monitor.install()  # idempotent: one callback, one observation per collection
    before = _count(registry, "2")
    gc.collect()
    gc.collect()
    assert _count(registry, "2") == before + 2
    total = registry.get_sample_value("headroom_gc_pause_seconds_sum", {"generation": "2"})
    assert total is not None and total > 0
    monitor.uninstall()
    gc.collect()
    assert _count(registry, "2") == before + 2  # not observed any more


def test_freezing_moves_the_live_heap_out_of_later_collections(monitor: GcMonitor,
                                                                registry: CollectorRegistry) -> None:
    try:
        assert registry.get_sample_value("headroom_gc_frozen_objects") == 0
        frozen = monitor.freeze_heap()
        # frozen objects are still freed by reference counting: other threads of the suite may free a few since
        assert 0 < gc.get_freeze_count() <= frozen
        assert registry.get_sample_value("headroom_gc_frozen_objects") == frozen  # counted once, at freeze time
        survivor = [object()]  # allocated after the freeze: still tracked, still collectable
        assert gc.is_tracked(survivor)
    finally:
        gc.unfreeze()
