"""`headroom profile --runtimes`: the pure variant derivation, and the command on digits (small sizes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from headroom.cli.main import app
from headroom.models.config import load_model_config
from headroom.profiling.runtimes import configured_threads, parse_batch_sizes, parse_runtimes, runtime_variant
from tests.models.conftest import PROJECT_MODELS, digits_repo  # noqa: F401  (the fixture)


def test_parse_runtimes_and_batch_sizes() -> None:
    assert parse_runtimes("eager, compile,onnx") == ("eager", "compile", "onnx")
    assert parse_batch_sizes("1,8,32") == (1, 8, 32)
    with pytest.raises(ValueError, match=r"'tensorrt' is not one of eager, compile, onnx"):
        parse_runtimes("eager,tensorrt")
    with pytest.raises(ValueError, match="name at least one"):
        parse_runtimes(" , ")
    for bad in ("1,x", "0,8", ""):
        with pytest.raises(ValueError, match="positive integers"):
            parse_batch_sizes(bad)


def test_digits_variants_switch_backend_and_keep_the_threads() -> None:
    config = load_model_config(PROJECT_MODELS / "digits")
    assert config.backend == "onnxruntime" and configured_threads(config) == 1
    eager = runtime_variant(config, "eager", threads=1)
    compiled = runtime_variant(config, "compile", threads=1, cache_dir="/tmp/x")
    onnx = runtime_variant(config, "onnx", threads=1)
    assert (eager.backend, eager.runtime.mode, eager.runtime.intra_op_threads) == ("torch", "eager", 1)
    assert eager.parameters["model_class"].endswith("runtime_variants:DigitsTorchModel")
    assert eager.parameters["weights"] == "model.safetensors"
    assert (compiled.runtime.mode, compiled.runtime.cache_dir) == ("compile", "/tmp/x")
    assert onnx == runtime_variant(onnx, "onnx", threads=1)  # idempotent
    assert (onnx.backend, onnx.parameters["model_class"]) == ("onnxruntime", config.parameters["model_class"])


def test_minilm_variants_use_the_runtime_aware_torch_class() -> None:
    config = load_model_config(PROJECT_MODELS / "minilm")
    for runtime in ("eager", "compile"):
        variant = runtime_variant(config, runtime, threads=2)
        assert variant.backend == "torch"
        assert variant.parameters["model_class"].endswith("runtime_variants:MiniLMTorchModel")


def test_a_model_without_the_other_engine_says_so() -> None:
    config = load_model_config(PROJECT_MODELS.parent / "benchmarks" / "models" / "noop")
    with pytest.raises(ValueError, match=r"'noop' \(backend python.*has no eager variant"):
        runtime_variant(config, "eager", threads=1)


def test_profile_runtimes_prints_the_table_and_json(digits_repo: Path, tmp_path: Path) -> None:  # noqa: F811
    out = tmp_path / "runtimes.json"
    args = ["profile", "digits", "--model-repository", str(digits_repo), "--runtimes", "eager,onnx",
            "--batch-sizes", "1,4", "--repeats", "3", "--json", "--output", str(out), "--cache-dir", str(tmp_path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "runtime comparison" in result.output and "speed-up" in result.output
    doc = json.loads(out.read_text())
    assert doc == json.loads(result.stdout[result.stdout.index("{"):])
    assert [r["runtime"] for r in doc["runtimes"]] == ["eager", "onnx"]
    for entry in doc["runtimes"]:
        assert entry["intra_op_threads"] == 1 and entry["load_s"] > 0
        assert [b["batch_size"] for b in entry["batches"]] == [1, 4]
        for batch in entry["batches"]:
            assert 0 < batch["p50_ms"] <= batch["p99_ms"] and batch["throughput_items_per_s"] > 0
    assert all(b["speedup_vs_eager_p50"] == 1.0 for b in doc["runtimes"][0]["batches"])
    assert doc["runtimes"][1]["artifact_cache"] == "miss (written)"  # the optimized ONNX graph, saved
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0, again.output
    assert json.loads(out.read_text())["runtimes"][1]["artifact_cache"] == "hit"  # a "restart" reads it


def test_profile_runtimes_rejects_an_unknown_runtime(digits_repo: Path) -> None:  # noqa: F811
    result = CliRunner().invoke(app, ["profile", "digits", "--model-repository", str(digits_repo),
                                      "--runtimes", "eager,tvm"])
    assert result.exit_code == 2 and "'tvm' is not one of eager, compile, onnx" in result.output


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_profile_all_three_runtimes_on_digits(digits_repo: Path, tmp_path: Path) -> None:  # noqa: F811
    """With inductor (minutes on a busy 2-core machine): compile appears, with its artifact cache written."""
    result = CliRunner().invoke(app, [
        "profile", "digits", "--model-repository", str(digits_repo), "--runtimes", "eager,compile,onnx",
        "--batch-sizes", "1,8", "--repeats", "5", "--json", "--cache-dir", str(tmp_path),
    ])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout[result.stdout.index("{"):])
    compiled = doc["runtimes"][1]
    assert compiled["runtime"] == "compile" and "compile" in compiled["cold_start_s"]
    assert compiled["artifact_cache"] in ("miss (written)", "hit")


def test_a_profile_records_the_shape_it_was_measured_on(digits_repo: Path, tmp_path: Path) -> None:  # noqa: F811
    """`headroom profile` writes the CPUs it could run on and its peak RSS: what `headroom deploy k8s
    --from-profile` sizes a replica from (headroom.router.k8s_plan.replica_shape)."""
    import os

    out = tmp_path / "digits.json"
    result = CliRunner().invoke(app, ["profile", "digits", "--model-repository", str(digits_repo),
                                      "--batch-sizes", "1,4", "--repeats", "3", "--output", str(out)])
    assert result.exit_code == 0, result.output
    meta = json.loads(out.read_text())["meta"]
    assert meta["cpus"] == len(os.sched_getaffinity(0))
    assert 10 * 1024 * 1024 < meta["peak_rss_bytes"] < 64 * 1024**3  # a real process's peak, in bytes
