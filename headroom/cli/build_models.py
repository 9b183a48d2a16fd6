"""`headroom build-models`: produce the default models' artifacts in a model repository."""

from __future__ import annotations

from pathlib import Path

import typer


def build_models(
    model_repository: Path = typer.Option(Path("models"), help="Model repository directory to populate."),
) -> None:
    """Train/export the default models' artifacts (idempotent: skips what is already built)."""
    typer.echo(f"model repository: {model_repository} (nothing to build yet)")
