"""`headroom deploy ray` through headroom's real top-level CLI: the Serve config file it prints, router.yaml +
flags merged as `headroom route` merges them, and bad input refused with exit code 2."""

from __future__ import annotations

import contextlib
import importlib
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import tritonclient.grpc as triton_grpc
import yaml
from ray.serve.schema import ServeDeploySchema
from typer.testing import CliRunner

from headroom.cli.main import app
from headroom.ray_serve.app import (
    GRPC_SERVICER_FUNCTION,
    INGRESS_DEPLOYMENT,
    LLM_DEPLOYMENT,
    MODELS_DEPLOYMENT,
    AppArgs,
)
from headroom.ray_serve.spec import ServeAppSpec
from tests.support.server import free_port


def _deploy(*argv: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["deploy", "ray", *argv])
    return result.exit_code, result.output


def _models(doc: dict[str, Any]) -> dict[str, Any]:
    return next(d for d in doc["applications"][0]["deployments"] if d["name"] == MODELS_DEPLOYMENT)


def test_prints_a_valid_serve_config_for_the_given_models(tmp_path: Path) -> None:
    out = tmp_path / "serve.yaml"
    code, text = _deploy("--model", "digits", "--replicas", "3", "--port", "8100", "--output", str(out),
                         "--trusted-backends", "python,onnxruntime")
    assert code == 0, text
    doc = yaml.safe_load(out.read_text())
    ServeDeploySchema.model_validate(doc)
    application = doc["applications"][0]
    args = AppArgs.model_validate(application["args"])
    assert args.models == ["digits"] and Path(args.model_repository).is_absolute() and args.replicas == 3
    assert args.trusted_backends == ["onnxruntime", "python"]
    assert _models(doc)["num_replicas"] == 3 and doc["http_options"]["port"] == 8100
    assert {d["name"] for d in application["deployments"]} == {INGRESS_DEPLOYMENT, MODELS_DEPLOYMENT}
    assert "grpc_options" not in doc  # --grpc-port -1 (the default): no gRPC proxy


def test_an_llm_model_gets_its_llm_deployment(tmp_path: Path) -> None:
    code, text = _deploy("--model", "smollm2", "--llm-replicas", "2", "--llm-num-cpus", "2", "--grpc-port", "9100")
    assert code == 0, text
    doc = yaml.safe_load(text)
    ServeDeploySchema.model_validate(doc)
    assert doc["grpc_options"] == {"port": 9100, "grpc_servicer_functions": [GRPC_SERVICER_FUNCTION]}
    module, _, function = GRPC_SERVICER_FUNCTION.rpartition(".")
    assert callable(getattr(importlib.import_module(module), function))
    deployments = {d["name"]: d for d in doc["applications"][0]["deployments"]}
    assert set(deployments) == {INGRESS_DEPLOYMENT, LLM_DEPLOYMENT}  # no tensor model: no model deployment
    assert deployments[LLM_DEPLOYMENT]["num_replicas"] == 2
    assert deployments[LLM_DEPLOYMENT]["ray_actor_options"] == {"num_cpus": 2.0}


def test_autoscale_gives_the_llm_deployment_serves_autoscaling_between_its_bounds() -> None:
    code, text = _deploy("--model", "smollm2", "--model", "minilm", "--autoscale", "--min-replicas", "1",
                         "--max-replicas", "6", "--llm-max-replicas", "3")
    assert code == 0, text
    doc = yaml.safe_load(text)
    ServeDeploySchema.model_validate(doc)
    llm = next(d for d in doc["applications"][0]["deployments"] if d["name"] == LLM_DEPLOYMENT)
    # headroom's policy (target utilisation 0.5) of one replica's llm_capacity (32): 16 ongoing requests
    assert "num_replicas" not in llm and llm["max_ongoing_requests"] == 32
    assert llm["autoscaling_config"]["min_replicas"] == 1 and llm["autoscaling_config"]["max_replicas"] == 3
    assert llm["autoscaling_config"]["target_ongoing_requests"] == 16.0
    assert _models(doc)["autoscaling_config"]["max_replicas"] == 6  # the model deployment keeps its own
    assert AppArgs.model_validate(doc["applications"][0]["args"]).llm_max_replicas == 3
    code, text = _deploy("--model", "smollm2", "--autoscale", "--max-replicas", "2", "--llm-min-replicas", "3")
    assert code == 2 and "min_replicas" in text  # a floor above the ceiling is refused before anything runs


def test_router_yaml_feeds_policy_capacity_and_autoscaling_and_flags_win(tmp_path: Path) -> None:
    config = tmp_path / "router.yaml"
    config.write_text(yaml.safe_dump({
        "fleet": {"replicas": 2, "replica_capacity": 10, "drain_timeout_s": 12, "models": ["noop"]},
        "router": {"policy": "prefix"},
        "autoscaler": {"min_replicas": 2, "max_replicas": 6, "target_utilisation": 0.6, "window_s": 20,
                       "scale_down_stabilisation_s": 120, "cooldown_s": 30},
    }))
    code, text = _deploy("--config", str(config), "--max-replicas", "5")
    assert code == 0, text
    doc = yaml.safe_load(text)
    ServeDeploySchema.model_validate(doc)
    args = AppArgs.model_validate(doc["applications"][0]["args"])
    assert args.router == "prefix" and args.models == ["noop"] and args.drain_timeout_s == 12
    models = _models(doc)
    assert models["max_ongoing_requests"] == 10 and models["graceful_shutdown_timeout_s"] == 12
    assert models["autoscaling_config"] == {"min_replicas": 2, "max_replicas": 5, "initial_replicas": 2,
                                            "target_ongoing_requests": 6.0, "look_back_period_s": 20.0,
                                            "upscale_delay_s": 0.0, "downscale_delay_s": 120.0}


def test_rate_limits_and_cors_origins_reach_the_ingress_spec(tmp_path: Path) -> None:
    code, text = _deploy("--model", "digits", "--rate-limit-rps", "5", "--rate-limit-burst", "10",
                         "--llm-tokens-per-s", "200", "--cors-origin", "http://a.local", "--cors-origin", "http://b.local")
    assert code == 0, text
    spec = AppArgs.model_validate(yaml.safe_load(text)["applications"][0]["args"]).spec()
    assert (spec.rate_limit_rps, spec.rate_limit_burst, spec.llm_tokens_per_s) == (5.0, 10.0, 200.0)
    assert spec.cors_origins == ("http://a.local", "http://b.local")
    code, text = _deploy("--rate-limit-rps", "-1")
    assert code == 2 and "rate-limit-rps" in text


def test_bad_input_is_refused_with_exit_code_2(tmp_path: Path) -> None:
    code, text = _deploy("--policy", "fastest")
    assert code == 2 and "fastest" in text
    config = tmp_path / "router.yaml"
    config.write_text(yaml.safe_dump({"fleet": {"replicas": 2, "replica_capacty": 3}}))
    code, text = _deploy("--config", str(config))
    assert code == 2 and "replica_capacity" in text  # did-you-mean on the unknown key


def test_args_defaults_are_the_specs() -> None:
    assert AppArgs.model_validate({"model_repository": "m"}).spec() == ServeAppSpec("m")


def test_run_serves_on_a_local_cluster_until_sigterm(tmp_path: Path) -> None:
    """`headroom deploy ray --run` as a real process: its own local Ray cluster, Serve on 127.0.0.1, a request
    answered, then SIGTERM deletes the application, stops Serve and the cluster, and the process exits 0."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "noop").symlink_to(Path(__file__).resolve().parents[2] / "benchmarks" / "models" / "noop")
    port, grpc_port = free_port(), free_port()
    log_path = tmp_path / "deploy.log"
    cmd = [sys.executable, "-m", "headroom.cli.main", "deploy", "ray", "--run", "--model-repository", str(repo),
           "--replicas", "1", "--port", str(port), "--grpc-port", str(grpc_port), "--ray-num-cpus", "1"]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 240.0
        while True:
            assert proc.poll() is None, log_path.read_text(errors="replace")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/v2/health/ready", timeout=2.0).status_code == 200:
                    break
            assert time.monotonic() < deadline, "not ready:\n" + log_path.read_text(errors="replace")
            time.sleep(0.5)
        body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 2], "data": [3, 4]}]}
        r = httpx.post(url + "/v2/models/noop/infer", json=body, timeout=60.0)
        assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [3, 4], r.text
        tensor = triton_grpc.InferInput("input", [1, 2], "FP32")
        tensor.set_data_from_numpy(np.array([[3, 4]], dtype=np.float32))
        grpc_client = triton_grpc.InferenceServerClient(f"127.0.0.1:{grpc_port}")  # Serve's gRPC proxy
        assert grpc_client.infer("noop", [tensor]).as_numpy("output").tolist() == [[3.0, 4.0]]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120.0) == 0, log_path.read_text(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30.0)
