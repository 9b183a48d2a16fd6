"""Terminal and file output of `headroom bench` (rich), and the option-to-config mapping of its CLI.

Kept apart from headroom/cli/bench.py so the Typer module holds only the command signatures.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markdown import Markdown
from rich.table import Table
from rich.text import Text

from headroom.loadgen.arrivals import ArrivalSpec
from headroom.loadgen.clients import ClientConfig
from headroom.loadgen.collector import LiveSnapshot
from headroom.loadgen.records import Slo
from headroom.loadgen.runner import BenchConfig, RunOutcome
from headroom.loadgen.sweep import ParetoPoint
from headroom.loadgen.workloads import DEFAULT_WORKLOAD_FOR_PROTOCOL, WorkloadSpec

STDERR = Console(stderr=True)  # progress, notes and errors
STDOUT = Console()  # the report itself


def parse_floats(text: str, what: str) -> tuple[float, ...]:
    """`"10,20"` -> (10.0, 20.0); ValueError naming the option otherwise."""
    try:
        return tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ValueError(f"{what}: expected comma-separated numbers, got {text!r}") from None


def _same_named(kw: Mapping[str, Any], *names: str) -> dict[str, Any]:
    """The options `names`, for the config fields named like them."""
    return {name: kw[name] for name in names}


def config_from_options(**kw: Any) -> BenchConfig:
    """The BenchConfig for the CLI's options (keyword names as in `headroom bench run`)."""
    protocol = kw["protocol"]
    workload = kw["workload"]
    if not workload:
        workload = "jsonl" if kw["dataset_path"] else DEFAULT_WORKLOAD_FOR_PROTOCOL.get(protocol, "sentences")
    return BenchConfig(
        client=ClientConfig(
            **_same_named(kw, "url", "model", "protocol", "timeout_s", "max_connections", "input_name", "ignore_eos",
                          "http_client"),
            text_shape=tuple(int(d) for d in str(kw.get("text_shape") or "1,1").split(",")),
            stream=not kw["no_stream"],
            default_max_tokens=kw["max_tokens"],
        ),
        arrival=ArrivalSpec(
            **_same_named(kw, "cv", "on_s", "off_s", "step_s"),
            kind=kw["arrival"],
            rate_per_s=kw["rate"],
            duration_s=kw["duration"],
            off_rate_per_s=kw["off_rate"],
            end_rate_per_s=kw["end_rate"],
            rates_per_s=parse_floats(kw["rates"], "--rates"),
            trace_path=kw["trace"],
        ),
        workload=WorkloadSpec(
            **_same_named(kw, "num_samples", "input_len_std", "output_len_std", "prefix_words"),
            kind=workload,
            input_len_mean=kw["input_len"],
            output_len_mean=kw["output_len"],
            path=kw["dataset_path"],
        ),
        slo=Slo(p99_ms=kw["slo_p99_ms"], e2e_ms=kw["slo_e2e_ms"], ttft_ms=kw["slo_ttft_ms"], tpot_ms=kw["slo_tpot_ms"]),
        **_same_named(kw, "scenario", "num_queries", "seed", "metrics_url", "scrape_interval_s", "confidence",
                      "late_threshold_ms", "label"),
        closed_concurrency=kw["concurrency"],
        duration_s=kw["duration"],
        warmup_queries=kw["warmup"],
        command_line=" ".join(shlex.quote(a) for a in sys.argv),
    )


def progress_text(snap: LiveSnapshot, elapsed_s: float, total_s: float) -> Text:
    return Text.assemble(
        ("bench ", "bold"),
        f"{elapsed_s:5.1f}/{total_s:.0f} s  ",
        ("rate ", "dim"),
        f"{snap.rate_per_s:7.1f}/s  ",
        ("done ", "dim"),
        f"{snap.completed:7d}  ",
        ("p50 ", "dim"),
        (f"{snap.p50_ms:8.2f} ms  ", "green"),
        ("p99 ", "dim"),
        (f"{snap.p99_ms:8.2f} ms  ", "dark_orange"),
        ("errors ", "dim"),
        (f"{snap.errors}", "red" if snap.errors else "green"),
    )


def write_outputs(outcome: RunOutcome, json_out: Path | None, markdown_out: Path | None, plots: Path | None) -> None:
    from headroom.loadgen.report import markdown_summary

    result = outcome.result
    md = markdown_summary(result)
    STDOUT.print(Markdown(md))
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(result, indent=1))
        STDERR.print(f"wrote {json_out}")
    if markdown_out is not None:
        markdown_out.parent.mkdir(parents=True, exist_ok=True)
        markdown_out.write_text(md)
        STDERR.print(f"wrote {markdown_out}")
    if plots is not None:
        from headroom.loadgen.plots import plot_run

        for path in plot_run(outcome.collector, outcome.scrape, plots, result.get("label", "")):
            STDERR.print(f"wrote {path}")


def point_json(p: ParetoPoint) -> dict[str, Any]:
    return {"label": p.label, "throughput_per_s": p.throughput_per_s, "p99_ms": p.p99_ms, "on_frontier": p.on_frontier}


def print_pareto(points: Sequence[ParetoPoint]) -> None:
    table = Table(title="latency-throughput frontier")
    for col in ("run", "throughput/s", "p99 ms", "frontier"):
        table.add_column(col, justify="right" if col != "run" else "left")
    for p in points:
        table.add_row(p.label, f"{p.throughput_per_s:,.2f}", f"{p.p99_ms:,.2f}", "yes" if p.on_frontier else "")
    STDOUT.print(table)


def print_compare(rows: Sequence[tuple[str, float, float, float | None, str]], name_a: str, name_b: str) -> None:
    """The `compare` table: metric, A, B, B/A and whether B is better."""
    table = Table(title=f"{name_b} vs {name_a}")
    for col in ("metric", name_a, name_b, "B/A", "B is"):
        table.add_column(col, justify="left" if col == "metric" else "right")
    colours = {"better": "green", "worse": "red", "same": "white"}
    for metric, va, vb, ratio, verdict in rows:
        ratio_text = "-" if ratio is None else f"{ratio:.3f}"
        table.add_row(
            metric, f"{va:,.2f}", f"{vb:,.2f}", ratio_text, f"[{colours[verdict]}]{verdict}[/{colours[verdict]}]"
        )
    STDOUT.print(table)
