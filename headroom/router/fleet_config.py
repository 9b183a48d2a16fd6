"""`router.yaml`: one validated file for a fleet — the replicas, every router policy and the autoscaler.

    fleet:                      # what `headroom route` starts
      replicas: 2
      backend: local            # local | ray
      replica_capacity: 8
      drain_timeout_s: 30
      model_repository: models
    router:                     # headroom.router.config.ProxyConfig, every policy with its parameters
      policy: peak_ewma
      health: {consecutive_failures: 5, base_ejection_s: 30}
      retry_budget: {budget_fraction: 0.2}
      hedging: true
      hedge: {percentile: 0.95}
      shed: {start_utilisation: 0.8}
      adaptive_concurrency: false
      degrade: {fallbacks: {minilm-large: minilm}}
      canary: {steps: [0.05, 0.5, 1.0], max_p99_ratio: 1.2}
    autoscaler:                 # present = autoscaling on (headroom.autoscaler.policy.AutoscalerConfig)
      min_replicas: 1
      max_replicas: 4

Unknown keys are refused with a did-you-mean and every value is checked (`headroom.core.strict_mapping`).
`headroom route --config router.yaml` and `headroom deploy k8s --config router.yaml` read the same file; flags
given on the command line override the file. `headroom route --config router.yaml --print-config` prints the
merged configuration in the same format (it reads back equal).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Any

import yaml

from headroom.autoscaler.policy import AutoscalerConfig
from headroom.core.strict_mapping import ConfigError, from_mapping, to_mapping
from headroom.router.config import ProxyConfig

BACKENDS = ("local", "ray")


@dataclass(frozen=True, slots=True)
class FleetSpec:
    """The replicas `headroom route` starts."""

    replicas: int = 2  # started at once
    backend: str = "local"  # local processes or Ray actors
    replica_capacity: int = 8  # concurrent requests one replica serves within its SLO
    drain_timeout_s: float = 30.0  # how long a replica may finish in-flight work on SIGTERM
    model_repository: str = "models"  # <model>/config.yaml + <version>/ (Ray: the same path on every node)
    models: tuple[str, ...] = ()  # serve only these model directories (empty = all)

    def __post_init__(self) -> None:
        if self.replicas < 1 or self.replica_capacity < 1:
            raise ValueError("replicas and replica_capacity must be >= 1")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend {self.backend!r}: use one of {', '.join(BACKENDS)}")
        if self.drain_timeout_s < 0:
            raise ValueError("drain_timeout_s must be >= 0")


@dataclass(frozen=True, slots=True)
class FleetConfig:
    """Everything about a fleet in one value."""

    fleet: FleetSpec = field(default_factory=FleetSpec)
    router: ProxyConfig = field(default_factory=ProxyConfig)
    autoscaler: AutoscalerConfig | None = None  # None = a fixed number of replicas


def parse_fleet_config(data: Mapping[str, Any] | None, source: str = "router.yaml") -> FleetConfig:
    """A FleetConfig from a parsed document; ConfigError names the file and the key."""
    if data is None:
        return FleetConfig()
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: expected a mapping with fleet / router / autoscaler sections")
    try:
        return from_mapping(FleetConfig, data)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def load_fleet_config(path: Path) -> FleetConfig:
    """Read and validate a router.yaml."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    return parse_fleet_config(data, str(path))


def dump_fleet_config(cfg: FleetConfig) -> str:
    """The YAML form of `cfg` (parse_fleet_config(yaml.safe_load(...)) gives it back)."""
    doc = to_mapping(cfg)
    if cfg.autoscaler is None:
        del doc["autoscaler"]
    return str(yaml.safe_dump(doc, sort_keys=False))


#: command-line flag -> (section, key) it overrides
FLAG_KEYS: dict[str, tuple[str, str]] = {
    "replicas": ("fleet", "replicas"),
    "backend": ("fleet", "backend"),
    "replica_capacity": ("fleet", "replica_capacity"),
    "drain_timeout_s": ("fleet", "drain_timeout_s"),
    "model_repository": ("fleet", "model_repository"),
    "model": ("fleet", "models"),
    "policy": ("router", "policy"),
    "hedging": ("router", "hedging"),
    "tied": ("router", "tied"),
    "shedding": ("router", "shedding"),
    "min_replicas": ("autoscaler", "min_replicas"),
    "max_replicas": ("autoscaler", "max_replicas"),
    "warm_pool": ("autoscaler", "warm_pool"),
}


def apply_flags(cfg: FleetConfig, given: Mapping[str, Any], cli_defaults: Mapping[str, Any]) -> FleetConfig:
    """`cfg` with the flags the user gave on the command line (`given`) on top. `autoscale: true` turns the
    autoscaler on (the CLI's floor, ceiling and warm pool unless the file or a flag set them), `false` off."""
    doc = to_mapping(cfg)
    autoscale = given.get("autoscale")
    if autoscale is True and cfg.autoscaler is None:
        doc["autoscaler"] = {k: cli_defaults[k] for k in ("min_replicas", "max_replicas", "warm_pool")}
    elif autoscale is False:
        doc["autoscaler"] = None
    for flag, value in given.items():
        if flag not in FLAG_KEYS:
            continue
        section, key = FLAG_KEYS[flag]
        if section == "autoscaler" and doc.get("autoscaler") is None:
            continue  # --min-replicas without autoscaling changes nothing
        doc[section][key] = [str(v) for v in value] if isinstance(value, tuple | list) else (
            str(value) if isinstance(value, PurePath) else value)
    return parse_fleet_config(doc, "command line")


def given_flags(ctx: Any) -> dict[str, Any]:
    """The options of a click/typer context that the user set (command line or environment), not defaults."""
    out: dict[str, Any] = {}
    for name, value in ctx.params.items():
        source = ctx.get_parameter_source(name)
        if source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT"):
            out[name] = value
    return out
