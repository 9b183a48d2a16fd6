"""cache_aware in router.yaml and on the command line: selectable, its index knobs validated and round-tripped."""

from __future__ import annotations

import pytest
import yaml
from typer.testing import CliRunner

from headroom.cli.main import app
from headroom.core.strict_mapping import ConfigError
from headroom.router.fleet_config import dump_fleet_config, parse_fleet_config


def test_router_yaml_selects_cache_aware_and_its_knobs() -> None:
    doc = {"router": {"policy": "cache_aware",
                      "prefix_index": {"tokenizers_from": "/srv/models", "routed_ttl_s": 3.0}}}
    cfg = parse_fleet_config(doc)
    assert cfg.router.policy == "cache_aware"
    assert cfg.router.prefix_index.tokenizers_from == "/srv/models" and cfg.router.prefix_index.routed_ttl_s == 3.0
    assert parse_fleet_config(yaml.safe_load(dump_fleet_config(cfg))) == cfg


@pytest.mark.parametrize(("index", "message"), [
    ({"routed_ttl": 3.0}, "routed_ttl"),  # unknown key
    ({"routed_ttl_s": -1.0}, "routed_ttl_s"),
])
def test_bad_index_knobs_are_refused(index: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_fleet_config({"router": {"policy": "cache_aware", "prefix_index": index}})


def test_route_accepts_the_policy_flag() -> None:
    out = CliRunner().invoke(app, ["route", "--policy", "cache_aware", "--print-config"])
    assert out.exit_code == 0, out.output
    assert yaml.safe_load(out.output)["router"]["policy"] == "cache_aware"
    bad = CliRunner().invoke(app, ["route", "--policy", "cache_awareness", "--print-config"])
    assert bad.exit_code != 0 and "cache_aware" in bad.output
