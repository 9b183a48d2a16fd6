"""`headroom batch`: static inference over a dataset into a SQLite prediction store (the command's body).

Wired by the CLI as `app.command("batch")(batch_cli.batch)`; heavy imports stay inside the function so
`headroom --help` stays fast.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import typer


def batch(
    model: str = typer.Argument(..., help="Model name in the repository (e.g. digits)."),
    dataset: Path = typer.Option(
        ...,
        "--dataset",
        help="A .npz file with one array per model input, named like the inputs in config.yaml; the leading "
        "axis is the item axis (each row becomes one single-item request, e.g. input: [N, 1, 8, 8] for digits).",
    ),
    output: Path = typer.Option(Path("predictions.sqlite"), "--output", help="SQLite store to write (created)."),
    model_repository: Path = typer.Option(Path("models"), help="Model repository directory."),
    version: str = typer.Option("", help="Version to run (default: the highest one the version policy serves)."),
    batch_size: int = typer.Option(0, help="Items per model call (default: the model's max_batch_size)."),
    recompute: bool = typer.Option(False, "--recompute", help="Recompute items already in the store."),
) -> None:
    """Run a model offline over a dataset in its largest batches (MLPerf Offline) and store every prediction.

    Predictions are keyed by a hash of the single-item request (model, version, input bytes), so a server
    started with the same store answers identical requests from it and falls back to the model otherwise.
    Re-running skips items already stored unless --recompute is given.
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from headroom.lifecycle.offline import PredictionStore, run_offline
    from headroom.models.repository import ModelRepository

    console = Console()
    if not dataset.is_file():
        raise typer.BadParameter(f"{dataset} does not exist; save one with numpy.savez(path, input=array)")
    repo = ModelRepository(model_repository)
    index = repo.scan([model])
    entry = index.get(model)
    if entry is None:
        raise typer.BadParameter(f"model {model!r} is not in {model_repository} (see `headroom models list`)")
    arrays = load_dataset(dataset)
    names = {spec.name for spec in entry.config.inputs}
    if set(arrays) != names:
        raise typer.BadParameter(
            f"{dataset} holds arrays {sorted(arrays)} but {model} takes inputs {sorted(names)}; name them alike"
        )
    if version and int(version) not in entry.versions:
        raise typer.BadParameter(f"version {version} of {model} is not served; available: {list(entry.versions)}")
    chosen = int(version) if version else max(entry.versions)
    loaded = repo.load_version(entry, chosen)
    store = PredictionStore(output)
    try:
        with Progress(
            TextColumn(f"{model} v{chosen}: offline"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        ) as progress:
            task = progress.add_task("offline", total=None)
            report = run_offline(
                loaded.model,
                model,
                str(chosen),
                arrays,
                store,
                batch_size=batch_size or None,
                skip_existing=not recompute,
                on_progress=lambda done, total: progress.update(task, completed=done, total=total),
            )
    finally:
        store.close()
        loaded.unload()
    console.print(
        f"{model} v{chosen}: {report.computed} items computed in {report.batches} batches of up to "
        f"{report.batch_size} ({report.items_per_s:.0f} items/s), {report.skipped} already stored -> {output}"
    )


def load_dataset(path: Path) -> dict[str, np.ndarray]:
    """The arrays of an .npz file by name (pickle refused)."""
    with np.load(path, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}
