"""`headroom rollout start|status`: roll a model's new version out through a running `headroom route`."""

from __future__ import annotations

import time
from typing import Any

import httpx
import orjson
import typer
from rich.console import Console

app = typer.Typer(help="Roll a new model version out through a running router: start its replicas, shift traffic "
                       "step by step on measured error rate and p99, then promote or roll back.",
                  no_args_is_help=True, add_completion=False)
TERMINAL = ("complete", "rolled_back", "failed")


def _steps(text: str) -> list[float]:
    try:
        return [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise typer.BadParameter(f"{text!r}: write percentages like 5,25,50,100") from None


def _line(doc: dict[str, Any]) -> str:
    parts = [f"phase {doc.get('phase')}"]
    if "model" in doc:
        parts.append(f"{doc['model']} v{doc.get('version')} (stable v{doc.get('stable_version') or 'current'})")
    if "weight" in doc:
        parts.append(f"new version gets {doc['weight'] * 100:.0f}% (step {doc.get('step', 0) + 1}"
                     f"/{len(doc.get('steps', []))})")
    arms = doc.get("arms") or {}
    for arm, s in arms.items():
        parts.append(f"{arm}: {s['requests']} req, {s['errors']} err, p99 {s['p99_s'] * 1e3:.1f} ms")
    if doc.get("detail"):
        parts.append(str(doc["detail"]))
    return " · ".join(parts)


@app.command("start")
def start(
    model: str = typer.Option(..., help="The model directory whose version changes."),
    version: str = typer.Option(..., help="The new version directory (<repository>/<model>/<version>/)."),
    router: str = typer.Option("http://127.0.0.1:8000", help="The router (`headroom route`) to drive."),
    replicas: int = typer.Option(1, min=1, help="Replicas of the new version to start."),
    steps: str = typer.Option("5,25,50,100", help="Traffic percentages for the new version, ending at 100."),
    step_duration_s: float = typer.Option(60.0, min=0.0, help="Least time at each step."),
    min_requests: int = typer.Option(100, min=1, help="New-version requests a step needs before a verdict."),
    max_error_rate: float = typer.Option(0.01, min=0.0, max=1.0, help="Roll back when the new version's error "
                                         "rate exceeds the stable one's by more than this (0.01 = 1 point)."),
    max_p99_ratio: float = typer.Option(1.2, min=1.0, help="Roll back when its p99 exceeds this x the stable p99."),
    wait: bool = typer.Option(True, help="Follow the rollout until it completes, rolls back or fails."),
) -> None:
    """Start replicas of MODEL at VERSION behind the router, then shift traffic to them step by step."""
    out = Console()
    body = {"model": model, "version": version, "replicas": replicas, "steps": _steps(steps),
            "step_duration_s": step_duration_s, "min_requests": min_requests, "max_error_rate": max_error_rate,
            "max_p99_ratio": max_p99_ratio}
    try:
        r = httpx.post(f"{router.rstrip('/')}/router/rollout", content=orjson.dumps(body), timeout=30.0)
    except httpx.HTTPError as exc:
        out.print(f"[bold red]error:[/] cannot reach the router at {router}: {exc}")
        raise typer.Exit(1) from None
    if r.status_code != 202:
        out.print(f"[bold red]error ({r.status_code}):[/] {r.text}")
        raise typer.Exit(1)
    out.print(_line(r.json()))
    if wait:
        raise typer.Exit(_follow(router, out))


def _follow(router: str, out: Console, poll_s: float = 2.0) -> int:
    last = ""
    while True:
        doc = httpx.get(f"{router.rstrip('/')}/router/rollout", timeout=30.0).json()
        line = _line(doc)
        if line != last:
            out.print(line)
            last = line
        if doc.get("phase") in TERMINAL:
            return 0 if doc["phase"] == "complete" else 3
        time.sleep(poll_s)


@app.command("status")
def status(router: str = typer.Option("http://127.0.0.1:8000", help="The router (`headroom route`)."),
           json_out: bool = typer.Option(False, "--json", help="Print the router's JSON document.")) -> None:
    """Where the current (or last) rollout is."""
    try:
        doc = httpx.get(f"{router.rstrip('/')}/router/rollout", timeout=30.0).json()
    except httpx.HTTPError as exc:
        Console().print(f"[bold red]error:[/] cannot reach the router at {router}: {exc}")
        raise typer.Exit(1) from None
    typer.echo(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() if json_out else _line(doc))
