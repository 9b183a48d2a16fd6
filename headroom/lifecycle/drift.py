"""Training–serving skew guard: per-feature histograms of live inputs against a training reference (PSI).

Population Stability Index of one feature, with reference bin shares e_i and live shares a_i:

    PSI = Σ (a_i - e_i) · ln(a_i / e_i)          < 0.1 stable, 0.1–0.2 moderate, > 0.2 significant shift

`fit_reference` and `psi` are pure; `DriftMonitor` keeps a sliding window of recent rows, recomputes PSI,
exports it (gauges per feature and the mean, a counter of alerts) to an injected prometheus registry, and
logs one warning each time the mean PSI crosses the threshold upwards.

    reference = fit_reference(train_images.reshape(len(train_images), -1), num_bins=10)
    monitor = DriftMonitor("digits", reference, DriftConfig(threshold_psi=0.2), registry=registry)
    monitor.observe(request_pixels.reshape(n, -1))
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge

log = logging.getLogger("headroom.lifecycle.drift")
PSI_EPSILON = 1e-4  # bin shares are clipped to this so empty bins do not make PSI infinite


@dataclass(frozen=True, slots=True)
class DriftReference:
    """The training distribution, binned per feature."""

    edges: np.ndarray  # [F, B + 1] bin edges per feature; the outer ones are -inf and +inf
    expected: np.ndarray  # [F, B] share of the training rows falling in each bin
    feature_names: tuple[str, ...]  # F names used as the metric label


def _as_rows(features: np.ndarray, num_features: int | None = None) -> np.ndarray:
    x = np.asarray(features, dtype=np.float64)
    x = x.reshape(len(x), -1) if x.ndim != 2 else x
    if num_features is not None and x.shape[1] != num_features:
        raise ValueError(f"expected {num_features} features per row, got {x.shape[1]}; flatten inputs the same way")
    return x


def fit_reference(
    features: np.ndarray, num_bins: int = 10, feature_names: Sequence[str] | None = None
) -> DriftReference:
    """Equal-width bins over each feature's training range ([N, F] rows; other shapes are flattened per row)."""
    x = _as_rows(features)
    if len(x) < 2 or num_bins < 2:
        raise ValueError("a drift reference needs at least 2 rows and 2 bins")
    low, high = x.min(axis=0), x.max(axis=0)
    high = np.where(high > low, high, low + 1.0)  # a constant feature still gets a real bin width
    edges = np.linspace(low, high, num_bins + 1, axis=1)
    edges[:, 0], edges[:, -1] = -np.inf, np.inf
    names = tuple(feature_names) if feature_names is not None else tuple(f"f{i}" for i in range(x.shape[1]))
    if len(names) != x.shape[1]:
        raise ValueError(f"{len(names)} feature names for {x.shape[1]} features")
    return DriftReference(edges=edges, expected=bin_shares(edges, x), feature_names=names)


def bin_shares(edges: np.ndarray, features: np.ndarray) -> np.ndarray:
    """[F, B] share of rows per bin for each feature."""
    x = _as_rows(features, edges.shape[0])
    num_bins = edges.shape[1] - 1
    shares = np.empty((x.shape[1], num_bins))
    for f in range(x.shape[1]):
        idx = np.clip(np.searchsorted(edges[f], x[:, f], side="right") - 1, 0, num_bins - 1)
        shares[f] = np.bincount(idx, minlength=num_bins) / max(len(x), 1)
    return shares


def psi(reference: DriftReference, features: np.ndarray) -> np.ndarray:
    """Per-feature PSI ([F]) of `features` against the reference. Pure."""
    actual = np.clip(bin_shares(reference.edges, features), PSI_EPSILON, None)
    expected = np.clip(reference.expected, PSI_EPSILON, None)
    result: np.ndarray = np.sum((actual - expected) * np.log(actual / expected), axis=1)
    return result


@dataclass(frozen=True, slots=True)
class DriftConfig:
    """How the monitor judges drift."""

    window_rows: int = 1000  # the most recent rows PSI is computed over
    min_rows: int = 100  # no verdict before this many rows (PSI on a handful of rows is noise)
    threshold_psi: float = 0.2  # mean PSI above this is drift (0.2 = the usual "significant shift")

    def __post_init__(self) -> None:
        if self.window_rows < 1 or not 1 <= self.min_rows <= self.window_rows or self.threshold_psi <= 0:
            raise ValueError("DriftConfig needs window_rows >= min_rows >= 1 and threshold_psi > 0")


@dataclass(frozen=True, slots=True)
class DriftStatus:
    """The monitor's verdict after an observation."""

    rows: int  # rows in the window the PSI was computed over
    psi_per_feature: np.ndarray  # [F] PSI of each feature
    psi_mean: float  # mean over features: the number compared with the threshold
    psi_max: float  # the most shifted feature's PSI
    drifting: bool  # psi_mean > threshold_psi


@dataclass(frozen=True, slots=True)
class DriftMetrics:
    """The drift metric families, registered once per registry and shared by every model's monitor."""

    psi: Gauge  # headroom_input_drift_psi{model,feature}
    psi_mean: Gauge  # headroom_input_drift_psi_mean{model}
    alerts: Counter  # headroom_input_drift_alerts_total{model}

    @staticmethod
    def create(registry: CollectorRegistry) -> DriftMetrics:
        return DriftMetrics(
            Gauge("headroom_input_drift_psi", "PSI of one input feature against training", ["model", "feature"],
                  registry=registry),
            Gauge("headroom_input_drift_psi_mean", "Mean input PSI over features", ["model"], registry=registry),
            Counter("headroom_input_drift_alerts", "Times the mean PSI crossed the threshold", ["model"],
                    registry=registry),
        )


class DriftMonitor:
    """Sliding-window PSI with a threshold; thread-safe. Metrics go to `registry` (or shared `metrics`)."""

    def __init__(
        self,
        model: str,
        reference: DriftReference,
        cfg: DriftConfig | None = None,
        registry: CollectorRegistry | None = None,
        metrics: DriftMetrics | None = None,
    ) -> None:
        self.model, self.reference, self.cfg = model, reference, cfg or DriftConfig()
        self._rows: deque[np.ndarray] = deque()
        self._num_rows = 0
        self._drifting = False
        self._lock = threading.Lock()
        if metrics is None and registry is not None:
            metrics = DriftMetrics.create(registry)
        self._psi_gauge = metrics.psi if metrics is not None else None
        self._mean_gauge = metrics.psi_mean if metrics is not None else None
        self._alerts = metrics.alerts if metrics is not None else None
        if self._alerts is not None:
            self._alerts.labels(model)  # export 0 before the first alert

    def observe(self, features: np.ndarray) -> DriftStatus | None:
        """Add rows ([n, F] or any [n, ...]); returns the verdict, or None before `min_rows` rows were seen."""
        rows = _as_rows(features, self.reference.edges.shape[0])
        with self._lock:
            self._rows.append(rows)
            self._num_rows += len(rows)
            while self._num_rows - len(self._rows[0]) >= self.cfg.window_rows:
                self._num_rows -= len(self._rows.popleft())
            if self._num_rows < self.cfg.min_rows:
                return None
            window = np.concatenate(self._rows)[-self.cfg.window_rows :]
            values = psi(self.reference, window)
            status = DriftStatus(
                len(window),
                values,
                float(values.mean()),
                float(values.max()),
                float(values.mean()) > self.cfg.threshold_psi,
            )
            crossed = status.drifting and not self._drifting
            self._drifting = status.drifting
        self._export(status, crossed)
        return status

    def _export(self, status: DriftStatus, crossed: bool) -> None:
        if self._psi_gauge is not None and self._mean_gauge is not None:
            for name, value in zip(self.reference.feature_names, status.psi_per_feature, strict=True):
                self._psi_gauge.labels(self.model, name).set(float(value))
            self._mean_gauge.labels(self.model).set(status.psi_mean)
        if crossed:
            if self._alerts is not None:
                self._alerts.labels(self.model).inc()
            worst = self.reference.feature_names[int(np.argmax(status.psi_per_feature))]
            log.warning(
                "input drift on model %r: mean PSI %.3f > %.3f over the last %d rows (worst feature %s, PSI %.3f); "
                "serving inputs no longer look like training data: check upstream preprocessing or retrain",
                self.model,
                status.psi_mean,
                self.cfg.threshold_psi,
                status.rows,
                worst,
                status.psi_max,
            )
