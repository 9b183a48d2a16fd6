"""`headroom profile MODEL`: service time by batch size on this machine, as a profile for plan/sim."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from headroom.profiling.measure import BatchTiming, default_batch_sizes, profile_document, profile_model


def profile(
    model: str = typer.Argument(..., help="Model directory name in the repository (e.g. minilm, digits)."),
    model_repository: Path = typer.Option(Path("models"), help="Model repository directory."),
    batch_size: list[int] = typer.Option([], "--batch-size", help="Batch sizes to measure (repeatable); "
                                         "default 1, 2, 4, ... up to max_batch_size."),
    repeats: int = typer.Option(20, min=1, help="Timed predict calls per batch size."),
    output: Path = typer.Option(None, "--output", "-o", help="Write the JSON profile here (default: print)."),
) -> None:
    """Measure how long one batched model call takes at each batch size, and write a service-time profile.

    The profile feeds `headroom plan ... --from-profile` and `headroom sim --profile`. Only the model call is
    timed (preprocessing is per request and overlaps batches in the server).
    """
    from headroom.models.repository import ModelRepository  # heavy (torch): not at `headroom --help`

    console = Console(stderr=True)
    repo = ModelRepository(model_repository)
    index = repo.scan([model])
    if not index.models:
        console.print(f"[red]error:[/] {model!r} is not a tensor model (LLM profiling: see docs/llm.md)")
        raise typer.Exit(code=2)
    entry = index.models[0]
    with console.status(f"loading {model} ..."):
        loaded = repo.load_version(entry, entry.versions[-1])
    sizes = tuple(batch_size) or default_batch_sizes(entry.config.max_batch_size)
    table = Table(title=f"{model} v{loaded.version}: predict time by batch size ({repeats} repeats)")
    for col in ("batch", "mean ms", "p50 ms", "p99 ms", "items/s", "cv"):
        table.add_column(col, justify="right")
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("measuring", total=len(sizes))

        def done(t: BatchTiming) -> None:
            progress.advance(task)
            table.add_row(str(t.batch_size), f"{t.mean_ms:.2f}", f"{t.percentile_ms(50):.2f}",
                          f"{t.percentile_ms(99):.2f}", f"{t.batch_size / (t.mean_ms / 1e3):.0f}", f"{t.cv:.3f}")

        timings = profile_model(loaded.model, sizes, repeats, done)
    loaded.unload()
    console.print(table)
    doc = json.dumps(profile_document(model, timings, repeats), indent=2)
    if output is None:
        typer.echo(doc)
    else:
        output.write_text(doc + "\n")
        console.print(f"profile written to {output}")
