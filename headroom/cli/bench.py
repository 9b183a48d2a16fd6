"""`headroom bench`: the open-loop load generator (run, sweep, compare, pareto).

`headroom bench URL ...` is shorthand for `headroom bench run URL ...`: the group inserts `run` when its first
argument is not one of its subcommands.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.live import Live
from rich.markup import escape
from rich.text import Text
from typer.core import TyperGroup

from headroom.cli.bench_options import (
    Arrival,
    Concurrency,
    Confidence,
    Cpus,
    Cv,
    DatasetPath,
    Duration,
    EndRate,
    HtmlOut,
    HttpClientOpt,
    IgnoreEos,
    InputLen,
    InputLenStd,
    InputName,
    JsonOut,
    Label,
    LateMs,
    MaxConn,
    MaxTokens,
    MetricsUrl,
    Model,
    NoStream,
    NumQueries,
    NumSamples,
    OffRate,
    OffS,
    OnS,
    OutputLen,
    OutputLenStd,
    PrefixWords,
    Protocol,
    Quiet,
    Rate,
    Rates,
    Scenario,
    ScrapeS,
    Seed,
    SloE2e,
    SloP99,
    SloTpot,
    SloTtft,
    StepS,
    TextShape,
    TimeoutS,
    Trace,
    Url,
    Warmup,
    Workload,
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


@app.command("run")
def run(
    url: Url,
    model: Model = "model",
    protocol: Protocol = "v2-http",
    scenario: Scenario = "server",
    arrival: Arrival = "poisson",
    rate: Rate = 10.0,
    duration: Duration = 10.0,
    slo_p99_ms: SloP99 = 0.0,
    json_out: JsonOut = None,
    markdown: Annotated[Path | None, typer.Option(help="Write the Markdown summary here.")] = None,
    plots: Annotated[Path | None, typer.Option(help="Write PNG plots into this directory.")] = None,
    html: HtmlOut = None,
    concurrency: Concurrency = 0,
    num_queries: NumQueries = 0,
    cv: Cv = 1.0,
    on_s: OnS = 1.0,
    off_s: OffS = 1.0,
    off_rate: OffRate = 0.0,
    end_rate: EndRate = 0.0,
    rates: Rates = "",
    step_s: StepS = 1.0,
    trace: Trace = "",
    workload: Workload = "",
    dataset_path: DatasetPath = "",
    num_samples: NumSamples = 256,
    input_len: InputLen = 64,
    input_len_std: InputLenStd = 16,
    output_len: OutputLen = 64,
    output_len_std: OutputLenStd = 0,
    prefix_words: PrefixWords = 512,
    slo_e2e_ms: SloE2e = 0.0,
    slo_ttft_ms: SloTtft = 0.0,
    slo_tpot_ms: SloTpot = 0.0,
    seed: Seed = 0,
    timeout_s: TimeoutS = 60.0,
    max_connections: MaxConn = 256,
    input_name: InputName = "",
    text_shape: TextShape = "1,1",
    no_stream: NoStream = False,
    ignore_eos: IgnoreEos = False,
    max_tokens: MaxTokens = 64,
    metrics_url: MetricsUrl = "",
    scrape_interval_s: ScrapeS = 1.0,
    warmup: Warmup = 4,
    confidence: Confidence = 0.99,
    late_threshold_ms: LateMs = 10.0,
    label: Label = "",
    cpus: Cpus = "",
    http_client: HttpClientOpt = "aiohttp",
    quiet: Quiet = False,
) -> None:
    """Benchmark URL once and report percentiles, goodput, errors, stages and server metrics.

    Example: headroom bench http://127.0.0.1:8000 -m digits --rate 200 --duration 30 --slo-p99-ms 20
    --json out.json --plots plots/
    """
    _pin(cpus)
    kw = dict(locals())
    try:
        config = config_from_options(**kw)
        outcome = asyncio.run(_run_with_live(config, quiet))
    except ValueError as exc:
        raise _fail(str(exc)) from None
    write_outputs(outcome, json_out, markdown, plots)
    if html is not None:
        console.print(f"wrote {run_html(outcome, html)}")
    counts = outcome.result["counts"]
    if counts["completed"] and counts["ok"] == 0:
        examples = "; ".join(f"{k}: {v}" for k, v in counts["error_examples"].items())
        raise _fail(f"every request failed ({examples}). Check the URL, --model and --protocol.")


@app.command("sweep")
def sweep(
    url: Url,
    model: Model = "model",
    protocol: Protocol = "v2-http",
    arrival: Arrival = "poisson",
    rate: Annotated[float, typer.Option("--rate", "-r", help="Knob sweep: the rate of every run.")] = 10.0,
    duration: Duration = 30.0,
    slo_p99_ms: SloP99 = 0.0,
    json_out: JsonOut = None,
    low_rate: Annotated[float, typer.Option(help="Bisection: lowest rate considered.")] = 1.0,
    high_rate: Annotated[float, typer.Option(help="Bisection: first guess (doubled while VALID).")] = 100.0,
    tolerance: Annotated[float, typer.Option(help="Bisection: stop when the bracket is this fraction wide.")] = 0.05,
    max_probes: Annotated[int, typer.Option(help="Bisection: at most this many runs.")] = 12,
    knob: Annotated[
        str,
        typer.Option(
            help="Knob sweep: knob name (e.g. max_queue_delay_ms); needs --values, --server-cmd, --ready-url."
        ),
    ] = "",
    values: Annotated[str, typer.Option(help="Knob sweep: comma-separated values.")] = "",
    server_cmd: Annotated[
        str, typer.Option(help="Knob sweep: server command line with {value}, started and stopped once per value.")
    ] = "",
    ready_url: Annotated[
        str, typer.Option(help="Knob sweep: polled until 200 before each run (default URL/v2/health/ready).")
    ] = "",
    server_cpus: Annotated[
        str,
        typer.Option(
            help="Knob sweep: pin the server (taskset -c LIST); otherwise it inherits the generator's --cpus."
        ),
    ] = "",
    plot: Annotated[Path | None, typer.Option(help="PNG of the Pareto frontier (knob sweep).")] = None,
    html: HtmlOut = None,
    workload: Workload = "",
    dataset_path: DatasetPath = "",
    num_samples: NumSamples = 256,
    input_len: InputLen = 64,
    input_len_std: InputLenStd = 16,
    output_len: OutputLen = 64,
    output_len_std: OutputLenStd = 0,
    prefix_words: PrefixWords = 512,
    seed: Seed = 0,
    timeout_s: TimeoutS = 60.0,
    max_connections: MaxConn = 256,
    input_name: InputName = "",
    text_shape: TextShape = "1,1",
    no_stream: NoStream = False,
    ignore_eos: IgnoreEos = False,
    max_tokens: MaxTokens = 64,
    warmup: Warmup = 4,
    confidence: Confidence = 0.99,
    late_threshold_ms: LateMs = 10.0,
    label: Label = "",
    cpus: Cpus = "",
    http_client: HttpClientOpt = "aiohttp",
) -> None:
    """Find the highest rate whose Server run is VALID under --slo-p99-ms (bisection), or, with --knob, run
    once per knob value and draw the latency-throughput Pareto frontier.

    Example: headroom bench sweep http://127.0.0.1:8000 -m digits --slo-p99-ms 20 --duration 30 --json peak.json
    """
    from headroom.loadgen.sweep import BisectConfig

    _pin(cpus)
    kw = dict(locals())
    kw.update(
        scenario="server",
        concurrency=0,
        num_queries=0,
        cv=1.0,
        on_s=1.0,
        off_s=1.0,
        off_rate=0.0,
        end_rate=0.0,
        rates="",
        step_s=1.0,
        trace="",
        slo_e2e_ms=0.0,
        slo_ttft_ms=0.0,
        slo_tpot_ms=0.0,
        metrics_url="",
        scrape_interval_s=1.0,
    )
    try:
        base = config_from_options(**kw)
        if knob:
            summary = knob_sweep(
                base,
                knob,
                values,
                server_cmd,
                ready_url or url.rstrip("/") + "/v2/health/ready",
                server_cpus,
                plot,
            )
        else:
            summary = rate_sweep(base, slo_p99_ms, BisectConfig(low_rate_per_s=low_rate,
                                                                high_rate_per_s=max(high_rate, low_rate),
                                                                rel_tolerance=tolerance, max_probes=max_probes))
    except ValueError as exc:
        raise _fail(str(exc)) from None
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(summary, indent=1))
        console.print(f"wrote {json_out}")
    if html is not None:
        console.print(f"wrote {sweep_html(summary, html)}")


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
