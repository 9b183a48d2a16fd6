"""StageHistograms exports exactly what prometheus_client's Histogram would for the same observations."""

from __future__ import annotations

import re

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from headroom.server.metrics import LATENCY_BUCKETS_S
from headroom.server.stage_histograms import StageHistograms

FAMILIES = (("t_queue_seconds", "Queue."), ("t_total_seconds", "Total."))
# on a bound (inclusive), between bounds, zero, above the last bound (+Inf), and a second label value
OBSERVATIONS = [("a", (0.0005, 0.0)), ("a", (0.0007, 0.1)), ("b", (0.1, 40.0)), ("a", (30.0, 0.002)),
                ("b", (0.0, 0.0001))]


def exposition(registry: CollectorRegistry) -> str:
    text = generate_latest(registry).decode()
    return re.sub(r"(_created\{[^}]*\}) \S+", r"\1 T", text)  # creation times differ by construction


def test_same_exposition_as_prometheus_histograms() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    fast = StageHistograms(FAMILIES, LATENCY_BUCKETS_S, ours)
    plain = [Histogram(name, doc, ["model"], buckets=LATENCY_BUCKETS_S, registry=theirs) for name, doc in FAMILIES]
    for label, values in OBSERVATIONS:
        fast.observe(label, values)
        for histogram, value in zip(plain, values, strict=True):
            histogram.labels(label).observe(value)
    assert exposition(ours) == exposition(theirs)
    assert 't_total_seconds_bucket{le="+Inf",model="b"} 2.0' in exposition(ours)


def test_nothing_is_exported_before_the_first_observation() -> None:
    registry = CollectorRegistry()
    StageHistograms(FAMILIES, LATENCY_BUCKETS_S, registry)
    assert "t_queue_seconds_bucket" not in exposition(registry)


def test_a_clashing_name_is_refused_at_registration() -> None:
    registry = CollectorRegistry()
    Histogram("t_queue_seconds", "Taken.", registry=registry)
    with pytest.raises(ValueError):
        StageHistograms(FAMILIES, LATENCY_BUCKETS_S, registry)


def test_buckets_must_ascend() -> None:
    with pytest.raises(ValueError):
        StageHistograms(FAMILIES, (0.1, 0.01), None)
