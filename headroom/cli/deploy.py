"""`headroom deploy`: `k8s` (Kubernetes manifests, headroom.router.k8s) and `ray` (a Ray Serve application,
headroom.ray_serve.cli). One group, so each target is named as documented."""

from __future__ import annotations

import typer

from headroom.ray_serve.cli import deploy_ray
from headroom.router.k8s import k8s

app = typer.Typer(help="Deploy a headroom fleet: Kubernetes manifests (k8s) or a Ray Serve application (ray).",
                  add_completion=False, pretty_exceptions_enable=False, no_args_is_help=True)


@app.callback()
def deploy() -> None:
    """Deploy a headroom fleet: `headroom deploy k8s` writes Kubernetes manifests, `headroom deploy ray` a Ray
    Serve config file (or, with --run, runs the application on a Ray cluster)."""


app.command("k8s")(k8s)
app.command("ray")(deploy_ray)
