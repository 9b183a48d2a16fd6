"""Regenerate BENCHMARKS.md from the result files under benchmarks/results/.

    .venv/bin/python scripts/make_benchmarks_md.py            # reads benchmarks/results, writes BENCHMARKS.md
    .venv/bin/python scripts/make_benchmarks_md.py --results DIR --out FILE

Each `*.json` written by `headroom bench ... --json` is one row; files in a subdirectory form one section (the
subdirectory is the comparison, e.g. `batching/`, `peers/`, `llm/`), and every row is compared with the first
file of its section (sorted by name, so name the baseline `0-...`). Sweep files (`headroom bench sweep --json`)
are listed with their peak rate or Pareto frontier. Nothing is measured here: the page is only as fresh as
the result files, and each row says when and where it was measured.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

RUN_SCHEMA = "headroom.bench/1"
ROOT = Path(__file__).resolve().parents[1]


def _num(value: Any, digits: int = 2) -> str:
    return f"{value:,.{digits}f}" if isinstance(value, int | float) and not isinstance(value, bool) else "-"


def _ratio(value: float, base: float) -> str:
    return f"{value / base:.2f}x" if base else "-"


def _run_rows(runs: list[tuple[Path, dict[str, Any]]]) -> list[str]:
    lines = [
        "| run | protocol | load | scenario | req/s | goodput/s | p50 ms | p99 ms | p99.9 ms | TTFT p99 | errors "
        "| vs first |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    base = runs[0][1]
    for path, r in runs:
        lat, ttft = r["latency_ms"], r["ttft_ms"]
        scen = r["scenario"]
        verdict = "VALID" if scen["valid"] else "invalid"
        late = " (generator late)" if r["generator"]["fell_behind"] else ""
        versus = (
            f"thr {_ratio(r['throughput']['ok_per_s'], base['throughput']['ok_per_s'])}, "
            f"p99 {_ratio(lat['p99_ms'], base['latency_ms']['p99_ms'])}"
            if r is not base
            else "baseline"
        )
        lines.append(
            f"| {r.get('label') or path.stem} | {r['config']['client']['protocol']} | {r['load']['label']}{late} "
            f"| {scen['name']} {verdict} | {_num(r['throughput']['ok_per_s'])} | "
            f"{_num(r['goodput']['requests_per_s'])} | {_num(lat['p50_ms'])} | {_num(lat['p99_ms'])} | "
            f"{_num(lat['p99.9_ms'])} | {_num(ttft['p99_ms']) if ttft['count'] else '-'} | "
            f"{r['counts']['errors']} | {versus} |"
        )
    envs = {(r["environment"]["hostname"], r["environment"]["cpu_count"]) for _, r in runs}
    dates = sorted(r["environment"]["date_utc"] for _, r in runs)
    lines.append("")
    lines.append(
        f"Measured {dates[0]} .. {dates[-1]} on "
        + ", ".join(f"{host} ({cpus} CPUs)" for host, cpus in sorted(envs, key=str))
        + "."
    )
    return lines


def _sweep_lines(path: Path, s: dict[str, Any]) -> list[str]:
    if s.get("kind") == "peak_rate":
        return [
            f"- `{path.name}`: highest VALID rate under p99 <= {s['slo_p99_ms']:g} ms: "
            f"**{s['peak_rate_per_s']:.2f}/s** (invalid at {s['lowest_invalid_per_s']:.2f}/s; "
            f"{len(s['probes'])} probes)"
        ]
    lines = [
        f"- `{path.name}`: Pareto frontier over `{s['knob']}`",
        "",
        "| run | throughput/s | p99 ms | frontier |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {p['label']} | {_num(p['throughput_per_s'])} | {_num(p['p99_ms'])} | {'yes' if p['on_frontier'] else ''} |"
        for p in s["points"]
    ]
    return lines


def _reliability_lines(results_dir: Path) -> list[str]:
    """The table of the latest `make reliability` run (`reliability_<UTC>.md` beside its `.json`), if any."""
    tables = sorted(results_dir.glob("reliability_*.md"))
    if not tables:
        return []
    latest = tables[-1]
    try:
        run = json.loads(latest.with_suffix(".json").read_text())
    except (OSError, json.JSONDecodeError):
        run = {}
    when = f"started {run.get('started_utc', '?')}, {_num(run.get('total_seconds', 0) / 60, 1)} min"
    note = run.get("note") or "machine state not recorded"
    return [f"## Reliability (`make reliability`, issue 17; `results/{latest.name}`, {when}; {note})", "",
            latest.read_text().rstrip(), ""]


def render(results_dir: Path, summary: Path | None = None) -> str:
    """The BENCHMARKS.md text for every result under `results_dir`, after the curated `summary` (if any)."""
    sections: dict[str, list[tuple[Path, dict[str, Any]]]] = {}
    sweeps: dict[str, list[tuple[Path, dict[str, Any]]]] = {}
    skipped: list[str] = []
    for path in sorted(results_dir.rglob("*.json")):
        rel = path.relative_to(results_dir)
        section = rel.parts[0] if len(rel.parts) > 1 else "runs"
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            skipped.append(str(rel))
            continue
        if isinstance(data, dict) and data.get("schema") == RUN_SCHEMA:
            sections.setdefault(section, []).append((path, data))
        elif isinstance(data, dict) and data.get("kind") in ("peak_rate", "knob"):
            sweeps.setdefault(section, []).append((path, data))
        else:
            skipped.append(str(rel))
    out = [
        "# Benchmarks",
        "",
        "Generated by `python scripts/make_benchmarks_md.py` from `benchmarks/results/` — do not edit by hand.",
        "The summary is `benchmarks/summary.md` and names the result file behind each number; the tables after it",
        "come from `headroom bench` result files (open loop, latency from the intended send time unless the load",
        "column says closed-loop). How to reproduce: see `benchmarks/README.md` and the scripts under `benchmarks/`.",
        "",
    ]
    if summary is not None and summary.is_file():
        # The curated summary (benchmarks/summary.md) quotes the other result files (engine, lifecycle,
        # simulator validation, serving comparisons) with their ratios; each number names its file.
        out += [summary.read_text().rstrip(), ""]
    out += _reliability_lines(results_dir)
    if summary is not None and summary.is_file():
        out += ["## headroom bench runs", ""]
    if not sections and not sweeps:
        out.append("No results yet: run the commands in `benchmarks/README.md` to produce them.")
    for name in sorted(set(sections) | set(sweeps)):
        out += [f"## {name}", ""]
        if name in sections:
            out += [*_run_rows(sections[name]), ""]
        for path, sweep in sweeps.get(name, []):
            out += [*_sweep_lines(path, sweep), ""]
    if skipped:
        out += ["", "Other result files (summarised above): " + ", ".join(f"`{s}`" for s in skipped)]
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results", help="result directory")
    parser.add_argument("--out", type=Path, default=ROOT / "BENCHMARKS.md", help="Markdown file to write")
    parser.add_argument("--summary", type=Path, default=None,
                        help="curated summary placed first (default: summary.md beside the results directory; "
                             "skipped when the file does not exist)")
    args = parser.parse_args(argv)
    if not args.results.is_dir():
        print(f"error: {args.results} is not a directory of result JSONs", file=sys.stderr)
        return 2
    summary = args.summary if args.summary is not None else args.results.parent / "summary.md"
    args.out.write_text(render(args.results, summary))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
