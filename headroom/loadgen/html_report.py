"""Interactive HTML reports (plotly): one self-contained page per run, sweep or Pareto set, usable offline.

The page inlines plotly.js once (no `<script src="http...">`), so it opens from a laptop, a CI artifact or an
air-gapped machine. It holds the same views as the PNGs of headroom.loadgen.plots, but zoomable and with
hover values: the latency histogram coloured as on the simulator page (green <= p95, orange p95..p99, red the
worst 1%), the latency CDF, throughput and p99 over time, the scraped queue / batch / KV series over time,
the Server-Timing stage bars and the latency-throughput Pareto frontier. The result JSON itself is embedded
(`<script type="application/json" id="headroom-data">`) so the numbers behind every chart travel with it.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from headroom.loadgen.plots import GREEN, ORANGE, RED
from headroom.loadgen.sweep import ParetoPoint

BLUE = "#1f4e79"
_CSS = (
    "body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:1100px;color:#222}"
    "table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
    "th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}.bad{color:#d62828}.ok{color:#2e9e44}"
    ".fig{margin:1em 0;border-top:1px solid #eee}"
)


def _go() -> Any:
    import plotly.graph_objects as go  # type: ignore[import-untyped]

    return go


def latency_histogram_figure(latencies_ms: Sequence[float], title: str = "Latency") -> Any:
    """Stacked histogram: each request coloured by its own value (<= p95 green, p95..p99 orange, > p99 red)."""
    go = _go()
    fig = go.Figure()
    data = np.asarray(latencies_ms, dtype=np.float64)
    if data.size:
        p50, p95, p99 = (float(v) for v in np.percentile(data, [50, 95, 99]))
        edges = np.histogram_bin_edges(data, bins=min(80, max(10, data.size // 20)))
        centres, widths = (edges[:-1] + edges[1:]) / 2.0, np.diff(edges)
        for subset, colour, name in (
            (data[data <= p95], GREEN, "fast (<= p95)"),
            (data[(data > p95) & (data <= p99)], ORANGE, "tail (p95..p99)"),
            (data[data > p99], RED, "worst 1% (> p99)"),
        ):
            counts = np.histogram(subset, bins=edges)[0]
            fig.add_bar(
                x=centres,
                y=counts,
                width=widths,
                marker_color=colour,
                name=name,
                hovertemplate="%{x:.2f} ms: %{y} requests<extra>" + name + "</extra>",
            )
        for value, name in ((p50, "p50"), (p95, "p95"), (p99, "p99")):
            fig.add_vline(
                x=value,
                line_dash="dash",
                line_color="#333",
                annotation_text=f"{name} {value:.1f} ms",
                annotation_textangle=-90,
            )
    fig.update_layout(
        barmode="stack",
        bargap=0,
        title=f"{title}: green fast, orange tail, red the worst 1%",
        xaxis_title="latency (ms)",
        yaxis_title="requests",
    )
    return fig


def cdf_figure(named_latencies_ms: dict[str, Sequence[float]], title: str = "Latency CDF") -> Any:
    """Empirical CDFs (log x), one line per named distribution (latency, TTFT, TPOT ...)."""
    go = _go()
    fig = go.Figure()
    for name, values in named_latencies_ms.items():
        data = np.sort(np.asarray(values, dtype=np.float64))
        if not data.size:
            continue
        step = max(1, data.size // 2000)  # at most ~2000 points per line keeps the page light
        idx = np.unique(np.concatenate([np.arange(0, data.size, step), [data.size - 1]]))
        fig.add_scatter(
            x=data[idx],
            y=(idx + 1) / data.size,
            mode="lines",
            name=name,
            hovertemplate="%{x:.2f} ms: %{y:.4f}<extra>" + name + "</extra>",
        )
    fig.update_layout(title=title, xaxis_type="log", xaxis_title="ms (log)", yaxis_title="fraction of requests")
    return fig


def timeseries_figure(series: dict[str, list[float]], title: str = "Throughput and p99 over time") -> Any:
    """completed/s (and errors/s) on the left axis, p99 per window on the right."""
    go = _go()
    fig = go.Figure()
    t = series.get("t_s", [])
    fig.add_scatter(x=t, y=series.get("completed_per_s", []), name="completed/s", line_color=BLUE)
    if any(series.get("errors_per_s", [])):
        fig.add_scatter(x=t, y=series.get("errors_per_s", []), name="errors/s", line_color=RED)
    fig.add_scatter(x=t, y=series.get("p99_ms", []), name="p99 (ms)", line_color=ORANGE, yaxis="y2")
    fig.update_layout(
        title=title,
        xaxis_title="time (s)",
        yaxis={"title": "requests/s", "rangemode": "tozero"},
        yaxis2={"title": "p99 latency (ms)", "overlaying": "y", "side": "right", "rangemode": "tozero"},
    )
    return fig


def scraped_figure(scrape: dict[str, Any], title: str = "Server metrics over time") -> Any | None:
    """Queue depth / batch / KV gauges as scraped from /metrics; None when nothing was scraped."""
    times = scrape.get("t_s") or []
    series: dict[str, list[float | None]] = scrape.get("series") or {}
    keys = [k for k in series if not k.split("{")[0].endswith(("_sum", "_count", "_total", "_created"))]
    if not times or not keys:
        return None
    go = _go()
    fig = go.Figure()
    for key in sorted(keys)[:12]:
        fig.add_scatter(x=times, y=series[key], name=key[:80], mode="lines+markers", marker_size=3)
    fig.update_layout(title=title, xaxis_title="time (s)", yaxis_title="value", legend_font_size=9, showlegend=True)
    return fig


def stages_figure(stages: dict[str, dict[str, float]], title: str = "Server-Timing stages") -> Any | None:
    if not stages:
        return None
    go = _go()
    names = list(stages)
    fig = go.Figure()
    fig.add_bar(y=names, x=[stages[n]["mean_ms"] for n in names], orientation="h", name="mean", marker_color=GREEN)
    fig.add_bar(y=names, x=[stages[n]["p99_ms"] for n in names], orientation="h", name="p99", marker_color=RED)
    fig.update_layout(title=title, barmode="group", xaxis_title="ms", height=260 + 40 * len(names))
    return fig


def _add_labelled_points(fig: Any, points: Sequence[ParetoPoint], mode: str, name: str, **style: str) -> None:
    """One trace of (throughput, p99) points, each labelled with its run's label."""
    fig.add_scatter(
        x=[p.throughput_per_s for p in points],
        y=[p.p99_ms for p in points],
        mode=mode,
        text=[p.label for p in points],
        textposition="top right",
        name=name,
        **style,
    )


def pareto_figure(points: Sequence[ParetoPoint], title: str = "Latency-throughput Pareto frontier") -> Any:
    go = _go()
    fig = go.Figure()
    front = sorted((p for p in points if p.on_frontier), key=lambda p: p.throughput_per_s)
    rest = [p for p in points if not p.on_frontier]
    _add_labelled_points(fig, rest, "markers+text", "dominated", marker_color="#999")
    _add_labelled_points(fig, front, "lines+markers+text", "frontier", line_color=GREEN)
    fig.update_layout(title=title, xaxis_title="throughput (requests/s)", yaxis_title="p99 latency (ms)")
    return fig


def _fmt(value: Any) -> str:
    return (
        f"{value:,.2f}" if isinstance(value, int | float) and not isinstance(value, bool) else html.escape(str(value))
    )


def summary_table(result: dict[str, Any]) -> str:
    """HTML: load, verdict, percentile table and throughput of one run result."""
    scen, thr, counts = result["scenario"], result["throughput"], result["counts"]
    verdict = f"<b class='{'ok' if scen['valid'] else 'bad'}'>{'VALID' if scen['valid'] else 'INVALID'}</b>"
    reasons = html.escape("; ".join(scen["reasons"]))
    client = result["config"]["client"]
    rows = [
        f"<p>target <code>{html.escape(client['url'])}</code> ({html.escape(client['protocol'])}), model "
        f"<code>{html.escape(client['model'])}</code><br>load: <b>{html.escape(result['load']['label'])}</b><br>"
        f"scenario {html.escape(scen['name'])}: {verdict} {reasons}<br>"
        f"throughput {_fmt(thr['requests_per_s'])} req/s ({_fmt(thr['ok_per_s'])} ok/s"
        + (f", {_fmt(thr['output_tokens_per_s'])} output tokens/s" if thr.get("output_tokens_per_s") else "")
        + f"); goodput {100 * result['goodput']['fraction']:.1f}%; {counts['completed']} completed, "
        f"{counts['errors']} errors; generator: {result['generator']['late_sends']} late sends"
        + (" — <b class='bad'>the generator fell behind its schedule</b>" if result["generator"]["fell_behind"] else "")
        + f"<br>{html.escape(str(result['environment'].get('date_utc', '')))} on "
        f"{html.escape(str(result['environment'].get('hostname', '')))}</p>",
        "<table><tr><th>metric</th><th>p50</th><th>p90</th><th>p95</th><th>p99</th><th>p99.9</th><th>mean</th>"
        "<th>max</th><th>n</th></tr>",
    ]
    for name, key in (
        ("latency (ms)", "latency_ms"),
        ("TTFT (ms)", "ttft_ms"),
        ("TPOT (ms)", "tpot_ms"),
        ("ITL (ms)", "itl_ms"),
    ):
        h = result.get(key) or {}
        if not h.get("count"):
            continue
        cells = "".join(
            f"<td>{_fmt(h[k])}</td>" for k in ("p50_ms", "p90_ms", "p95_ms", "p99_ms", "p99.9_ms", "mean_ms", "max_ms")
        )
        rows.append(f"<tr><td>{name}</td>{cells}<td>{int(h['count'])}</td></tr>")
    rows.append("</table>")
    return "\n".join(rows)


def _json_script(data: Any) -> str:
    # "</" inside a <script> would end it early; JSON allows "<\/" as the same string.
    text = json.dumps(data, default=str).replace("</", "<\\/")
    return f'<script type="application/json" id="headroom-data">{text}</script>'


def page(title: str, intro_html: str, figures: Sequence[Any], data: Any) -> str:
    """One self-contained HTML document: plotly.js inlined once, each figure in its own div, `data` embedded."""
    from plotly.offline import get_plotlyjs  # type: ignore[import-untyped]

    divs = [
        f"<div class='fig'>{fig.to_html(full_html=False, include_plotlyjs=False, div_id=f'fig{i}')}</div>"
        for i, fig in enumerate(figures)
    ]
    return (
        "<!DOCTYPE html>\n<html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{_CSS}</style>"
        f"<script type='text/javascript'>{get_plotlyjs()}</script></head><body>"
        f"<h1>{html.escape(title)}</h1>{intro_html}{''.join(divs)}{_json_script(data)}</body></html>\n"
    )


def run_figures(
    result: dict[str, Any], latencies_ms: Sequence[float], extra_cdfs: dict[str, Sequence[float]] | None = None
) -> list[Any]:
    """Every per-run figure: histogram, CDF (plus TTFT/TPOT when given), time series, scraped series, stages."""
    label = result.get("label") or result["config"]["client"]["model"]
    figures = [
        latency_histogram_figure(latencies_ms, f"{label}: latency"),
        cdf_figure({"latency": latencies_ms, **(extra_cdfs or {})}, f"{label}: CDF"),
        timeseries_figure(result.get("timeseries") or {}, f"{label}: throughput and p99 over time"),
    ]
    for maybe in (
        scraped_figure(result.get("server_metrics") or {}, f"{label}: server metrics (queue depth, batch, KV)"),
        stages_figure(result.get("server_timing_ms") or {}, f"{label}: Server-Timing stages"),
    ):
        if maybe is not None:
            figures.append(maybe)
    return figures


def write_run_html(
    result: dict[str, Any],
    latencies_ms: Sequence[float],
    path: Path,
    extra_cdfs: dict[str, Sequence[float]] | None = None,
) -> Path:
    """The page for one run; `latencies_ms` are the successful requests' end-to-end latencies."""
    title = f"headroom bench: {result.get('label') or result['config']['client']['model']}"
    return _write(path, page(title, summary_table(result), run_figures(result, latencies_ms, extra_cdfs), result))


def pareto_table(points: Sequence[ParetoPoint]) -> str:
    rows = "".join(
        f"<tr><td>{html.escape(p.label)}</td><td>{_fmt(p.throughput_per_s)}</td><td>{_fmt(p.p99_ms)}</td>"
        f"<td>{'yes' if p.on_frontier else ''}</td></tr>"
        for p in points
    )
    return f"<table><tr><th>run</th><th>throughput/s</th><th>p99 ms</th><th>frontier</th></tr>{rows}</table>"


def write_pareto_html(points: Sequence[ParetoPoint], path: Path, title: str, data: Any, intro_html: str = "") -> Path:
    """The page for a set of runs (sweep, knob sweep, `pareto`): frontier chart + table; `data` is embedded."""
    body = intro_html + pareto_table(points)
    return _write(path, page(title, body, [pareto_figure(points, title)], data))


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path
