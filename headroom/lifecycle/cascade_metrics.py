"""Cascade counters as Prometheus metrics: how many served items the INT8 model answered alone and how many
were recomputed in FP32, per cascade model.

A collector, read at scrape time from the models the server currently serves (nothing on the request path):

    headroom_cascade_items_total{model,version,path="fast"}         items answered by the fast (INT8) model
    headroom_cascade_items_total{model,version,path="recomputed"}   items recomputed by the accurate (FP32) one
    headroom_cascade_tau{model,version}                             the confidence threshold τ

The counts restart when a model is reloaded (a counter reset, which Prometheus' rate() handles).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from headroom.models.base import Model

if TYPE_CHECKING:
    from headroom.lifecycle.cascade import CascadeModel

ServedModels = Callable[[], Iterable[tuple[str, str, Model]]]  # -> (model name, version, loaded model)


def cascade_of(model: Model) -> CascadeModel | None:
    """The CascadeModel a served model runs (itself, or the `cascade` of a DigitsCascadeModel), if any."""
    from headroom.lifecycle.cascade import CascadeModel  # here: it imports the digits model (onnxruntime)

    if isinstance(model, CascadeModel):
        return model
    inner = getattr(model, "cascade", None)
    return inner if isinstance(inner, CascadeModel) else None


class CascadeCollector(Collector):
    """Exports the counts of every served cascade model; register it on the server's registry."""

    def __init__(self, served: ServedModels) -> None:
        self._served = served

    def describe(self) -> Iterable[Metric]:
        return [CounterMetricFamily("headroom_cascade_items", "Cascade items by path (fast INT8 or recomputed FP32)",
                                    labels=["model", "version", "path"]),
                GaugeMetricFamily("headroom_cascade_tau", "Cascade confidence threshold", labels=["model", "version"])]

    def collect(self) -> Iterator[Metric]:
        items = CounterMetricFamily("headroom_cascade_items", "Cascade items by path (fast INT8 or recomputed FP32)",
                                    labels=["model", "version", "path"])
        tau = GaugeMetricFamily("headroom_cascade_tau", "Cascade confidence threshold", labels=["model", "version"])
        for name, version, model in self._served():
            cascade = cascade_of(model)
            if cascade is None:
                continue
            counts = cascade.counts()
            items.add_metric([name, version, "fast"], counts.items - counts.recomputed)
            items.add_metric([name, version, "recomputed"], counts.recomputed)
            tau.add_metric([name, version], cascade.tau)
        yield items
        yield tau
