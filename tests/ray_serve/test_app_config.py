"""The Serve application's arguments (the edge), deployment options and the Serve config file that
`headroom deploy ray` prints, validated by Serve's own schema. No cluster needed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pydantic
import pytest
from ray.serve.request_router import RequestRouter
from ray.serve.schema import ServeDeploySchema

from headroom.ray_serve.app import (
    IMPORT_PATH,
    INGRESS_DEPLOYMENT,
    LLM_DEPLOYMENT,
    MODELS_DEPLOYMENT,
    AppArgs,
    llm_deployment_options,
    models_deployment_options,
    serve_config,
)
from headroom.ray_serve.router import HeadroomRequestRouter
from headroom.ray_serve.spec import ROUTER_CLASS_PATH, ServeAppSpec

REPO = Path(__file__).resolve().parents[2] / "models"


def test_args_split_comma_lists_and_refuse_unknown_keys() -> None:
    args = AppArgs.model_validate({"model_repository": "models", "models": "digits, noop", "replicas": "2"})
    spec = args.spec()
    assert spec.models == ("digits", "noop") and spec.replicas == 2
    with pytest.raises(pydantic.ValidationError, match="replica_count"):
        AppArgs.model_validate({"model_repository": "models", "replica_count": 2})


@pytest.mark.parametrize("bad", [{"router": "fastest"}, {"replicas": 0}, {"max_models_per_replica": 0},
                                 {"replica_num_cpus": -1.0}, {"trusted_backends": "onnxruntime,anything"}])
def test_spec_refuses_values_that_cannot_run(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        AppArgs.model_validate({"model_repository": "models", **bad}).spec()


def test_headroom_policy_is_serves_request_router() -> None:
    options = models_deployment_options(ServeAppSpec("models", router="affinity"), None)
    router = options["request_router_config"]
    assert router == {"request_router_class": ROUTER_CLASS_PATH, "request_router_kwargs": {"policy": "affinity"}}
    module, _, name = ROUTER_CLASS_PATH.rpartition(".")
    assert getattr(__import__(module, fromlist=[name]), name) is HeadroomRequestRouter
    assert issubclass(HeadroomRequestRouter, RequestRouter)
    assert "request_router_config" not in models_deployment_options(ServeAppSpec("models", router="serve"), None)


def test_serve_config_is_a_valid_serve_deploy_file() -> None:
    args = AppArgs.model_validate({"model_repository": "/srv/models", "models": ["digits"], "autoscale": True,
                                   "min_replicas": 1, "max_replicas": 5, "replica_capacity": 8})
    doc = serve_config(args, port=8100)
    ServeDeploySchema.model_validate(doc)
    app = doc["applications"][0]
    assert app["import_path"] == IMPORT_PATH and app["args"]["models"] == ["digits"]
    models = next(d for d in app["deployments"] if d["name"] == MODELS_DEPLOYMENT)
    assert "num_replicas" not in models and models["autoscaling_config"]["target_ongoing_requests"] == 4.0
    assert models["autoscaling_config"]["max_replicas"] == 5 and models["max_ongoing_requests"] == 8
    assert AppArgs.model_validate(app["args"]) == args  # the file's args rebuild the same application


def test_the_ingress_holds_what_the_replicas_hold_at_their_autoscaling_ceiling() -> None:
    fixed = serve_config(AppArgs.model_validate({"model_repository": str(REPO), "models": ["minilm"]}))
    ingress = next(d for d in fixed["applications"][0]["deployments"] if d["name"] == INGRESS_DEPLOYMENT)
    assert ingress["max_ongoing_requests"] == 100  # 1 replica x 8: the floor
    scaled = AppArgs.model_validate({"model_repository": str(REPO), "models": ["smollm2", "minilm"], "autoscale": True,
                                     "min_replicas": 1, "max_replicas": 6, "replica_capacity": 8,
                                     "llm_max_replicas": 3})
    ingress = next(d for d in serve_config(scaled)["applications"][0]["deployments"] if d["name"] == INGRESS_DEPLOYMENT)
    assert ingress["max_ongoing_requests"] == 4 * (6 * 8 + 3 * 32)  # tensor and LLM replicas at their max


def test_rendering_a_serve_config_does_not_import_ray() -> None:
    """`headroom deploy ray` (no --run) and `headroom deploy k8s` work where Ray is not installed."""
    code = ("import sys; from headroom.cli.deploy import app; from headroom.ray_serve.app import AppArgs, "
            "serve_config; serve_config(AppArgs(model_repository='m', router='prefix')); "
            "assert 'ray' not in sys.modules, 'ray was imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_serve_config_deploys_the_llm_when_the_repository_has_one() -> None:
    args = AppArgs.model_validate({"model_repository": str(REPO), "models": ["smollm2", "minilm"],
                                   "llm_replicas": 2, "router": "prefix"})
    doc = serve_config(args)
    ServeDeploySchema.model_validate(doc)
    deployments = {d["name"]: d for d in doc["applications"][0]["deployments"]}
    assert set(deployments) == {INGRESS_DEPLOYMENT, MODELS_DEPLOYMENT, LLM_DEPLOYMENT}
    llm = deployments[LLM_DEPLOYMENT]
    assert llm["num_replicas"] == 2 and llm["max_ongoing_requests"] == 32
    assert llm_deployment_options(args.spec())["request_router_config"]["request_router_kwargs"] == {"policy": "prefix"}
    only_llm = serve_config(AppArgs.model_validate({"model_repository": str(REPO), "models": ["smollm2"]}))
    assert {d["name"] for d in only_llm["applications"][0]["deployments"]} == {INGRESS_DEPLOYMENT, LLM_DEPLOYMENT}
    with pytest.raises(ValueError, match="llm_timeout_s"):
        AppArgs.model_validate({"model_repository": "m", "llm_timeout_s": 0}).spec()


def test_the_llm_deployment_autoscales_with_the_model_deployments_policy_between_its_own_bounds() -> None:
    autoscaler = {"min_replicas": 2, "max_replicas": 8, "target_utilisation": 0.25, "scale_down_utilisation": 0.1,
                  "window_s": 20, "scale_down_stabilisation_s": 120, "cooldown_s": 30}
    args = AppArgs.model_validate({"model_repository": str(REPO), "models": ["smollm2"], "autoscaler": autoscaler,
                                   "llm_capacity": 16, "llm_max_replicas": 3})
    doc = serve_config(args)
    ServeDeploySchema.model_validate(doc)
    llm = next(d for d in doc["applications"][0]["deployments"] if d["name"] == LLM_DEPLOYMENT)
    assert "num_replicas" not in llm
    assert llm["autoscaling_config"] == {"min_replicas": 2, "max_replicas": 3, "initial_replicas": 2,
                                         "target_ongoing_requests": 4.0, "look_back_period_s": 20.0,
                                         "upscale_delay_s": 0.0, "downscale_delay_s": 120.0}
    fixed = llm_deployment_options(args.spec())  # no autoscaler: llm_replicas, as before
    assert fixed["num_replicas"] == 1 and "autoscaling_config" not in fixed
    with pytest.raises(ValueError, match="llm_min_replicas"):
        AppArgs.model_validate({"model_repository": "m", "llm_min_replicas": 3, "llm_max_replicas": 2}).spec()
