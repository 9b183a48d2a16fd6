"""The drift monitor in the running server: served inputs are sampled and checked off the event loop.

A model version opts in by shipping `drift_reference.npz` in its version directory (digits gets one from
`headroom build-models`; any model can get one with `save_reference`). The file holds the training
histograms (`DriftReference`), the input tensor it describes, and how rows become features: `flatten` (each
element of the input is a feature) or a `module:function` mapping an [N, ...] array to [N, F] features.

The data plane calls `offer(model, version_dir, inputs)` for each validated request (a counter and a queue
put); every `sample_every`-th request of a model is handed to one worker thread that loads the reference once
per version, computes the features and feeds that model's `DriftMonitor` (PSI gauges, one warning per
crossing). When the worker falls behind, samples are dropped rather than queued without bound.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from prometheus_client import CollectorRegistry, Counter

from headroom.lifecycle.drift import DriftConfig, DriftMetrics, DriftMonitor, DriftReference

log = logging.getLogger("headroom.lifecycle.drift")

REFERENCE_FILE = "drift_reference.npz"  # looked up in each served version directory
FLATTEN = "flatten"  # the default feature map: every element of the input tensor is a feature

Features = Callable[[np.ndarray], np.ndarray]  # [N, ...] input rows -> [N, F] features


@dataclass(frozen=True, slots=True)
class ServedReference:
    """A training reference as a served model ships it."""

    reference: DriftReference  # binned training distribution of the features
    input_name: str  # the request input the features are computed from
    features: str  # FLATTEN or "module:function"


def save_reference(path: Path, reference: DriftReference, input_name: str, features: str = FLATTEN) -> None:
    """Write a reference file (npz, no pickle)."""
    np.savez(path, edges=reference.edges, expected=reference.expected,
             feature_names=np.array(reference.feature_names, dtype=str),
             input_name=np.array(input_name), features=np.array(features))


def load_reference(path: Path) -> ServedReference:
    """Read a reference file written by `save_reference`; raises ValueError saying what is wrong."""
    try:
        with np.load(path, allow_pickle=False) as data:
            reference = DriftReference(np.asarray(data["edges"], dtype=np.float64),
                                       np.asarray(data["expected"], dtype=np.float64),
                                       tuple(str(n) for n in data["feature_names"]))
            return ServedReference(reference, str(data["input_name"]), str(data["features"]))
    except (OSError, KeyError, ValueError) as exc:
        raise ValueError(f"{path}: not a drift reference ({exc}); rebuild it with `headroom build-models`") from None


def resolve_features(spec: str) -> Features:
    """FLATTEN or an importable `module:function`."""
    if spec == FLATTEN:
        return lambda x: np.asarray(x, dtype=np.float64).reshape(len(x), -1)
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ValueError(f"drift features {spec!r}: write `flatten` or `package.module:function`")
    func = getattr(importlib.import_module(module), attr, None)
    if not callable(func):
        raise ValueError(f"drift features {spec!r}: {attr} is not a function of {module}")
    result: Features = func
    return result


@dataclass(frozen=True, slots=True)
class DriftFeedConfig:
    """How the server samples inputs for the drift monitors."""

    sample_every: int = 1  # feed every N-th request of a model (1 = all)
    max_pending: int = 64  # samples waiting for the worker beyond this are dropped
    monitor: DriftConfig = field(default_factory=DriftConfig)  # each monitor: window, min rows, PSI threshold

    def __post_init__(self) -> None:
        if self.sample_every < 1 or self.max_pending < 1:
            raise ValueError("drift sampling needs sample_every >= 1 and max_pending >= 1")


class _Served:
    """A model's reference and monitor (None when its version ships no reference)."""

    def __init__(self, version_dir: Path, monitor: DriftMonitor | None, input_name: str, features: Features) -> None:
        self.version_dir, self.monitor, self.input_name, self.features = version_dir, monitor, input_name, features


class DriftFeed:
    """Samples served inputs into per-model DriftMonitors on one worker thread; `close()` at shutdown."""

    def __init__(self, cfg: DriftFeedConfig | None = None, registry: CollectorRegistry | None = None) -> None:
        self.cfg = cfg or DriftFeedConfig()
        self._metrics = DriftMetrics.create(registry) if registry is not None else None
        self._dropped = (Counter("headroom_input_drift_dropped_samples", "Samples dropped: drift worker behind",
                                 ["model"], registry=registry) if registry is not None else None)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="drift")
        self._lock = threading.Lock()
        self._pending = 0
        self._seen: dict[str, int] = {}  # requests offered per model (event-loop thread only)
        self._has_reference: dict[Path, bool] = {}  # version dir -> ships a reference (one stat per version)
        self._served: dict[str, _Served] = {}  # worker thread only
        self._closed = False

    def offer(self, model: str, version_dir: Path, inputs: Mapping[str, np.ndarray]) -> None:
        """Called on the event loop for each validated request: cheap, never blocks."""
        has_reference = self._has_reference.get(version_dir)
        if has_reference is None:
            has_reference = self._has_reference[version_dir] = (version_dir / REFERENCE_FILE).is_file()
        if not has_reference:
            return
        count = self._seen.get(model, 0)
        self._seen[model] = count + 1
        if count % self.cfg.sample_every or self._closed:
            return
        with self._lock:
            if self._pending >= self.cfg.max_pending:
                if self._dropped is not None:
                    self._dropped.labels(model).inc()
                return
            self._pending += 1
        self._executor.submit(self._observe, model, version_dir, dict(inputs))

    def monitor(self, model: str) -> DriftMonitor | None:
        """The model's monitor once a sample of it was processed (None without a reference)."""
        served = self._served.get(model)
        return served.monitor if served is not None else None

    def flush(self) -> None:
        """Wait until every accepted sample was processed (tests, shutdown)."""
        self._executor.submit(lambda: None).result()

    def close(self) -> None:
        self._closed = True
        self._executor.shutdown(wait=True, cancel_futures=True)

    def _observe(self, model: str, version_dir: Path, inputs: Mapping[str, np.ndarray]) -> None:
        try:
            served = self._served.get(model)
            if served is None or served.version_dir != version_dir:
                served = self._open(model, version_dir)
                self._served[model] = served
            if served.monitor is not None and served.input_name in inputs:
                served.monitor.observe(served.features(inputs[served.input_name]))
        except Exception as exc:  # a broken reference must never break serving: say it once per version
            log.warning("drift monitor for %r disabled: %s", model, exc)
            self._served[model] = _Served(version_dir, None, "", _no_features)
        finally:
            with self._lock:
                self._pending -= 1

    def _open(self, model: str, version_dir: Path) -> _Served:
        path = version_dir / REFERENCE_FILE
        if not path.is_file():
            return _Served(version_dir, None, "", _no_features)
        ref = load_reference(path)
        monitor = DriftMonitor(model, ref.reference, self.cfg.monitor, metrics=self._metrics)
        log.info("drift monitor for %r: %d features of input %r against %s", model,
                 len(ref.reference.feature_names), ref.input_name, path)
        return _Served(version_dir, monitor, ref.input_name, resolve_features(ref.features))


def _no_features(x: np.ndarray) -> np.ndarray:
    return np.zeros((len(x), 0))

