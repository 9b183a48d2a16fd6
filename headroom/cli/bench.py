"""`headroom bench` (being built; see the issue tracker)."""

from __future__ import annotations

import typer

app = typer.Typer(help="headroom bench", no_args_is_help=True)


@app.command("version")
def version() -> None:
    """Print the headroom version."""
    from headroom import __version__

    typer.echo(__version__)
