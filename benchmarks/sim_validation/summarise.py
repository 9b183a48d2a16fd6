"""Median errors over repeated `headroom sim --validate` runs (this machine is noisy: quote medians).

    .venv/bin/python benchmarks/sim_validation/summarise.py OUT.json RUN1.json RUN2.json RUN3.json

Per judged load: each run's p50 / p99 error, the median over runs, and the verdict on the medians (|median| <=
the runs' target for p50 and p99 at every judged load). Per run it also lists the calibration's in-service
slowdown against the slowdown the server showed at each load (`real.server_usage.slowdown_at_load`): when the
machine's speed drifts between the calibration pass and a load, the two differ and that run's errors move
with it. Writes OUT.json and prints a plain table.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any


def summarise(runs: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    """The summary document for `runs` (validation reports with the same loads)."""
    loads = [r["load_fraction"] for r in runs[0]["loads"]]
    if any([r["load_fraction"] for r in run["loads"]] != loads for run in runs):
        raise ValueError("the runs do not share the same loads")
    target = runs[0]["config"]["target_rel_error"]
    rows = []
    for i, load in enumerate(loads):
        per = [run["loads"][i] for run in runs]
        e50 = [p["rel_error"]["p50"] for p in per]
        e99 = [p["rel_error"]["p99"] for p in per]
        m50, m99 = statistics.median(e50), statistics.median(e99)
        judged = per[0]["judged"]
        rows.append({"load": load, "judged": judged, "rate_per_s": [round(p["rate_per_s"], 2) for p in per],
                     "real_utilisation": [p["real"].get("utilisation") for p in per],
                     "sim_utilisation": [p["sim"]["utilisation"] for p in per],
                     "p50_real_sim_ms": [(p["real"]["p50_ms"], p["sim"]["p50_ms"]) for p in per],
                     "p99_real_sim_ms": [(p["real"]["p99_ms"], p["sim"]["p99_ms"]) for p in per],
                     "rel_error_p50": e50, "rel_error_p99": e99,
                     "median_rel_error_p50": round(m50, 4), "median_rel_error_p99": round(m99, 4),
                     "runs_passing": sum(1 for p in per if p["pass"]) if judged else None,
                     "median_pass": (abs(m50) <= target and abs(m99) <= target) if judged else None})
    drift = [{"file": name, "calibrated_scale": run["simulated"]["service_time_scale"],
              "slowdown_at_loads": [p["real"]["server_usage"].get("slowdown_at_load") for p in run["loads"]],
              "load_average_at_end": run["environment"]["load_average"], "verdict": run["verdict"]["pass"]}
             for run, name in zip(runs, names, strict=True)]
    judged_rows = [r for r in rows if r["judged"]]
    return {"schema": "headroom.sim.validate.summary/2", "model": runs[0]["model"],
            "command": runs[0]["environment"].get("command_line"), "target_rel_error": target,
            "load_basis": runs[0]["config"].get("load_basis", "capacity"), "runs": drift, "loads": rows,
            "verdict_on_medians": bool(judged_rows) and all(r["median_pass"] for r in judged_rows)}


def main() -> None:
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    out, files = Path(sys.argv[1]), [Path(p) for p in sys.argv[2:]]
    summary = summarise([json.loads(p.read_text()) for p in files], [p.name for p in files])
    out.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"{summary['model']}, {len(files)} runs, loads as {summary['load_basis']}")
    for r in summary["loads"]:
        errs = ", ".join(f"{a:+.1%}/{b:+.1%}" for a, b in zip(r["rel_error_p50"], r["rel_error_p99"], strict=True))
        verdict = ("pass" if r["median_pass"] else "fail") if r["judged"] else "reported"
        print(f"  {r['load']:.0%}: p50/p99 errors {errs}; median {r['median_rel_error_p50']:+.1%} / "
              f"{r['median_rel_error_p99']:+.1%} -> {verdict}")
    print(f"verdict on medians: {'pass' if summary['verdict_on_medians'] else 'fail'}; wrote {out}")


if __name__ == "__main__":
    main()
