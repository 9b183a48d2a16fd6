"""`headroom bench ... --html`: one self-contained interactive page per run / sweep / Pareto set.

Checked: the page exists, loads no script from the network, carries the run's data, colours the histogram as
on the simulator page, and (in a real headless Chromium, offline) plotly draws every chart.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from headroom.cli.bench import app
from headroom.loadgen.html_report import latency_histogram_figure, pareto_figure, write_pareto_html
from headroom.loadgen.sweep import ParetoPoint, pareto_frontier
from tests.loadgen.fake_server import FakeServerConfig, running_server

runner = CliRunner()
CHROMIUM = next(
    (p for p in (shutil.which(n) for n in ("chromium-headless-shell", "chromium", "chromium-browser")) if p), None
)


def _embedded(page: str) -> Any:
    m = re.search(r'<script type="application/json" id="headroom-data">(.*?)</script>', page, re.S)
    assert m is not None, "the page does not embed its data"
    return json.loads(m.group(1))


def _assert_self_contained(page: str) -> None:
    assert page.startswith("<!DOCTYPE html>")
    assert not re.search(r"<script[^>]+src\s*=", page), "a script is loaded from elsewhere: the page needs a network"
    assert not re.search(r"<link[^>]+href\s*=\s*[\"']https?:", page)
    assert "Plotly.newPlot" in page and len(page) > 1_000_000  # plotly.js (~4.5 MB) is inlined


def _run_with_html(tmp_path: Path, url: str, extra: list[str]) -> tuple[Path, Path]:
    out, js = tmp_path / "run.html", tmp_path / "run.json"
    args = [url, "-m", "m", "--duration", "1", "--confidence", "0", "--late-threshold-ms", "1000", "--quiet"]
    done = runner.invoke(app, [*args, *extra, "--json", str(js), "--html", str(out), "--label", "fake <run>"])
    assert done.exit_code == 0, done.output
    return out, js


def test_run_html_is_self_contained_and_carries_the_data(tmp_path: Path) -> None:
    with running_server(FakeServerConfig(service_s=0.002)) as (url, _):
        out, js = _run_with_html(tmp_path, url, ["--rate", "60", "--slo-p99-ms", "2000"])
    page = out.read_text()
    _assert_self_contained(page)
    result = json.loads(js.read_text())
    data = _embedded(page)
    assert data["counts"] == result["counts"] and data["counts"]["ok"] > 20
    assert data["latency_ms"]["p99_ms"] == result["latency_ms"]["p99_ms"]
    assert "fake &lt;run&gt;" in page and "fake <run>" not in page.split('id="headroom-data"')[0]  # escaped
    for title in (
        "green fast, orange tail, red the worst 1%",
        "CDF",
        "throughput and p99 over time",
        "server metrics (queue depth",
        "Server-Timing stages",
    ):
        assert title in page, title


def test_streaming_run_adds_ttft_and_tpot_cdfs(tmp_path: Path) -> None:
    with running_server(FakeServerConfig(num_tokens=4)) as (url, _):
        out, _ = _run_with_html(tmp_path, url, ["-p", "openai-chat", "--concurrency", "2", "--max-tokens", "4"])
    page = out.read_text()
    assert '"name":"TTFT"' in page and '"name":"TPOT"' in page
    assert "TTFT (ms)" in page  # the summary table row


def test_histogram_colours_each_request_by_its_own_percentile_band() -> None:
    rng = np.random.default_rng(0)
    latencies = rng.lognormal(mean=2.0, sigma=0.6, size=2000)
    fig = latency_histogram_figure(latencies.tolist())
    by_colour = {t.marker.color: int(sum(t.y)) for t in fig.data}
    p95, p99 = np.percentile(latencies, [95, 99])
    assert by_colour["#2e9e44"] == int((latencies <= p95).sum())
    assert by_colour["#f08c00"] == int(((latencies > p95) & (latencies <= p99)).sum())
    assert by_colour["#d62828"] == int((latencies > p99).sum()) == 20  # the worst 1% is always visible in red
    assert sum(by_colour.values()) == latencies.size


def test_pareto_figure_draws_only_frontier_points_on_the_line() -> None:
    points = pareto_frontier([ParetoPoint("a", 10, 5), ParetoPoint("b", 20, 8), ParetoPoint("c", 15, 9)])
    fig = pareto_figure(points)
    dominated, frontier = fig.data
    assert list(frontier.text) == ["a", "b"] and list(dominated.text) == ["c"]


def test_pareto_and_sweep_commands_write_html(tmp_path: Path) -> None:
    with running_server(FakeServerConfig(service_s=0.002)) as (url, _):
        _, first = _run_with_html(tmp_path, url, ["--rate", "40"])
        (tmp_path / "a").mkdir()
        _, second = _run_with_html(tmp_path / "a", url, ["--concurrency", "2"])
        swept = runner.invoke(
            app,
            [
                "sweep",
                url,
                "-m",
                "m",
                "--slo-p99-ms",
                "2000",
                "--duration",
                "0.5",
                "--low-rate",
                "20",
                "--high-rate",
                "40",
                "--max-probes",
                "2",
                "--confidence",
                "0",
                "--late-threshold-ms",
                "1000",
                "--html",
                str(tmp_path / "sweep.html"),
            ],
        )
    assert swept.exit_code == 0, swept.output
    sweep_page = (tmp_path / "sweep.html").read_text()
    _assert_self_contained(sweep_page)
    assert _embedded(sweep_page)["kind"] == "peak_rate" and "highest VALID rate" in sweep_page
    done = runner.invoke(app, ["pareto", str(first), str(second), "--html", str(tmp_path / "pareto.html")])
    assert done.exit_code == 0, done.output
    data = _embedded((tmp_path / "pareto.html").read_text())
    assert data["kind"] == "pareto" and len(data["points"]) == 2 and any(p["on_frontier"] for p in data["points"])


def test_embedded_json_cannot_close_its_script_tag(tmp_path: Path) -> None:
    page = write_pareto_html([ParetoPoint("x", 1, 1, True)], tmp_path / "p.html", "t", {"s": "</script><b>"})
    text = page.read_text()
    assert _embedded(text) == {"s": "</script><b>"}


def test_page_renders_offline_in_chromium(tmp_path: Path) -> None:
    if CHROMIUM is None:
        pytest.fail("no Chromium binary on PATH: run `apt-get install chromium-headless-shell` (make test does)")
    with running_server(FakeServerConfig(service_s=0.002)) as (url, _):
        out, _ = _run_with_html(tmp_path, url, ["--rate", "60"])
    dom = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-proxy-server",
            "--proxy-server=127.0.0.1:9",
            "--virtual-time-budget=10000",
            "--dump-dom",
            out.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    # plotly replaces each figure div's content with its SVG; a page whose JS failed to load has none.
    assert dom.count('class="main-svg"') >= 2 * 5, dom[:2000]
    assert "green fast, orange tail" in dom
