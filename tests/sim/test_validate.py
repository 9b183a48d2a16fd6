"""`headroom sim --validate`: the helpers, and one short end-to-end run against the real server (digits).

The end-to-end test checks the machinery and the report's structure, not the 15 % accuracy: this machine
is shared and noisy, so accuracy is measured in benchmarks/sim_validation/ and reported in docs/sim.md.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from headroom.cli.main import app
from headroom.models.repository import ModelRepository
from headroom.server.dataplane import policy_config
from headroom.sim.profile import ServiceProfile
from headroom.sim.validate import (
    Overhead,
    ValidateConfig,
    capacity_per_s,
    relative_error,
    sim_config_for,
    with_batch_overhead,
)

MODELS = Path(__file__).resolve().parents[2] / "models"


def test_relative_error_is_signed_and_nan_when_undefined() -> None:
    assert relative_error(11.0, 10.0) == pytest.approx(0.1)
    assert relative_error(9.0, 10.0) == pytest.approx(-0.1)
    assert math.isnan(relative_error(1.0, 0.0))
    assert math.isnan(relative_error(math.nan, 1.0))


def test_capacity_is_full_batches_over_batch_time_plus_executor_cost() -> None:
    profile = ServiceProfile.linear(0.004, 0.001, max_batch_size=32)  # T(32) = 36 ms
    assert capacity_per_s(profile, 32) == pytest.approx(32 / 0.036)
    assert capacity_per_s(profile, 32, per_batch_s=0.004) == pytest.approx(32 / 0.040)
    shifted = with_batch_overhead(profile, 0.002)
    assert shifted.mean_service_s(1) == pytest.approx(profile.mean_service_s(1) + 0.002)
    assert shifted.mean_service_s(32) == pytest.approx(profile.mean_service_s(32) + 0.002)


def test_simulated_deployment_uses_the_servers_policy_for_the_model() -> None:
    config = ModelRepository(MODELS).scan(["digits"]).models[0].config
    sim = sim_config_for(config, seed=3)
    assert sim.policy == policy_config(config)
    assert sim.batching == config.batching.mode
    assert sim.replicas == config.instances
    assert sim.seed == 3


def test_overhead_draws_resample_the_measured_costs() -> None:
    ov = Overhead(per_request_s=0.002, per_batch_s=0.0, single_stream_p50_s=0.003,
                  single_stream_compute_p50_s=0.001, samples_s=(0.001, 0.002, 0.009))
    draws = ov.draw(1000, np.random.default_rng(0))
    assert set(np.unique(draws)) <= {0.001, 0.002, 0.009}
    assert np.array_equal(draws, ov.draw(1000, np.random.default_rng(0)))
    fixed = Overhead(0.002, 0.0, 0.003, 0.001)
    assert np.all(fixed.draw(5, np.random.default_rng(0)) == 0.002)


@pytest.mark.parametrize("kwargs", [{"loads": ()}, {"loads": (0.0,)}, {"duration_s": 0.0}, {"overhead": "magic"},
                                    {"capacity_per_s": -1.0}])
def test_bad_settings_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        ValidateConfig(model="digits", **kwargs)  # type: ignore[arg-type]


def test_cli_refuses_a_model_that_is_not_in_the_repository(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["sim", "--validate", "--model", "nope", "--model-repository", str(MODELS)])
    assert result.exit_code == 2
    assert "nope" in result.output


def test_short_validation_against_the_real_server(tmp_path: Path) -> None:
    out = tmp_path / "validation.json"
    result = CliRunner().invoke(app, [
        "sim", "--validate", "--model", "digits", "--model-repository", str(MODELS), "--loads", "0.3,0.8",
        "--capacity-per-s", "40", "--duration", "2", "--calibration-queries", "30", "--seed", "5",
        "--json", str(out),
    ])
    assert result.exit_code in (0, 1), result.output  # 1 = accuracy target missed (not judged here)
    report = json.loads(out.read_text())
    assert report["schema"] == "headroom.sim.validate/1" and report["model"] == "digits"
    assert report["simulated"]["batching"] == "dynamic" and report["simulated"]["max_batch_size"] == 32
    assert report["capacity"]["used_per_s"] == 40 and report["capacity"]["implied_per_s"] > 0
    assert report["overhead"]["per_request_ms"] > 0 and report["overhead"]["per_batch_ms"] >= 0
    assert set(report["profile"]["service_ms"]) == {"1", "2", "4", "8", "16", "32"}
    rows = report["loads"]
    assert [r["load_fraction"] for r in rows] == [0.3, 0.8]
    for row, judged in zip(rows, (True, False), strict=True):
        assert row["rate_per_s"] == pytest.approx(40 * row["load_fraction"])
        # the simulator replayed the bench's own schedule: as many requests as the server answered
        assert row["requests"] == row["real"]["completed"] > 0
        assert row["real"]["errors"] == 0
        for side in ("real", "sim"):
            assert 0 < row[side]["p50_ms"] <= row[side]["p99_ms"]
        assert row["sim"]["p50_ms"] >= report["overhead"]["per_request_ms"]
        assert row["rel_error"]["p50"] == pytest.approx(row["sim"]["p50_ms"] / row["real"]["p50_ms"] - 1, abs=1e-3)
        assert row["real"]["mean_batch_size"] >= 1 and row["sim"]["mean_batch_size"] >= 1
        assert row["judged"] is judged and (row["pass"] is None) is (not judged)
    assert report["verdict"]["judged_loads"] == [0.3]
    assert report["verdict"]["pass"] is rows[0]["pass"]
    assert (result.exit_code == 0) is report["verdict"]["pass"]
