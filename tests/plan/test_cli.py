"""`headroom plan ...` through the real CLI entry point."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from headroom.cli.main import app

runner = CliRunner()


def _json(*args: str) -> dict[str, object]:
    result = runner.invoke(app, ["plan", *args, "--json"])
    assert result.exit_code == 0, result.output
    out: dict[str, object] = json.loads(result.output)
    return out


def test_capacity_json_reproduces_the_textbook() -> None:
    out = _json("capacity", "--peak-qps", "5000", "--p99-ms", "50", "--service-ms", "5", "--headroom", "0.3",
                "--redundancy", "1")
    assert out["max_utilisation"] == 0.54
    assert out["base_replicas"] == 47
    assert out["recommended_replicas"] == 62
    assert round(float(str(out["utilisation_after_k_failures"])), 3) == 0.410


def test_mmc_json() -> None:
    out = _json("mmc", "--arrival-rate", "90", "--service-ms", "20", "--servers", "2")
    assert abs(float(str(out["mean_wait_s"])) - 0.0852632) < 1e-6
    assert out["servers"] == 2


def test_other_subcommands_run() -> None:
    for args in (["mm1", "--arrival-rate", "100", "--service-ms", "5"],
                 ["md1", "--arrival-rate", "100", "--service-ms", "5"],
                 ["mg1", "--arrival-rate", "100", "--service-ms", "5", "--service-cv", "0.5"],
                 ["little", "--arrival-rate", "1000", "--time-ms", "50"],
                 ["batching", "--arrival-rate", "500"],
                 ["cost", "--option", "cpu:0.17:50", "--option", "t4:0.53:400"],
                 ["llm"], ["knee"]):
        table = runner.invoke(app, ["plan", *args])
        assert table.exit_code == 0, (args, table.output)
        as_json = runner.invoke(app, ["plan", *args, "--json"])
        assert as_json.exit_code == 0, (args, as_json.output)
        json.loads(as_json.output)


def test_unstable_input_exits_with_a_hint() -> None:
    result = runner.invoke(app, ["plan", "mm1", "--arrival-rate", "300", "--service-ms", "5"])
    assert result.exit_code == 2
    assert "servers" in result.output


def test_from_profile() -> None:
    # resnet50_v100: 5 ms at batch 1 -> the same plan as --service-ms 5.
    out = _json("capacity", "--peak-qps", "5000", "--p99-ms", "50", "--from-profile", "resnet50_v100")
    assert out["recommended_replicas"] == 62
    batch = _json("batching", "--arrival-rate", "500", "--window-ms", "10", "--from-profile", "resnet50_v100")
    envelope = batch["envelope"]
    assert isinstance(envelope, dict)
    # Batch seen p99 = 12 -> T(12) interpolated between 9.1 ms (8) and 14 ms (16) = 11.55 ms; + 10 ms window.
    assert abs(float(envelope["envelope_s"]) - (0.010 + 0.01155)) < 1e-9
    missing = runner.invoke(app, ["plan", "capacity", "--peak-qps", "10", "--p99-ms", "50"])
    assert missing.exit_code == 2
    assert "--from-profile" in missing.output
