"""router.yaml: validated, unknown keys refused, round trip, flags over the file, read by route and deploy k8s."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from headroom.autoscaler.policy import AutoscalerConfig
from headroom.cli.main import app
from headroom.core.strict_mapping import ConfigError
from headroom.router.fleet_config import FleetConfig, apply_flags, dump_fleet_config, parse_fleet_config

FILE = """
fleet: {replicas: 3, replica_capacity: 12, drain_timeout_s: 45}
router:
  policy: round_robin
  health: {consecutive_failures: 2, base_ejection_s: 5}
  retry_budget: {max_tokens: 4}
  hedging: true
  hedge: {percentile: 0.9}
  shed: {start_utilisation: 0.7}
  degrade: {fallbacks: {big: small}}
  canary: {steps: [0.1, 1.0]}
autoscaler: {min_replicas: 2, max_replicas: 6}
"""


def test_a_file_sets_every_section_and_leaves_the_rest_at_defaults() -> None:
    cfg = parse_fleet_config(yaml.safe_load(FILE))
    assert cfg.fleet.replicas == 3 and cfg.fleet.replica_capacity == 12
    assert cfg.router.policy == "round_robin" and cfg.router.hedging
    assert cfg.router.health.consecutive_failures == 2 and cfg.router.health.max_ejection_s == 300.0
    assert cfg.router.retry_budget.max_tokens == 4 and cfg.router.retry_budget.budget_fraction == 0.2  # merged
    assert cfg.router.hedge.percentile == 0.9 and cfg.router.shed.start_utilisation == 0.7
    assert dict(cfg.router.degrade.fallbacks) == {"big": "small"} and cfg.router.canary.steps == (0.1, 1.0)
    assert cfg.autoscaler == AutoscalerConfig(min_replicas=2, max_replicas=6)


@pytest.mark.parametrize("cfg", [FleetConfig(), parse_fleet_config(yaml.safe_load(FILE))])
def test_round_trip(cfg: FleetConfig) -> None:
    assert parse_fleet_config(yaml.safe_load(dump_fleet_config(cfg))) == cfg


@pytest.mark.parametrize(("doc", "message"), [
    ({"router": {"polcy": "p2c"}}, "router.polcy: unknown key (did you mean 'policy'?)"),
    ({"router": {"health": {"consecutive_failure": 1}}}, "router.health.consecutive_failure: unknown key"),
    ({"fleets": {}}, "fleets: unknown key (did you mean 'fleet'?)"),
    ({"router": {"hedging": "yes"}}, "router.hedging: expected true or false"),
    ({"fleet": {"replicas": 2.5}}, "fleet.replicas: expected an integer"),
    ({"router": {"policy": "random"}}, "unknown routing policy 'random'"),
    ({"router": {"canary": {"steps": [0.5, 0.1]}}}, "router.canary: steps must be increasing"),
    ({"autoscaler": {"min_replicas": 5, "max_replicas": 2}}, "need 0 <= min_replicas <= max_replicas"),
    (["not", "a", "mapping"], "expected a mapping"),
])
def test_mistakes_are_refused_with_where_and_why(doc: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")):
        parse_fleet_config(doc)  # type: ignore[arg-type]


def test_flags_given_override_the_file() -> None:
    cfg = parse_fleet_config(yaml.safe_load(FILE))
    defaults = {"min_replicas": 1, "max_replicas": 4, "warm_pool": 0}
    flags = {"policy": "p2c", "replicas": 5, "max_replicas": 9, "model": ["minilm"], "model_repository": Path("/m")}
    out = apply_flags(cfg, flags, defaults)
    assert out.router.policy == "p2c" and out.fleet.replicas == 5 and out.fleet.models == ("minilm",)
    assert out.fleet.model_repository == "/m"  # the CLI gives a Path
    assert out.autoscaler is not None and out.autoscaler.max_replicas == 9 and out.autoscaler.min_replicas == 2
    assert apply_flags(cfg, {"autoscale": False}, defaults).autoscaler is None
    on = apply_flags(FleetConfig(), {"autoscale": True}, defaults).autoscaler
    assert on is not None and (on.min_replicas, on.max_replicas, on.warm_pool) == (1, 4, 0)
    assert apply_flags(FleetConfig(), {"min_replicas": 3}, defaults).autoscaler is None  # no autoscaling asked


def test_route_prints_the_merged_config_and_refuses_a_bad_file(tmp_path: Path) -> None:
    good = tmp_path / "router.yaml"
    good.write_text(FILE)
    result = CliRunner().invoke(app, ["route", "--config", str(good), "--policy", "p2c", "--print-config"])
    assert result.exit_code == 0, result.output
    printed = parse_fleet_config(yaml.safe_load(result.stdout))
    assert printed.router.policy == "p2c" and printed.fleet.replicas == 3 and printed.router.hedging
    bad = tmp_path / "bad.yaml"
    bad.write_text("router: {max_atempts: 2}\n")
    result = CliRunner().invoke(app, ["route", "--config", str(bad)])
    assert result.exit_code == 2 and "did you mean 'max_attempts'?" in result.output


def test_deploy_k8s_reads_the_same_file(tmp_path: Path) -> None:
    good = tmp_path / "router.yaml"
    good.write_text(FILE)
    result = CliRunner().invoke(app, ["deploy", "k8s", "--config", str(good), "--max-replicas", "7"])
    assert result.exit_code == 0, result.output
    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(result.stdout)}
    assert docs["Deployment", "headroom"]["spec"]["replicas"] == 3
    router_yaml = docs["ConfigMap", "headroom-router"]["data"]["router.yaml"]
    assert parse_fleet_config(yaml.safe_load(router_yaml)) == parse_fleet_config(yaml.safe_load(FILE))
    assert docs["HorizontalPodAutoscaler", "headroom"]["spec"]["minReplicas"] == 2
    assert docs["HorizontalPodAutoscaler", "headroom"]["spec"]["maxReplicas"] == 7  # the flag wins
    grace = docs["Deployment", "headroom"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace >= 45  # covers the file's drain time
