"""The latency histogram PNG: green bars for fast requests, orange for the tail, red for the worst 1 %.

As on the simulator page: green below p90, orange from p90 to p99, red above p99 (the outliers that decide
a p99 SLA). Dashed lines mark p50, p95 and p99.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt

GREEN, ORANGE, RED = "#2e9e5b", "#f0a030", "#d64545"


def bar_colours(edges_s: npt.NDArray[np.float64], p90_s: float, p99_s: float) -> list[str]:
    """Colour of each histogram bar by where its left edge sits (same rule as the dashboard)."""
    return [GREEN if left < p90_s else (ORANGE if left < p99_s else RED) for left in edges_s[:-1]]


def latency_histogram_png(latencies_s: npt.NDArray[np.float64], path: str | Path, title: str = "",
                          bins: int = 60) -> Path:
    """Write the coloured histogram of `latencies_s` (seconds) to `path` and return it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(path)
    if latencies_s.size == 0:
        raise ValueError("no completed requests to plot; raise the duration or lower the load")
    ms = latencies_s * 1e3
    p50, p90, p95, p99 = (float(v) for v in np.percentile(ms, [50, 90, 95, 99]))
    top = float(np.percentile(ms, 99.9)) * 1.05 if ms.size > 1000 else float(ms.max()) * 1.05
    low = float(ms.min()) * 0.9
    counts, edges = np.histogram(np.clip(ms, low, top), bins=bins, range=(low, max(top, low + 1e-6)))
    fig, ax = plt.subplots(figsize=(8, 4), dpi=110)
    ax.bar(edges[:-1], counts, width=np.diff(edges), align="edge", color=bar_colours(edges, p90, p99),
           edgecolor="white", linewidth=0.3)
    for label, value in (("p50", p50), ("p95", p95), ("p99", p99)):
        ax.axvline(value, color="#333333", linestyle="--", linewidth=0.8)
        ax.text(value, ax.get_ylim()[1] * 0.95, f" {label} {value:.1f} ms", rotation=90, va="top", fontsize=8)
    ax.set_xlabel("latency (ms)")
    ax.set_ylabel("requests")
    ax.set_title(title or f"{ms.size:,} requests: green fast, orange tail (p90-p99), red worst 1 %")
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out
