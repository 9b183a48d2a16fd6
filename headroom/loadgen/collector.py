"""Aggregate request records as they arrive: HdrHistograms per metric, errors by status, goodput, stages.

`Collector.add` is the dispatcher's sink; `snapshot()` feeds the live progress display; `summary()` is the
measurement part of the JSON result. Time series are bucketed by completion time in `window_s` windows.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np

from headroom.loadgen.histogram import LatencyHistogram
from headroom.loadgen.records import RequestRecord, Slo


@dataclass(frozen=True, slots=True)
class LiveSnapshot:
    """What the progress display shows."""

    completed: int  # queries finished so far
    errors: int  # of which failed
    rate_per_s: float  # completions per second over the last window
    p50_ms: float  # running p50 of end-to-end latency
    p99_ms: float  # running p99 of end-to-end latency


class Collector:
    """Mutable accumulator owned by one run."""

    def __init__(self, slo: Slo, window_s: float = 1.0, keep_records: bool = True) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        self.slo = slo
        self.window_s = window_s
        self.keep_records = keep_records
        self.records: list[RequestRecord] = []
        self.latency = LatencyHistogram()
        self.ttft = LatencyHistogram()
        self.tpot = LatencyHistogram()
        self.itl = LatencyHistogram()
        self.by_status: Counter[str] = Counter()
        self.errors_sample: dict[str, str] = {}
        self.good = 0
        self.ok = 0
        self.output_tokens = 0
        self.input_tokens = 0
        self.first_intended_s: float | None = None
        self.last_end_s = 0.0
        self._stage_ms: dict[str, list[float]] = defaultdict(list)
        self._window_latencies: dict[int, list[float]] = defaultdict(list)
        self._window_errors: Counter[int] = Counter()

    def add(self, record: RequestRecord) -> None:
        """Record one finished query."""
        if self.keep_records:
            self.records.append(record)
        self.by_status[record.status] += 1
        if self.first_intended_s is None or record.intended_s < self.first_intended_s:
            self.first_intended_s = record.intended_s
        self.last_end_s = max(self.last_end_s, record.end_s)
        window = int(record.end_s // self.window_s)
        if not record.ok:
            self._window_errors[window] += 1
            self.errors_sample.setdefault(record.status, record.error)
            return
        self.ok += 1
        self.latency.record_s(record.latency_s)
        self._window_latencies[window].append(record.latency_s)
        if record.ttft_s is not None:
            self.ttft.record_s(record.ttft_s)
        if record.tpot_s is not None:
            self.tpot.record_s(record.tpot_s)
        for gap_s in record.itl_s:
            self.itl.record_s(gap_s)
        self.output_tokens += record.output_tokens
        self.input_tokens += record.input_tokens
        for stage, ms in record.server_timing_ms:
            self._stage_ms[stage].append(ms)
        if self.slo.request_meets(record):
            self.good += 1

    @property
    def completed(self) -> int:
        return sum(self.by_status.values())

    def snapshot(self, now_offset_s: float) -> LiveSnapshot:
        """Progress so far; the rate is over the last full window before `now_offset_s`."""
        window = int(now_offset_s // self.window_s) - 1
        done = len(self._window_latencies.get(window, ())) + self._window_errors.get(window, 0)
        return LiveSnapshot(
            completed=self.completed,
            errors=self.completed - self.ok,
            rate_per_s=done / self.window_s if window >= 0 else 0.0,
            p50_ms=self.latency.percentile_ms(50.0),
            p99_ms=self.latency.percentile_ms(99.0),
        )

    def duration_s(self) -> float:
        """From the first intended send to the last reply."""
        start_s = self.first_intended_s or 0.0
        return max(self.last_end_s - start_s, 1e-9)

    def over_bound_count(self, bound_ms: float) -> int:
        """Queries that failed or took longer than `bound_ms` (MLPerf counts both as over the bound)."""
        failed = self.completed - self.ok
        slow = sum(1 for r in self.records if r.ok and r.latency_s * 1000.0 > bound_ms)
        return failed + slow

    def stage_summary(self) -> dict[str, dict[str, float]]:
        """Per Server-Timing stage: count, mean, p50, p99 (ms)."""
        out: dict[str, dict[str, float]] = {}
        for stage, values in self._stage_ms.items():
            arr = np.asarray(values, dtype=np.float64)
            out[stage] = {
                "count": float(arr.size),
                "mean_ms": float(arr.mean()),
                "p50_ms": float(np.percentile(arr, 50)),
                "p99_ms": float(np.percentile(arr, 99)),
            }
        return out

    def timeseries(self) -> dict[str, list[float]]:
        """Per window (by completion time): completions/s, errors/s and p99 latency (ms)."""
        windows = set(self._window_latencies) | set(self._window_errors)
        last = max(windows, default=-1)
        t_s, rate, errors, p99 = [], [], [], []
        for w in range(last + 1):
            lat = self._window_latencies.get(w, [])
            t_s.append((w + 1) * self.window_s)
            rate.append((len(lat) + self._window_errors.get(w, 0)) / self.window_s)
            errors.append(self._window_errors.get(w, 0) / self.window_s)
            p99.append(float(np.percentile(lat, 99)) * 1000.0 if lat else 0.0)
        return {"t_s": t_s, "completed_per_s": rate, "errors_per_s": errors, "p99_ms": p99}

    def summary(self) -> dict[str, Any]:
        """The measurement block of the JSON result."""
        duration_s = self.duration_s()
        completed = self.completed
        return {
            "counts": {
                "completed": completed,
                "ok": self.ok,
                "errors": completed - self.ok,
                "by_status": dict(sorted(self.by_status.items())),
                "error_examples": self.errors_sample,
            },
            "duration_s": duration_s,
            "throughput": {
                "requests_per_s": completed / duration_s,
                "ok_per_s": self.ok / duration_s,
                "output_tokens_per_s": self.output_tokens / duration_s,
                "total_tokens_per_s": (self.input_tokens + self.output_tokens) / duration_s,
            },
            "goodput": {
                "requests_per_s": self.good / duration_s,
                "fraction": self.good / completed if completed else 0.0,
                "good": self.good,
            },
            "latency_ms": self.latency.summary(),
            "ttft_ms": self.ttft.summary(),
            "tpot_ms": self.tpot.summary(),
            "itl_ms": self.itl.summary(),
            "server_timing_ms": self.stage_summary(),
            "timeseries": self.timeseries(),
            "hdr_latency": self.latency.encode(),
        }
