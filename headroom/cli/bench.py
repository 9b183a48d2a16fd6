"""`headroom bench`: the open-loop load generator (run, sweep, compare, pareto).

`headroom bench URL ...` is shorthand for `headroom bench run URL ...`: the group inserts `run` when its first
argument is not one of its subcommands.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.live import Live
from rich.markup import escape
from rich.text import Text
from typer.core import TyperGroup

from headroom.cli.bench_options import (
    ARRIVAL,
    BISECTION,
    CLIENT,
    DATASET,
    DURATION,
    GOODPUT_SLOS,
    HTML_OUT,
    JSON_OUT,
    KNOB_SWEEP,
    LOAD_SHAPE,
    MARKDOWN_OUT,
    MEASUREMENT,
    PLOTS_OUT,
    QUIET,
    RATE,
    SCENARIO,
    SCRAPE,
    SLO_P99,
    SWEEP_RATE,
    TARGET,
    HtmlOut,
    command_options,
    defaults,
)
from headroom.cli.bench_sweep import knob_sweep, rate_sweep, run_html, sweep_html
from headroom.loadgen.clients import PROTOCOLS
from headroom.loadgen.console import (
    STDERR,
    config_from_options,
    point_json,
    print_compare,
    print_pareto,
    progress_text,
    write_outputs,
)
from headroom.loadgen.runner import BenchConfig, RunOutcome, run_bench
from headroom.loadgen.scenarios import SCENARIOS
from headroom.profiling.affinity import pin_process

if TYPE_CHECKING:
    from typer._click.core import Context


class _DefaultRunGroup(TyperGroup):
    """Route `headroom bench URL ...` to `headroom bench run URL ...`."""

    def parse_args(self, ctx: Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


app = typer.Typer(
    cls=_DefaultRunGroup,
    no_args_is_help=True,
    help=(
        "Load-test a model server. `headroom bench URL --model M` (= `headroom bench run URL ...`) sends an "
        "open-loop schedule (Poisson by default) and measures latency from each request's INTENDED send time, "
        "so a stalled server shows up in the tail. Protocols: "
        + ", ".join(PROTOCOLS)
        + ". Scenarios (MLPerf): "
        + ", ".join(SCENARIOS)
        + ". `sweep` finds the highest rate that meets a p99 SLO (or sweeps a server knob); `compare A.json "
        "B.json` prints ratios; `pareto *.json` draws the latency-throughput frontier."
    ),
)
console = STDERR


def _pin(cpus: str) -> None:
    if not cpus:
        return
    try:
        pin_process(cpus)
    except (ValueError, OSError) as exc:
        raise typer.BadParameter(str(exc)) from None


def _fail(message: str) -> typer.Exit:
    console.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True)  # server text may hold [brackets]
    return typer.Exit(code=2)


async def _run_with_live(config: BenchConfig, quiet: bool) -> RunOutcome:
    total_s = config.arrival.duration_s if config.closed_concurrency == 0 else config.duration_s
    if quiet:
        return await run_bench(config)
    with Live(Text("starting..."), console=console, refresh_per_second=4, transient=False) as live:
        return await run_bench(config, on_progress=lambda s, t: live.update(progress_text(s, t, total_s)))


RUN_OPTIONS = (
    *TARGET,
    SCENARIO,
    ARRIVAL,
    RATE,
    DURATION,
    SLO_P99,
    JSON_OUT,
    MARKDOWN_OUT,
    PLOTS_OUT,
    HTML_OUT,
    *LOAD_SHAPE,
    *DATASET,
    *GOODPUT_SLOS,
    *CLIENT,
    *SCRAPE,
    *MEASUREMENT,
    QUIET,
)


@app.command("run")
@command_options(*RUN_OPTIONS)
def run(**kw: Any) -> None:
    """Benchmark URL once and report percentiles, goodput, errors, stages and server metrics.

    Example: headroom bench http://127.0.0.1:8000 -m digits --rate 200 --duration 30 --slo-p99-ms 20
    --json out.json --plots plots/
    """
    _pin(kw["cpus"])
    try:
        config = config_from_options(**kw)
        outcome = asyncio.run(_run_with_live(config, kw["quiet"]))
    except ValueError as exc:
        raise _fail(str(exc)) from None
    write_outputs(outcome, kw["json_out"], kw["markdown"], kw["plots"])
    if kw["html"] is not None:
        console.print(f"wrote {run_html(outcome, kw['html'])}")
    counts = outcome.result["counts"]
    if counts["completed"] and counts["ok"] == 0:
        examples = "; ".join(f"{k}: {v}" for k, v in counts["error_examples"].items())
        raise _fail(f"every request failed ({examples}). Check the URL, --model and --protocol.")


SWEEP_OPTIONS = (
    *TARGET,
    ARRIVAL,
    SWEEP_RATE,
    DURATION.replace(default=30.0),
    SLO_P99,
    JSON_OUT,
    *BISECTION,
    *KNOB_SWEEP,
    HTML_OUT,
    *DATASET,
    *CLIENT,
    *MEASUREMENT,
)


@app.command("sweep")
@command_options(*SWEEP_OPTIONS)
def sweep(**kw: Any) -> None:
    """Find the highest rate whose Server run is VALID under --slo-p99-ms (bisection), or, with --knob, run
    once per knob value and draw the latency-throughput Pareto frontier.

    Example: headroom bench sweep http://127.0.0.1:8000 -m digits --slo-p99-ms 20 --duration 30 --json peak.json
    """
    from headroom.loadgen.sweep import BisectConfig

    _pin(kw["cpus"])
    run_defaults = defaults(RUN_OPTIONS)  # every run is a Server run, with `run`'s defaults for what sweep lacks
    try:
        base = config_from_options(**(run_defaults | kw))
        if kw["knob"]:
            summary = knob_sweep(
                base,
                kw["knob"],
                kw["values"],
                kw["server_cmd"],
                kw["ready_url"] or kw["url"].rstrip("/") + "/v2/health/ready",
                kw["server_cpus"],
                kw["plot"],
            )
        else:
            low_rate = kw["low_rate"]
            bisect = BisectConfig(low_rate_per_s=low_rate, high_rate_per_s=max(kw["high_rate"], low_rate),
                                  rel_tolerance=kw["tolerance"], max_probes=kw["max_probes"])
            summary = rate_sweep(base, kw["slo_p99_ms"], bisect)
    except ValueError as exc:
        raise _fail(str(exc)) from None
    json_out = kw["json_out"]
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(summary, indent=1))
        console.print(f"wrote {json_out}")
    if kw["html"] is not None:
        console.print(f"wrote {sweep_html(summary, kw['html'])}")


@app.command("compare")
def compare(
    a: Annotated[Path, typer.Argument(help="Baseline result JSON.")],
    b: Annotated[Path, typer.Argument(help="Candidate result JSON.")],
    markdown: Annotated[Path | None, typer.Option(help="Also write the table as Markdown here.")] = None,
) -> None:
    """Print B/A ratios for throughput, goodput and latency percentiles (and whether B is better)."""
    from headroom.loadgen.report import compare_markdown, compare_rows, load_result

    try:
        ra, rb = load_result(a), load_result(b)
    except ValueError as exc:
        raise _fail(str(exc)) from None
    print_compare(compare_rows(ra, rb), a.name, b.name)
    for name, res in ((a.name, ra), (b.name, rb)):
        if res["load"]["mode"] == "closed":
            console.print(f"[yellow]{name} is a closed-loop run: its latencies are coordinated with the server.")
    if markdown is not None:
        markdown.write_text(compare_markdown(ra, rb, a.stem, b.stem))


@app.command("pareto")
def pareto_cmd(
    results: Annotated[list[Path], typer.Argument(help="Result JSONs (each run's --label names its point).")],
    plot: Annotated[Path | None, typer.Option(help="Write the frontier as PNG here.")] = None,
    html: HtmlOut = None,
) -> None:
    """Mark which runs are on the latency-throughput Pareto frontier (goodput when an SLO was set)."""
    from headroom.loadgen.knob import point_from_result
    from headroom.loadgen.plots import pareto
    from headroom.loadgen.report import load_result
    from headroom.loadgen.sweep import pareto_frontier

    try:
        points = pareto_frontier(
            [point_from_result(load_result(p), load_result(p).get("label") or p.stem) for p in results]
        )
    except ValueError as exc:
        raise _fail(str(exc)) from None
    print_pareto(points)
    if plot is not None:
        console.print(f"wrote {pareto(points, plot)}")
    if html is not None:
        from headroom.loadgen.html_report import write_pareto_html

        data = {"kind": "pareto", "points": [point_json(p) for p in points], "files": [str(p) for p in results]}
        console.print(f"wrote {write_pareto_html(points, html, 'Latency-throughput Pareto frontier', data)}")
