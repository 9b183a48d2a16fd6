"""The `headroom bench` command-line options shared by `run` and `sweep` (Typer `Annotated` aliases)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from headroom.loadgen.arrivals import ARRIVAL_KINDS
from headroom.loadgen.clients import PROTOCOLS
from headroom.loadgen.workloads import WORKLOADS

Url = Annotated[
    str,
    typer.Argument(
        metavar="URL",
        help="Server base URL (http://127.0.0.1:8000); host:port for v2-grpc; "
        "for --protocol image the full route (http://host:port/v2/models/digits/classify).",
    ),
]
Model = Annotated[str, typer.Option("--model", "-m", help="Model name (V2 route and OpenAI `model` field).")]
Protocol = Annotated[str, typer.Option("--protocol", "-p", help="One of: " + ", ".join(PROTOCOLS) + ".")]
Scenario = Annotated[
    str,
    typer.Option(
        "--scenario",
        "-s",
        help=(
            "server: open loop at --rate, VALID if p99 <= --slo-p99-ms with 99% confidence (>= 459 queries); offline: "
            "rate*duration queries all at t=0, metric throughput; single-stream: one at a time, metric p90; "
            "multi-stream: 8-sample queries one at a time, metric p99."
        ),
    ),
]
Arrival = Annotated[
    str,
    typer.Option(
        "--arrival",
        "-a",
        help="Open-loop arrivals: "
        + ", ".join(ARRIVAL_KINDS)
        + ". gamma uses --cv; on_off --on-s/--off-s/--off-rate; ramp "
        "--end-rate; steps --rates/--step-s; trace --trace.",
    ),
]
Rate = Annotated[float, typer.Option("--rate", "-r", help="Mean arrival rate (requests/s).")]
Duration = Annotated[float, typer.Option("--duration", "-d", help="Seconds of load (schedule length).")]
SloP99 = Annotated[float, typer.Option("--slo-p99-ms", help="p99 latency bound (ms): decides VALID and goodput.")]
JsonOut = Annotated[
    Path | None, typer.Option("--json", help="Write the full result (config, environment, measurements) here.")
]
HtmlOut = Annotated[
    Path | None,
    typer.Option(
        "--html",
        help="Write one self-contained interactive page (plotly, works offline) with every chart and the data.",
    ),
]


Concurrency = Annotated[
    int,
    typer.Option(
        help="> 0: CLOSED loop with this many workers instead of a schedule (labelled closed-loop in every report)."
    ),
]
NumQueries = Annotated[
    int, typer.Option(help="Offline / closed loop: number of queries (0 = rate*duration / until --duration).")
]
Cv = Annotated[float, typer.Option(help="gamma: coefficient of variation of gaps (1 = Poisson, >1 bursty).")]
OnS = Annotated[float, typer.Option(help="on_off: seconds per burst.")]
OffS = Annotated[float, typer.Option(help="on_off: seconds per quiet phase.")]
OffRate = Annotated[float, typer.Option(help="on_off: rate during quiet phases.")]
EndRate = Annotated[float, typer.Option(help="ramp: final rate (starts at --rate).")]
Rates = Annotated[str, typer.Option(help="steps: comma-separated rates, e.g. 10,50,100.")]
StepS = Annotated[float, typer.Option(help="steps: seconds per step.")]
Trace = Annotated[str, typer.Option(help="trace: CSV whose first column is send times in seconds.")]
Workload = Annotated[
    str,
    typer.Option(
        help="Dataset: " + ", ".join(WORKLOADS) + " (default by protocol: "
        "digits for V2/image, chat for OpenAI chat/completions, sentences "
        "for embeddings)."
    ),
]
DatasetPath = Annotated[
    str, typer.Option(help='JSONL file: {"text"|"prompt": ..., "max_tokens": n} or {"body": {...}} per line.')
]
NumSamples = Annotated[int, typer.Option(help="Distinct synthetic samples (cycled).")]
InputLen = Annotated[int, typer.Option(help="chat: mean prompt length (words).")]
InputLenStd = Annotated[int, typer.Option(help="chat: prompt length std (words).")]
OutputLen = Annotated[int, typer.Option(help="chat/shared-prefix: mean max_tokens.")]
OutputLenStd = Annotated[int, typer.Option(help="chat/shared-prefix: max_tokens std.")]
PrefixWords = Annotated[int, typer.Option(help="shared-prefix: words in the shared prefix.")]
SloE2e = Annotated[float, typer.Option(help="Per-request end-to-end bound (ms) for goodput (default: p99 bound).")]
SloTtft = Annotated[float, typer.Option(help="Per-request TTFT bound (ms) for goodput.")]
SloTpot = Annotated[float, typer.Option(help="Per-request TPOT bound (ms) for goodput.")]
Seed = Annotated[int, typer.Option(help="Seeds the schedule and the dataset.")]
TimeoutS = Annotated[float, typer.Option(help="Per-request timeout (s); counted as status 'timeout'.")]
MaxConn = Annotated[int, typer.Option(help="Pooled connections (HTTP).")]
InputName = Annotated[str, typer.Option(help="V2 input tensor name (default: input for images, text for text).")]
TextShape = Annotated[
    str,
    typer.Option(
        help="V2 shape of one text sample: 1,1 for a batching model whose input "
        "is [1] per row (Triton style, the default), 1 for a non-batching model."
    ),
]
NoStream = Annotated[bool, typer.Option(help="OpenAI: do not stream (no TTFT/TPOT/ITL).")]
IgnoreEos = Annotated[bool, typer.Option(help="OpenAI: send ignore_eos (vLLM) so outputs have max_tokens tokens.")]
MaxTokens = Annotated[int, typer.Option(help="OpenAI: max_tokens when the sample names none.")]
MetricsUrl = Annotated[str, typer.Option(help="Prometheus endpoint to scrape ('' = URL/metrics, 'none' = off).")]
ScrapeS = Annotated[float, typer.Option(help="Seconds between /metrics scrapes.")]
Warmup = Annotated[int, typer.Option(help="Queries sent and discarded before measuring.")]
Confidence = Annotated[float, typer.Option(help="Early-stopping confidence for VALID (0 = plain p99 check).")]
LateMs = Annotated[float, typer.Option(help="A send more than this behind schedule counts as late.")]
Label = Annotated[str, typer.Option(help="Name for this run in reports.")]
Cpus = Annotated[str, typer.Option(help="Pin the generator to these CPUs (e.g. 0 or 0,1 or 2-3).")]
Quiet = Annotated[bool, typer.Option(help="No live progress.")]
HttpClientOpt = Annotated[
    str,
    typer.Option(
        help="HTTP library: httpx (default) or aiohttp (about 5x less generator CPU per request: use it when the "
        "report says the generator fell behind)."
    ),
]
