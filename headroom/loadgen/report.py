"""Human-readable views of a result: a Markdown summary, and `compare` ratios between two results."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from headroom.core.parsed_file import parse_file
from headroom.loadgen.runner import RESULT_SCHEMA

# (label, path into the result, higher is better)
COMPARE_METRICS: tuple[tuple[str, tuple[str, ...], bool], ...] = (
    ("throughput (req/s)", ("throughput", "requests_per_s"), True),
    ("goodput (req/s)", ("goodput", "requests_per_s"), True),
    ("output tokens/s", ("throughput", "output_tokens_per_s"), True),
    ("latency p50 (ms)", ("latency_ms", "p50_ms"), False),
    ("latency p90 (ms)", ("latency_ms", "p90_ms"), False),
    ("latency p99 (ms)", ("latency_ms", "p99_ms"), False),
    ("latency p99.9 (ms)", ("latency_ms", "p99.9_ms"), False),
    ("TTFT p50 (ms)", ("ttft_ms", "p50_ms"), False),
    ("TTFT p99 (ms)", ("ttft_ms", "p99_ms"), False),
    ("TPOT p50 (ms)", ("tpot_ms", "p50_ms"), False),
    ("ITL p99 (ms)", ("itl_ms", "p99_ms"), False),
    ("errors", ("counts", "errors"), False),
)


def load_result(path: str | Path) -> dict[str, Any]:
    """Read a result JSON written by `headroom bench --json`, with an error that says what is wrong."""
    file = Path(path)
    data = parse_file(
        file,
        json.loads,
        json.JSONDecodeError,
        f"{file}: no such file (write one with `headroom bench URL ... --json {file}`)",
        lambda exc: f"{file}: not JSON ({exc.msg} at line {exc.lineno})",
    )
    if not isinstance(data, dict) or data.get("schema") != RESULT_SCHEMA:
        raise ValueError(f"{file}: not a headroom bench result (expected schema {RESULT_SCHEMA!r})")
    return data


def dig(result: dict[str, Any], path: tuple[str, ...]) -> float | None:
    node: Any = result
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return float(node) if isinstance(node, int | float) and not isinstance(node, bool) else None


def compare_rows(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, float, float, float | None, str]]:
    """(metric, A, B, B/A, verdict) for every metric both results carry; verdict is better/worse/same for B."""
    rows = []
    for label, path, higher_better in COMPARE_METRICS:
        va, vb = dig(a, path), dig(b, path)
        if va is None or vb is None or (va == 0 and vb == 0 and "latency" not in path[0]):
            continue
        if label.startswith(("TTFT", "TPOT", "ITL")) and (va == 0 or vb == 0):
            continue
        ratio = vb / va if va else None
        if ratio is None or abs(ratio - 1.0) < 0.02:
            verdict = "same" if ratio is not None else ("worse" if higher_better != (vb > va) else "better")
        else:
            verdict = "better" if (ratio > 1.0) == higher_better else "worse"
        rows.append((label, va, vb, ratio, verdict))
    return rows


def _fmt(value: float | None, digits: int = 2) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def markdown_summary(result: dict[str, Any]) -> str:
    """A Markdown page for one run: load model, verdict, latency table, throughput, errors, generator health."""
    lat = result["latency_ms"]
    scen = result["scenario"]
    gen = result["generator"]
    lines = [
        f"# headroom bench: {result.get('label') or result['config']['client']['model']}",
        "",
        f"- target: `{result['config']['client']['url']}` ({result['config']['client']['protocol']}), "
        f"model `{result['config']['client']['model']}`",
        f"- load: **{result['load']['label']}**",
        f"- scenario: {scen['name']} — **{'VALID' if scen['valid'] else 'INVALID'}**"
        + ("" if scen["valid"] else f" ({'; '.join(scen['reasons'])})"),
        f"- date: {result['environment']['date_utc']} on {result['environment']['hostname']} "
        f"({result['environment']['cpu_count']} CPUs, generator pinned to {result['environment']['generator_cpus']})",
        "",
        "| metric | p50 | p90 | p95 | p99 | p99.9 | mean | max | n |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, key in (
        ("latency (ms)", "latency_ms"),
        ("TTFT (ms)", "ttft_ms"),
        ("TPOT (ms)", "tpot_ms"),
        ("ITL (ms)", "itl_ms"),
    ):
        h = result[key]
        if not h["count"]:
            continue
        lines.append(
            f"| {name} | {_fmt(h['p50_ms'])} | {_fmt(h['p90_ms'])} | {_fmt(h['p95_ms'])} | {_fmt(h['p99_ms'])} | "
            f"{_fmt(h['p99.9_ms'])} | {_fmt(h['mean_ms'])} | {_fmt(h['max_ms'])} | {int(h['count'])} |"
        )
    thr, good, counts = result["throughput"], result["goodput"], result["counts"]
    lines += [
        "",
        f"- throughput: {_fmt(thr['requests_per_s'])} req/s ({_fmt(thr['ok_per_s'])} ok/s)"
        + (f", {_fmt(thr['output_tokens_per_s'], 1)} output tokens/s" if thr["output_tokens_per_s"] else ""),
        f"- goodput (met every SLO): {_fmt(good['requests_per_s'])} req/s = {100 * good['fraction']:.1f}% of requests",
        f"- requests: {counts['completed']} completed, {counts['errors']} errors "
        f"(by status: {', '.join(f'{k}: {v}' for k, v in counts['by_status'].items())})",
        f"- generator: {gen['late_sends']} of {gen['queries_sent']} sends late, max lag "
        f"{_fmt(gen['max_send_lag_ms'], 1)} ms"
        + (" — **the generator fell behind its schedule**" if gen["fell_behind"] else ""),
    ]
    if lat["count"] == 0:
        lines.append("- no request succeeded: check the URL, model name and protocol")
    means = (result.get("server_metrics") or {}).get("window_means") or {}
    if means:
        lines.append(
            "- server metrics, mean per observation during the run: "
            + ", ".join(f"`{k}` {_fmt(v)}" for k, v in sorted(means.items()))
        )
    stages = result.get("server_timing_ms") or {}
    if stages:
        lines += ["", "| Server-Timing stage | mean (ms) | p50 | p99 |", "|---|---|---|---|"]
        lines += [
            f"| {k} | {_fmt(v['mean_ms'])} | {_fmt(v['p50_ms'])} | {_fmt(v['p99_ms'])} |" for k, v in stages.items()
        ]
    return "\n".join(lines) + "\n"


def compare_markdown(a: dict[str, Any], b: dict[str, Any], name_a: str = "A", name_b: str = "B") -> str:
    rows = compare_rows(a, b)
    lines = [f"| metric | {name_a} | {name_b} | {name_b}/{name_a} | {name_b} is |", "|---|---|---|---|---|"]
    lines += [f"| {m} | {_fmt(va)} | {_fmt(vb)} | {_fmt(r, 3)} | {v} |" for m, va, vb, r, v in rows]
    for name, res in ((name_a, a), (name_b, b)):
        if res["load"]["mode"] == "closed":
            lines.append(f"\n{name} is a closed-loop run: its latencies are coordinated with the server.")
    return "\n".join(lines) + "\n"
