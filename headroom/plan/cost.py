"""Cost per inference from an hourly price and a throughput, and the GPU-vs-CPU comparison at a real load.

``cost per million = hourly price / (throughput per s * 3600) * 1e6`` (example 1.3: $4/h at 200 req/s is
$5.56 per million; table 22: a $0.53/h T4 at 400 img/s is $0.37 per million images).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SECONDS_PER_HOUR = 3600.0


def cost_per_million(hourly_cost: float, throughput_per_s: float) -> float:
    """Dollars per million inferences for an instance kept busy at `throughput_per_s`."""
    if hourly_cost < 0:
        raise ValueError(f"hourly_cost must be >= 0, got {hourly_cost}")
    if throughput_per_s <= 0:
        raise ValueError(f"throughput_per_s must be > 0, got {throughput_per_s}")
    return hourly_cost / (throughput_per_s * SECONDS_PER_HOUR) * 1e6


@dataclass(frozen=True, slots=True)
class InstanceOption:
    """One hardware choice: a price and the throughput it sustains within the SLO."""

    name: str  # e.g. "c5.xlarge (CPU)"
    hourly_cost: float  # dollars per instance-hour
    throughput_per_s: float  # sustained inferences per second per instance


@dataclass(frozen=True, slots=True)
class CostRow:
    """One option evaluated at a load."""

    name: str  # the option's name
    hourly_cost: float  # dollars per instance-hour
    throughput_per_s: float  # per-instance capacity
    cost_per_million_at_capacity: float  # the unit cost if every instance ran saturated
    instances: int  # ceil(load / (throughput * max utilisation)), at least 1
    fleet_hourly_cost: float  # instances * hourly cost
    utilisation: float  # load / (instances * throughput)
    cost_per_million_at_load: float  # fleet hourly cost over the load actually served
    idle_hourly_cost: float  # the part of the fleet's cost paying for idle capacity


def compare(options: list[InstanceOption], load_per_s: float, max_utilisation: float = 1.0) -> list[CostRow]:
    """Each option at `load_per_s`, cheapest fleet first; keeps each instance below `max_utilisation`."""
    if load_per_s <= 0:
        raise ValueError(f"load_per_s must be > 0, got {load_per_s}")
    if not 0 < max_utilisation <= 1:
        raise ValueError(f"max_utilisation must be in (0, 1], got {max_utilisation}")
    rows = []
    for opt in options:
        n = max(1, math.ceil(load_per_s / (opt.throughput_per_s * max_utilisation) - 1e-9))
        fleet = n * opt.hourly_cost
        util = load_per_s / (n * opt.throughput_per_s)
        rows.append(CostRow(name=opt.name, hourly_cost=opt.hourly_cost, throughput_per_s=opt.throughput_per_s,
                            cost_per_million_at_capacity=cost_per_million(opt.hourly_cost, opt.throughput_per_s),
                            instances=n, fleet_hourly_cost=fleet, utilisation=util,
                            cost_per_million_at_load=cost_per_million(fleet, load_per_s),
                            idle_hourly_cost=fleet * (1.0 - util)))
    return sorted(rows, key=lambda r: (r.fleet_hourly_cost, r.name))


def parse_option(text: str) -> InstanceOption:
    """``NAME:HOURLY_COST:THROUGHPUT`` (e.g. ``t4:0.53:400``) into an InstanceOption."""
    parts = text.rsplit(":", 2)
    if len(parts) != 3:
        raise ValueError(f"expected NAME:HOURLY_COST:THROUGHPUT_PER_S (e.g. t4:0.53:400), got {text!r}")
    try:
        return InstanceOption(name=parts[0], hourly_cost=float(parts[1]), throughput_per_s=float(parts[2]))
    except ValueError:
        raise ValueError(f"cost and throughput must be numbers in {text!r} (e.g. t4:0.53:400)") from None
