"""`headroom sim` end to end through the CLI: table, JSON and the coloured histogram PNG."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image
from typer.testing import CliRunner

from headroom.cli.main import app

runner = CliRunner()


def test_sim_json_and_plot(tmp_path: Path) -> None:
    out, png = tmp_path / "out.json", tmp_path / "lat.png"
    result = runner.invoke(app, ["sim", "--rate", "500", "--replicas", "2", "--batching", "dynamic",
                                 "--max-batch-size", "16", "--service-ms", "5", "--per-item-ms", "0.6",
                                 "--duration", "10", "--json", str(out), "--plot", str(png)])
    assert result.exit_code == 0, result.output
    assert "P99" in result.output
    data = json.loads(out.read_text())
    m = data["metrics"]
    assert m["completed"] == m["offered"] > 4000
    assert m["p50_latency_s"] <= m["p95_latency_s"] <= m["p99_latency_s"]
    img = Image.open(png).convert("RGB")
    colours = set(img.getdata())
    assert (0x2E, 0x9E, 0x5B) in colours and (0xD6, 0x45, 0x45) in colours  # green bars and red worst 1 %


def test_sim_stdout_json_with_builtin_profile_and_autoscale() -> None:
    result = runner.invoke(app, ["sim", "--profile", "resnet50_v100", "--rate", "150", "--batching", "none",
                                 "--autoscale", "--cold-start-s", "5", "--duration", "60", "--json", "-"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert max(n for _, n in data["replica_timeline"]) >= 2


def test_sim_reports_bad_input() -> None:
    result = runner.invoke(app, ["sim", "--batching", "continuous", "--duration", "1"])
    assert result.exit_code == 2
    assert "llm" in result.output


def test_sim_reports_token_latencies_for_continuous_batching() -> None:
    args = ["sim", "--profile", "llm_8b_gpu", "--batching", "continuous", "--rate", "4", "--duration", "30"]
    table = runner.invoke(app, args)
    assert table.exit_code == 0, table.output
    assert "TTFT p50 / p90 / p99" in table.output and "TPOT" in table.output and "ITL" in table.output
    result = runner.invoke(app, [*args, "--json", "-"])
    assert result.exit_code == 0, result.output
    m = json.loads(result.output)["metrics"]
    for name in ("ttft", "tpot", "itl"):
        assert 0 < m[f"{name}_p50_s"] <= m[f"{name}_p90_s"] <= m[f"{name}_p99_s"]
    assert m["tpot_p50_s"] < m["ttft_p50_s"] < m["p50_latency_s"]


def test_sim_host_cpu_stretches_batches_through_the_cli() -> None:
    args = ["sim", "--rate", "60", "--batching", "none", "--service-ms", "10", "--duration", "30", "--json", "-"]
    plain = json.loads(runner.invoke(app, args).output)["metrics"]
    shared = runner.invoke(app, [*args, "--host-cpu-ms", "2"])
    assert shared.exit_code == 0, shared.output
    m = json.loads(shared.output)["metrics"]
    # 60 req/s x 2 ms of host work fill 12 % of the core: each batch takes about 10 / 0.88 ms instead of 10
    assert m["busy_s"] / m["completed"] == pytest.approx(0.010 / (1 - 60 * 0.002), rel=0.05)
    assert plain["busy_s"] / plain["completed"] == pytest.approx(0.010)
    assert runner.invoke(app, [*args, "--host-cpu-ms", "-1"]).exit_code == 2


def test_sim_service_time_scale_slows_every_batch_through_the_cli() -> None:
    args = ["sim", "--rate", "60", "--batching", "none", "--service-ms", "10", "--duration", "30", "--json", "-"]
    result = runner.invoke(app, [*args, "--service-time-scale", "1.3"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    assert payload["config"]["service_time_scale"] == 1.3
    assert payload["metrics"]["busy_s"] / payload["metrics"]["completed"] == pytest.approx(0.013)
    refused = runner.invoke(app, [*args, "--service-time-scale", "0"])
    assert refused.exit_code == 2 and "service_time_scale" in refused.output


def test_sim_per_batch_host_cpu_through_the_cli() -> None:
    # back-to-back batches (rate far above 1 / 10 ms): every batch waits for the previous one's 2 ms
    args = ["sim", "--rate", "500", "--batching", "none", "--service-ms", "10", "--duration", "5", "--json", "-"]
    result = runner.invoke(app, [*args, "--host-cpu-per-batch-ms", "2"])
    assert result.exit_code == 0, result.output
    m = json.loads(result.output)["metrics"]
    assert m["throughput_per_s"] == pytest.approx(1 / 0.012, rel=0.02)
    assert runner.invoke(app, [*args, "--host-cpu-per-batch-ms", "-1"]).exit_code == 2
