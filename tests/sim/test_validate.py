"""`headroom sim --validate`: the helpers, and one short end-to-end run against the real server (digits).

The end-to-end test checks the machinery and the report's structure, not the 15 % accuracy: this machine
is shared and noisy, so accuracy is measured in benchmarks/sim_validation/ and reported in docs/sim.md.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from headroom.cli.main import app
from headroom.models.config import load_model_config
from headroom.models.repository import ModelRepository
from headroom.server.dataplane import policy_config
from headroom.sim.calibrate import Overhead, ServerReading, process_cpu_s, usage_between
from headroom.sim.profile import ServiceProfile
from headroom.sim.validate import (
    ValidateConfig,
    capacity_per_s,
    run_validation,
    sim_config_for,
    with_batch_overhead,
)
from headroom.sim.validate_compare import host_cost_s, relative_error
from headroom.sim.validate_profile import pinned, pinned_repository

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


def test_host_cost_scales_the_host_cpu_by_the_cores_the_model_keeps_busy() -> None:
    ov = Overhead(0.002, 0.0, 0.003, 0.001, host_cpu_per_request_s=0.0015)
    one_thread = ServiceProfile.constant(0.01, meta={"busy_fraction": 0.97})
    assert host_cost_s(ov, one_thread, server_cores=1, model_threads=1) == pytest.approx(0.0015 * 0.97)
    assert host_cost_s(ov, one_thread, server_cores=2, model_threads=1) == pytest.approx(0.0015 * 0.97 / 2)
    assert host_cost_s(ov, one_thread, server_cores=2, model_threads=2) == pytest.approx(0.0015 * 0.97)
    sleeper = ServiceProfile.constant(0.01, meta={"busy_fraction": 0.0})
    assert host_cost_s(ov, sleeper, server_cores=1, model_threads=1) == 0.0
    assert host_cost_s(ov, ServiceProfile.constant(0.01), 1, 1) == pytest.approx(0.0015)  # unknown: CPU-bound


def test_pinned_repository_overrides_the_thread_count_and_links_the_rest(tmp_path: Path) -> None:
    source = tmp_path / "src"
    (source / "m" / "1").mkdir(parents=True)
    (source / "m" / "1" / "model.onnx").write_bytes(b"x")
    (source / "m" / "config.yaml").write_text(
        "backend: onnxruntime\nmax_batch_size: 4\ninputs: [{name: x, datatype: FP32, shape: [2]}]\n"
        "outputs: [{name: y, datatype: FP32, shape: [2]}]\nparameters: {intra_op_threads: 2}\n")
    repo = pinned_repository(source, "m", 1, tmp_path / "work")
    assert repo != source
    assert load_model_config(repo / "m").runtime.intra_op_threads == 1
    assert (repo / "m" / "1" / "model.onnx").read_bytes() == b"x"
    assert pinned_repository(source, "m", 0, tmp_path / "other") == source
    sleep_repo = Path(__file__).resolve().parents[2] / "benchmarks" / "sim_validation" / "models"
    assert pinned_repository(sleep_repo, "sleep", 1, tmp_path / "py") == sleep_repo  # no thread knob


def test_pinned_restores_the_affinity_and_refuses_unavailable_cpus() -> None:
    before = os.sched_getaffinity(0)
    first = min(before)
    with pinned(str(first)) as cpus:
        assert cpus == {first} and os.sched_getaffinity(0) == {first}
    assert os.sched_getaffinity(0) == before
    with pytest.raises(ValueError, match="not available"), pinned(str(max(before) + 1000)):
        pass
    cpu = process_cpu_s(os.getpid())
    sum(i * i for i in range(200_000))
    assert process_cpu_s(os.getpid()) >= cpu > 0


@pytest.mark.parametrize("kwargs", [{"loads": ()}, {"loads": (0.0,)}, {"duration_s": 0.0}, {"overhead": "magic"},
                                    {"capacity_per_s": -1.0}, {"model_threads": -1}, {"server_cpus": "x"},
                                    {"calibration_load": 0.7}, {"calibration_load": -0.1},
                                    {"calibration_duration_s": 0.0}, {"saturation_queries": -1},
                                    {"load_basis": "rate"}, {"loads": (0.5, 1.2)}, {"calibration_high_load": 0.3},
                                    {"calibration_high_load": 2.0}])
def test_bad_settings_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        ValidateConfig(model="digits", **kwargs)  # type: ignore[arg-type]


def test_cli_refuses_a_model_that_is_not_in_the_repository(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["sim", "--validate", "--model", "nope", "--model-repository", str(MODELS)])
    assert result.exit_code == 2
    assert "nope" in result.output


def test_short_validation_against_the_real_server(tmp_path: Path) -> None:
    out = tmp_path / "validation.json"
    cpu = str(min(os.sched_getaffinity(0)))  # server and generator pinned (to the same CPU: works anywhere)
    result = CliRunner().invoke(app, [
        "sim", "--validate", "--model", "digits", "--model-repository", str(MODELS), "--loads", "0.3,0.8",
        "--capacity-per-s", "40", "--duration", "2", "--calibration-queries", "30", "--seed", "5",
        "--server-cpus", cpu, "--generator-cpus", cpu, "--json", str(out), "--calibration-duration", "2",
        "--saturation-queries", "200", "--load-basis", "capacity",
    ])
    assert result.exit_code in (0, 1), result.output  # 1 = accuracy target missed (not judged here)
    report = json.loads(out.read_text())
    assert report["schema"] == "headroom.sim.validate/4" and report["model"] == "digits"
    assert report["config"]["load_basis"] == "capacity"
    assert report["config"]["server_cpus"] == cpu and report["config"]["model_threads"] == 1
    assert report["profile"]["meta"]["cpus"] == [int(cpu)] and report["profile"]["meta"]["intra_op_threads"] == 1
    meta = report["profile"]["meta"]
    assert meta["cpu_per_wall"] > 0 and 0 < meta["busy_fraction"] <= 1  # a CPU model burns CPU while it predicts
    ov, cap = report["overhead"], report["capacity"]
    assert ov["host_cpu_per_request_ms"] > 0 and ov["requests"] > 0 and ov["mode"].startswith("open loop")
    assert report["single_stream_calibration"]["requests"] >= 30
    # the judged costs come from the open-loop pass at 0.15 of the isolated capacity
    single = report["single_stream_calibration"]
    isolated = 32 / (report["profile"]["service_ms"]["32"] + single["per_batch_ms"]) * 1e3
    assert cap["isolated_per_s"] == pytest.approx(isolated, rel=1e-3)
    assert ov["mode"] == "open loop, Poisson 6.00 req/s"  # 0.15 of --capacity-per-s
    slow = report["slowdown"]
    scale = cap["service_time_scale"]
    assert scale == slow["service_time_scale"] == report["simulated"]["service_time_scale"] > 0
    assert scale == pytest.approx(slow["busy_per_batch_ms"] / (slow["expected_busy_per_batch_ms"]
                                                               * slow["host_stretch_at_rate"]), rel=1e-2)
    bmax_ms = (scale * (report["profile"]["service_ms"]["32"] + ov["per_batch_ms"])
               + 32 * ov["host_cost_per_arrival_ms"] + ov["host_cost_per_batch_ms"])
    assert cap["effective_per_s"] == pytest.approx(32 / bmax_ms * 1e3, rel=1e-3)
    assert report["simulated"]["batching"] == "dynamic" and report["simulated"]["max_batch_size"] == 32
    assert cap["used_per_s"] == 40
    sat = cap["measured_saturation"]  # the closed-loop check at 2 x B_max in flight
    assert sat["concurrency"] == 64 and sat["throughput_per_s"] > 0 and sat["errors"] == 0
    assert sat["effective_over_measured"] == pytest.approx(cap["effective_per_s"] / sat["throughput_per_s"], rel=1e-3)
    # host CPU per request at the low open-loop pass's batches and at the high one's: per request + per batch / B
    high = report["high_load_calibration"]
    assert high["mode"] == "open loop, Poisson 34.00 req/s" and high["requests"] > 0  # 0.85 of --capacity-per-s
    if ov["host_cost_per_batch_ms"] > 0:
        assert "high-load open-loop pass" in ov["host_split"]
    assert ov["host_cost_per_arrival_ms"] >= 0 and ov["host_cost_per_batch_ms"] >= 0
    assert report["simulated"]["host_cpu_per_batch_ms"] == ov["host_cost_per_batch_ms"]
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
        assert row["real"]["server_usage"]["slowdown_at_load"] > 0  # the scale's diagnostic at each load
        assert 0 < row["real"]["utilisation"] <= 1.05 and row["load_basis"] == "capacity"
        assert row["sim_without_host_cpu"]["p50_ms"] <= row["sim"]["p50_ms"]  # host work only slows batches
        assert row["judged"] is judged and (row["pass"] is None) is (not judged)
    assert report["verdict"]["judged_loads"] == [0.3]
    assert report["verdict"]["pass"] is rows[0]["pass"]
    assert (result.exit_code == 0) is report["verdict"]["pass"]


def test_usage_between_splits_server_cpu_into_batch_threads_and_host_work() -> None:
    pid = 100
    metrics0 = {"headroom_busy_seconds_total{model=\"m\"}": 1.0, "executions": 10.0, "inferences": 10.0,
                "compute_s": 0.8}
    metrics1 = {"headroom_busy_seconds_total{model=\"m\"}": 3.0, "executions": 60.0, "inferences": 110.0,
                "compute_s": 2.6}
    before = ServerReading(metrics0, cpu_s=5.0, threads_cpu_s={100: 1.0, 101: 3.0, 102: 0.5},
                           threads_wait_s={101: 0.1})
    # main thread (event loop) +0.15 s, executor 101 +1.9 s (the batch thread), pool thread 102 +0.05 s,
    # and thread 103 started meanwhile with 0.1 s
    after = ServerReading(metrics1, cpu_s=7.2, threads_cpu_s={100: 1.15, 101: 4.9, 102: 0.55, 103: 0.1},
                          threads_wait_s={101: 0.35})
    used = usage_between(before, after, pid, model_threads=1)
    assert used["batches"] == 50 and used["items"] == 100
    assert used["busy_s"] == pytest.approx(2.0) and used["compute_s"] == pytest.approx(1.8)
    assert used["batch_threads_cpu_s"] == pytest.approx(1.9)
    assert used["batch_threads_wait_s"] == pytest.approx(0.25)
    assert used["host_cpu_per_item_s"] == pytest.approx((2.2 - 1.9) / 100)
    two = usage_between(before, after, pid, model_threads=2)  # an intra-op pool thread: the next busiest
    assert two["batch_threads_cpu_s"] == pytest.approx(2.0)


def test_a_model_that_sleeps_loses_nothing_to_host_cpu(tmp_path: Path) -> None:
    """The sleep model's batches use no CPU: host work measured at calibration must not stretch them, so the
    effective capacity equals the isolated one (within 1 %) while the host CPU per request is still measured."""
    repo = Path(__file__).resolve().parents[2] / "benchmarks" / "sim_validation" / "models"
    cfg = ValidateConfig(model="sleep", model_repository=repo, loads=(0.2,), duration_s=2.0, profile_repeats=5,
                         calibration_queries=20, warmup_queries=5, server_cpus=str(min(os.sched_getaffinity(0))),
                         calibration_load=0.0, saturation_queries=0, calibration_high_load=0.0)
    report = run_validation(cfg)  # no slowdown pass: capacities differ by host work only
    assert report["profile"]["meta"]["busy_fraction"] < 0.2
    assert report["overhead"]["host_cpu_per_request_ms"] > 0
    assert report["overhead"]["host_cost_per_arrival_ms"] < 0.2 * report["overhead"]["host_cpu_per_request_ms"]
    cap = report["capacity"]
    assert cap["effective_per_s"] == pytest.approx(cap["isolated_per_s"], rel=0.01)
    assert cap["service_time_scale"] == 1.0 and report["overhead"]["mode"] == "single-stream closed loop"
    assert report["config"]["model_threads"] == 1 and report["profile"]["meta"]["intra_op_threads"] is None
    # the load is a target utilisation: the simulator was 20 % busy at the rate chosen, on the bench's schedule,
    # and the real server's own busy fraction is reported beside it
    (row,) = report["loads"]
    assert report["config"]["load_basis"] == "utilisation" and row["load_basis"] == "utilisation"
    assert row["sim"]["utilisation"] == pytest.approx(0.2, abs=0.003)
    assert 0 < row["real"]["utilisation"] <= 1.05
    assert report["high_load_calibration"] is None and report["overhead"]["host_split"] == "all per request"


def test_settled_gc_freezes_the_generators_heap_for_a_run_and_restores_it() -> None:
    import gc

    from headroom.sim.calibrate import settled_gc

    assert gc.get_freeze_count() == 0
    with settled_gc():
        assert gc.get_freeze_count() > 0  # the survivors of earlier passes are out of the collector's way
        assert gc.isenabled()  # the run's own garbage is still collected
    assert gc.get_freeze_count() == 0
