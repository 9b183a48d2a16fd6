"""The reliability suite (`make reliability`; not part of `make test`): overload at 2x capacity, a retry storm
(64 connections re-sending at once on a 503), a replica killed (-9) and one drained (SIGTERM) behind `headroom
route`, 16 abandoned LLM streams, and a fuzz of every HTTP route and gRPC ModelInfer. Real servers on 127.0.0.1,
bounded loops, stops by itself.

    python -m benchmarks.reliability.run                       # the full run (minutes; quiet machine)
    python -m benchmarks.reliability.run --duration-s 5 --failover-duration-s 5 --fuzz-cases 200   # a smoke

Writes benchmarks/results/reliability_<UTC>.json and .md (the table for BENCHMARKS.md) and prints the table. It
says where at the start, bounds every scenario in time (the fuzz by `--fuzz-budget-s`), and prints each
scenario's duration and the total.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.reliability import failover, fuzz, overload, storm, streams
from benchmarks.reliability.common import ROOT
from benchmarks.reliability.report import markdown

SCENARIOS = ("overload", "storm", "failover", "streams", "fuzz")


def _portable(value: Any) -> str:
    """An argument as text, a path inside the repository relative to it (no machine paths in result files)."""
    if isinstance(value, Path) and value.resolve().is_relative_to(ROOT):
        return str(value.resolve().relative_to(ROOT))
    return str(value)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", choices=SCENARIOS, action="append", help="Run only these scenarios (repeatable).")
    p.add_argument("--duration-s", type=float, default=30.0, help="Overload run at 2x capacity (>= 30 s).")
    p.add_argument("--capacity-s", type=float, default=10.0, help="Closed-loop capacity measurement.")
    p.add_argument("--slo-ms", type=float, default=100.0, help="minilm's latency SLO.")
    p.add_argument("--storm-s", type=float, default=15.0, help="Retry storm: 64 connections re-sending at once.")
    p.add_argument("--failover-rate", type=float, default=100.0, help="Requests/s through the router (>= 100).")
    p.add_argument("--failover-duration-s", type=float, default=20.0, help="Per fault (>= 20 s: >= 2000 requests).")
    p.add_argument("--streams", type=int, default=16, help="Abandoned LLM streams.")
    p.add_argument("--fuzz-cases", type=int, default=10_000, help="HTTP cases; gRPC ModelInfer gets as many.")
    p.add_argument("--fuzz-budget-s", type=float, default=900.0,
                   help="Most seconds the fuzz may take (HTTP up to 2/3, gRPC the rest); fewer cases are reported.")
    p.add_argument("--out-dir", type=Path, default=ROOT / "benchmarks" / "results")
    p.add_argument("--note", default="", help="How the machine was (e.g. 'quiet'); the load averages are added.")
    a = p.parse_args()
    chosen = a.only or list(SCENARIOS)
    results: dict[str, Any] = {"started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                               "args": {k: _portable(v) for k, v in vars(a).items()}, "scenario_seconds": {}}
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    a.out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = a.out_dir / f"reliability_{stamp}.json", a.out_dir / f"reliability_{stamp}.md"
    bounds = {"overload": 60 + 3 + a.capacity_s + a.duration_s, "storm": 60 + 3 + a.capacity_s + a.storm_s,
              "failover": 2 * (120 + a.failover_duration_s),
              "streams": 120.0, "fuzz": 120 + a.fuzz_budget_s}  # server starts included (a quiet machine)
    bound_min = sum(bounds[name] for name in chosen) / 60
    print(f"reliability: {', '.join(chosen)}; typically well under {bound_min:.0f} min on a quiet machine; "
          f"results will be in {md_path} and {json_path}", flush=True)
    runners: dict[str, Callable[[Path], Any]] = {
        "overload": lambda logs: overload.run(logs, a.duration_s, a.capacity_s, a.slo_ms),
        "storm": lambda logs: storm.run(logs, a.storm_s, a.capacity_s),
        "failover": lambda logs: failover.run(logs, a.failover_rate, a.failover_duration_s),
        "streams": lambda logs: streams.run(logs, a.streams),
        "fuzz": lambda logs: fuzz.run(logs, a.fuzz_cases, a.fuzz_cases, a.fuzz_budget_s),
    }
    t0, load_start = time.monotonic(), os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="headroom-reliability-") as tmp:
        for name in chosen:
            started = time.monotonic()
            results[name] = runners[name](Path(tmp))
            results["scenario_seconds"][name] = round(time.monotonic() - started, 1)
            print(f"  {name}: done in {results['scenario_seconds'][name]:.0f} s", flush=True)
    results["total_seconds"] = round(time.monotonic() - t0, 1)
    load_end = os.getloadavg()[0]
    results["load_average_1m"] = {"start": load_start, "end": load_end}
    results["note"] = "; ".join(x for x in (a.note, f"1-min load average {load_start:.1f} at the start, "
                                            f"{load_end:.1f} at the end") if x)
    json_path.write_text(json.dumps(results, indent=2) + "\n")
    table = markdown(results)
    md_path.write_text(table)
    print(table)
    print(f"wrote {md_path} and {json_path} in {results['total_seconds'] / 60:.1f} min "
          "(python scripts/make_benchmarks_md.py puts the latest table into BENCHMARKS.md)")


if __name__ == "__main__":
    main()
