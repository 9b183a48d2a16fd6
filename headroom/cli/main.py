"""`headroom` entry point. Each subcommand lives in its own module; this file only wires them."""

from __future__ import annotations

import typer

from headroom.cli import bench, build_models, models, plan, profile, serve, sim
from headroom.gateway import keys_cli
from headroom.lifecycle import batch_cli
from headroom.router import cli as router_cli
from headroom.router import k8s, ray_cli

app = typer.Typer(
    name="headroom",
    help="Serve models within their latency SLOs, load-test them, and plan the hardware a load needs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("serve")(serve.serve)
app.command("build-models")(build_models.build_models)
app.command("profile")(profile.profile)
app.add_typer(models.app, name="models")
app.add_typer(bench.app, name="bench")
app.add_typer(plan.app, name="plan")
app.add_typer(sim.app, name="sim")
app.add_typer(keys_cli.app, name="keys")
app.command("route")(router_cli.route)
app.command("route-ray")(ray_cli.route_ray)
app.command("batch")(batch_cli.batch)
app.add_typer(k8s.deploy_app, name="deploy")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
