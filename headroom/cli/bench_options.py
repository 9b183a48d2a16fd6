"""The `headroom bench` command-line options, each declared once (name, type, default, help), grouped as the
commands use them, and `command_options`, which gives a command its list of them.

Typer reads a command's options from its signature: `command_options` sets that signature from the list, so `run`
and `sweep` share one declaration of every option they have in common; the command functions take `**kw`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from headroom.loadgen.arrivals import ARRIVAL_KINDS
from headroom.loadgen.clients import PROTOCOLS
from headroom.loadgen.workloads import WORKLOADS

Command = TypeVar("Command", bound=Callable[..., None])


def parameter(name: str, annotation: object, default: object = inspect.Parameter.empty) -> inspect.Parameter:
    """The command parameter `name: annotation = default` (keyword-only: Typer passes options by name)."""
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


def option(name: str, kind: object, default: object, help: str, *flags: str) -> inspect.Parameter:
    """The command parameter `name: Annotated[kind, typer.Option(*flags, help=help)] = default`."""
    return parameter(name, Annotated[kind, typer.Option(*flags, help=help)], default)


def command_options(*options: inspect.Parameter) -> Callable[[Command], Command]:
    """Decorate a Typer command taking `**kw`: its options are `options`, in this order."""

    def decorate(command: Command) -> Command:
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in inspect.signature(command).parameters.values()):
            raise TypeError(f"{command.__name__} must take **kw: its options come from command_options")
        command.__signature__ = inspect.Signature(list(options), return_annotation=None)  # type: ignore[attr-defined]
        return command

    return decorate


def defaults(options: tuple[inspect.Parameter, ...]) -> dict[str, Any]:
    """{name: default} of `options` (those with one)."""
    return {p.name: p.default for p in options if p.default is not inspect.Parameter.empty}


URL = parameter(
    "url",
    Annotated[
        str,
        typer.Argument(
            metavar="URL",
            help="Server base URL (http://127.0.0.1:8000); host:port for v2-grpc; "
            "for --protocol image the full route (http://host:port/v2/models/digits/classify).",
        ),
    ],
)
TARGET = (
    URL,
    option("model", str, "model", "Model name (V2 route and OpenAI `model` field).", "--model", "-m"),
    option("protocol", str, "v2-http", "One of: " + ", ".join(PROTOCOLS) + ".", "--protocol", "-p"),
)
SCENARIO = option(
    "scenario",
    str,
    "server",
    "server: open loop at --rate, VALID if p99 <= --slo-p99-ms with 99% confidence (>= 459 queries); offline: "
    "rate*duration queries all at t=0, metric throughput; single-stream: one at a time, metric p90; "
    "multi-stream: 8-sample queries one at a time, metric p99.",
    "--scenario",
    "-s",
)
ARRIVAL = option(
    "arrival",
    str,
    "poisson",
    "Open-loop arrivals: "
    + ", ".join(ARRIVAL_KINDS)
    + ". gamma uses --cv; on_off --on-s/--off-s/--off-rate; ramp "
    "--end-rate; steps --rates/--step-s; trace --trace.",
    "--arrival",
    "-a",
)
RATE = option("rate", float, 10.0, "Mean arrival rate (requests/s).", "--rate", "-r")
DURATION = option("duration", float, 10.0, "Seconds of load (schedule length).", "--duration", "-d")
SLO_P99 = option("slo_p99_ms", float, 0.0, "p99 latency bound (ms): decides VALID and goodput.", "--slo-p99-ms")
JSON_OUT = option(
    "json_out", Path | None, None, "Write the full result (config, environment, measurements) here.", "--json"
)
HtmlOut = Annotated[
    Path | None,
    typer.Option(
        "--html",
        help="Write one self-contained interactive page (plotly, works offline) with every chart and the data.",
    ),
]
HTML_OUT = parameter("html", HtmlOut, None)

# run only: more outputs, and no live view
MARKDOWN_OUT = option("markdown", Path | None, None, "Write the Markdown summary here.")
PLOTS_OUT = option("plots", Path | None, None, "Write PNG plots into this directory.")
QUIET = option("quiet", bool, False, "No live progress.")

# how the load is offered beyond --arrival and --rate (run only)
LOAD_SHAPE = (
    option(
        "concurrency",
        int,
        0,
        "> 0: CLOSED loop with this many workers instead of a schedule (labelled closed-loop in every report).",
    ),
    option("num_queries", int, 0, "Offline / closed loop: number of queries (0 = rate*duration / until --duration)."),
    option("cv", float, 1.0, "gamma: coefficient of variation of gaps (1 = Poisson, >1 bursty)."),
    option("on_s", float, 1.0, "on_off: seconds per burst."),
    option("off_s", float, 1.0, "on_off: seconds per quiet phase."),
    option("off_rate", float, 0.0, "on_off: rate during quiet phases."),
    option("end_rate", float, 0.0, "ramp: final rate (starts at --rate)."),
    option("rates", str, "", "steps: comma-separated rates, e.g. 10,50,100."),
    option("step_s", float, 1.0, "steps: seconds per step."),
    option("trace", str, "", "trace: CSV whose first column is send times in seconds."),
)
DATASET = (
    option(
        "workload",
        str,
        "",
        "Dataset: " + ", ".join(WORKLOADS) + " (default by protocol: "
        "digits for V2/image, chat for OpenAI chat/completions, sentences "
        "for embeddings).",
    ),
    option("dataset_path", str, "", 'JSONL file: {"text"|"prompt": ..., "max_tokens": n} or {"body": {...}} per line.'),
    option("num_samples", int, 256, "Distinct synthetic samples (cycled)."),
    option("input_len", int, 64, "chat: mean prompt length (words)."),
    option("input_len_std", int, 16, "chat: prompt length std (words)."),
    option("output_len", int, 64, "chat/shared-prefix: mean max_tokens."),
    option("output_len_std", int, 0, "chat/shared-prefix: max_tokens std."),
    option("prefix_words", int, 512, "shared-prefix: words in the shared prefix."),
)
# per-request bounds for goodput (run only)
GOODPUT_SLOS = (
    option("slo_e2e_ms", float, 0.0, "Per-request end-to-end bound (ms) for goodput (default: p99 bound)."),
    option("slo_ttft_ms", float, 0.0, "Per-request TTFT bound (ms) for goodput."),
    option("slo_tpot_ms", float, 0.0, "Per-request TPOT bound (ms) for goodput."),
)
CLIENT = (
    option("seed", int, 0, "Seeds the schedule and the dataset."),
    option("timeout_s", float, 60.0, "Per-request timeout (s); counted as status 'timeout'."),
    option("max_connections", int, 256, "Pooled connections (HTTP)."),
    option("input_name", str, "", "V2 input tensor name (default: input for images, text for text)."),
    option(
        "text_shape",
        str,
        "1,1",
        "V2 shape of one text sample: 1,1 for a batching model whose input "
        "is [1] per row (Triton style, the default), 1 for a non-batching model.",
    ),
    option("no_stream", bool, False, "OpenAI: do not stream (no TTFT/TPOT/ITL)."),
    option("ignore_eos", bool, False, "OpenAI: send ignore_eos (vLLM) so outputs have max_tokens tokens."),
    option("max_tokens", int, 64, "OpenAI: max_tokens when the sample names none."),
)
# the server's /metrics (run only)
SCRAPE = (
    option("metrics_url", str, "", "Prometheus endpoint to scrape ('' = URL/metrics, 'none' = off)."),
    option("scrape_interval_s", float, 1.0, "Seconds between /metrics scrapes."),
)
MEASUREMENT = (
    option("warmup", int, 4, "Queries sent and discarded before measuring."),
    option("confidence", float, 0.99, "Early-stopping confidence for VALID (0 = plain p99 check)."),
    option("late_threshold_ms", float, 10.0, "A send more than this behind schedule counts as late."),
    option("label", str, "", "Name for this run in reports."),
    option("cpus", str, "", "Pin the generator to these CPUs (e.g. 0 or 0,1 or 2-3)."),
    option(
        "http_client",
        str,
        "aiohttp",
        "HTTP library: aiohttp (the default: about 5x less generator CPU per request than httpx, which matters "
        "when the report says the generator fell behind) or httpx.",
    ),
)

# sweep only: a knob sweep's runs, the rate bisection, the knob sweep
SWEEP_RATE = option("rate", float, 10.0, "Knob sweep: the rate of every run.", "--rate", "-r")
BISECTION = (
    option("low_rate", float, 1.0, "Bisection: lowest rate considered."),
    option("high_rate", float, 100.0, "Bisection: first guess (doubled while VALID)."),
    option("tolerance", float, 0.05, "Bisection: stop when the bracket is this fraction wide."),
    option("max_probes", int, 12, "Bisection: at most this many runs."),
)
KNOB_SWEEP = (
    option(
        "knob", str, "", "Knob sweep: knob name (e.g. max_queue_delay_ms); needs --values, --server-cmd, --ready-url."
    ),
    option("values", str, "", "Knob sweep: comma-separated values."),
    option("server_cmd", str, "", "Knob sweep: server command line with {value}, started and stopped once per value."),
    option("ready_url", str, "", "Knob sweep: polled until 200 before each run (default URL/v2/health/ready)."),
    option(
        "server_cpus",
        str,
        "",
        "Knob sweep: pin the server (taskset -c LIST); otherwise it inherits the generator's --cpus.",
    ),
    option("plot", Path | None, None, "PNG of the Pareto frontier (knob sweep)."),
)
