"""`headroom serve`: start the inference server."""

from __future__ import annotations

from pathlib import Path

import typer


def serve(
    host: str = typer.Option("127.0.0.1", help="Address to bind HTTP and gRPC to."),
    http_port: int = typer.Option(8000, help="HTTP port (KServe V2, OpenAI, /metrics)."),
    grpc_port: int = typer.Option(8001, help="gRPC port (inference.GRPCInferenceService)."),
    model_repository: Path = typer.Option(Path("models"), help="Directory of <model>/config.yaml + versions."),
) -> None:
    """Serve every model in the repository over KServe V2 (HTTP + gRPC) and the OpenAI API."""
    raise typer.Exit(code=1)
