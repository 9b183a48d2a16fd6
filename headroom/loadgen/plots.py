"""PNG plots of a run (matplotlib, Agg backend): where people would rather look than read.

latency_hist.png     latency histogram coloured as on the simulator page: green fast (<= p95),
                     orange tail (p95..p99), red the worst 1% (> p99, the requests that decide a p99 SLA)
latency_cdf.png      empirical CDF with p50/p99 marked (log x)
timeseries.png       completions/s and p99 per window over the run
queue_depth.png      scraped queue / batch / KV series over time (when the server exposes them)
stages.png           mean Server-Timing stage durations
pareto.png           latency-throughput frontier of several runs (sweep / knob sweep)
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from headroom.loadgen.collector import Collector
from headroom.loadgen.scrape import ScrapeLog
from headroom.loadgen.sweep import ParetoPoint

GREEN, ORANGE, RED = "#2e9e44", "#f08c00", "#d62828"


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def latency_histogram(latencies_ms: Sequence[float], path: Path, title: str = "Latency") -> Path:
    """Histogram with bars coloured by where they fall: <= p95 green, p95..p99 orange, > p99 red."""
    plt = _pyplot()
    data = np.asarray(latencies_ms, dtype=np.float64)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    if data.size:
        p50, p95, p99 = np.percentile(data, [50, 95, 99])
        edges = np.histogram_bin_edges(data, bins=min(60, max(10, data.size // 20)))
        bottom = np.zeros(edges.size - 1)
        # Each request is coloured by its own value, so the worst 1% is always visible in red.
        for subset, colour in (
            (data[data <= p95], GREEN),
            (data[(data > p95) & (data <= p99)], ORANGE),
            (data[data > p99], RED),
        ):
            counts = np.histogram(subset, bins=edges)[0]
            ax.bar(
                edges[:-1],
                counts,
                width=np.diff(edges),
                bottom=bottom,
                align="edge",
                color=colour,
                edgecolor="white",
                lw=0.3,
            )
            bottom += counts
        for value, name in ((p50, "p50"), (p95, "p95"), (p99, "p99")):
            ax.axvline(value, color="#333333", ls="--", lw=0.8)
            ax.annotate(
                f"{name} {value:.1f} ms",
                (value, ax.get_ylim()[1] * 0.95),
                rotation=90,
                fontsize=8,
                ha="right",
                va="top",
            )
    ax.set_xlabel("latency (ms)")
    ax.set_ylabel("requests")
    ax.set_title(f"{title}: green fast, orange tail, red the worst 1%")
    return _save(fig, path)


def latency_cdf(latencies_ms: Sequence[float], path: Path, title: str = "Latency CDF") -> Path:
    plt = _pyplot()
    data = np.sort(np.asarray(latencies_ms, dtype=np.float64))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    if data.size:
        ax.plot(data, np.arange(1, data.size + 1) / data.size, color="#1f4e79")
        for q, colour in ((50, GREEN), (99, RED)):
            value = float(np.percentile(data, q))
            ax.axvline(value, color=colour, ls="--", lw=0.8, label=f"p{q} {value:.1f} ms")
        ax.set_xscale("log")
        ax.legend(loc="lower right")
    ax.set_xlabel("latency (ms, log)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def timeseries(series: dict[str, list[float]], path: Path, title: str = "Throughput and p99 over time") -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    t = series.get("t_s", [])
    ax.plot(t, series.get("completed_per_s", []), color="#1f4e79", label="completed/s")
    if any(series.get("errors_per_s", [])):
        ax.plot(t, series.get("errors_per_s", []), color=RED, label="errors/s")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("requests/s")
    ax.set_ylim(bottom=0)
    ax2 = ax.twinx()
    ax2.plot(t, series.get("p99_ms", []), color=ORANGE, label="p99 (ms)")
    ax2.set_ylim(bottom=0)
    ax2.set_ylabel("p99 latency (ms)")
    lines = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    ax.legend(lines, [str(line.get_label()) for line in lines], loc="upper left")
    ax.set_title(title)
    return _save(fig, path)


def scraped_series(log: ScrapeLog, path: Path, title: str = "Server metrics over time") -> Path | None:
    """Queue depth / batch / KV series as scraped; None when nothing was scraped."""
    keys = [k for k in log.series if not k.split("{")[0].endswith(("_sum", "_count", "_total", "_created"))]
    if not log.times_s or not keys:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for key in sorted(keys)[:8]:
        values = [np.nan if v is None else v for v in log.series[key]]
        ax.plot(log.times_s, values, label=key[:60], marker=".", ms=3)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("value")
    ax.legend(fontsize=7, loc="upper left")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def stage_bars(stages: dict[str, dict[str, float]], path: Path, title: str = "Server-Timing stages") -> Path | None:
    if not stages:
        return None
    plt = _pyplot()
    names = list(stages)
    means = [stages[n]["mean_ms"] for n in names]
    p99s = [stages[n]["p99_ms"] for n in names]
    fig, ax = plt.subplots(figsize=(8, 0.6 * len(names) + 2))
    y = np.arange(len(names))
    ax.barh(y - 0.2, means, height=0.4, color=GREEN, label="mean")
    ax.barh(y + 0.2, p99s, height=0.4, color=RED, label="p99")
    ax.set_yticks(y, names)
    ax.set_xlabel("ms")
    ax.legend()
    ax.set_title(title)
    return _save(fig, path)


def pareto(points: Sequence[ParetoPoint], path: Path, title: str = "Latency-throughput Pareto frontier") -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    front = sorted((p for p in points if p.on_frontier), key=lambda p: p.throughput_per_s)
    rest = [p for p in points if not p.on_frontier]
    ax.scatter([p.throughput_per_s for p in rest], [p.p99_ms for p in rest], color="#999999", label="dominated")
    ax.plot([p.throughput_per_s for p in front], [p.p99_ms for p in front], "-o", color=GREEN, label="frontier")
    for p in points:
        ax.annotate(p.label, (p.throughput_per_s, p.p99_ms), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("throughput (requests/s)")
    ax.set_ylabel("p99 latency (ms)")
    ax.legend()
    ax.grid(alpha=0.3)
    ax.set_title(title)
    return _save(fig, path)


def _save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
    return path


def plot_run(collector: Collector, scrape: ScrapeLog, out_dir: Path, title: str = "") -> list[Path]:
    """Every per-run plot into `out_dir`; returns the files written."""
    latencies_ms = [r.latency_s * 1000.0 for r in collector.records if r.ok]
    prefix = f"{title}: " if title else ""
    written = [
        latency_histogram(latencies_ms, out_dir / "latency_hist.png", prefix + "Latency"),
        latency_cdf(latencies_ms, out_dir / "latency_cdf.png", prefix + "Latency CDF"),
        timeseries(collector.timeseries(), out_dir / "timeseries.png", prefix + "Throughput and p99 over time"),
    ]
    for maybe in (
        scraped_series(scrape, out_dir / "queue_depth.png", prefix + "Server metrics over time"),
        stage_bars(collector.stage_summary(), out_dir / "stages.png", prefix + "Server-Timing stages"),
    ):
        if maybe is not None:
            written.append(maybe)
    return written
