"""The reliability suite (`make reliability`; not part of `make test`): overload at 2x capacity, a replica
killed (-9) and one drained (SIGTERM) behind `headroom route`, 16 abandoned LLM streams, and a fuzz of every
HTTP route and gRPC ModelInfer. Real servers on 127.0.0.1, bounded loops, stops by itself.

    python -m benchmarks.reliability.run                       # the full run (minutes; quiet machine)
    python -m benchmarks.reliability.run --duration-s 5 --failover-duration-s 5 --fuzz-cases 200   # a smoke

Writes benchmarks/results/reliability_<UTC>.json and .md (the table for BENCHMARKS.md) and prints the table.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.reliability import failover, fuzz, overload, streams
from benchmarks.reliability.common import ROOT
from benchmarks.reliability.report import markdown

SCENARIOS = ("overload", "failover", "streams", "fuzz")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", choices=SCENARIOS, action="append", help="Run only these scenarios (repeatable).")
    p.add_argument("--duration-s", type=float, default=30.0, help="Overload run at 2x capacity (>= 30 s).")
    p.add_argument("--capacity-s", type=float, default=10.0, help="Closed-loop capacity measurement.")
    p.add_argument("--slo-ms", type=float, default=100.0, help="minilm's latency SLO.")
    p.add_argument("--failover-rate", type=float, default=100.0, help="Requests/s through the router (>= 100).")
    p.add_argument("--failover-duration-s", type=float, default=20.0, help="Per fault (>= 20 s: >= 2000 requests).")
    p.add_argument("--streams", type=int, default=16, help="Abandoned LLM streams.")
    p.add_argument("--fuzz-cases", type=int, default=10_000, help="HTTP cases; gRPC ModelInfer gets as many.")
    p.add_argument("--out-dir", type=Path, default=ROOT / "benchmarks" / "results")
    a = p.parse_args()
    chosen = a.only or list(SCENARIOS)
    results: dict[str, Any] = {"started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                               "args": {k: str(v) for k, v in vars(a).items()}}
    with tempfile.TemporaryDirectory(prefix="headroom-reliability-") as tmp:
        logs = Path(tmp)
        if "overload" in chosen:
            results["overload"] = overload.run(logs, a.duration_s, a.capacity_s, a.slo_ms)
        if "failover" in chosen:
            results["failover"] = failover.run(logs, a.failover_rate, a.failover_duration_s)
        if "streams" in chosen:
            results["streams"] = streams.run(logs, a.streams)
        if "fuzz" in chosen:
            results["fuzz"] = fuzz.run(logs, a.fuzz_cases, a.fuzz_cases)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    a.out_dir.mkdir(parents=True, exist_ok=True)
    json_path = a.out_dir / f"reliability_{stamp}.json"
    json_path.write_text(json.dumps(results, indent=2) + "\n")
    table = markdown(results)
    (a.out_dir / f"reliability_{stamp}.md").write_text(table)
    print(table)
    print(f"wrote {json_path}")


if __name__ == "__main__":
    main()
