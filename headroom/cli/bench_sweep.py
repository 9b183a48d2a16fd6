"""What `headroom bench sweep` runs (a rate bisection or a knob sweep) and the HTML pages of runs and sweeps.

Kept apart from headroom/cli/bench.py, which holds the command signatures.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any

from headroom.loadgen.console import STDERR as console
from headroom.loadgen.console import point_json, print_pareto
from headroom.loadgen.runner import BenchConfig, RunOutcome, sweep_peak_rate

if TYPE_CHECKING:
    from headroom.loadgen.sweep import BisectConfig


def rate_sweep(base: BenchConfig, slo_p99_ms: float, bisect: BisectConfig) -> dict[str, Any]:
    """Bisect for the highest rate whose Server run is VALID with p99 <= `slo_p99_ms`; the sweep's summary."""
    if slo_p99_ms <= 0:
        raise ValueError("the rate sweep needs a bound: pass --slo-p99-ms")

    def on_probe(rate_per_s: float, outcome: RunOutcome) -> None:
        scen = outcome.result["scenario"]
        mark = "[green]VALID[/green]" if scen["valid"] else "[red]invalid[/red]"
        console.print(
            f"  {rate_per_s:10.3f}/s  p99 {outcome.result['latency_ms']['p99_ms']:9.2f} ms  "
            f"{mark}  {'; '.join(scen['reasons'])}"
        )

    console.print(f"bisecting for the highest rate with p99 <= {slo_p99_ms:g} ms ...")
    state, results = asyncio.run(sweep_peak_rate(base, bisect, on_probe))
    console.print(
        f"[bold]highest VALID rate: {state.best_valid_per_s:.3f}/s[/bold]"
        + (f" (invalid at {state.lowest_invalid_per_s:.3f}/s)" if state.lowest_invalid_per_s else "")
    )
    return {
        "kind": "peak_rate",
        "slo_p99_ms": slo_p99_ms,
        "peak_rate_per_s": state.best_valid_per_s,
        "lowest_invalid_per_s": state.lowest_invalid_per_s,
        "probes": [list(p) for p in state.probes],
        "runs": results,
    }


def run_html(outcome: RunOutcome, path: Path) -> Path:
    from headroom.loadgen.html_report import write_run_html

    ok = [r for r in outcome.collector.records if r.ok]
    extra = {
        "TTFT": [r.ttft_s * 1000.0 for r in ok if r.ttft_s is not None],
        "TPOT": [r.tpot_s * 1000.0 for r in ok if r.tpot_s is not None],
    }
    latencies_ms = [r.latency_s * 1000.0 for r in ok]
    return write_run_html(outcome.result, latencies_ms, path, {k: v for k, v in extra.items() if v})


def sweep_html(summary: dict[str, Any], path: Path) -> Path:
    """Pareto page of a sweep: the knob's points, or every bisection probe (label = its rate)."""
    from headroom.loadgen.html_report import write_pareto_html
    from headroom.loadgen.knob import point_from_result
    from headroom.loadgen.sweep import ParetoPoint, pareto_frontier

    if summary["kind"] == "knob":
        points = [
            ParetoPoint(p["label"], p["throughput_per_s"], p["p99_ms"], p["on_frontier"]) for p in summary["points"]
        ]
        return write_pareto_html(points, path, f"Pareto frontier over {summary['knob']}", summary)
    points = pareto_frontier([point_from_result(r) for r in summary["runs"]])
    peak = f"{summary['peak_rate_per_s']:.3f}/s"
    intro = f"<p>highest VALID rate under p99 &le; {summary['slo_p99_ms']:g} ms: <b>{peak}</b></p>"
    return write_pareto_html(points, path, "Rate sweep: every probe on the latency-throughput plane", summary, intro)


def knob_sweep(
    base: BenchConfig,
    knob: str,
    values: str,
    server_cmd: str,
    ready_url: str,
    server_cpus: str,
    plot: Path | None,
) -> dict[str, Any]:
    from headroom.loadgen.knob import KnobSweepConfig, run_knob_sweep
    from headroom.loadgen.plots import pareto

    cfg = KnobSweepConfig(
        knob=knob,
        values=tuple(v.strip() for v in values.split(",") if v.strip()),
        server_cmd=server_cmd,
        ready_url=ready_url,
        server_cpus=server_cpus,
    )

    def on_result(value: str, outcome: RunOutcome) -> None:
        r = outcome.result
        console.print(
            f"  {knob}={value}: {r['throughput']['ok_per_s']:.1f} ok/s, p99 {r['latency_ms']['p99_ms']:.2f} ms"
        )

    points, results = asyncio.run(run_knob_sweep(base, cfg, on_result))
    print_pareto(points)
    if plot is not None:
        console.print(f"wrote {pareto(points, plot, f'Pareto frontier over {knob}')}")
    return {"kind": "knob", "knob": knob, "points": [point_json(p) for p in points], "runs": results}
