"""Re-simulate a saved `headroom sim --validate` report with other host-CPU costs (no server, simulator only).

    .venv/bin/python benchmarks/sim_validation/replay.py REPORT.json --host-request-ms 1.12 --host-batch-ms 0.75 \\
        [--scale 1.06] [--model-repository models]

Each load's schedule is rebuilt from the report's rate, duration and seed (the bench's own arrivals), the
profile and the calibrated fixed costs come from the report, and the in-service slowdown is re-derived from the
report's calibration pass with the new per-request cost (or given with --scale). Prints real vs simulated p50 /
p99 per load: a what-if on the calibration, e.g. splitting host CPU differently.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from headroom.loadgen.arrivals import ArrivalSpec
from headroom.models.repository import ModelRepository
from headroom.sim.calibrate import Overhead
from headroom.sim.profile import profile_from_mapping
from headroom.sim.slowdown import service_time_scale
from headroom.sim.validate import ValidateConfig, sim_config_for
from headroom.sim.validate_compare import compare_load
from headroom.sim.validate_report import with_batch_overhead


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("report", type=Path, help="a validation report (benchmarks/results/sim_validation_*.json)")
    ap.add_argument("--host-request-ms", type=float, required=True, help="host CPU per arrival (model ms lost)")
    ap.add_argument("--host-batch-ms", type=float, required=True, help="host CPU per completed batch")
    ap.add_argument("--scale", type=float, default=0.0, help="in-service slowdown (0 = re-derive it)")
    ap.add_argument("--model-repository", type=Path, default=Path("models"))
    args = ap.parse_args()
    d = json.loads(args.report.read_text())
    o = d["overhead"]
    overhead = Overhead(per_request_s=o["per_request_ms"] / 1e3, per_batch_s=o["per_batch_ms"] / 1e3,
                        single_stream_p50_s=0.0, single_stream_compute_p50_s=0.0)
    profile = with_batch_overhead(profile_from_mapping(d["profile"]), overhead.per_batch_s)
    host_s, batch_s = args.host_request_ms / 1e3, args.host_batch_ms / 1e3
    scale = args.scale
    if scale <= 0:
        cal_rate = float(o["mode"].split("Poisson ")[1].split(" ")[0])
        scale = service_time_scale(o["busy_per_batch_ms"] / 1e3, o["mean_batch_size"], profile, cal_rate, host_s)
    mcfg = ModelRepository(args.model_repository).scan([d["model"]]).models[0].config
    cfg = ValidateConfig(model=d["model"], duration_s=d["config"]["duration_s"],
                         load_basis=d["config"].get("load_basis", "capacity"))
    base = replace(sim_config_for(mcfg, 0), service_time_scale=scale, host_cpu_per_batch_s=batch_s)
    print(f"{args.report.name}: host {args.host_request_ms} ms/request + {args.host_batch_ms} ms/batch, "
          f"slowdown x{scale:.4f}")
    for i, row in enumerate(d["loads"]):
        seed = d["config"]["seed"] + 1000 * (i + 1)
        spec = ArrivalSpec(kind="poisson", rate_per_s=row["rate_per_s"], duration_s=cfg.duration_s)
        real = {"latency_ms": {"p50_ms": row["real"]["p50_ms"], "p99_ms": row["real"]["p99_ms"]},
                "counts": {"completed": 0, "errors": 0}, "throughput": {"requests_per_s": 0.0},
                "generator": {"late_fraction": 0.0}, "scenario": {"valid": False}}
        r = compare_load(row["load_fraction"], row["rate_per_s"], real, replace(base, seed=seed), profile, overhead,
                         spec, seed, cfg, host_s, batch_s)
        print(f"  {row['load_fraction']:.0%} at {row['rate_per_s']:.1f}/s: p50 {row['real']['p50_ms']:.1f} / "
              f"{r['sim']['p50_ms']:.1f} ms ({r['rel_error']['p50']:+.1%}), p99 {row['real']['p99_ms']:.1f} / "
              f"{r['sim']['p99_ms']:.1f} ms ({r['rel_error']['p99']:+.1%})")


if __name__ == "__main__":
    main()
