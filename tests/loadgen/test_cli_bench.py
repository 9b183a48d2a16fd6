"""`headroom bench` end to end through its Typer app against the fake server (tests/cli is not ours)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from headroom.cli.bench import app
from tests.loadgen.fake_server import FakeServerConfig, running_server

runner = CliRunner()


def test_run_compare_and_pareto(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    with running_server(FakeServerConfig(service_s=0.002)) as (url, _):
        first = runner.invoke(
            app,
            [
                url,
                "-m",
                "m",
                "--rate",
                "60",
                "--duration",
                "1",
                "--slo-p99-ms",
                "2000",
                "--confidence",
                "0",
                "--late-threshold-ms",
                "1000",
                "--json",
                str(a),
                "--markdown",
                str(tmp_path / "a.md"),
                "--plots",
                str(tmp_path / "plots"),
                "--quiet",
                "--label",
                "open",
            ],
        )
        assert first.exit_code == 0, first.output
        second = runner.invoke(
            app,
            [
                "run",
                url,
                "-m",
                "m",
                "--concurrency",
                "2",
                "--duration",
                "0.5",
                "--json",
                str(b),
                "--quiet",
                "--label",
                "closed",
                "--http-client",
                "aiohttp",
            ],
        )
        assert second.exit_code == 0, second.output
    result = json.loads(a.read_text())
    assert result["schema"] == "headroom.bench/1"
    assert result["load"]["mode"] == "open" and "open-loop poisson" in result["load"]["label"]
    assert result["config"]["client"]["protocol"] == "v2-http"
    assert result["config"]["arrival"]["rate_per_s"] == 60.0
    assert result["environment"]["cpu_count"] >= 1 and result["environment"]["command_line"]
    assert result["counts"]["errors"] == 0 and result["counts"]["completed"] > 20
    assert result["scenario"]["valid"], result["scenario"]["reasons"]
    assert result["server_metrics"]["series"]["fake_queue_depth"]
    assert "VALID" in (tmp_path / "a.md").read_text()
    assert {p.name for p in (tmp_path / "plots").iterdir()} >= {
        "latency_hist.png",
        "latency_cdf.png",
        "timeseries.png",
        "stages.png",
        "queue_depth.png",
    }
    closed = json.loads(b.read_text())
    assert closed["load"]["mode"] == "closed" and "closed-loop" in closed["load"]["label"]
    assert closed["config"]["client"]["http_client"] == "aiohttp" and closed["counts"]["errors"] == 0

    compared = runner.invoke(app, ["compare", str(a), str(b), "--markdown", str(tmp_path / "cmp.md")])
    assert compared.exit_code == 0, compared.output
    assert "closed-loop run" in compared.output
    assert "latency p99 (ms)" in (tmp_path / "cmp.md").read_text()

    frontier = runner.invoke(app, ["pareto", str(a), str(b), "--plot", str(tmp_path / "pareto.png")])
    assert frontier.exit_code == 0, frontier.output
    assert (tmp_path / "pareto.png").stat().st_size > 0


def test_errors_say_how_to_fix_them(tmp_path: Path) -> None:
    bad_protocol = runner.invoke(app, ["http://127.0.0.1:9", "-p", "soap", "--quiet"])
    assert bad_protocol.exit_code == 2 and "choose one of" in bad_protocol.output
    refused = runner.invoke(
        app, ["http://127.0.0.1:9", "--rate", "20", "--duration", "0.2", "--warmup", "0", "--quiet", "--timeout-s", "2"]
    )
    assert refused.exit_code == 2 and "every request failed" in refused.output
    not_json = tmp_path / "x.json"
    not_json.write_text("{}")
    compared = runner.invoke(app, ["compare", str(not_json), str(not_json)])
    assert compared.exit_code == 2 and "not a headroom bench result" in compared.output
